//! dma-buf registrations through libibverbs: the function table ([`DmabufApi`]) holding
//! `ibv_reg_dmabuf_mr`, the per-device probe NCCL uses to tell "unsupported" from "bad fd",
//! and the checks made on the descriptor NCCL passes.
//!
//! `ibv_reg_dmabuf_mr` carries symbol version `IBVERBS_1.12` (rdma-core 34). The plugin is
//! linked `BIND_NOW`: calling the `ibverbs-sys` extern directly would make the whole plugin
//! fail to load on older rdma-core. It is therefore looked up at run time with `dlvsym`, as
//! NCCL does; a library without it means "dma-buf unsupported". The table is also the seam
//! tests use to stand a fake in for the real call.

use ibverbs_sys as sys;
use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::sync::OnceLock;

/// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`.
pub type RegDmabufFn =
    unsafe extern "C" fn(*mut sys::ibv_pd, u64, usize, u64, c_int, c_int) -> *mut sys::ibv_mr;
/// `ibv_dereg_mr(mr)`.
pub type DeregFn = unsafe extern "C" fn(*mut sys::ibv_mr) -> c_int;

/// The verbs calls dma-buf support needs.
#[derive(Clone, Copy)]
pub struct DmabufApi {
    /// `None`: libibverbs predates rdma-core 34.
    pub reg: Option<RegDmabufFn>,
    pub dereg: DeregFn,
}

impl DmabufApi {
    /// The process's libibverbs, looked up once.
    pub fn system() -> &'static DmabufApi {
        static API: OnceLock<DmabufApi> = OnceLock::new();
        API.get_or_init(|| DmabufApi {
            reg: lookup_reg_dmabuf_mr(),
            dereg: sys::ibv_dereg_mr,
        })
    }
}

/// `dlvsym(libibverbs, "ibv_reg_dmabuf_mr", "IBVERBS_1.12")`. The library is already loaded
/// (the plugin links it), so `RTLD_NOLOAD` only returns a handle on it.
fn lookup_reg_dmabuf_mr() -> Option<RegDmabufFn> {
    let lib = CString::new("libibverbs.so.1").expect("no NUL");
    let name = CString::new("ibv_reg_dmabuf_mr").expect("no NUL");
    let ver = CString::new("IBVERBS_1.12").expect("no NUL");
    // SAFETY: dlopen with RTLD_NOLOAD of a library this object already depends on takes a
    // reference on it and loads nothing; the handle is never closed (the plugin keeps using
    // the library). dlvsym only reads the strings, which outlive the calls.
    let p = unsafe {
        let mut h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            h = libc::RTLD_DEFAULT;
        }
        libc::dlvsym(h, name.as_ptr(), ver.as_ptr())
    };
    if p.is_null() {
        return None;
    }
    // SAFETY: a symbol of this name and version has this C signature (verbs.h of rdma-core
    // 34 and later); data and function pointers have the same size on this platform.
    Some(unsafe { std::mem::transmute::<*mut c_void, RegDmabufFn>(p) })
}

/// What the probe registration said about one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// libibverbs has no `ibv_reg_dmabuf_mr`.
    NoSymbol,
    /// The provider or kernel cannot register dma-bufs (errno `EOPNOTSUPP`: provider without
    /// the verb; `EPROTONOSUPPORT`: kernel older than 5.12).
    Unsupported(i32),
    /// Any other errno (normally `EBADF`: the kernel tried to look the fd up): supported.
    Supported(i32),
}

impl Probe {
    pub fn supported(self) -> bool {
        matches!(self, Probe::Supported(_))
    }

    /// For messages: `probe errno EBADF`.
    pub fn describe(self) -> String {
        match self {
            Probe::NoSymbol => {
                "libibverbs lacks ibv_reg_dmabuf_mr@IBVERBS_1.12 (rdma-core older than 34)".into()
            }
            Probe::Unsupported(e) => format!(
                "the device or kernel cannot register dma-bufs (probe errno {})",
                errno_name(e)
            ),
            Probe::Supported(e) => format!("probe errno {}", errno_name(e)),
        }
    }
}

/// NCCL's rule: `EOPNOTSUPP` and `EPROTONOSUPPORT` mean unsupported, anything else supported.
pub fn classify(errno: i32) -> Probe {
    if errno == libc::EOPNOTSUPP || errno == libc::EPROTONOSUPPORT {
        Probe::Unsupported(errno)
    } else {
        Probe::Supported(errno)
    }
}

/// `EBADF` etc. for the errnos the probe meets, the number otherwise.
pub fn errno_name(e: i32) -> String {
    match e {
        0 => "0".into(),
        libc::EBADF => "EBADF".into(),
        libc::EOPNOTSUPP => "EOPNOTSUPP".into(),
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::EFAULT => "EFAULT".into(),
        libc::ENOMEM => "ENOMEM".into(),
        libc::EPERM => "EPERM".into(),
        libc::ENOSYS => "ENOSYS".into(),
        _ => e.to_string(),
    }
}

/// Register offset 0, length 0, fd -1 on `pd` and read errno (NCCL's probe; errno is cleared
/// first, which NCCL does not do). A registration that unexpectedly succeeds is released and
/// counts as supported.
///
/// # Safety
/// `pd` is whatever `api.reg` accepts: a live protection domain for the real call.
pub unsafe fn probe_pd(api: &DmabufApi, pd: *mut sys::ibv_pd) -> Probe {
    let Some(reg) = api.reg else {
        return Probe::NoSymbol;
    };
    // SAFETY: the thread's errno location is always valid.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: per this function's contract; fd -1 with length 0 touches no memory.
    let mr = unsafe { reg(pd, 0, 0, 0, -1, 0) };
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if !mr.is_null() {
        // SAFETY: releases the registration just made, once.
        unsafe { (api.dereg)(mr) };
        return Probe::Supported(0);
    }
    classify(errno)
}

/// Probe device `index` of `list` on a throwaway protection domain.
pub fn probe_device(
    list: &super::super::context::DeviceList,
    index: usize,
) -> crate::fabric::Result<Probe> {
    let ctx = super::super::context::Context::open(list, index)?;
    // SAFETY: live context.
    let pd = unsafe { sys::ibv_alloc_pd(ctx.raw()) };
    if pd.is_null() {
        return Err(super::super::ffi::last_error(format!(
            "{}: ibv_alloc_pd",
            ctx.name()
        )));
    }
    // SAFETY: `pd` is live until the dealloc below.
    let r = unsafe { probe_pd(DmabufApi::system(), pd) };
    // SAFETY: deallocates the PD made above, which has no objects, once.
    unsafe { sys::ibv_dealloc_pd(pd) };
    Ok(r)
}

/// Check the descriptor NCCL passes to `regMrDmaBuf`: it must be open now (NCCL closes it
/// as soon as the call returns, and the registration takes its own reference on the
/// dma-buf). Returns what `/proc/self/fd` shows it to be, for messages.
pub fn check_fd(fd: RawFd) -> io::Result<String> {
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: F_GETFD on a descriptor number has no memory effects; a closed one is EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "?".into()))
}

/// Whether a `/proc/self/fd` link target names a dma-buf (`/dmabuf:<name>` on current
/// kernels, `anon_inode:dmabuf` on old ones).
pub fn is_dmabuf_target(target: &str) -> bool {
    target.starts_with("/dmabuf:") || target.starts_with("anon_inode:dmabuf")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static ERRNO: AtomicI32 = AtomicI32::new(0);
    static DEREGS: AtomicUsize = AtomicUsize::new(0);
    // Serialises the tests sharing the statics above.
    static LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    unsafe extern "C" fn fake_reg(
        _pd: *mut sys::ibv_pd,
        offset: u64,
        len: usize,
        iova: u64,
        fd: c_int,
        access: c_int,
    ) -> *mut sys::ibv_mr {
        assert_eq!(
            (offset, len, iova, fd, access),
            (0, 0, 0, -1, 0),
            "NCCL's probe"
        );
        CALLS.fetch_add(1, Ordering::SeqCst);
        let e = ERRNO.load(Ordering::SeqCst);
        if e < 0 {
            // "Succeeds": a dangling but non-null pointer only the fake dereg sees.
            return std::ptr::NonNull::<sys::ibv_mr>::dangling().as_ptr();
        }
        // SAFETY: the thread's errno location is always valid.
        unsafe { *libc::__errno_location() = e };
        std::ptr::null_mut()
    }

    unsafe extern "C" fn fake_dereg(_mr: *mut sys::ibv_mr) -> c_int {
        DEREGS.fetch_add(1, Ordering::SeqCst);
        0
    }

    fn api(reg: bool) -> DmabufApi {
        DmabufApi {
            reg: reg.then_some(fake_reg as RegDmabufFn),
            dereg: fake_dereg,
        }
    }

    fn run(errno: i32) -> Probe {
        ERRNO.store(errno, Ordering::SeqCst);
        // SAFETY: the fake ignores the PD.
        unsafe { probe_pd(&api(true), std::ptr::null_mut()) }
    }

    #[test]
    fn errno_rules_are_nccls() {
        let _g = LOCK.lock();
        let before = CALLS.load(Ordering::SeqCst);
        assert_eq!(run(libc::EBADF), Probe::Supported(libc::EBADF));
        assert_eq!(run(libc::EINVAL), Probe::Supported(libc::EINVAL));
        assert_eq!(run(libc::EOPNOTSUPP), Probe::Unsupported(libc::EOPNOTSUPP));
        assert_eq!(
            run(libc::EPROTONOSUPPORT),
            Probe::Unsupported(libc::EPROTONOSUPPORT)
        );
        assert_eq!(CALLS.load(Ordering::SeqCst) - before, 4);
        assert!(run(libc::EBADF).supported());
        assert!(!run(libc::EOPNOTSUPP).supported());
    }

    #[test]
    fn a_stale_errno_does_not_leak_into_the_probe() {
        let _g = LOCK.lock();
        // The fake fails without setting errno: the result must not be the old EOPNOTSUPP.
        // SAFETY: the thread's errno location is always valid.
        unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
        ERRNO.store(0, Ordering::SeqCst);
        // SAFETY: as in `run`.
        let p = unsafe { probe_pd(&api(true), std::ptr::null_mut()) };
        assert_eq!(p, Probe::Supported(0));
    }

    #[test]
    fn a_successful_probe_is_released_and_counts_as_supported() {
        let _g = LOCK.lock();
        let before = DEREGS.load(Ordering::SeqCst);
        assert_eq!(run(-1), Probe::Supported(0));
        assert_eq!(DEREGS.load(Ordering::SeqCst) - before, 1);
    }

    #[test]
    fn missing_symbol_means_unsupported() {
        // SAFETY: the fake table has no registration call; the PD is not used.
        let p = unsafe { probe_pd(&api(false), std::ptr::null_mut()) };
        assert_eq!(p, Probe::NoSymbol);
        assert!(!p.supported());
        assert!(p.describe().contains("rdma-core older than 34"));
        assert!(Probe::Unsupported(libc::EOPNOTSUPP)
            .describe()
            .contains("probe errno EOPNOTSUPP"));
        assert_eq!(
            Probe::Supported(libc::EBADF).describe(),
            "probe errno EBADF"
        );
    }

    #[test]
    fn this_hosts_libibverbs_exports_the_versioned_symbol() {
        // The build host's rdma-core (44) and the GPU machine's (50) are both >= 34.
        assert!(DmabufApi::system().reg.is_some());
    }

    #[test]
    fn fd_checks() {
        assert_eq!(check_fd(-1).unwrap_err().raw_os_error(), Some(libc::EBADF));
        let f = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        let fd = f.as_raw_fd();
        assert!(check_fd(fd).unwrap().ends_with("/status"));
        // A number far above any open descriptor (closing one here could race other tests
        // reusing its number).
        assert_eq!(
            check_fd(1 << 20).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        drop(f);
        assert!(is_dmabuf_target("/dmabuf:"));
        assert!(is_dmabuf_target("anon_inode:dmabuf"));
        assert!(!is_dmabuf_target("/memfd:x (deleted)"));
    }
}
