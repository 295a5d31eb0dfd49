//! `#[repr(C)]` mirrors of NCCL's ext-net v9 structures (NCCL 2.24–2.28 `net_v9.h`; layouts
//! checked against include/nccl_net_ha.h by tests/c_layout.rs). New in v9: `size_t` message
//! sizes, `forceFlush`, virtual-device properties, `maxP2pBytes`/`maxCollBytes`, `makeVDevice`.

use super::common::{NcclDebugLogger, NcclResult, NCCL_NET_MAX_DEVS_PER_NIC};
use super::v8::NcclNetDeviceHandleV8;
use std::os::raw::{c_char, c_int, c_void};

/// `ncclNetDeviceHandle_v9_t` is v8's.
pub type NcclNetDeviceHandleV9 = NcclNetDeviceHandleV8;

/// `ncclNetVDeviceProps_v9_t` (20 bytes): the physical devices a virtual NIC fuses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NcclNetVDevicePropsV9 {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC],
}

/// `ncclNetProperties_v9_t` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: NcclNetVDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNet_v9_t` (160 bytes): a name and 19 entry points.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclNetV9 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut NcclNetPropertiesV9) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> NcclResult>,
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV9,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV9,
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
    /// `(sendComm, data, size_t size, tag, mhandle, request)`.
    pub isend: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            *mut c_void,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// `(recvComm, n, data, size_t* sizes, tags, mhandles, request)`.
    pub irecv: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut *mut c_void,
            *mut usize,
            *mut c_int,
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
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV9) -> NcclResult>,
}

// SAFETY: the table is immutable after construction; its only pointer (`name`) points to a
// 'static NUL-terminated string, and function pointers are thread-safe to share.
unsafe impl Sync for NcclNetV9 {}
// SAFETY: as above; nothing in the table is tied to a thread.
unsafe impl Send for NcclNetV9 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn sizes_match_nccl() {
        assert_eq!(size_of::<NcclNetV9>(), 160);
        assert_eq!(size_of::<NcclNetPropertiesV9>(), 104);
        assert_eq!(align_of::<NcclNetPropertiesV9>(), 8);
        assert_eq!(offset_of!(NcclNetPropertiesV9, force_flush), 32);
        assert_eq!(offset_of!(NcclNetPropertiesV9, v_props), 64);
        assert_eq!(size_of::<NcclNetVDevicePropsV9>(), 20);
    }
}
