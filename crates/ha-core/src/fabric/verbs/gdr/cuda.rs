//! The CUDA driver, as far as GPUDirect detection needs it: behind the [`CudaDriver`] trait so
//! that detection runs against a fake in tests, and implemented for real by [`DlCuda`], which
//! loads `libcuda.so.1` at run time (`dlopen`): the plugin has no link-time CUDA dependency,
//! and a host without the driver simply reports "no CUDA driver".
//!
//! Symbols are looked up by their exported names; where `cuda.h` maps a name to a versioned
//! one (`cuMemAlloc` → `cuMemAlloc_v2`) the versioned symbol is used, since the plain export
//! is the legacy ABI. Enum values are `cuda.h`'s (checked on an H100, driver 580 / CUDA 13).

use std::ffi::{CStr, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::raw::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const ATTR_CC_MAJOR: i32 = 75;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
pub const ATTR_GDR_SUPPORTED: i32 = 116;
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124; some third-party headers say 113 or 142).
pub const ATTR_DMA_BUF_SUPPORTED: i32 = 124;
/// First driver with `cuMemGetHandleForAddressRange` (NCCL's own minimum for dma-buf).
pub const DMABUF_MIN_DRIVER: i32 = 11070;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` and its `CU_MEMORYTYPE_DEVICE` value.
pub const PTR_ATTR_MEMORY_TYPE: i32 = 2;
pub const MEMORYTYPE_DEVICE: u32 = 2;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub const HANDLE_TYPE_DMA_BUF_FD: i32 = 1;

/// A `CUresult` other than `CUDA_SUCCESS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError(pub i32);

impl std::fmt::Display for CuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            1 => "CUDA_ERROR_INVALID_VALUE",
            2 => "CUDA_ERROR_OUT_OF_MEMORY",
            3 => "CUDA_ERROR_NOT_INITIALIZED",
            35 => "CUDA_ERROR_INSUFFICIENT_DRIVER",
            100 => "CUDA_ERROR_NO_DEVICE",
            101 => "CUDA_ERROR_INVALID_DEVICE",
            201 => "CUDA_ERROR_INVALID_CONTEXT",
            500 => "CUDA_ERROR_NOT_FOUND",
            801 => "CUDA_ERROR_NOT_SUPPORTED",
            _ => "CUDA error",
        };
        write!(f, "{name} ({})", self.0)
    }
}

/// The driver calls detection makes.
pub trait CudaDriver: Send + Sync {
    /// `cuInit(0)`.
    fn init(&self) -> Result<(), CuError>;
    /// `cuDriverGetVersion` (e.g. 13000 for CUDA 13.0).
    fn driver_version(&self) -> Result<i32, CuError>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> Result<i32, CuError>;
    /// `cuDeviceGetAttribute(attr)` of the GPU with this ordinal.
    fn attribute(&self, ordinal: i32, attr: i32) -> Result<i32, CuError>;
}

/// What one GPU offers (`None`: the driver could not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuCaps {
    pub ordinal: i32,
    pub cc_major: Option<i32>,
    /// `GPU_DIRECT_RDMA_SUPPORTED`.
    pub gdr: Option<bool>,
    /// `DMA_BUF_SUPPORTED`.
    pub dmabuf: Option<bool>,
}

/// The driver and its GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaSummary {
    pub version: i32,
    pub gpus: Vec<GpuCaps>,
}

/// Outcome of looking at the CUDA side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaStatus {
    /// `HA_NCCL_GDR=0`: not even loaded.
    Skipped,
    /// `libcuda.so.1` cannot be loaded (no NVIDIA driver): the `dlerror` text.
    NotFound(String),
    /// Loaded, but a call failed: which and how.
    Failed(String),
    Ready(CudaSummary),
}

impl CudaSummary {
    /// Some GPU may do GPUDirect RDMA (an attribute the driver cannot report counts as yes:
    /// NCCL decides per GPU anyway).
    pub fn any_gdr(&self) -> bool {
        self.gpus.iter().any(|g| g.gdr != Some(false))
    }
    /// Some GPU can export dma-bufs and the driver is new enough for it.
    pub fn any_dmabuf(&self) -> bool {
        self.version >= DMABUF_MIN_DRIVER && self.gpus.iter().any(|g| g.dmabuf == Some(true))
    }
    /// One line: `driver 13000, 1 GPU(s) [GPU 0: cc 9, GPUDirect RDMA 1, dma-buf 1]`.
    pub fn describe(&self) -> String {
        let bit = |v: Option<bool>| match v {
            Some(true) => "1",
            Some(false) => "0",
            None => "?",
        };
        let gpus: Vec<String> = self
            .gpus
            .iter()
            .map(|g| {
                format!(
                    "GPU {}: cc {}, GPUDirect RDMA {}, dma-buf {}",
                    g.ordinal,
                    g.cc_major.map_or("?".to_string(), |c| c.to_string()),
                    bit(g.gdr),
                    bit(g.dmabuf)
                )
            })
            .collect();
        format!(
            "CUDA driver {}, {} GPU(s) [{}]",
            self.version,
            self.gpus.len(),
            gpus.join("; ")
        )
    }
}

/// Ask `drv` what the GPUs offer.
pub fn summarize(drv: &dyn CudaDriver) -> CudaStatus {
    if let Err(e) = drv.init() {
        return CudaStatus::Failed(format!("cuInit: {e}"));
    }
    let version = match drv.driver_version() {
        Ok(v) => v,
        Err(e) => return CudaStatus::Failed(format!("cuDriverGetVersion: {e}")),
    };
    let n = match drv.device_count() {
        Ok(n) => n,
        Err(e) => return CudaStatus::Failed(format!("cuDeviceGetCount: {e}")),
    };
    if n <= 0 {
        return CudaStatus::Failed(format!("CUDA driver {version} sees no GPU"));
    }
    let flag = |o: i32, a: i32| drv.attribute(o, a).ok().map(|v| v != 0);
    let gpus = (0..n)
        .map(|o| GpuCaps {
            ordinal: o,
            cc_major: drv.attribute(o, ATTR_CC_MAJOR).ok(),
            gdr: flag(o, ATTR_GDR_SUPPORTED),
            dmabuf: flag(o, ATTR_DMA_BUF_SUPPORTED),
        })
        .collect();
    CudaStatus::Ready(CudaSummary { version, gpus })
}

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuIntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type CuCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuCtxRelease = unsafe extern "C" fn(c_int) -> c_int;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut c_ulonglong, usize) -> c_int;
type CuMemFree = unsafe extern "C" fn(c_ulonglong) -> c_int;
type CuGetHandle =
    unsafe extern "C" fn(*mut c_void, c_ulonglong, usize, c_int, c_ulonglong) -> c_int;
type CuPointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, c_ulonglong) -> c_int;

/// The driver's entry points detection uses, plus those the GPU self-test (`ha-gdr-probe`)
/// needs to make a GPU buffer and export it as a dma-buf (`None` where the driver lacks one).
pub struct DlCuda {
    init: CuInit,
    version: CuIntOut,
    count: CuIntOut,
    device_get: CuDeviceGet,
    attribute: CuDeviceGetAttribute,
    ctx_retain: Option<CuCtxRetain>,
    ctx_release: Option<CuCtxRelease>,
    ctx_set_current: Option<CuCtxSetCurrent>,
    mem_alloc: Option<CuMemAlloc>,
    mem_free: Option<CuMemFree>,
    get_handle: Option<CuGetHandle>,
    pointer_attribute: Option<CuPointerGetAttribute>,
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc that stays valid
    // until the next dl* call on this thread; it is copied at once.
    unsafe {
        let m = libc::dlerror();
        if m.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(m).to_string_lossy().into_owned()
        }
    }
}

impl DlCuda {
    /// The process's CUDA driver, loaded once (never unloaded: NCCL and the CUDA runtime hold
    /// it too). `Err` carries the `dlerror` text when there is no driver.
    pub fn load() -> Result<&'static DlCuda, String> {
        static DRIVER: OnceLock<Result<DlCuda, String>> = OnceLock::new();
        DRIVER
            .get_or_init(|| Self::open("libcuda.so.1"))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn open(lib: &str) -> Result<DlCuda, String> {
        let name = CString::new(lib).map_err(|_| "bad library name".to_string())?;
        // SAFETY: dlopen with a valid NUL-terminated name; loading runs the driver library's
        // constructors, which is what using CUDA means (NCCL has loaded it already).
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(format!("dlopen {lib}: {}", dlerror_text()));
        }
        let sym = |s: &str| -> *mut c_void {
            let c = CString::new(s).expect("symbol names have no NUL");
            // SAFETY: `h` is a live handle (never closed); `c` is valid for the call.
            unsafe { libc::dlsym(h, c.as_ptr()) }
        };
        macro_rules! opt {
            ($name:literal, $ty:ty) => {{
                let p = sym($name);
                // SAFETY: a non-null symbol of libcuda with this name has this C signature
                // (cuda.h); function pointers and data pointers have the same size here.
                (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
            }};
        }
        macro_rules! req {
            ($name:literal, $ty:ty) => {
                opt!($name, $ty).ok_or_else(|| format!("{lib} lacks {}", $name))?
            };
        }
        Ok(DlCuda {
            init: req!("cuInit", CuInit),
            version: req!("cuDriverGetVersion", CuIntOut),
            count: req!("cuDeviceGetCount", CuIntOut),
            device_get: req!("cuDeviceGet", CuDeviceGet),
            attribute: req!("cuDeviceGetAttribute", CuDeviceGetAttribute),
            ctx_retain: opt!("cuDevicePrimaryCtxRetain", CuCtxRetain),
            ctx_release: opt!("cuDevicePrimaryCtxRelease_v2", CuCtxRelease),
            ctx_set_current: opt!("cuCtxSetCurrent", CuCtxSetCurrent),
            mem_alloc: opt!("cuMemAlloc_v2", CuMemAlloc),
            mem_free: opt!("cuMemFree_v2", CuMemFree),
            get_handle: opt!("cuMemGetHandleForAddressRange", CuGetHandle),
            pointer_attribute: opt!("cuPointerGetAttribute", CuPointerGetAttribute),
        })
    }

    fn device(&self, ordinal: i32) -> Result<c_int, CuError> {
        let mut d: c_int = 0;
        // SAFETY: resolved cuDeviceGet; `d` is a live out-parameter.
        check(unsafe { (self.device_get)(&mut d, ordinal) })?;
        Ok(d)
    }

    /// A `bytes`-long device allocation on GPU `ordinal` (primary context retained and made
    /// current on this thread). For the GPU self-test.
    pub fn gpu_buffer(&'static self, ordinal: i32, bytes: usize) -> Result<GpuBuffer, CuError> {
        let missing = CuError(500);
        let (retain, alloc) = (
            self.ctx_retain.ok_or(missing)?,
            self.mem_alloc.ok_or(missing)?,
        );
        let set = self.ctx_set_current.ok_or(missing)?;
        self.init()?;
        let dev = self.device(ordinal)?;
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: resolved driver calls with live out-parameters; the context is released in
        // GpuBuffer's Drop (or below on failure).
        unsafe {
            check(retain(&mut ctx, dev))?;
            let mut ptr: c_ulonglong = 0;
            let r = check(set(ctx)).and_then(|_| check(alloc(&mut ptr, bytes)));
            if let Err(e) = r {
                if let Some(rel) = self.ctx_release {
                    rel(dev);
                }
                return Err(e);
            }
            Ok(GpuBuffer {
                cuda: self,
                dev,
                ptr,
                len: bytes,
            })
        }
    }
}

fn check(rc: c_int) -> Result<(), CuError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(CuError(rc))
    }
}

impl CudaDriver for DlCuda {
    fn init(&self) -> Result<(), CuError> {
        // SAFETY: resolved cuInit; flags must be 0.
        check(unsafe { (self.init)(0) })
    }
    fn driver_version(&self) -> Result<i32, CuError> {
        let mut v: c_int = 0;
        // SAFETY: resolved call, live out-parameter.
        check(unsafe { (self.version)(&mut v) })?;
        Ok(v)
    }
    fn device_count(&self) -> Result<i32, CuError> {
        let mut n: c_int = 0;
        // SAFETY: resolved call, live out-parameter.
        check(unsafe { (self.count)(&mut n) })?;
        Ok(n)
    }
    fn attribute(&self, ordinal: i32, attr: i32) -> Result<i32, CuError> {
        let dev = self.device(ordinal)?;
        let mut v: c_int = 0;
        // SAFETY: resolved call, live out-parameter, a device handle from cuDeviceGet.
        check(unsafe { (self.attribute)(&mut v, attr, dev) })?;
        Ok(v)
    }
}

/// GPU memory from [`DlCuda::gpu_buffer`]; freed (and the context released) on drop.
pub struct GpuBuffer {
    cuda: &'static DlCuda,
    dev: c_int,
    pub ptr: u64,
    pub len: usize,
}

impl GpuBuffer {
    /// A new dma-buf file descriptor for the whole buffer (`cuMemGetHandleForAddressRange`,
    /// flags 0), as NCCL makes one before `regMrDmaBuf`. The caller owns it.
    pub fn export_dmabuf(&self) -> Result<OwnedFd, CuError> {
        let f = self.cuda.get_handle.ok_or(CuError(500))?;
        let mut fd: c_int = -1;
        // SAFETY: resolved call; for DMA_BUF_FD the handle is an `int` (live local); the range
        // is this live allocation.
        check(unsafe {
            f(
                (&mut fd as *mut c_int).cast(),
                self.ptr,
                self.len,
                HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(CuError(1));
        }
        // SAFETY: the driver just created this descriptor for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` of the buffer (2 = device memory).
    pub fn memory_type(&self) -> Result<u32, CuError> {
        let f = self.cuda.pointer_attribute.ok_or(CuError(500))?;
        let mut t: c_uint = 0;
        // SAFETY: resolved call; MEMORY_TYPE writes one unsigned int into the live local.
        check(unsafe {
            f(
                (&mut t as *mut c_uint).cast(),
                PTR_ATTR_MEMORY_TYPE,
                self.ptr,
            )
        })?;
        Ok(t)
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        // SAFETY: frees the allocation made in `gpu_buffer` and releases the context it
        // retained, exactly once.
        unsafe {
            if let Some(free) = self.cuda.mem_free {
                free(self.ptr);
            }
            if let Some(rel) = self.cuda.ctx_release {
                rel(self.dev);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A driver that answers from a table; `None` in a slot = that call fails.
    #[derive(Clone, Default)]
    pub(crate) struct FakeCuda {
        pub init: Option<i32>,
        pub version: Option<i32>,
        pub count: Option<i32>,
        /// (ordinal, attribute) → value; missing = CUDA_ERROR_INVALID_VALUE.
        pub attrs: HashMap<(i32, i32), i32>,
    }

    impl FakeCuda {
        /// A driver with `gpus` GPUs, each with these GDR and dma-buf attributes.
        pub(crate) fn with(version: i32, gpus: &[(i32, i32)]) -> FakeCuda {
            let mut attrs = HashMap::new();
            for (o, &(gdr, dmabuf)) in gpus.iter().enumerate() {
                attrs.insert((o as i32, ATTR_CC_MAJOR), 9);
                attrs.insert((o as i32, ATTR_GDR_SUPPORTED), gdr);
                attrs.insert((o as i32, ATTR_DMA_BUF_SUPPORTED), dmabuf);
            }
            FakeCuda {
                init: Some(0),
                version: Some(version),
                count: Some(gpus.len() as i32),
                attrs,
            }
        }
    }

    impl CudaDriver for FakeCuda {
        fn init(&self) -> Result<(), CuError> {
            check(self.init.unwrap_or(3))
        }
        fn driver_version(&self) -> Result<i32, CuError> {
            self.version.ok_or(CuError(3))
        }
        fn device_count(&self) -> Result<i32, CuError> {
            self.count.ok_or(CuError(3))
        }
        fn attribute(&self, o: i32, a: i32) -> Result<i32, CuError> {
            self.attrs.get(&(o, a)).copied().ok_or(CuError(1))
        }
    }

    #[test]
    fn h100_like_driver() {
        let s = summarize(&FakeCuda::with(13000, &[(1, 1)]));
        let CudaStatus::Ready(s) = s else {
            panic!("{s:?}")
        };
        assert!(s.any_gdr() && s.any_dmabuf());
        assert_eq!(
            s.describe(),
            "CUDA driver 13000, 1 GPU(s) [GPU 0: cc 9, GPUDirect RDMA 1, dma-buf 1]"
        );
    }

    #[test]
    fn failing_calls_are_named() {
        let mut f = FakeCuda::with(13000, &[(1, 1)]);
        f.init = Some(100);
        assert_eq!(
            summarize(&f),
            CudaStatus::Failed("cuInit: CUDA_ERROR_NO_DEVICE (100)".into())
        );
        let mut f = FakeCuda::with(13000, &[(1, 1)]);
        f.version = None;
        assert!(
            matches!(summarize(&f), CudaStatus::Failed(m) if m.starts_with("cuDriverGetVersion"))
        );
        let mut f = FakeCuda::with(13000, &[(1, 1)]);
        f.count = None;
        assert!(
            matches!(summarize(&f), CudaStatus::Failed(m) if m.starts_with("cuDeviceGetCount"))
        );
        let f = FakeCuda::with(13000, &[]);
        assert_eq!(
            summarize(&f),
            CudaStatus::Failed("CUDA driver 13000 sees no GPU".into())
        );
    }

    #[test]
    fn capability_rules() {
        let ready = |v, g: &[(i32, i32)]| match summarize(&FakeCuda::with(v, g)) {
            CudaStatus::Ready(s) => s,
            other => panic!("{other:?}"),
        };
        // One capable GPU among several is enough.
        let s = ready(12020, &[(0, 0), (1, 1)]);
        assert!(s.any_gdr() && s.any_dmabuf());
        // No GPU with GPUDirect RDMA.
        assert!(!ready(12020, &[(0, 1), (0, 1)]).any_gdr());
        // dma-buf needs driver 11.7.
        assert!(!ready(11060, &[(1, 1)]).any_dmabuf());
        assert!(ready(11070, &[(1, 1)]).any_dmabuf());
        // An attribute the driver cannot report: GDR unknown counts as possible, dma-buf not.
        let mut f = FakeCuda::with(11040, &[(1, 1)]);
        f.attrs.clear();
        let CudaStatus::Ready(s) = summarize(&f) else {
            panic!()
        };
        assert_eq!(
            s.gpus[0],
            GpuCaps {
                ordinal: 0,
                cc_major: None,
                gdr: None,
                dmabuf: None
            }
        );
        assert!(s.any_gdr() && !s.any_dmabuf());
        assert!(s.describe().contains("GPUDirect RDMA ?, dma-buf ?"));
    }

    #[test]
    fn error_names() {
        assert_eq!(CuError(801).to_string(), "CUDA_ERROR_NOT_SUPPORTED (801)");
        assert_eq!(CuError(999).to_string(), "CUDA error (999)");
    }

    #[test]
    fn loading_a_missing_library_says_why() {
        match DlCuda::open("libcuda-that-does-not-exist.so.9") {
            Err(e) => assert!(
                e.starts_with("dlopen libcuda-that-does-not-exist.so.9: "),
                "{e}"
            ),
            Ok(_) => panic!("loaded a library that does not exist"),
        }
    }
}
