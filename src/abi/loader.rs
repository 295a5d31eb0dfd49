//! Loader for any ext-net library exporting v8, v9, v10 or v11: `dlopen`s it, looks up the
//! newest `ncclNetPlugin_vN` it exports (as NCCL 2.28 does) or the version asked for, and
//! wraps the table in methods that marshal arguments the way NCCL's proxy does, whatever the
//! version. Used by `ha-harness` (to compare plugins) and by the C-ABI tests (misuse tests
//! reach the raw tables through [`Plugin::table_v8`] etc.).
//!
//! v11 contexts: [`Plugin::init`] makes one default context (communicator id 0) that
//! `listen`/`connect` use; [`Plugin::init_context`] makes more (one per NCCL communicator),
//! used through [`Plugin::listen_in`] / [`Plugin::connect_in`] and ended by
//! [`Plugin::finalize`]. For v8–v10 a context is only the traffic class `connect` passes (v10).
//!
//! The library is never `dlclose`d: plugins may run background threads.
//!
//! Buffers are passed as raw pointers: the caller keeps them alive and untouched while a
//! request that uses them is in flight, exactly as NCCL does.

use super::common::{
    NcclResult, NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE,
    NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_OPTIONAL_RECV_COMPLETION, NCCL_NET_TRAFFIC_CLASS_UNDEF,
    NCCL_REMOTE_ERROR, NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NCCL_UNHANDLED_CUDA_ERROR,
};
use super::v10_types::{NcclNetCommConfigV10, NcclNetV10};
use super::v11_types::{NcclNetAttrV11, NcclNetPropertiesV11, NcclNetV11};
use super::v8_types::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use super::v9_types::{NcclNetPropertiesV9, NcclNetV9};
use std::ffi::{CStr, CString};
use std::fmt;
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::OnceLock;

/// Name of the data symbol a v8 plugin exports.
pub const SYMBOL_V8: &str = "ncclNetPlugin_v8";

/// An ext-net ABI version this loader drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Abi {
    V8 = 8,
    V9 = 9,
    V10 = 10,
    V11 = 11,
}

impl Abi {
    /// Newest first: the order NCCL 2.28 probes the symbols in.
    pub const NEWEST_FIRST: [Abi; 4] = [Abi::V11, Abi::V10, Abi::V9, Abi::V8];

    /// The data symbol holding this version's table.
    pub fn symbol(self) -> &'static str {
        match self {
            Abi::V8 => SYMBOL_V8,
            Abi::V9 => "ncclNetPlugin_v9",
            Abi::V10 => "ncclNetPlugin_v10",
            Abi::V11 => "ncclNetPlugin_v11",
        }
    }

    pub fn number(self) -> u32 {
        self as u32
    }

    /// `v8`, `8`, `V11`, ... (case-insensitive).
    pub fn parse(s: &str) -> Result<Abi, String> {
        let t = s.trim();
        let n = t.strip_prefix(['v', 'V']).unwrap_or(t);
        match n {
            "8" => Ok(Abi::V8),
            "9" => Ok(Abi::V9),
            "10" => Ok(Abi::V10),
            "11" => Ok(Abi::V11),
            _ => Err(format!("ABI {s:?}: expected v8, v9, v10 or v11")),
        }
    }
}

impl fmt::Display for Abi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.number())
    }
}

/// The table of the loaded version.
#[derive(Clone, Copy)]
enum Table {
    V8(&'static NcclNetV8),
    V9(&'static NcclNetV9),
    V10(&'static NcclNetV10),
    V11(&'static NcclNetV11),
}

/// A communicator's network context: v11's `init` result (NULL before v11) and the traffic
/// class (v10 passes it to `connect`, v11 to `init`; -1 = undefined).
#[derive(Debug)]
pub struct NetCtx {
    ptr: *mut c_void,
    traffic_class: i32,
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

/// A device's properties (any version), with the strings copied out. Fields a version lacks
/// read as NCCL's adapter fills them for it (v8: `maxP2pBytes` 1 GiB, one physical device).
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
    /// v9+: NCCL must flush every receive.
    pub force_flush: i32,
    /// v9+: the physical devices of this (virtual) device.
    pub vdevs: Vec<i32>,
    /// v9+: largest point-to-point transfer NCCL issues (v8: 1 GiB).
    pub max_p2p_bytes: usize,
    /// v9+: largest collective-offload transfer (v8: 512 MiB).
    pub max_coll_bytes: usize,
    /// v11: requests per multi-request (before: 1).
    pub max_multi_request_size: i32,
}

macro_rules! opaque_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(*mut c_void);

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

/// A loaded plugin of any supported version. Shareable between threads (NCCL drives one
/// plugin from several).
pub struct Plugin {
    path: PathBuf,
    /// The `dlopen` handle, kept for its lifetime meaning only: never closed.
    _handle: *mut c_void,
    abi: Abi,
    table: Table,
    /// The context `listen`/`connect` use: made by `init`.
    default_ctx: OnceLock<NetCtx>,
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

/// The library's table of version `abi` at `addr`.
///
/// # Safety
/// `addr` must be the address of the `ncclNetPlugin_v<abi>` data symbol of a library that is
/// never unloaded, and that symbol must have the layout of the version's table.
unsafe fn table_at(abi: Abi, addr: *mut c_void) -> Table {
    // SAFETY (each arm): per the function's contract the object at `addr` is that version's
    // table (layouts mirrored in `v*_types`, checked against the C header by tests); it lives
    // for 'static and is only read.
    unsafe {
        match abi {
            Abi::V8 => Table::V8(&*(addr as *const NcclNetV8)),
            Abi::V9 => Table::V9(&*(addr as *const NcclNetV9)),
            Abi::V10 => Table::V10(&*(addr as *const NcclNetV10)),
            Abi::V11 => Table::V11(&*(addr as *const NcclNetV11)),
        }
    }
}

impl Plugin {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)` and use the newest table it exports (v11, v10,
    /// v9, then v8), as NCCL 2.28 does.
    pub fn open(path: &Path) -> Result<Self, String> {
        Self::open_abi(path, None)
    }

    /// As [`Plugin::open`], but with `Some(abi)` that version's table (an error if the library
    /// does not export it).
    pub fn open_abi(path: &Path, abi: Option<Abi>) -> Result<Self, String> {
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
        let candidates: Vec<Abi> = match abi {
            Some(a) => vec![a],
            None => Abi::NEWEST_FIRST.to_vec(),
        };
        for a in &candidates {
            let addr = lookup(handle, a.symbol());
            if !addr.is_null() {
                // SAFETY: `addr` is the library's `ncclNetPlugin_v<a>` symbol, which by the
                // ext-net ABI is that version's table; the library is never dlclosed.
                let table = unsafe { table_at(*a, addr) };
                return Ok(Plugin {
                    path: path.to_path_buf(),
                    _handle: handle,
                    abi: *a,
                    table,
                    default_ctx: OnceLock::new(),
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
                "{}: none of {} (not an ext-net plugin of v8..v11?)",
                path.display(),
                names.join(", ")
            ),
        })
    }

    /// The versions `path` exports, newest first (without initialising anything).
    pub fn exported_abis(path: &Path) -> Result<Vec<Abi>, String> {
        let cpath = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: path contains a NUL byte", path.display()))?;
        // SAFETY: as in `open_abi`.
        let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!(
                "dlopen {}: {}",
                path.display(),
                dl_error("unknown error")
            ));
        }
        Ok(Abi::NEWEST_FIRST
            .into_iter()
            .filter(|a| !lookup(handle, a.symbol()).is_null())
            .collect())
    }

    /// The version this wrapper drives.
    pub fn abi(&self) -> Abi {
        self.abi
    }

    /// The path the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table's `name` (empty if NULL).
    pub fn name(&self) -> String {
        let n = match self.table {
            Table::V8(t) => t.name,
            Table::V9(t) => t.name,
            Table::V10(t) => t.name,
            Table::V11(t) => t.name,
        };
        c_string(n).unwrap_or_default()
    }

    /// The raw v8 table (when this wrapper drives v8), for misuse tests.
    pub fn table_v8(&self) -> Option<&NcclNetV8> {
        match self.table {
            Table::V8(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v9 table (when this wrapper drives v9).
    pub fn table_v9(&self) -> Option<&NcclNetV9> {
        match self.table {
            Table::V9(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v10 table (when this wrapper drives v10).
    pub fn table_v10(&self) -> Option<&NcclNetV10> {
        match self.table {
            Table::V10(t) => Some(t),
            _ => None,
        }
    }

    /// The raw v11 table (when this wrapper drives v11).
    pub fn table_v11(&self) -> Option<&NcclNetV11> {
        match self.table {
            Table::V11(t) => Some(t),
            _ => None,
        }
    }

    /// Names of the mandatory entries that are NULL in the table (all except `getDeviceMr`,
    /// `irecvConsumed`, `makeVDevice` and `setNetAttr`, which NCCL allows to be NULL).
    pub fn missing_entries(&self) -> Vec<&'static str> {
        macro_rules! common {
            ($t:expr) => {
                vec![
                    ("init", $t.init.is_none()),
                    ("devices", $t.devices.is_none()),
                    ("getProperties", $t.get_properties.is_none()),
                    ("listen", $t.listen.is_none()),
                    ("connect", $t.connect.is_none()),
                    ("accept", $t.accept.is_none()),
                    ("regMr", $t.reg_mr.is_none()),
                    ("regMrDmaBuf", $t.reg_mr_dma_buf.is_none()),
                    ("deregMr", $t.dereg_mr.is_none()),
                    ("isend", $t.isend.is_none()),
                    ("irecv", $t.irecv.is_none()),
                    ("iflush", $t.iflush.is_none()),
                    ("test", $t.test.is_none()),
                    ("closeSend", $t.close_send.is_none()),
                    ("closeRecv", $t.close_recv.is_none()),
                    ("closeListen", $t.close_listen.is_none()),
                ]
            };
        }
        let all = match self.table {
            Table::V8(t) => common!(t),
            Table::V9(t) => common!(t),
            Table::V10(t) => common!(t),
            Table::V11(t) => {
                let mut v = common!(t);
                v.push(("finalize", t.finalize.is_none()));
                v
            }
        };
        all.into_iter()
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

    /// `init` with a NULL logger (and, v10+, a NULL profiler callback). For v11 this makes
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

    /// A communicator's context: v11 calls `init(&ctx, comm_id, {traffic_class}, NULL, NULL)`
    /// (one per communicator, as NCCL 2.28 does); older versions call their `init` (plugins
    /// keep it idempotent; NCCL's adapters call it once) and remember the traffic class for
    /// v10's `connect`.
    pub fn init_context(&self, comm_id: u64, traffic_class: i32) -> Result<NetCtx, NcclError> {
        let mut ptr: *mut c_void = ptr::null_mut();
        match self.table {
            Table::V8(t) => {
                let f = self.entry(t.init, "init")?;
                // SAFETY: `init` takes a nullable logger; NULL is passed.
                check(unsafe { f(None) })?
            }
            Table::V9(t) => {
                let f = self.entry(t.init, "init")?;
                // SAFETY: as for v8.
                check(unsafe { f(None) })?
            }
            Table::V10(t) => {
                let f = self.entry(t.init, "init")?;
                // SAFETY: nullable logger and profiler callback; NULL is passed for both.
                check(unsafe { f(None, None) })?
            }
            Table::V11(t) => {
                let f = self.entry(t.init, "init")?;
                let mut config = NcclNetCommConfigV10 { traffic_class };
                // SAFETY: `ptr` and `config` are live locals for the call (plugins copy the
                // config); logger and profiler callback are nullable and NULL.
                check(unsafe { f(&mut ptr, comm_id, &mut config, None, None) })?;
                if ptr.is_null() {
                    tracing::error!("plugin {}: init succeeded with a NULL context", self.name());
                    return Err(NcclError(NCCL_INTERNAL_ERROR));
                }
            }
        }
        Ok(NetCtx { ptr, traffic_class })
    }

    /// `finalize(ctx)` (v11); a no-op before v11.
    pub fn finalize(&self, ctx: NetCtx) -> Result<(), NcclError> {
        match self.table {
            Table::V11(t) => {
                let f = self.entry(t.finalize, "finalize")?;
                // SAFETY: `ctx` came from this plugin's `init` and is consumed here, so it is
                // finalized once.
                check(unsafe { f(ctx.ptr) })
            }
            _ => Ok(()),
        }
    }

    /// `setNetAttr(ctx, attr)` (v11; `Ok(false)` when the version or the plugin has none).
    pub fn set_net_attr(&self, ctx: &NetCtx, attr: &NetAttr) -> Result<bool, NcclError> {
        let Table::V11(t) = self.table else {
            return Ok(false);
        };
        let Some(f) = t.set_net_attr else {
            return Ok(false);
        };
        let mut a = *attr;
        // SAFETY: live context of this plugin; `a` is a live local copy for the call.
        check(unsafe { f(ctx.ptr, &mut a) })?;
        Ok(true)
    }

    fn default_ctx(&self) -> Result<&NetCtx, NcclError> {
        self.default_ctx.get().ok_or_else(|| {
            tracing::error!("plugin {}: used before init()", self.name());
            NcclError(NCCL_INVALID_USAGE)
        })
    }

    /// `devices`: the number of devices.
    pub fn devices(&self) -> Result<i32, NcclError> {
        let f = match self.table {
            Table::V8(t) => t.devices,
            Table::V9(t) => t.devices,
            Table::V10(t) => t.devices,
            Table::V11(t) => t.devices,
        };
        let f = self.entry(f, "devices")?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable int for the duration of the call.
        check(unsafe { f(&mut n) })?;
        Ok(n)
    }

    /// `getProperties(dev)`, strings copied.
    pub fn properties(&self, dev: i32) -> Result<Props, NcclError> {
        let v9_props = |raw: &NcclNetPropertiesV9| Props {
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
            force_flush: raw.force_flush,
            vdevs: raw.v_props.devs[..(raw.v_props.ndevs.clamp(0, 4) as usize)].to_vec(),
            max_p2p_bytes: raw.max_p2p_bytes,
            max_coll_bytes: raw.max_coll_bytes,
            max_multi_request_size: 1,
        };
        match self.table {
            Table::V8(t) => {
                let f = self.entry(t.get_properties, "getProperties")?;
                let raw: NcclNetPropertiesV8 = read_props(|p| {
                    // SAFETY: `p` is a writable, aligned, zeroed props struct for the call.
                    unsafe { f(dev, p) }
                })?;
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
                    force_flush: 0,
                    vdevs: vec![dev],
                    max_p2p_bytes: 1 << 30,
                    max_coll_bytes: 512 << 20,
                    max_multi_request_size: 1,
                })
            }
            Table::V9(t) => {
                let f = self.entry(t.get_properties, "getProperties")?;
                // SAFETY: as for v8.
                let raw = read_props(|p| unsafe { f(dev, p) })?;
                Ok(v9_props(&raw))
            }
            Table::V10(t) => {
                let f = self.entry(t.get_properties, "getProperties")?;
                // SAFETY: as for v8.
                let raw = read_props(|p| unsafe { f(dev, p) })?;
                Ok(v9_props(&raw))
            }
            Table::V11(t) => {
                let f = self.entry(t.get_properties, "getProperties")?;
                // SAFETY: as for v8.
                let raw: NcclNetPropertiesV11 = read_props(|p| unsafe { f(dev, p) })?;
                let as_v9 = NcclNetPropertiesV9 {
                    name: raw.name,
                    pci_path: raw.pci_path,
                    guid: raw.guid,
                    ptr_support: raw.ptr_support,
                    reg_is_global: raw.reg_is_global,
                    force_flush: raw.force_flush,
                    speed: raw.speed,
                    port: raw.port,
                    latency: raw.latency,
                    max_comms: raw.max_comms,
                    max_recvs: raw.max_recvs,
                    net_device_type: raw.net_device_type,
                    net_device_version: raw.net_device_version,
                    v_props: raw.v_props,
                    max_p2p_bytes: raw.max_p2p_bytes,
                    max_coll_bytes: raw.max_coll_bytes,
                };
                Ok(Props {
                    max_multi_request_size: raw.max_multi_request_size,
                    ..v9_props(&as_v9)
                })
            }
        }
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
        let h = handle.as_mut_ptr().cast();
        // SAFETY (each arm): `handle` is a writable buffer of NCCL_NET_HANDLE_MAXSIZE bytes and
        // `comm` a writable pointer, both valid for the call; `ctx` is a live context.
        let rc = match self.table {
            Table::V8(t) => unsafe { self.entry(t.listen, "listen")?(dev, h, &mut comm) },
            Table::V9(t) => unsafe { self.entry(t.listen, "listen")?(dev, h, &mut comm) },
            Table::V10(t) => unsafe { self.entry(t.listen, "listen")?(dev, h, &mut comm) },
            Table::V11(t) => unsafe { self.entry(t.listen, "listen")?(ctx.ptr, dev, h, &mut comm) },
        };
        check(rc)?;
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
        let h = handle.as_mut_ptr().cast();
        let mut config = NcclNetCommConfigV10 {
            traffic_class: ctx.traffic_class,
        };
        // SAFETY (each arm): `handle` is a writable 128-byte buffer (plugins keep connect
        // state in it); `comm`, `dev_comm` and `config` are live locals; `ctx` is live.
        let rc = match self.table {
            Table::V8(t) => unsafe {
                self.entry(t.connect, "connect")?(dev, h, &mut comm, &mut dev_comm)
            },
            Table::V9(t) => unsafe {
                self.entry(t.connect, "connect")?(dev, h, &mut comm, &mut dev_comm)
            },
            Table::V10(t) => unsafe {
                self.entry(t.connect, "connect")?(dev, &mut config, h, &mut comm, &mut dev_comm)
            },
            Table::V11(t) => unsafe {
                self.entry(t.connect, "connect")?(ctx.ptr, dev, h, &mut comm, &mut dev_comm)
            },
        };
        check(rc)?;
        Ok((!comm.is_null()).then_some(Comm(comm)))
    }

    /// One `accept` step: `Ok(None)` means "not yet".
    pub fn accept(&self, listen: &Comm) -> Result<Option<Comm>, NcclError> {
        let mut comm: *mut c_void = ptr::null_mut();
        let mut dev_comm: *mut NcclNetDeviceHandleV8 = ptr::null_mut();
        // SAFETY (each arm): `listen` came from this plugin's `listen` and is not closed
        // (closing consumes it); the out pointers are writable for the call.
        let rc = match self.table {
            Table::V8(t) => unsafe {
                self.entry(t.accept, "accept")?(listen.0, &mut comm, &mut dev_comm)
            },
            Table::V9(t) => unsafe {
                self.entry(t.accept, "accept")?(listen.0, &mut comm, &mut dev_comm)
            },
            Table::V10(t) => unsafe {
                self.entry(t.accept, "accept")?(listen.0, &mut comm, &mut dev_comm)
            },
            Table::V11(t) => unsafe {
                self.entry(t.accept, "accept")?(listen.0, &mut comm, &mut dev_comm)
            },
        };
        check(rc)?;
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
        let f = match self.table {
            Table::V8(t) => t.reg_mr,
            Table::V9(t) => t.reg_mr,
            Table::V10(t) => t.reg_mr,
            Table::V11(t) => t.reg_mr,
        };
        let f = self.entry(f, "regMr")?;
        let mut mr: *mut c_void = ptr::null_mut();
        // SAFETY: `comm` is a live comm of this plugin; `mr` is writable. The buffer is only
        // recorded by the plugin; the caller keeps it valid while it is registered.
        check(unsafe { f(comm.0, buf.cast(), len, ptr_type, &mut mr) })?;
        Ok(Mr(mr))
    }

    /// `deregMr(comm, mr)`.
    pub fn dereg_mr(&self, comm: &Comm, mr: Mr) -> Result<(), NcclError> {
        let f = match self.table {
            Table::V8(t) => t.dereg_mr,
            Table::V9(t) => t.dereg_mr,
            Table::V10(t) => t.dereg_mr,
            Table::V11(t) => t.dereg_mr,
        };
        let f = self.entry(f, "deregMr")?;
        // SAFETY: `comm` is live and `mr` was returned by `reg_mr` (consumed here, so it cannot
        // be deregistered twice through this API).
        check(unsafe { f(comm.0, mr.0) })
    }

    /// `isend` with an `int` size, as v8 takes it: `Ok(None)` means "try later". For v9+ a
    /// negative size cannot be expressed and is refused here (`ncclInvalidArgument`).
    pub fn isend(
        &self,
        comm: &Comm,
        buf: *mut u8,
        size: i32,
        tag: i32,
        mr: &Mr,
    ) -> Result<Option<Request>, NcclError> {
        if let Table::V8(t) = self.table {
            let f = self.entry(t.isend, "isend")?;
            let mut req: *mut c_void = ptr::null_mut();
            // SAFETY: `comm` is a live send comm, `mr` a live registration, `req` writable. The
            // plugin reads `size` bytes at `buf` until the request completes; the caller keeps
            // that memory valid meanwhile.
            check(unsafe { f(comm.0, buf.cast(), size, tag, mr.0, &mut req) })?;
            return Ok((!req.is_null()).then_some(Request(req)));
        }
        let size = usize::try_from(size).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
        self.isend_sized(comm, buf, size, tag, mr)
    }

    /// `isend` with a `size_t` size (v9+; for v8, sizes above `INT_MAX` are refused here with
    /// `ncclInvalidArgument`, as NCCL's v8 adapter refuses them with an error).
    pub fn isend_sized(
        &self,
        comm: &Comm,
        buf: *mut u8,
        size: usize,
        tag: i32,
        mr: &Mr,
    ) -> Result<Option<Request>, NcclError> {
        let mut req: *mut c_void = ptr::null_mut();
        let b = buf.cast();
        // SAFETY (each arm): as in `isend`; v10/v11's profiler handle is nullable and NULL.
        let rc = match self.table {
            Table::V8(_) => {
                let size = i32::try_from(size).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
                return self.isend(comm, buf, size, tag, mr);
            }
            Table::V9(t) => unsafe {
                self.entry(t.isend, "isend")?(comm.0, b, size, tag, mr.0, &mut req)
            },
            Table::V10(t) => unsafe {
                self.entry(t.isend, "isend")?(comm.0, b, size, tag, mr.0, ptr::null_mut(), &mut req)
            },
            Table::V11(t) => unsafe {
                self.entry(t.isend, "isend")?(comm.0, b, size, tag, mr.0, ptr::null_mut(), &mut req)
            },
        };
        check(rc)?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `irecv` of `bufs.len()` buffers (a multi-receive when > 1) with `int` sizes:
    /// `Ok(None)` = "try later". The four slices must have the same length (else
    /// `ncclInvalidArgument`, nothing called). For v9+ negative sizes are refused here.
    pub fn irecv(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[i32],
        tags: &[i32],
        mrs: &[&Mr],
    ) -> Result<Option<Request>, NcclError> {
        let n = bufs.len();
        if sizes.len() != n || tags.len() != n || mrs.len() != n {
            return Err(NcclError(NCCL_INVALID_ARGUMENT));
        }
        if let Table::V8(t) = self.table {
            let f = self.entry(t.irecv, "irecv")?;
            let n_c = c_int::try_from(n).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
            let mut data = ArgArray::new(ptr::null_mut(), bufs.iter().map(|b| b.cast::<c_void>()));
            let mut sz = ArgArray::new(0, sizes.iter().copied());
            let mut tg = ArgArray::new(0, tags.iter().copied());
            let mut mh = ArgArray::new(ptr::null_mut(), mrs.iter().map(|m| m.0));
            let mut req: *mut c_void = ptr::null_mut();
            // SAFETY: the four arrays hold `n` valid elements each and outlive the call (plugins
            // copy them: NCCL passes stack arrays); `comm` is a live recv comm; `req` is
            // writable. The plugin writes into the buffers until the request completes; the
            // caller keeps that memory valid meanwhile.
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
            return Ok((!req.is_null()).then_some(Request(req)));
        }
        let sizes: Vec<usize> = sizes
            .iter()
            .map(|&s| usize::try_from(s).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT)))
            .collect::<Result<_, _>>()?;
        self.irecv_sized(comm, bufs, &sizes, tags, mrs, false)
    }

    /// `irecv` with `size_t` sizes (v9+; for v8 sizes above `INT_MAX` are refused here). With
    /// `optional_completion`, `*request` is preset to `NCCL_NET_OPTIONAL_RECV_COMPLETION` as
    /// NCCL does for LL/LL128 receives (v9+; NCCL's v8 adapter clears it, and so does this).
    pub fn irecv_sized(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[usize],
        tags: &[i32],
        mrs: &[&Mr],
        optional_completion: bool,
    ) -> Result<Option<Request>, NcclError> {
        let n = bufs.len();
        if sizes.len() != n || tags.len() != n || mrs.len() != n {
            return Err(NcclError(NCCL_INVALID_ARGUMENT));
        }
        if let Table::V8(_) = self.table {
            let sizes: Vec<i32> = sizes
                .iter()
                .map(|&s| i32::try_from(s).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT)))
                .collect::<Result<_, _>>()?;
            return self.irecv(comm, bufs, &sizes, tags, mrs);
        }
        let n_c = c_int::try_from(n).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
        let mut data = ArgArray::new(ptr::null_mut(), bufs.iter().map(|b| b.cast::<c_void>()));
        let mut sz = ArgArray::new(0usize, sizes.iter().copied());
        let mut tg = ArgArray::new(0, tags.iter().copied());
        let mut mh = ArgArray::new(ptr::null_mut(), mrs.iter().map(|m| m.0));
        let mut ph = ArgArray::new(ptr::null_mut::<c_void>(), (0..n).map(|_| ptr::null_mut()));
        let mut req: *mut c_void = if optional_completion {
            NCCL_NET_OPTIONAL_RECV_COMPLETION as *mut c_void
        } else {
            ptr::null_mut()
        };
        let (d, s, g, m, p) = (
            data.as_mut_ptr(),
            sz.as_mut_ptr(),
            tg.as_mut_ptr(),
            mh.as_mut_ptr(),
            ph.as_mut_ptr(),
        );
        // SAFETY (each arm): as in `irecv`: `n` valid elements per array (the profiler
        // handles are NULL), live comm, writable `req`.
        let rc = match self.table {
            Table::V8(_) => unreachable!("handled above"),
            Table::V9(t) => unsafe {
                self.entry(t.irecv, "irecv")?(comm.0, n_c, d, s, g, m, &mut req)
            },
            Table::V10(t) => unsafe {
                self.entry(t.irecv, "irecv")?(comm.0, n_c, d, s, g, m, p, &mut req)
            },
            Table::V11(t) => unsafe {
                self.entry(t.irecv, "irecv")?(comm.0, n_c, d, s, g, m, p, &mut req)
            },
        };
        check(rc)?;
        if req as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION {
            tracing::error!(
                "plugin {}: irecv left the optional-completion hint as its request",
                self.name()
            );
            return Err(NcclError(NCCL_INTERNAL_ERROR));
        }
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
        let f = match self.table {
            Table::V8(t) => t.iflush,
            Table::V9(t) => t.iflush,
            Table::V10(t) => t.iflush,
            Table::V11(t) => t.iflush,
        };
        let f = self.entry(f, "iflush")?;
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
    /// it again, and neither may the caller. (`test` reports `int` sizes in every version.)
    pub fn test(&self, req: &Request, sizes_out: &mut [i32]) -> Result<bool, NcclError> {
        let f = match self.table {
            Table::V8(t) => t.test,
            Table::V9(t) => t.test,
            Table::V10(t) => t.test,
            Table::V11(t) => t.test,
        };
        let f = self.entry(f, "test")?;
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

    fn close_with(
        &self,
        f: Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>,
        what: &'static str,
        comm: Comm,
    ) -> Result<(), NcclError> {
        let f = self.entry(f, what)?;
        // SAFETY: `comm` is a live comm of the right kind, consumed here so it cannot be closed
        // twice.
        check(unsafe { f(comm.0) })
    }

    /// `closeSend`.
    pub fn close_send(&self, comm: Comm) -> Result<(), NcclError> {
        let f = match self.table {
            Table::V8(t) => t.close_send,
            Table::V9(t) => t.close_send,
            Table::V10(t) => t.close_send,
            Table::V11(t) => t.close_send,
        };
        self.close_with(f, "closeSend", comm)
    }

    /// `closeRecv`.
    pub fn close_recv(&self, comm: Comm) -> Result<(), NcclError> {
        let f = match self.table {
            Table::V8(t) => t.close_recv,
            Table::V9(t) => t.close_recv,
            Table::V10(t) => t.close_recv,
            Table::V11(t) => t.close_recv,
        };
        self.close_with(f, "closeRecv", comm)
    }

    /// `closeListen`.
    pub fn close_listen(&self, comm: Comm) -> Result<(), NcclError> {
        let f = match self.table {
            Table::V8(t) => t.close_listen,
            Table::V9(t) => t.close_listen,
            Table::V10(t) => t.close_listen,
            Table::V11(t) => t.close_listen,
        };
        self.close_with(f, "closeListen", comm)
    }
}

/// Call a `getProperties` into a zeroed struct and return it.
fn read_props<T>(call: impl FnOnce(*mut T) -> NcclResult) -> Result<T, NcclError> {
    let mut raw = MaybeUninit::<T>::zeroed();
    check(call(raw.as_mut_ptr()))?;
    // SAFETY: every props type is plain data for which all-zero is a valid value (NULL
    // pointers, zero numbers), so the struct is initialised whether or not the plugin filled
    // every field.
    Ok(unsafe { raw.assume_init() })
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
            err.contains("ncclNetPlugin_v11, ncclNetPlugin_v10"),
            "{err}"
        );
        assert_eq!(Plugin::exported_abis(Path::new("libc.so.6")), Ok(vec![]));
    }

    #[test]
    fn abi_names_parse() {
        assert_eq!(Abi::parse("v8"), Ok(Abi::V8));
        assert_eq!(Abi::parse("11"), Ok(Abi::V11));
        assert_eq!(Abi::parse(" V10 "), Ok(Abi::V10));
        assert!(Abi::parse("v7").is_err());
        assert_eq!(Abi::V9.to_string(), "v9");
        assert_eq!(Abi::V10.symbol(), "ncclNetPlugin_v10");
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
