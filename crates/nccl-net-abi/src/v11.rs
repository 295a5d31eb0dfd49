//! `#[repr(C)]` mirrors of NCCL's ext-net v11 structures (NCCL 2.28 `net_v11.h`; layouts
//! checked against include/nccl_net_ha.h by tests/c_layout.rs). New in v11: `init` is called
//! once per communicator and returns a context that `listen`/`connect` take, `finalize(ctx)`,
//! `setNetAttr(ctx, attr)`, and `maxMultiRequestSize` in the properties.

use super::common::{NcclDebugLogger, NcclProfilerCallback, NcclResult};
use super::v10::NcclNetCommConfigV10;
use super::v9::{NcclNetDeviceHandleV9, NcclNetVDevicePropsV9};
use std::os::raw::{c_char, c_int, c_void};

/// `ncclNetDeviceHandle_v11_t` is v8's.
pub type NcclNetDeviceHandleV11 = NcclNetDeviceHandleV9;
/// `ncclNetVDeviceProps_v11_t` has v9's layout.
pub type NcclNetVDevicePropsV11 = NcclNetVDevicePropsV9;
/// `ncclNetCommConfig_v11_t` has v10's layout.
pub type NcclNetCommConfigV11 = NcclNetCommConfigV10;

/// `ncclNetProperties_v11_t` (112 bytes): v9's plus `maxMultiRequestSize`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV11 {
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
    pub v_props: NcclNetVDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetCommAttr_v11_t` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NcclNetCommAttrV11 {
    pub max_concurrent_peers: i32,
    pub min_concurrent_peers: i32,
    pub max_flows_per_peer: i32,
    pub min_flows_per_peer: i32,
}

/// `ncclNetAttr_v11_t` (44 bytes): NCCL's hints about the traffic to come.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NcclNetAttrV11 {
    pub send_comm_attr: NcclNetCommAttrV11,
    pub recv_comm_attr: NcclNetCommAttrV11,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// `ncclNet_v11_t` (176 bytes): a name and 21 entry points.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclNetV11 {
    pub name: *const c_char,
    /// `(void** ctx, uint64_t commId, config, logFunction, profFunction)`.
    pub init: Option<
        unsafe extern "C" fn(
            *mut *mut c_void,
            u64,
            *mut NcclNetCommConfigV11,
            NcclDebugLogger,
            NcclProfilerCallback,
        ) -> NcclResult,
    >,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties:
        Option<unsafe extern "C" fn(c_int, *mut NcclNetPropertiesV11) -> NcclResult>,
    /// `(ctx, dev, handle, listenComm)`.
    pub listen: Option<
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut *mut c_void) -> NcclResult,
    >,
    /// `(ctx, dev, handle, sendComm, sendDevComm)`.
    pub connect: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV11,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV11,
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
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV11) -> NcclResult>,
    pub finalize: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
    pub set_net_attr: Option<unsafe extern "C" fn(*mut c_void, *mut NcclNetAttrV11) -> NcclResult>,
}

// SAFETY: the table is immutable after construction; its only pointer (`name`) points to a
// 'static NUL-terminated string, and function pointers are thread-safe to share.
unsafe impl Sync for NcclNetV11 {}
// SAFETY: as above; nothing in the table is tied to a thread.
unsafe impl Send for NcclNetV11 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn sizes_match_nccl() {
        assert_eq!(size_of::<NcclNetV11>(), 176);
        assert_eq!(size_of::<NcclNetPropertiesV11>(), 112);
        assert_eq!(
            offset_of!(NcclNetPropertiesV11, max_multi_request_size),
            104
        );
        assert_eq!(size_of::<NcclNetAttrV11>(), 44);
    }
}
