//! Which NCCL loaded the plugin, found from the logger it passed to `init` (its
//! `ncclDebugLog`): `dladdr` names the library holding it, `dlopen(RTLD_NOLOAD)` of that name
//! gives a handle without loading anything, and through it `ncclGetVersion` and the
//! directories that library's `dlopen` of a bare name searches (`dlinfo(RTLD_DI_SERINFO)`:
//! its RPATH, `LD_LIBRARY_PATH`, its RUNPATH, the system directories). This works when NCCL
//! was loaded `RTLD_LOCAL` (PyTorch), where `dlsym(RTLD_DEFAULT, ...)` finds nothing, and
//! picks the right NCCL when a process holds several.

use std::ffi::{CStr, CString, OsStr};
use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The NCCL library that called `init`.
#[derive(Debug)]
pub(super) struct NcclLib {
    /// `ncclGetVersion` (`NCCL_VERSION_CODE`), if the library exports it.
    pub version: Option<i32>,
    /// Where its `dlopen` of a bare name looks, in order (without `ld.so.cache`).
    pub search_dirs: Vec<PathBuf>,
}

/// The file of the shared object holding `addr` (`None`: not in any).
fn object_of(addr: *const c_void) -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only inspects the loaded-object list and writes `info`, a live local.
    let rc = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if rc == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is filled; `dli_fname` is NULL or a NUL-terminated
    // string owned by the loader, copied at once.
    let fname = unsafe { info.assume_init().dli_fname };
    if fname.is_null() {
        return None;
    }
    // SAFETY: non-NULL, NUL-terminated (see above).
    let bytes = unsafe { CStr::from_ptr(fname) }.to_bytes();
    (!bytes.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(bytes)))
}

/// This plugin's own file (as the loader opened it).
pub(super) fn own_path() -> Option<PathBuf> {
    object_of(own_path as *const c_void)
}

/// The NCCL whose `ncclDebugLog` is `logger`; `None` when the logger is not in a library
/// that can be re-opened by name (NCCL linked into the executable).
pub(super) fn loading_nccl(logger: *const ()) -> Option<NcclLib> {
    let path = object_of(logger.cast())?;
    let cpath = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: RTLD_NOLOAD only returns a new reference to an object already loaded (the one
    // holding `logger`): nothing is loaded and no constructor runs. Closed below.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    let version = version_of(handle);
    let search_dirs = search_dirs(handle);
    // SAFETY: drops the reference taken above; the library stays loaded (NCCL holds it).
    unsafe { libc::dlclose(handle) };
    Some(NcclLib {
        version,
        search_dirs,
    })
}

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

fn version_of(handle: *mut c_void) -> Option<i32> {
    for name in [c"ncclGetVersion", c"pncclGetVersion"] {
        // SAFETY: a live handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if sym.is_null() {
            continue;
        }
        // SAFETY: NCCL exports `ncclResult_t ncclGetVersion(int* version)` under this name
        // (nccl.h, every release since 2.3); it only writes the version.
        let f = unsafe { std::mem::transmute::<*mut c_void, GetVersion>(sym) };
        let mut v: c_int = 0;
        // SAFETY: `v` is a live, writable int for the call.
        if unsafe { f(&mut v) } == 0 && v > 0 {
            return Some(v);
        }
    }
    None
}

/// glibc's `Dl_serpath`.
#[repr(C)]
struct SerPath {
    name: *const c_char,
    flags: c_uint,
}

/// glibc's `Dl_serinfo` header (`dls_serpath[]` follows).
#[repr(C)]
struct SerInfo {
    size: usize,
    cnt: c_uint,
    first: SerPath,
}

/// `dlinfo(RTLD_DI_SERINFO)`: the directories `dlopen` of a bare name from `handle`'s
/// library searches, in order.
fn search_dirs(handle: *mut c_void) -> Vec<PathBuf> {
    let mut head = SerInfo {
        size: 0,
        cnt: 0,
        first: SerPath {
            name: std::ptr::null(),
            flags: 0,
        },
    };
    // SAFETY: SERINFOSIZE writes only `size` and `cnt` of the live local.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_SERINFOSIZE,
            (&mut head as *mut SerInfo).cast(),
        )
    };
    if rc != 0 || head.size < std::mem::size_of::<SerInfo>() || head.cnt == 0 {
        return Vec::new();
    }
    // The buffer glibc fills: the header, `cnt` entries, then the strings they point to.
    let words = head.size.div_ceil(8);
    let mut buf = vec![0u64; words];
    let info = buf.as_mut_ptr().cast::<SerInfo>();
    // SAFETY: `buf` is 8-byte aligned and `head.size` bytes long, as SERINFO requires; its
    // header is set to the size and count SERINFOSIZE reported, and glibc writes within it.
    let rc = unsafe {
        (*info).size = head.size;
        (*info).cnt = head.cnt;
        libc::dlinfo(handle, libc::RTLD_DI_SERINFO, info.cast())
    };
    if rc != 0 {
        return Vec::new();
    }
    let first = std::mem::offset_of!(SerInfo, first);
    (0..head.cnt as usize)
        .filter_map(|i| {
            let off = first + i * std::mem::size_of::<SerPath>();
            if off + std::mem::size_of::<SerPath>() > head.size {
                return None;
            }
            // SAFETY: within the filled buffer (checked above); glibc set `name` to a
            // NUL-terminated string inside the same buffer.
            let name = unsafe { (*buf.as_ptr().cast::<u8>().add(off).cast::<SerPath>()).name };
            if name.is_null() {
                return None;
            }
            // SAFETY: non-NULL and NUL-terminated (see above); copied before `buf` goes.
            let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
            Some(PathBuf::from(OsStr::from_bytes(bytes)))
        })
        .collect()
}
