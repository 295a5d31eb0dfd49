//! Loader for any ext-net v8 library: `dlopen`s it, looks up `ncclNetPlugin_v8` and wraps the
//! table in methods that marshal arguments the way NCCL's proxy does. Used by `ha-harness`
//! (to compare plugins) and by misuse tests (through [`PluginV8::table`]).
//!
//! The library is never `dlclose`d: plugins may run background threads.
//!
//! Buffers are passed as raw pointers: the caller keeps them alive and untouched while a
//! request that uses them is in flight, exactly as NCCL does.

use super::common::{
    NcclResult, NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE,
    NCCL_NET_HANDLE_MAXSIZE, NCCL_REMOTE_ERROR, NCCL_SUCCESS, NCCL_SYSTEM_ERROR,
    NCCL_UNHANDLED_CUDA_ERROR,
};
use super::v8_types::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use std::ffi::{CStr, CString};
use std::fmt;
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;

/// Name of the data symbol a v8 plugin exports.
pub const SYMBOL_V8: &str = "ncclNetPlugin_v8";

/// How many sizes `test` can report through its internal scratch array (NCCL passes an array of
/// `NCCL_PROXY_MAX_SUBS` ints; 64 covers every NCCL version).
const TEST_SIZES_SCRATCH: usize = 64;

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

fn check(rc: NcclResult) -> Result<(), NcclError> {
    if rc == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(NcclError(rc))
    }
}

/// `ncclNetProperties_v8_t`, with the strings copied out.
#[derive(Debug, Clone, PartialEq)]
pub struct Props {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub ptr_support: i32,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub reg_is_global: i32,
}

macro_rules! opaque_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(*mut c_void);

        impl $name {
            /// The plugin's pointer, for raw calls through [`PluginV8::table`].
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

/// Argument array for `irecv`/`iflush`: on the stack for the usual n <= 8.
enum ArgArray<T: Copy> {
    Inline([T; 8]),
    Heap(Vec<T>),
}

impl<T: Copy> ArgArray<T> {
    fn new(fill: T, items: impl ExactSizeIterator<Item = T>) -> Self {
        if items.len() <= 8 {
            let mut a = [fill; 8];
            for (slot, v) in a.iter_mut().zip(items) {
                *slot = v;
            }
            ArgArray::Inline(a)
        } else {
            ArgArray::Heap(items.collect())
        }
    }

    fn as_mut_ptr(&mut self) -> *mut T {
        match self {
            ArgArray::Inline(a) => a.as_mut_ptr(),
            ArgArray::Heap(v) => v.as_mut_ptr(),
        }
    }
}

/// A loaded v8 plugin. Shareable between threads (NCCL drives one plugin from several).
pub struct PluginV8 {
    path: PathBuf,
    /// The `dlopen` handle, kept for its lifetime meaning only: never closed.
    _handle: *mut c_void,
    table: &'static NcclNetV8,
}

// SAFETY: the handle is never used after `open`, and the table is immutable static data of the
// library (which is never unloaded). Ext-net plugins are called concurrently from several NCCL
// threads (one proxy thread per device/communicator), so their entry points are thread-safe.
unsafe impl Send for PluginV8 {}
// SAFETY: as above; `&PluginV8` only gives access to the immutable table.
unsafe impl Sync for PluginV8 {}

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

/// Copies a plugin-owned C string (NULL gives `None`).
fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-NULL strings handed out by a plugin (table name, property strings) are
    // NUL-terminated and live at least as long as the plugin is loaded; copied immediately.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl PluginV8 {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)` and look up `ncclNetPlugin_v8`.
    pub fn open(path: &Path) -> Result<Self, String> {
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
        let sym = CString::new(SYMBOL_V8).expect("symbol name has no NUL");
        // SAFETY: clearing any stale error first, then looking up a symbol in a handle that was
        // just returned by dlopen; both strings are valid for the calls.
        let addr = unsafe {
            libc::dlerror();
            libc::dlsym(handle, sym.as_ptr())
        };
        if addr.is_null() {
            return Err(format!(
                "{}: no symbol {SYMBOL_V8} (not an ext-net v8 plugin?): {}",
                path.display(),
                dl_error("symbol is NULL")
            ));
        }
        // SAFETY: by the ext-net ABI `ncclNetPlugin_v8` is a data object of type
        // `ncclNet_v8_t`, whose layout `NcclNetV8` mirrors (checked by tests). The library is
        // never dlclosed, so the reference is valid for 'static; it is only read.
        let table: &'static NcclNetV8 = unsafe { &*(addr as *const NcclNetV8) };
        Ok(PluginV8 {
            path: path.to_path_buf(),
            _handle: handle,
            table,
        })
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table's `name` (empty if NULL).
    pub fn name(&self) -> String {
        c_string(self.table.name).unwrap_or_default()
    }

    /// The raw table, for tests that call entry points with deliberately bad arguments.
    pub fn table(&self) -> &NcclNetV8 {
        self.table
    }

    /// Names of the mandatory entries that are NULL in the table (all except `getDeviceMr` and
    /// `irecvConsumed`, which NCCL allows to be NULL).
    pub fn missing_entries(&self) -> Vec<&'static str> {
        let t = self.table;
        [
            ("init", t.init.is_none()),
            ("devices", t.devices.is_none()),
            ("getProperties", t.get_properties.is_none()),
            ("listen", t.listen.is_none()),
            ("connect", t.connect.is_none()),
            ("accept", t.accept.is_none()),
            ("regMr", t.reg_mr.is_none()),
            ("regMrDmaBuf", t.reg_mr_dma_buf.is_none()),
            ("deregMr", t.dereg_mr.is_none()),
            ("isend", t.isend.is_none()),
            ("irecv", t.irecv.is_none()),
            ("iflush", t.iflush.is_none()),
            ("test", t.test.is_none()),
            ("closeSend", t.close_send.is_none()),
            ("closeRecv", t.close_recv.is_none()),
            ("closeListen", t.close_listen.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect()
    }

    fn entry<F>(&self, f: Option<F>, what: &'static str) -> Result<F, NcclError> {
        f.ok_or_else(|| {
            tracing::error!(
                "plugin {} ({}): table entry {what} is NULL",
                self.name(),
                self.path.display()
            );
            NcclError(NCCL_INTERNAL_ERROR)
        })
    }

    /// `init` with a NULL logger.
    pub fn init(&self) -> Result<(), NcclError> {
        let f = self.entry(self.table.init, "init")?;
        // SAFETY: `init` takes a nullable logger; NULL is passed.
        check(unsafe { f(None) })
    }

    /// `devices`: the number of devices.
    pub fn devices(&self) -> Result<i32, NcclError> {
        let f = self.entry(self.table.devices, "devices")?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable int for the duration of the call.
        check(unsafe { f(&mut n) })?;
        Ok(n)
    }

    /// `getProperties(dev)`, strings copied.
    pub fn properties(&self, dev: i32) -> Result<Props, NcclError> {
        let f = self.entry(self.table.get_properties, "getProperties")?;
        let mut raw = MaybeUninit::<NcclNetPropertiesV8>::zeroed();
        // SAFETY: `raw` is a writable, properly aligned props struct for the call; all-zero is a
        // valid value of it (NULL pointers, zero numbers), so reading it afterwards is defined
        // even if the plugin leaves fields unset.
        let raw = unsafe {
            check(f(dev, raw.as_mut_ptr()))?;
            raw.assume_init()
        };
        Ok(Props {
            name: c_string(raw.name).unwrap_or_default(),
            pci_path: c_string(raw.pci_path),
            guid: raw.guid,
            ptr_support: raw.ptr_support,
            speed: raw.speed,
            port: raw.port,
            latency: raw.latency,
            max_comms: raw.max_comms,
            max_recvs: raw.max_recvs,
            reg_is_global: raw.reg_is_global,
        })
    }

    /// `listen(dev)`: the 128-byte handle to give the peer, and the listen comm.
    pub fn listen(&self, dev: i32) -> Result<([u8; NCCL_NET_HANDLE_MAXSIZE], Comm), NcclError> {
        let f = self.entry(self.table.listen, "listen")?;
        let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        let mut comm: *mut c_void = ptr::null_mut();
        // SAFETY: `handle` is a writable buffer of NCCL_NET_HANDLE_MAXSIZE bytes and `comm` a
        // writable pointer, both valid for the call.
        check(unsafe { f(dev, handle.as_mut_ptr().cast(), &mut comm) })?;
        if comm.is_null() {
            tracing::error!("plugin {}: listen succeeded with a NULL comm", self.name());
            return Err(NcclError(NCCL_INTERNAL_ERROR));
        }
        Ok((handle, Comm(comm)))
    }

    /// One `connect` step: `Ok(None)` means "not yet, call again with the same handle".
    pub fn connect(
        &self,
        dev: i32,
        handle: &mut [u8; NCCL_NET_HANDLE_MAXSIZE],
    ) -> Result<Option<Comm>, NcclError> {
        let f = self.entry(self.table.connect, "connect")?;
        let mut comm: *mut c_void = ptr::null_mut();
        let mut dev_comm: *mut NcclNetDeviceHandleV8 = ptr::null_mut();
        // SAFETY: `handle` is a writable 128-byte buffer (plugins keep connect state in it);
        // `comm` and `dev_comm` are writable pointers; all valid for the call.
        check(unsafe { f(dev, handle.as_mut_ptr().cast(), &mut comm, &mut dev_comm) })?;
        Ok((!comm.is_null()).then_some(Comm(comm)))
    }

    /// One `accept` step: `Ok(None)` means "not yet".
    pub fn accept(&self, listen: &Comm) -> Result<Option<Comm>, NcclError> {
        let f = self.entry(self.table.accept, "accept")?;
        let mut comm: *mut c_void = ptr::null_mut();
        let mut dev_comm: *mut NcclNetDeviceHandleV8 = ptr::null_mut();
        // SAFETY: `listen` came from this plugin's `listen` and is not closed (closing consumes
        // it); the out pointers are writable for the call.
        check(unsafe { f(listen.0, &mut comm, &mut dev_comm) })?;
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
        let f = self.entry(self.table.reg_mr, "regMr")?;
        let mut mr: *mut c_void = ptr::null_mut();
        // SAFETY: `comm` is a live comm of this plugin; `mr` is writable. The buffer is only
        // recorded by the plugin; the caller keeps it valid while it is registered.
        check(unsafe { f(comm.0, buf.cast(), len, ptr_type, &mut mr) })?;
        Ok(Mr(mr))
    }

    /// `deregMr(comm, mr)`.
    pub fn dereg_mr(&self, comm: &Comm, mr: Mr) -> Result<(), NcclError> {
        let f = self.entry(self.table.dereg_mr, "deregMr")?;
        // SAFETY: `comm` is live and `mr` was returned by `reg_mr` (consumed here, so it cannot
        // be deregistered twice through this API).
        check(unsafe { f(comm.0, mr.0) })
    }

    /// `isend`: `Ok(None)` means "try later" (a NULL request).
    pub fn isend(
        &self,
        comm: &Comm,
        buf: *mut u8,
        size: i32,
        tag: i32,
        mr: &Mr,
    ) -> Result<Option<Request>, NcclError> {
        let f = self.entry(self.table.isend, "isend")?;
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: `comm` is a live send comm, `mr` a live registration, `req` writable. The
        // plugin reads `size` bytes at `buf` until the request completes; the caller keeps that
        // memory valid meanwhile.
        check(unsafe { f(comm.0, buf.cast(), size, tag, mr.0, &mut req) })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `irecv` of `bufs.len()` buffers (a multi-receive when > 1): `Ok(None)` = "try later".
    /// The four slices must have the same length (else `ncclInvalidArgument`, nothing called).
    pub fn irecv(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[i32],
        tags: &[i32],
        mrs: &[&Mr],
    ) -> Result<Option<Request>, NcclError> {
        let f = self.entry(self.table.irecv, "irecv")?;
        let n = bufs.len();
        if sizes.len() != n || tags.len() != n || mrs.len() != n {
            return Err(NcclError(NCCL_INVALID_ARGUMENT));
        }
        let n_c = c_int::try_from(n).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
        let mut data = ArgArray::new(ptr::null_mut(), bufs.iter().map(|b| b.cast::<c_void>()));
        let mut sz = ArgArray::new(0, sizes.iter().copied());
        let mut tg = ArgArray::new(0, tags.iter().copied());
        let mut mh = ArgArray::new(ptr::null_mut(), mrs.iter().map(|m| m.0));
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: the four arrays hold `n` valid elements each and outlive the call (plugins
        // copy them: NCCL passes stack arrays); `comm` is a live recv comm; `req` is writable.
        // The plugin writes into the buffers until the request completes; the caller keeps
        // that memory valid meanwhile.
        check(unsafe {
            f(
                comm.0,
                n_c,
                data.as_mut_ptr(),
                sz.as_mut_ptr(),
                tg.as_mut_ptr(),
                mh.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `iflush` of received buffers: `Ok(None)` means nothing to flush (or "try later").
    pub fn iflush(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[i32],
        mrs: &[&Mr],
    ) -> Result<Option<Request>, NcclError> {
        let f = self.entry(self.table.iflush, "iflush")?;
        let n = bufs.len();
        if sizes.len() != n || mrs.len() != n {
            return Err(NcclError(NCCL_INVALID_ARGUMENT));
        }
        let n_c = c_int::try_from(n).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
        let mut data = ArgArray::new(ptr::null_mut(), bufs.iter().map(|b| b.cast::<c_void>()));
        let mut sz = ArgArray::new(0, sizes.iter().copied());
        let mut mh = ArgArray::new(ptr::null_mut(), mrs.iter().map(|m| m.0));
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: as in `irecv`: `n` valid elements per array, live comm, writable `req`.
        check(unsafe {
            f(
                comm.0,
                n_c,
                data.as_mut_ptr(),
                sz.as_mut_ptr(),
                mh.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `test`: `Ok(true)` when done. On completion the sizes the plugin reported are copied
    /// into `sizes_out` (entries it did not write read -1). An empty `sizes_out` passes NULL,
    /// as NCCL does for flush requests. After `Ok(true)` the request is gone: NCCL never tests
    /// it again, and neither may the caller.
    pub fn test(&self, req: &Request, sizes_out: &mut [i32]) -> Result<bool, NcclError> {
        let f = self.entry(self.table.test, "test")?;
        let mut done: c_int = 0;
        let mut scratch = [-1 as c_int; TEST_SIZES_SCRATCH];
        let len = sizes_out.len();
        let sizes_ptr: *mut c_int = if len == 0 {
            ptr::null_mut()
        } else if len <= TEST_SIZES_SCRATCH {
            scratch.as_mut_ptr()
        } else {
            sizes_out.fill(-1);
            sizes_out.as_mut_ptr()
        };
        // SAFETY: `req` is an in-flight request of this plugin; `done` is writable; `sizes_ptr`
        // is NULL or points to at least max(len, 64) writable ints, more than any plugin writes
        // (one per receive of the request, at most NCCL_PROXY_MAX_SUBS).
        check(unsafe { f(req.0, &mut done, sizes_ptr) })?;
        if done != 0 && (1..=TEST_SIZES_SCRATCH).contains(&len) {
            sizes_out.copy_from_slice(&scratch[..len]);
        }
        Ok(done != 0)
    }

    /// `closeSend`.
    pub fn close_send(&self, comm: Comm) -> Result<(), NcclError> {
        let f = self.entry(self.table.close_send, "closeSend")?;
        // SAFETY: `comm` is a live send comm, consumed here so it cannot be closed twice.
        check(unsafe { f(comm.0) })
    }

    /// `closeRecv`.
    pub fn close_recv(&self, comm: Comm) -> Result<(), NcclError> {
        let f = self.entry(self.table.close_recv, "closeRecv")?;
        // SAFETY: `comm` is a live recv comm, consumed here so it cannot be closed twice.
        check(unsafe { f(comm.0) })
    }

    /// `closeListen`.
    pub fn close_listen(&self, comm: Comm) -> Result<(), NcclError> {
        let f = self.entry(self.table.close_listen, "closeListen")?;
        // SAFETY: `comm` is a live listen comm, consumed here so it cannot be closed twice.
        check(unsafe { f(comm.0) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let err = match PluginV8::open(Path::new("/nonexistent/libnothing.so")) {
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
        let err = match PluginV8::open(Path::new("libc.so.6")) {
            Ok(_) => panic!("libc accepted as a plugin"),
            Err(e) => e,
        };
        assert!(err.contains("no symbol ncclNetPlugin_v8"), "{err}");
    }

    #[test]
    fn arg_array_inline_and_heap() {
        let mut small = ArgArray::new(0, [1, 2, 3].into_iter());
        assert!(matches!(small, ArgArray::Inline(_)));
        // SAFETY: the inline array holds 8 ints; the first three were set.
        let first3 = unsafe { std::slice::from_raw_parts(small.as_mut_ptr(), 3) };
        assert_eq!(first3, &[1, 2, 3]);
        let mut big = ArgArray::new(0, 0..20);
        assert!(matches!(big, ArgArray::Heap(ref v) if v.len() == 20));
        // SAFETY: the heap array holds 20 ints.
        let all = unsafe { std::slice::from_raw_parts(big.as_mut_ptr(), 20) };
        assert_eq!(all[19], 19);
    }
}
