//! `#[repr(C)]` mirrors of NCCL's ext-net v8 structures (layouts checked against
//! include/nccl_net_ha.h by tests/c_layout.rs).

use super::common::{NcclDebugLogger, NcclResult};
use std::os::raw::{c_char, c_int, c_void};

/// `ncclNetProperties_v8_t` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetPropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetDeviceHandle_v8_t` (32 bytes); host-only plugins never fill one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclNetDeviceHandleV8 {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

/// `ncclNet_v8_t` (152 bytes): a name and 18 entry points.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclNetV8 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(NcclDebugLogger) -> NcclResult>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut NcclNetPropertiesV8) -> NcclResult>,
    pub listen: Option<unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> NcclResult>,
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV8,
        ) -> NcclResult,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut *mut c_void,
            *mut *mut NcclNetDeviceHandleV8,
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
            c_int,
            c_int,
            *mut c_void,
            *mut *mut c_void,
        ) -> NcclResult,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut *mut c_void,
            *mut c_int,
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
}

// SAFETY: the table is immutable after construction; its only pointer (`name`) points to a
// 'static NUL-terminated string, and function pointers are thread-safe to share.
unsafe impl Sync for NcclNetV8 {}
// SAFETY: as above; nothing in the table is tied to a thread.
unsafe impl Send for NcclNetV8 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    #[test]
    fn sizes_match_nccl() {
        assert_eq!(size_of::<NcclNetV8>(), 152);
        assert_eq!(size_of::<NcclNetPropertiesV8>(), 64);
        assert_eq!(align_of::<NcclNetPropertiesV8>(), 8);
        assert_eq!(size_of::<NcclNetDeviceHandleV8>(), 32);
    }
}
