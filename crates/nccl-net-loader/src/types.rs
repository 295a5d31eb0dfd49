//! The values the loader hands out: communicator contexts, opaque comm / registration /
//! request handles (the plugin's pointers, never dereferenced here) and errors.

use nccl_net_abi::common::{
    NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_REMOTE_ERROR,
    NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NCCL_UNHANDLED_CUDA_ERROR,
};
use nccl_net_abi::v11::NcclNetAttrV11;
use std::fmt;
use std::os::raw::c_void;

/// A communicator's network context: v11's `init` result (NULL before v11) and the traffic
/// class (v10 passes it to `connect`, v11 to `init`; -1 = undefined).
#[derive(Debug)]
pub struct NetCtx {
    pub(crate) ptr: *mut c_void,
    pub(crate) traffic_class: i32,
}

impl NetCtx {
    /// The plugin's context pointer (NULL before v11).
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }
    pub fn traffic_class(&self) -> i32 {
        self.traffic_class
    }
}

// SAFETY: the pointer is an opaque token owned by the plugin, never dereferenced here; NCCL
// uses a context from its init thread and its proxy threads alike.
unsafe impl Send for NetCtx {}
// SAFETY: as above; `&NetCtx` only reads the token.
unsafe impl Sync for NetCtx {}

/// `ncclNetAttr_v11_t` for [`Plugin::set_net_attr`].
pub type NetAttr = NcclNetAttrV11;

/// How many sizes `test` can report through its internal scratch array (NCCL passes an array of
/// `NCCL_PROXY_MAX_SUBS` ints; 64 covers every NCCL version).
pub(crate) const TEST_SIZES_SCRATCH: usize = 64;

/// A non-success `ncclResult_t` returned by the plugin (or synthesised by this wrapper for a
/// NULL table entry, `ncclInternalError`, or mismatched argument slices, `ncclInvalidArgument`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclError(pub i32);

impl NcclError {
    /// The C enumerator name of the code (`ncclSystemError`, ...).
    pub fn name(&self) -> &'static str {
        match self.0 {
            NCCL_SUCCESS => "ncclSuccess",
            NCCL_UNHANDLED_CUDA_ERROR => "ncclUnhandledCudaError",
            NCCL_SYSTEM_ERROR => "ncclSystemError",
            NCCL_INTERNAL_ERROR => "ncclInternalError",
            NCCL_INVALID_ARGUMENT => "ncclInvalidArgument",
            NCCL_INVALID_USAGE => "ncclInvalidUsage",
            NCCL_REMOTE_ERROR => "ncclRemoteError",
            7 => "ncclInProgress",
            _ => "unknown ncclResult_t",
        }
    }
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl std::error::Error for NcclError {}

macro_rules! opaque_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(pub(crate) *mut c_void);

        impl $name {
            /// The plugin's pointer, for raw calls through [`Plugin::table_v8`] etc.
            pub fn as_ptr(&self) -> *mut c_void {
                self.0
            }
        }

        // SAFETY: the pointer is an opaque token owned by the plugin; this type never
        // dereferences it. NCCL itself creates these objects on one thread and uses them on its
        // proxy thread, so v8 plugins must accept calls from any thread.
        unsafe impl Send for $name {}
    };
}

opaque_handle!(
    /// A listen, send or receive communicator.
    Comm
);
opaque_handle!(
    /// A memory registration handle (may be NULL: NCCL's socket plugin never sets one).
    Mr
);
opaque_handle!(
    /// An in-flight request from `isend`, `irecv` or `iflush`.
    Request
);
