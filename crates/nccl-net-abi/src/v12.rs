//! `#[repr(C)]` mirrors of NCCL's ext-net v12 structures (NCCL 2.30 `net_v12.h`; layouts
//! checked against include/nccl_net_ha.h by tests/c_layout.rs). New in v12: a virtual NIC may
//! fuse up to 8 physical devices (`vProps.devs[8]`, 36 bytes), and the properties end with
//! the device's `railId` and `planeId` (`NCCL_NET_ID_UNDEF` when unknown). The function table
//! has v11's members and signatures; the comm config, attributes and device handle are v11's.

use super::common::{NcclDebugLogger, NcclProfilerCallback, NcclResult};
use super::v11::{NcclNetAttrV11, NcclNetCommAttrV11, NcclNetCommConfigV11};
use super::v9::NcclNetDeviceHandleV9;
use std::os::raw::{c_char, c_int, c_void};

/// Physical devices one virtual NIC may fuse in v12 (`NCCL_NET_MAX_DEVS_PER_NIC_V12`).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// `railId`/`planeId` of a device whose rail or plane is not known (`NCCL_NET_ID_UNDEF`).
pub const NCCL_NET_ID_UNDEF: i16 = -1;

/// `ncclNetDeviceHandle_v12_t` is v8's.
pub type NcclNetDeviceHandleV12 = NcclNetDeviceHandleV9;
/// `ncclNetCommConfig_v12_t` has v10's layout (4 bytes).
pub type NcclNetCommConfigV12 = NcclNetCommConfigV11;
/// `ncclNetCommAttr_v12_t` has v11's layout (16 bytes).
pub type NcclNetCommAttrV12 = NcclNetCommAttrV11;
/// `ncclNetAttr_v12_t` has v11's layout (44 bytes).
pub type NcclNetAttrV12 = NcclNetAttrV11;

/// `ncclNetVDeviceProps_v12_t` (36 bytes): the physical devices a virtual NIC fuses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NcclNetVDevicePropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V12],
}

/// `ncclNetProperties_v12_t` (128 bytes): v11's with 8 devices per virtual NIC, then
/// `railId` and `planeId`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV12 {
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
    pub v_props: NcclNetVDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    /// The rail the device is on (`NCCL_NET_ID_UNDEF`: unknown).
    pub rail_id: i16,
    /// The network plane the device is on (`NCCL_NET_ID_UNDEF`: unknown).
    pub plane_id: i16,
}

/// `ncclNet_v12_t` (176 bytes): a name and 21 entry points, v11's order and signatures with
/// the v12 properties in `getProperties` and `makeVDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclNetV12 {
    pub name: *const c_char,
    /// `(void** ctx, uint64_t commId, config, logFunction, profFunction)`.
    pub init: Option<
        unsafe extern "C" fn(
            *mut *mut c_void,
            u64,
            *mut NcclNetCommConfigV12,
            NcclDebugLogger,
            NcclProfilerCallback,
        ) -> NcclResult,
    >,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties:
        Option<unsafe extern "C" fn(c_int, *mut NcclNetPropertiesV12) -> NcclResult>,
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
            *mut *mut NcclNetDeviceHandleV12,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV12,
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
        Option<unsafe extern "C" fn(*mut c_int, *mut NcclNetVDevicePropsV12) -> NcclResult>,
    pub finalize: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
    pub set_net_attr: Option<unsafe extern "C" fn(*mut c_void, *mut NcclNetAttrV12) -> NcclResult>,
}

// SAFETY: the table is immutable after construction; its only pointer (`name`) points to a
// 'static NUL-terminated string, and function pointers are thread-safe to share.
unsafe impl Sync for NcclNetV12 {}
// SAFETY: as above; nothing in the table is tied to a thread.
unsafe impl Send for NcclNetV12 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The sizes and offsets measured against NCCL 2.30.7's `net_v12.h` (x86-64).
    #[test]
    fn sizes_match_nccl() {
        assert_eq!(size_of::<NcclNetV12>(), 176);
        assert_eq!(offset_of!(NcclNetV12, set_net_attr), 168);
        assert_eq!(size_of::<NcclNetPropertiesV12>(), 128);
        assert_eq!(align_of::<NcclNetPropertiesV12>(), 8);
        assert_eq!(offset_of!(NcclNetPropertiesV12, v_props), 64);
        assert_eq!(offset_of!(NcclNetPropertiesV12, max_p2p_bytes), 104);
        assert_eq!(offset_of!(NcclNetPropertiesV12, max_coll_bytes), 112);
        assert_eq!(
            offset_of!(NcclNetPropertiesV12, max_multi_request_size),
            120
        );
        assert_eq!(offset_of!(NcclNetPropertiesV12, rail_id), 124);
        assert_eq!(offset_of!(NcclNetPropertiesV12, plane_id), 126);
        assert_eq!(size_of::<NcclNetVDevicePropsV12>(), 36);
        assert_eq!(size_of::<NcclNetAttrV12>(), 44);
        assert_eq!(size_of::<NcclNetCommConfigV12>(), 4);
    }
}
