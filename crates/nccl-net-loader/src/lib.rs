//! Loader for any ext-net library exporting v8, v9, v10, v11 or v12: `dlopen`s it, looks up
//! the newest `ncclNetPlugin_vN` it exports (as NCCL 2.30 does) or the version asked for, and
//! wraps the table in methods that marshal arguments the way NCCL's proxy does, whatever the
//! version. Used by `ha-harness` (to compare plugins) and by the C-ABI tests (misuse tests
//! reach the raw tables through [`Plugin::table_v8`] etc.).
//!
//! v11/v12 contexts: [`Plugin::init`] makes one default context (communicator id 0) that
//! `listen`/`connect` use; [`Plugin::init_context`] makes more (one per NCCL communicator),
//! used through [`Plugin::listen_in`] / [`Plugin::connect_in`] and ended by
//! [`Plugin::finalize`]. For v8–v10 a context is only the traffic class `connect` passes (v10).
//!
//! The library is never `dlclose`d by the loader: plugins may run background threads. A
//! caller that manages the library itself (as NCCL does, closing it after the last
//! communicator) wraps its own handle with [`Plugin::from_handle`].
//!
//! `init` passes NULL as NCCL's logger unless [`Plugin::set_logger`] gave one
//! ([`stderr_logger`] prints to stderr, for tools).
//!
//! Buffers are passed as raw pointers: the caller keeps them alive and untouched while a
//! request that uses them is in flight, exactly as NCCL does.

//!
//! One interface whatever the version: the entries whose C signature never changed are
//! copied once at load (`entries::Common`), the rest go through one small adapter per
//! version (`v8.rs` … `v12.rs`, behind the `Versioned` trait). The version is matched once,
//! when the library is opened ([`Plugin::open_abi`]).

mod abi;
mod call;
mod data;
mod entries;
mod logger;
mod props;
mod types;
mod v10;
mod v11;
mod v12;
mod v8;
mod v9;

pub use abi::{Abi, SYMBOL_V8};
pub use entries::RawTable;
pub use logger::{logger_for, stderr_logger};
pub use props::Props;
pub use types::{Comm, Mr, NcclError, NetAttr, NetCtx, Request};

use call::{rc, Call, CallError};
use entries::{Common, Versioned};
use nccl_net_abi::common::{
    NcclDebugLogger, NCCL_INTERNAL_ERROR, NCCL_INVALID_USAGE, NCCL_NET_HANDLE_MAXSIZE,
    NCCL_NET_TRAFFIC_CLASS_UNDEF,
};
use nccl_net_abi::v10::NcclNetV10;
use nccl_net_abi::v11::NcclNetV11;
use nccl_net_abi::v12::NcclNetV12;
use nccl_net_abi::v8::{NcclNetDeviceHandleV8, NcclNetV8};
use nccl_net_abi::v9::NcclNetV9;
use props::c_string;
use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::OnceLock;

/// Returns the message of the last `dlerror`, or `fallback` if there is none.
fn dl_error(fallback: &str) -> String {
    // SAFETY: dlerror takes no arguments and returns NULL or a NUL-terminated string owned by
    // libc, valid until the next dl* call on this thread; it is copied before returning.
    unsafe {
        let msg = libc::dlerror();
        if msg.is_null() {
            fallback.to_string()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

/// `dlsym(handle, name)`, NULL when absent.
fn lookup(handle: *mut c_void, name: &str) -> *mut c_void {
    let sym = CString::new(name).expect("symbol name has no NUL");
    // SAFETY: clearing any stale error first, then looking up a symbol in a handle returned by
    // dlopen; both strings are valid for the calls.
    unsafe {
        libc::dlerror();
        libc::dlsym(handle, sym.as_ptr())
    }
}

/// The adapter for version `abi`'s table at `addr`: the one place the version is matched.
///
/// # Safety
/// `addr` must be the address of the `ncclNetPlugin_v<abi>` data symbol of a library that is
/// never unloaded, and that symbol must have the layout of the version's table.
unsafe fn adapter(abi: Abi, addr: *mut c_void) -> Box<dyn Versioned> {
    // SAFETY (each arm): per the function's contract the object at `addr` is that version's
    // table (layouts mirrored in `nccl_net_abi`, checked against the C header by tests); it
    // lives for 'static and is only read.
    unsafe {
        match abi {
            Abi::V8 => Box::new(v8::V8(&*(addr as *const NcclNetV8))),
            Abi::V9 => Box::new(v9::V9(&*(addr as *const NcclNetV9))),
            Abi::V10 => Box::new(v10::V10(&*(addr as *const NcclNetV10))),
            Abi::V11 => Box::new(v11::V11(&*(addr as *const NcclNetV11))),
            Abi::V12 => Box::new(v12::V12(&*(addr as *const NcclNetV12))),
        }
    }
}

/// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`.
fn dlopen(path: &Path) -> Result<*mut c_void, String> {
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains a NUL byte", path.display()))?;
    // SAFETY: `cpath` is a valid NUL-terminated string for the duration of the call. Loading
    // runs the library's constructors: that is inherent to loading a plugin, as NCCL does.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!(
            "dlopen {}: {}",
            path.display(),
            dl_error("unknown error")
        ));
    }
    Ok(handle)
}

/// A loaded plugin of any supported version. Shareable between threads (NCCL drives one
/// plugin from several).
pub struct Plugin {
    path: PathBuf,
    /// The `dlopen` handle, kept for its lifetime meaning only: never closed.
    _handle: *mut c_void,
    /// The version's adapter (init, properties, listen, connect, isend, irecv, ...).
    ver: Box<dyn Versioned>,
    /// The entries every version shares, copied out of the table at load and again after the
    /// first `init` (a plugin may fill its table in `init`: nccl-rdma-sharp-plugins exports a
    /// table holding only `name` and `init` until then, as NCCL reads it after `init`).
    common: std::sync::RwLock<Common>,
    /// The context `listen`/`connect` use: made by `init`.
    default_ctx: OnceLock<NetCtx>,
    /// The logger `init` passes (NCCL's `ncclDebugLogger_t`; `None`: NULL).
    logger: NcclDebugLogger,
}

/// The historical name: the loader only drove v8 plugins once.
pub type PluginV8 = Plugin;

// SAFETY: the handle is never used after `open`, and the table is immutable static data of the
// library (which is never unloaded). Ext-net plugins are called concurrently from several NCCL
// threads (one proxy thread per device/communicator), so their entry points are thread-safe;
// the default context is an opaque token (see `NetCtx`).
unsafe impl Send for Plugin {}
// SAFETY: as above; `&Plugin` only gives access to the immutable table and the context token.
unsafe impl Sync for Plugin {}

impl Plugin {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)` and use the newest table it exports (v12, v11,
    /// v10, v9, then v8), as NCCL 2.30 does.
    pub fn open(path: &Path) -> Result<Self, String> {
        Self::open_abi(path, None)
    }

    /// As [`Plugin::open`], but with `Some(abi)` that version's table (an error if the library
    /// does not export it).
    pub fn open_abi(path: &Path, abi: Option<Abi>) -> Result<Self, String> {
        let handle = dlopen(path)?;
        // SAFETY: a handle this loader just opened and never closes.
        unsafe { Self::from_handle(handle, path, abi) }
    }

    /// Wrap a library the caller opened (and may close, as NCCL does after the last
    /// communicator): its newest table, or `Some(abi)`'s. `path` names it in messages.
    ///
    /// # Safety
    /// `handle` is a live `dlopen` handle of an ext-net plugin, and the library stays loaded
    /// for as long as the returned value (or anything obtained through it) is used.
    pub unsafe fn from_handle(
        handle: *mut c_void,
        path: &Path,
        abi: Option<Abi>,
    ) -> Result<Self, String> {
        let candidates: Vec<Abi> = match abi {
            Some(a) => vec![a],
            None => Abi::NEWEST_FIRST.to_vec(),
        };
        for a in &candidates {
            let addr = lookup(handle, a.symbol());
            if !addr.is_null() {
                // SAFETY: `addr` is the library's `ncclNetPlugin_v<a>` symbol, which by the
                // ext-net ABI is that version's table; the caller keeps the library loaded.
                let ver = unsafe { adapter(*a, addr) };
                return Ok(Plugin {
                    path: path.to_path_buf(),
                    _handle: handle,
                    common: std::sync::RwLock::new(ver.common()),
                    ver,
                    default_ctx: OnceLock::new(),
                    logger: None,
                });
            }
        }
        let names: Vec<&str> = candidates.iter().map(|a| a.symbol()).collect();
        Err(match abi {
            Some(Abi::V8) => format!(
                "{}: no symbol {SYMBOL_V8} (not an ext-net v8 plugin?): {}",
                path.display(),
                dl_error("symbol is NULL")
            ),
            Some(a) => format!(
                "{}: no symbol {} (the library does not export ext-net {a})",
                path.display(),
                a.symbol()
            ),
            None => format!(
                "{}: none of {} (not an ext-net plugin of v8..v12?)",
                path.display(),
                names.join(", ")
            ),
        })
    }

    /// The shared entries as the table holds them now.
    fn common(&self) -> Common {
        *self.common.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The logger every later `init` passes (as NCCL passes its `ncclDebugLog`).
    pub fn set_logger(&mut self, logger: NcclDebugLogger) {
        self.logger = logger;
    }

    /// The address of the table this wrapper drives (to tell whether a reloaded library is
    /// the same image).
    pub fn table_addr(&self) -> usize {
        match self.raw_table() {
            RawTable::V8(t) => t as *const _ as usize,
            RawTable::V9(t) => t as *const _ as usize,
            RawTable::V10(t) => t as *const _ as usize,
            RawTable::V11(t) => t as *const _ as usize,
            RawTable::V12(t) => t as *const _ as usize,
        }
    }

    /// The versions `path` exports, newest first (without initialising anything).
    pub fn exported_abis(path: &Path) -> Result<Vec<Abi>, String> {
        let handle = dlopen(path)?;
        Ok(Abi::NEWEST_FIRST
            .into_iter()
            .filter(|a| !lookup(handle, a.symbol()).is_null())
            .collect())
    }

    /// The version this wrapper drives.
    pub fn abi(&self) -> Abi {
        self.ver.abi()
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table's `name` (empty if NULL).
    pub fn name(&self) -> String {
        c_string(self.ver.name()).unwrap_or_default()
    }

    /// The raw table of the loaded version, for misuse tests that call entries directly.
    pub fn raw_table(&self) -> RawTable {
        self.ver.raw()
    }

    /// The raw v8 table (when this wrapper drives v8).
    pub fn table_v8(&self) -> Option<&NcclNetV8> {
        match self.raw_table() {
            RawTable::V8(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v9 table (when this wrapper drives v9).
    pub fn table_v9(&self) -> Option<&NcclNetV9> {
        match self.raw_table() {
            RawTable::V9(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v10 table (when this wrapper drives v10).
    pub fn table_v10(&self) -> Option<&NcclNetV10> {
        match self.raw_table() {
            RawTable::V10(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v11 table (when this wrapper drives v11).
    pub fn table_v11(&self) -> Option<&NcclNetV11> {
        match self.raw_table() {
            RawTable::V11(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v12 table (when this wrapper drives v12).
    pub fn table_v12(&self) -> Option<&NcclNetV12> {
        match self.raw_table() {
            RawTable::V12(t) => Some(t),
            _ => None,
        }
    }

    /// Names of the mandatory entries that are NULL in the table (all except `getDeviceMr`,
    /// `irecvConsumed`, `makeVDevice` and `setNetAttr`, which NCCL allows to be NULL).
    pub fn missing_entries(&self) -> Vec<&'static str> {
        let mut v = self.ver.missing();
        v.extend(self.common().missing());
        v
    }

    /// The result of an adapter call: a NULL entry is logged and reported as
    /// `ncclInternalError`.
    fn done<T>(&self, r: Call<T>) -> Result<T, NcclError> {
        r.map_err(|e| match e {
            CallError::Failed(code) => NcclError(code),
            CallError::Missing(what) => self.missing(what),
        })
    }

    fn missing(&self, what: &'static str) -> NcclError {
        tracing::error!(
            "plugin {} ({}): table entry {what} is NULL",
            self.name(),
            self.path.display()
        );
        NcclError(NCCL_INTERNAL_ERROR)
    }

    fn entry<F>(&self, f: Option<F>, what: &'static str) -> Result<F, NcclError> {
        f.ok_or_else(|| self.missing(what))
    }

    /// `init` with the logger of [`Plugin::set_logger`] (default NULL) and, v10+, a NULL
    /// profiler callback. For v11/v12 this makes
    /// the default context (communicator id 0, traffic class undefined) that
    /// [`Plugin::listen`] and [`Plugin::connect`] use; calling it again is harmless.
    pub fn init(&self) -> Result<(), NcclError> {
        if self.default_ctx.get().is_some() {
            return Ok(());
        }
        let ctx = self.init_context(0, NCCL_NET_TRAFFIC_CLASS_UNDEF)?;
        if let Err(extra) = self.default_ctx.set(ctx) {
            // Another thread made the default context first.
            self.finalize(extra)?;
        }
        Ok(())
    }

    /// A communicator's context: v11/v12 call `init(&ctx, comm_id, {traffic_class}, logger,
    /// NULL)` (one per communicator, as NCCL 2.28+ does); older versions call their `init` (plugins
    /// keep it idempotent; NCCL's adapters call it once) and remember the traffic class for
    /// v10's `connect`.
    pub fn init_context(&self, comm_id: u64, traffic_class: i32) -> Result<NetCtx, NcclError> {
        let ptr = self.done(self.ver.init(comm_id, traffic_class, self.logger))?;
        *self.common.write().unwrap_or_else(|p| p.into_inner()) = self.ver.common();
        if self.abi() >= Abi::V11 && ptr.is_null() {
            tracing::error!("plugin {}: init succeeded with a NULL context", self.name());
            return Err(NcclError(NCCL_INTERNAL_ERROR));
        }
        Ok(NetCtx { ptr, traffic_class })
    }

    /// `finalize(ctx)` (v11+); a no-op before v11.
    pub fn finalize(&self, ctx: NetCtx) -> Result<(), NcclError> {
        self.done(self.ver.finalize(ctx.ptr))
    }

    /// `setNetAttr(ctx, attr)` (v11+; `Ok(false)` when the version or the plugin has none).
    pub fn set_net_attr(&self, ctx: &NetCtx, attr: &NetAttr) -> Result<bool, NcclError> {
        self.done(self.ver.set_net_attr(ctx.ptr, attr))
    }

    fn default_ctx(&self) -> Result<&NetCtx, NcclError> {
        self.default_ctx.get().ok_or_else(|| {
            tracing::error!("plugin {}: used before init()", self.name());
            NcclError(NCCL_INVALID_USAGE)
        })
    }

    /// `devices`: the number of devices.
    pub fn devices(&self) -> Result<i32, NcclError> {
        let f = self.entry(self.common().devices, "devices")?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable int for the duration of the call.
        self.done(rc(unsafe { f(&mut n) }))?;
        Ok(n)
    }

    /// `getProperties(dev)`, strings copied.
    pub fn properties(&self, dev: i32) -> Result<Props, NcclError> {
        self.done(self.ver.properties(dev))
    }

    /// `listen(dev)` in the default context: the 128-byte handle to give the peer, and the
    /// listen comm.
    pub fn listen(&self, dev: i32) -> Result<([u8; NCCL_NET_HANDLE_MAXSIZE], Comm), NcclError> {
        self.listen_in(self.default_ctx()?, dev)
    }

    /// `listen(dev)` in context `ctx` (the context matters from v11 on).
    pub fn listen_in(
        &self,
        ctx: &NetCtx,
        dev: i32,
    ) -> Result<([u8; NCCL_NET_HANDLE_MAXSIZE], Comm), NcclError> {
        let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let mut comm: *mut c_void = ptr::null_mut();
        // SAFETY: `handle` is a writable buffer of NCCL_NET_HANDLE_MAXSIZE bytes and `comm` a
        // writable pointer, both valid for the call; `ctx` is a live context.
        let r = unsafe {
            self.ver
                .listen(ctx, dev, handle.as_mut_ptr().cast(), &mut comm)
        };
        self.done(r)?;
        if comm.is_null() {
            tracing::error!("plugin {}: listen succeeded with a NULL comm", self.name());
            return Err(NcclError(NCCL_INTERNAL_ERROR));
        }
        Ok((handle, Comm(comm)))
    }

    /// One `connect` step in the default context: `Ok(None)` means "not yet, call again with
    /// the same handle".
    pub fn connect(
        &self,
        dev: i32,
        handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
    ) -> Result<Option<Comm>, NcclError> {
        self.connect_in(self.default_ctx()?, dev, handle)
    }

    /// One `connect` step in context `ctx` (v10: its traffic class goes in the config; v11:
    /// the context itself).
    pub fn connect_in(
        &self,
        ctx: &NetCtx,
        dev: i32,
        handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
    ) -> Result<Option<Comm>, NcclError> {
        let mut comm: *mut c_void = ptr::null_mut();
        let mut dev_comm: *mut NcclNetDeviceHandleV8 = ptr::null_mut();
        // SAFETY: `handle` is a writable 128-byte buffer (plugins keep connect state in it);
        // `comm` and `dev_comm` are live locals; `ctx` is live.
        let r = unsafe {
            self.ver.connect(
                ctx,
                dev,
                handle.as_mut_ptr().cast(),
                &mut comm,
                &mut dev_comm,
            )
        };
        self.done(r)?;
        Ok((!comm.is_null()).then_some(Comm(comm)))
    }

    /// One `accept` step: `Ok(None)` means "not yet".
    pub fn accept(&self, listen: &Comm) -> Result<Option<Comm>, NcclError> {
        let f = self.entry(self.common().accept, "accept")?;
        let mut comm: *mut c_void = ptr::null_mut();
        let mut dev_comm: *mut NcclNetDeviceHandleV8 = ptr::null_mut();
        // SAFETY: `listen` came from this plugin's `listen` and is not closed (closing
        // consumes it); the out pointers are writable for the call.
        self.done(rc(unsafe { f(listen.0, &mut comm, &mut dev_comm) }))?;
        Ok((!comm.is_null()).then_some(Comm(comm)))
    }

    /// `regMr(comm, buf, len, ptr_type)`.
    pub fn reg_mr(
        &self,
        comm: &Comm,
        buf: *mut u8,
        len: usize,
        ptr_type: i32,
    ) -> Result<Mr, NcclError> {
        let f = self.entry(self.common().reg_mr, "regMr")?;
        let mut mr: *mut c_void = ptr::null_mut();
        // SAFETY: `comm` is a live comm of this plugin; `mr` is writable. The buffer is only
        // recorded by the plugin; the caller keeps it valid while it is registered.
        self.done(rc(unsafe { f(comm.0, buf.cast(), len, ptr_type, &mut mr) }))?;
        Ok(Mr(mr))
    }

    /// `regMrDmaBuf(comm, buf, len, ptr_type, offset, fd)`.
    pub fn reg_mr_dma_buf(
        &self,
        comm: &Comm,
        buf: *mut u8,
        len: usize,
        ptr_type: i32,
        offset: u64,
        fd: i32,
    ) -> Result<Mr, NcclError> {
        let f = self.entry(self.common().reg_mr_dma_buf, "regMrDmaBuf")?;
        let mut mr: *mut c_void = ptr::null_mut();
        // SAFETY: as in `reg_mr`; `fd` is the caller's (the plugin must not keep it open
        // beyond the call: NCCL closes it once the call returns).
        self.done(rc(unsafe {
            f(comm.0, buf.cast(), len, ptr_type, offset, fd, &mut mr)
        }))?;
        Ok(Mr(mr))
    }

    /// `deregMr(comm, mr)`.
    pub fn dereg_mr(&self, comm: &Comm, mr: Mr) -> Result<(), NcclError> {
        let f = self.entry(self.common().dereg_mr, "deregMr")?;
        // SAFETY: `comm` is live and `mr` was returned by `reg_mr` (consumed here, so it cannot
        // be deregistered twice through this API).
        self.done(rc(unsafe { f(comm.0, mr.0) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_net_abi::common::{NCCL_REMOTE_ERROR, NCCL_SYSTEM_ERROR};

    #[test]
    fn error_names() {
        assert_eq!(NcclError(NCCL_SYSTEM_ERROR).name(), "ncclSystemError");
        assert_eq!(NcclError(NCCL_INTERNAL_ERROR).name(), "ncclInternalError");
        assert_eq!(NcclError(NCCL_REMOTE_ERROR).name(), "ncclRemoteError");
        assert_eq!(NcclError(99).name(), "unknown ncclResult_t");
        assert_eq!(
            NcclError(NCCL_INVALID_USAGE).to_string(),
            "ncclInvalidUsage (5)"
        );
    }

    #[test]
    fn open_reports_missing_file() {
        let err = match Plugin::open(Path::new("/nonexistent/libnothing.so")) {
            Ok(_) => panic!("opened a missing file"),
            Err(e) => e,
        };
        assert!(
            err.starts_with("dlopen /nonexistent/libnothing.so:"),
            "{err}"
        );
    }

    #[test]
    fn open_rejects_library_without_symbol() {
        // libc is always present and loadable, and certainly not an NCCL plugin.
        let err = match Plugin::open_abi(Path::new("libc.so.6"), Some(Abi::V8)) {
            Ok(_) => panic!("libc accepted as a plugin"),
            Err(e) => e,
        };
        assert!(err.contains("no symbol ncclNetPlugin_v8"), "{err}");
        let err = match Plugin::open(Path::new("libc.so.6")) {
            Ok(_) => panic!("libc accepted as a plugin"),
            Err(e) => e,
        };
        assert!(
            err.contains("ncclNetPlugin_v12, ncclNetPlugin_v11, ncclNetPlugin_v10"),
            "{err}"
        );
        assert_eq!(Plugin::exported_abis(Path::new("libc.so.6")), Ok(vec![]));
    }
}
