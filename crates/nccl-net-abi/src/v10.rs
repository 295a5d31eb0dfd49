//! `#[repr(C)]` mirrors of NCCL's ext-net v10 structures (NCCL 2.26–2.28 `net_v10.h`; layouts
//! checked against include/nccl_net_ha.h by tests/c_layout.rs). New in v10: the profiler
//! callback in `init`, the per-communicator config (traffic class) in `connect`, and the
//! profiler handles in `isend`/`irecv`. Properties are v9's.

use super::common::{NcclDebugLogger, NcclProfilerCallback, NcclResult};
use super::v9::{NcclNetDeviceHandleV9, NcclNetPropertiesV9, NcclNetVDevicePropsV9};
use std::os::raw::{c_char, c_int, c_void};

/// `ncclNetDeviceHandle_v10_t` is v8's.
pub type NcclNetDeviceHandleV10 = NcclNetDeviceHandleV9;
/// `ncclNetVDeviceProps_v10_t` has v9's layout.
pub type NcclNetVDevicePropsV10 = NcclNetVDevicePropsV9;
/// `ncclNetProperties_v10_t` has v9's layout (104 bytes).
pub type NcclNetPropertiesV10 = NcclNetPropertiesV9;

/// `ncclNetCommConfig_v10_t` (4 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclNetCommConfigV10 {
    /// `NCCL_NET_TRAFFIC_CLASS_UNDEF` (-1) or the plugin-specific traffic class.
    pub traffic_class: c_int,
}

/// `ncclNet_v10_t` (160 bytes): a name and 19 entry points.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclNetV10 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger, NcclProfilerCallback) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties:
        Option<unsafe extern "C" fn(c_int, *mut NcclNetPropertiesV10) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> NcclResult>,
    /// `(dev, config, handle, sendComm, sendDevComm)`.
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut NcclNetCommConfigV10,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV10,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV10,
        ) -> NcclResult,
    >,
    pub reg_mr: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            u64,
            c_int,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub dereg_mr: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> NcclResult>,
    /// `(sendComm, data, size_t size, tag, mhandle, phandle, request)`.
    pub isend: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            *mut c_void,
            *mut c_void,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `(recvComm, n, data, size_t* sizes, tags, mhandles, phandles, request)`.
    pub irecv: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut *mut c_void,
            *mut usize,
            *mut c_int,
            *mut *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut *mut c_void,
            *mut c_int,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub test: Option<unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> NcclResult>,
    pub close_send: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
    pub close_recv: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
    pub close_listen: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
    pub get_device_mr:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> NcclResult>,
    pub make_v_device:
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV10) -> NcclResult>,
}

// SAFETY: the table is immutable after construction; its only pointer (`name`) points to a
// 'static NUL-terminated string, and function pointers are thread-safe to share.
unsafe impl Sync for NcclNetV10 {}
// SAFETY: as above; nothing in the table is tied to a thread.
unsafe impl Send for NcclNetV10 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_nccl() {
        assert_eq!(size_of::<NcclNetV10>(), 160);
        assert_eq!(size_of::<NcclNetCommConfigV10>(), 4);
    }
}
