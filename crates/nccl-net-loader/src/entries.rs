//! One interface over every version's table. The entries whose C signature is the same in
//! v8 … v12 are copied once, at load, into [`Common`]; what differs between versions goes
//! through one small adapter per version implementing [`Versioned`] (`v8.rs` … `v12.rs`),
//! the way NCCL converts an older table into its newest `ncclNet_t` with shims only for the
//! calls whose signature changed.

use crate::abi::Abi;
use crate::call::{invalid, Call};
use crate::props::Props;
use crate::NetCtx;
use nccl_net_abi::common::{NcclDebugLogger, NcclResult};
use nccl_net_abi::v10::NcclNetV10;
use nccl_net_abi::v11::{NcclNetAttrV11, NcclNetV11};
use nccl_net_abi::v12::NcclNetV12;
use nccl_net_abi::v8::{NcclNetDeviceHandleV8, NcclNetV8};
use nccl_net_abi::v9::NcclNetV9;
use std::os::raw::{c_char, c_int, c_void};

pub(crate) type DevicesFn = unsafe extern "C" fn(*mut c_int) -> NcclResult;
pub(crate) type AcceptFn = unsafe extern "C" fn(
    *mut c_void,
    *mut *mut c_void,
    *mut *mut NcclNetDeviceHandleV8,
) -> NcclResult;
pub(crate) type RegMrFn =
    unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, *mut *mut c_void) -> NcclResult;
pub(crate) type RegMrDmaBufFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    usize,
    c_int,
    u64,
    c_int,
    *mut *mut c_void,
) -> NcclResult;
pub(crate) type DeregMrFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> NcclResult;
pub(crate) type IflushFn = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    *mut *mut c_void,
    *mut c_int,
    *mut *mut c_void,
    *mut *mut c_void,
) -> NcclResult;
pub(crate) type TestFn = unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> NcclResult;
pub(crate) type CloseFn = unsafe extern "C" fn(*mut c_void) -> NcclResult;

/// The entries every version declares with the same C signature, copied out of the table.
#[derive(Clone, Copy)]
pub(crate) struct Common {
    pub devices: Option<DevicesFn>,
    pub accept: Option<AcceptFn>,
    pub reg_mr: Option<RegMrFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub close_send: Option<CloseFn>,
    pub close_recv: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
}

/// `Common` of any version's table (the fields have the same names and types in each).
macro_rules! common_of {
    ($t:expr) => {
        $crate::entries::Common {
            devices: $t.devices,
            accept: $t.accept,
            reg_mr: $t.reg_mr,
            reg_mr_dma_buf: $t.reg_mr_dma_buf,
            dereg_mr: $t.dereg_mr,
            iflush: $t.iflush,
            test: $t.test,
            close_send: $t.close_send,
            close_recv: $t.close_recv,
            close_listen: $t.close_listen,
        }
    };
}
pub(crate) use common_of;

impl Common {
    /// Names of the mandatory shared entries that are NULL.
    pub fn missing(&self) -> Vec<&'static str> {
        [
            ("devices", self.devices.is_none()),
            ("accept", self.accept.is_none()),
            ("regMr", self.reg_mr.is_none()),
            ("regMrDmaBuf", self.reg_mr_dma_buf.is_none()),
            ("deregMr", self.dereg_mr.is_none()),
            ("iflush", self.iflush.is_none()),
            ("test", self.test.is_none()),
            ("closeSend", self.close_send.is_none()),
            ("closeRecv", self.close_recv.is_none()),
            ("closeListen", self.close_listen.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect()
    }
}

/// A message size as the caller has it: v8 takes `int`, v9+ `size_t`; the adapter converts
/// (refusing with `ncclInvalidArgument` what its version cannot express).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Size {
    Int(c_int),
    Sized(usize),
}

impl Size {
    pub fn as_int(self) -> Call<c_int> {
        match self {
            Size::Int(v) => Ok(v),
            Size::Sized(v) => c_int::try_from(v).map_err(|_| invalid()),
        }
    }
    pub fn as_sized(self) -> Call<usize> {
        match self {
            Size::Sized(v) => Ok(v),
            Size::Int(v) => usize::try_from(v).map_err(|_| invalid()),
        }
    }
}

/// The raw table of the loaded version (for misuse tests that call entries directly).
#[derive(Clone, Copy)]
pub enum RawTable {
    V8(&'static NcclNetV8),
    V9(&'static NcclNetV9),
    V10(&'static NcclNetV10),
    V11(&'static NcclNetV11),
    V12(&'static NcclNetV12),
}

/// What differs between versions, behind one interface.
///
/// # Safety (of the `unsafe` methods)
/// The caller passes what NCCL's proxy would: comms and registrations of this plugin that are
/// live; `handle` a writable `NCCL_NET_HANDLE_MAXSIZE`-byte buffer; out-pointers writable for
/// the call; `n`-element arrays that stay valid for the call; buffers that stay valid until
/// the request completes.
pub(crate) trait Versioned: Send + Sync {
    fn abi(&self) -> Abi;
    fn name(&self) -> *const c_char;
    /// The shared entries, copied once at load.
    fn common(&self) -> Common;
    fn raw(&self) -> RawTable;
    /// Mandatory version-specific entries that are NULL.
    fn missing(&self) -> Vec<&'static str>;
    /// `init` for a communicator: the context pointer v11+ returns (NULL before v11).
    fn init(
        &self,
        comm_id: u64,
        traffic_class: c_int,
        logger: NcclDebugLogger,
    ) -> Call<*mut c_void>;
    /// `finalize(ctx)` (v11+); nothing before.
    fn finalize(&self, _ctx: *mut c_void) -> Call<()> {
        Ok(())
    }
    /// `setNetAttr(ctx, attr)`: `Ok(false)` when the version or the plugin has none.
    fn set_net_attr(&self, _ctx: *mut c_void, _attr: &NcclNetAttrV11) -> Call<bool> {
        Ok(false)
    }
    fn properties(&self, dev: c_int) -> Call<Props>;
    unsafe fn listen(
        &self,
        ctx: &NetCtx,
        dev: c_int,
        handle: *mut c_void,
        comm: *mut *mut c_void,
    ) -> Call<()>;
    unsafe fn connect(
        &self,
        ctx: &NetCtx,
        dev: c_int,
        handle: *mut c_void,
        comm: *mut *mut c_void,
        dev_comm: *mut *mut NcclNetDeviceHandleV8,
    ) -> Call<()>;
    #[allow(clippy::too_many_arguments)]
    unsafe fn isend(
        &self,
        comm: *mut c_void,
        data: *mut c_void,
        size: Size,
        tag: c_int,
        mr: *mut c_void,
        req: *mut *mut c_void,
    ) -> Call<()>;
    /// `sizes` holds `n` sizes; `req` may be preset (v9+: the optional-completion hint; the
    /// v8 adapter clears it, as NCCL's does).
    #[allow(clippy::too_many_arguments)]
    unsafe fn irecv(
        &self,
        comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: &[Size],
        tags: *mut c_int,
        mrs: *mut *mut c_void,
        req: *mut *mut c_void,
    ) -> Call<()>;
}
