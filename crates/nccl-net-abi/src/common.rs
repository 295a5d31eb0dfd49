//! C types shared by every ext-net ABI version: result codes, the logger, constants.
//! Values from NCCL's `ext-net/example/nccl/{err,common,net}.h` (see include/nccl_net_ha.h).

use std::os::raw::{c_char, c_int, c_ulong};

/// `ncclResult_t` (a C enum: 4 bytes).
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;

/// `ncclDebugLogLevel`.
pub const NCCL_LOG_NONE: c_int = 0;
pub const NCCL_LOG_VERSION: c_int = 1;
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_ABORT: c_int = 4;
pub const NCCL_LOG_TRACE: c_int = 5;

/// `ncclDebugLogSubSys` bits used here.
pub const NCCL_INIT: c_ulong = 1;
pub const NCCL_NET: c_ulong = 16;

/// `ncclDebugLogger_t`: `void (*)(level, flags, file, line, fmt, ...)`.
pub type NcclDebugLogger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t` (v10+ `init`):
/// `ncclResult_t (*)(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData)`.
pub type NcclProfilerCallback = Option<
    unsafe extern "C" fn(
        e_handle: *mut *mut std::os::raw::c_void,
        kind: c_int,
        p_handle: *mut std::os::raw::c_void,
        plugin_id: i64,
        ext_data: *mut std::os::raw::c_void,
    ) -> NcclResult,
>;

pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// Physical devices one virtual device may fuse (`ncclNetVDeviceProps_v9..v11_t`).
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;
/// `ncclNetCommConfig_v10/v11_t::trafficClass` when the application set none.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// An unset field of `ncclNetAttr_v11_t`.
pub const NCCL_NET_ATTR_UNDEF: c_int = -1;
pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_PTR_DMABUF: c_int = 0x4;
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;

/// `ncclNetDeviceType`.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
