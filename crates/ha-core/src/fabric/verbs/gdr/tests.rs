//! Detection against fake sysfs trees, fake CUDA drivers and fake probe results: every branch
//! of [`assess`], [`HostGdr::gather`] and [`require`].

use super::cuda::tests::FakeCuda;
use super::cuda::{CudaDriver, CudaStatus};
use super::dmabuf::Probe;
use super::peermem::{Peermem, PEERMEM_PATHS};
use super::*;
use std::path::PathBuf;

/// A fresh empty directory (a fake file-system root) under the system temp dir, removed on
/// drop.
pub(crate) struct TempRoot(pub PathBuf);

impl TempRoot {
    pub(crate) fn new(tag: &str) -> TempRoot {
        let p = std::env::temp_dir().join(format!(
            "ha-gdr-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempRoot(p)
    }

    /// Create file `rel` (and its folders) under the root.
    pub(crate) fn touch(&self, rel: &str) {
        let f = self.0.join(rel);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, "580.159.04\n").unwrap();
    }
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `'static` fake driver (leaked: a handful per test run).
fn driver(f: FakeCuda) -> &'static dyn CudaDriver {
    Box::leak(Box::new(f))
}

/// The H100 machines here: driver 13000, one GPU with GDR and dma-buf.
fn h100() -> FakeCuda {
    FakeCuda::with(13000, &[(1, 1)])
}

fn host(mode: GdrMode, root: &TempRoot, cuda: FakeCuda) -> HostGdr {
    HostGdr::gather(mode, &root.0, || Ok(driver(cuda)))
}

const EBADF: Probe = Probe::Supported(libc::EBADF);

#[test]
fn h100_without_peermem_gets_dmabuf_only() {
    let r = TempRoot::new("h100");
    let h = host(GdrMode::Auto, &r, h100());
    assert!(h.wants_probe());
    let d = assess(&h, Some(EBADF));
    assert_eq!(d.ptr_support, PTR_HOST | PTR_DMABUF);
    assert!(d.enabled());
    assert!(
        d.line()
            .starts_with("GPU Direct RDMA enabled via dma-buf (probe errno EBADF); nvidia-peermem not loaded (none of /sys/kernel/mm/memory_peers/nv_mem/version"),
        "{}",
        d.line()
    );
}

#[test]
fn peermem_and_dmabuf_together() {
    let r = TempRoot::new("both");
    r.touch(PEERMEM_PATHS[0]);
    let h = host(GdrMode::Auto, &r, h100());
    let d = assess(&h, Some(EBADF));
    assert_eq!(d.ptr_support, PTR_HOST | PTR_CUDA | PTR_DMABUF);
    assert_eq!(
        d.reason,
        format!(
            "nvidia-peermem ({}) and dma-buf (probe errno EBADF)",
            r.0.join(PEERMEM_PATHS[0]).display()
        )
    );
}

#[test]
fn peermem_only_when_the_device_cannot_do_dmabuf() {
    let r = TempRoot::new("pm");
    r.touch(PEERMEM_PATHS[2]);
    let h = host(GdrMode::Auto, &r, h100());
    for probe in [
        Probe::Unsupported(libc::EOPNOTSUPP),
        Probe::Unsupported(libc::EPROTONOSUPPORT),
        Probe::NoSymbol,
    ] {
        let d = assess(&h, Some(probe));
        assert_eq!(d.ptr_support, PTR_HOST | PTR_CUDA, "{probe:?}");
        assert!(d.reason.contains("dma-buf: "), "{}", d.reason);
    }
    let d = assess(&h, None);
    assert_eq!(d.ptr_support, PTR_HOST | PTR_CUDA);
    assert!(d
        .reason
        .ends_with("dma-buf: the device could not be probed"));
}

#[test]
fn disabled_with_the_right_reason() {
    let r = TempRoot::new("off");
    // No peermem, device without dma-buf (rxe, older mlx4...).
    let h = host(GdrMode::Auto, &r, h100());
    let d = assess(&h, Some(Probe::Unsupported(libc::EOPNOTSUPP)));
    assert_eq!(d.ptr_support, PTR_HOST);
    assert!(!d.enabled());
    assert!(
        d.line()
            .starts_with("GPU Direct RDMA disabled: nvidia-peermem not loaded"),
        "{}",
        d.line()
    );
    assert!(d.reason.ends_with(
        "dma-buf: the device or kernel cannot register dma-bufs (probe errno EOPNOTSUPP)"
    ));
    // Driver too old for dma-buf, GPU without the dma-buf attribute.
    let d = assess(
        &host(GdrMode::Auto, &r, FakeCuda::with(11060, &[(1, 1)])),
        Some(EBADF),
    );
    assert_eq!(d.ptr_support, PTR_HOST);
    assert!(d
        .reason
        .ends_with("dma-buf: CUDA driver 11060 is older than 11070"));
    let h = host(GdrMode::Auto, &r, FakeCuda::with(12000, &[(1, 0)]));
    assert!(!h.wants_probe());
    let d = assess(&h, None);
    assert!(d
        .reason
        .ends_with("dma-buf: no GPU reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"));
    // No GPU with GPUDirect RDMA at all: peermem does not help.
    r.touch(PEERMEM_PATHS[0]);
    let h = host(GdrMode::Auto, &r, FakeCuda::with(12000, &[(0, 1)]));
    assert!(!h.wants_probe());
    let d = assess(&h, Some(EBADF));
    assert_eq!(d.ptr_support, PTR_HOST);
    assert!(d.reason.starts_with("no GPU supports GPUDirect RDMA"));
}

#[test]
fn no_cuda_driver_behaves_as_before() {
    let r = TempRoot::new("nocuda");
    r.touch(PEERMEM_PATHS[0]);
    let h = HostGdr::gather(GdrMode::Auto, &r.0, || {
        Err("dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file".into())
    });
    assert!(matches!(h.cuda, CudaStatus::NotFound(_)));
    assert!(!h.wants_probe(), "no PD is allocated for a probe");
    let d = assess(&h, None);
    assert_eq!(d.ptr_support, PTR_HOST);
    assert_eq!(
        d.line(),
        "GPU Direct RDMA disabled: no CUDA driver (dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file)"
    );
    assert!(h.describe().starts_with("GPUDirect: no CUDA driver"));
    // A driver that loads but has no GPU.
    let mut f = h100();
    f.init = Some(100);
    let h = host(GdrMode::Auto, &r, f);
    assert!(!h.wants_probe());
    assert_eq!(
        assess(&h, None).line(),
        "GPU Direct RDMA disabled: CUDA driver unusable: cuInit: CUDA_ERROR_NO_DEVICE (100)"
    );
}

#[test]
fn mode_off_loads_nothing() {
    let r = TempRoot::new("mode0");
    r.touch(PEERMEM_PATHS[0]);
    let h = HostGdr::gather(GdrMode::Off, &r.0, || {
        panic!("the driver must not be loaded")
    });
    assert_eq!(h.cuda, CudaStatus::Skipped);
    assert_eq!(h.peermem, Peermem::Absent);
    assert!(!h.wants_probe());
    let d = assess(&h, Some(EBADF));
    assert_eq!(d.ptr_support, PTR_HOST);
    assert_eq!(d.line(), "GPU Direct RDMA disabled: HA_NCCL_GDR=0");
    assert_eq!(h.describe(), "GPUDirect RDMA off (HA_NCCL_GDR=0)");
}

#[test]
fn host_line_names_driver_gpus_and_peermem() {
    let r = TempRoot::new("line");
    let h = host(GdrMode::Required, &r, h100());
    assert_eq!(
        h.describe(),
        "GPUDirect: CUDA driver 13000, 1 GPU(s) [GPU 0: cc 9, GPUDirect RDMA 1, dma-buf 1]; nvidia-peermem not loaded; HA_NCCL_GDR=1"
    );
    r.touch(PEERMEM_PATHS[1]);
    let h = host(GdrMode::Auto, &r, h100());
    assert!(h.describe().contains("nvidia-peermem loaded ("));
    let mut f = h100();
    f.version = None;
    assert!(host(GdrMode::Auto, &r, f)
        .describe()
        .starts_with("GPUDirect: CUDA driver unusable: cuDriverGetVersion"));
}

#[test]
fn required_mode_names_every_device_without_gdr() {
    let ok = DeviceGdr {
        ptr_support: PTR_HOST | PTR_DMABUF,
        reason: "dma-buf (probe errno EBADF)".into(),
    };
    let bad = DeviceGdr {
        ptr_support: PTR_HOST,
        reason: "nvidia-peermem not loaded".into(),
    };
    let devs = vec![
        ("mlx5_0:1".to_string(), ok.clone()),
        ("rxe0:1".to_string(), bad.clone()),
        ("rxe1:1".to_string(), bad),
    ];
    assert!(require(GdrMode::Auto, &devs).is_ok());
    assert!(require(GdrMode::Off, &devs).is_ok());
    let e = require(GdrMode::Required, &devs).unwrap_err();
    assert!(e.starts_with("HA_NCCL_GDR=1 requires GPU Direct RDMA on every device"));
    assert!(e.contains("rxe0:1: nvidia-peermem not loaded; rxe1:1: nvidia-peermem not loaded"));
    assert!(!e.contains("mlx5_0"));
    assert!(e.ends_with("Set HA_NCCL_GDR=auto to run with host-memory staging instead"));
    assert!(require(GdrMode::Required, &devs[..1]).is_ok());
}

#[test]
fn mode_names_match_variants() {
    for (m, n) in GdrMode::ALL.iter().zip(GdrMode::NAMES) {
        assert_eq!(m.name(), *n);
    }
    assert_eq!(GdrMode::default(), GdrMode::Auto);
}
