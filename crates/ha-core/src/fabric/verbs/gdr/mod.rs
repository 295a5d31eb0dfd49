//! GPUDirect RDMA detection for the `verbs` fabric: which GPU memory each device can register,
//! decided the way NCCL's IB transport decides it, and said in one INFO line per device.
//!
//! * `NCCL_PTR_CUDA` (GPU virtual addresses straight into `ibv_reg_mr`): the peer-memory
//!   client is loaded ([`peermem`]; process-wide, as in NCCL).
//! * `NCCL_PTR_DMABUF` (GPU memory exported as a dma-buf fd): a probe registration on the
//!   device ([`dmabuf`]) says the provider and kernel support it, and the CUDA driver can
//!   export dma-bufs (driver ≥ 11.7 and some GPU with `DMA_BUF_SUPPORTED`).
//! * Either needs the CUDA driver ([`cuda`], loaded at run time) and a GPU that supports
//!   GPUDirect RDMA at all. Without the driver nothing is probed and the devices offer host
//!   memory only, exactly as before GPUDirect support existed.
//!
//! `HA_NCCL_GDR` selects: `auto` (detect), `0` (host memory only, the driver is not even
//! loaded), `1` (required: opening the fabric fails, naming each device and why, unless every
//! offered device has GPUDirect RDMA). `1` exists for operators who would rather have the job
//! stop than silently stage every byte through host memory at a fraction of the bandwidth.
//!
//! The decision itself ([`assess`]) is a pure function of the gathered facts, tested against
//! fake sysfs trees, fake drivers and fake probe results.

pub mod cuda;
pub mod dmabuf;
pub mod peermem;

use crate::fabric::{PTR_CUDA, PTR_DMABUF, PTR_HOST};
use cuda::{CudaDriver, CudaStatus};
use dmabuf::Probe;
use peermem::Peermem;
use std::path::Path;

/// `HA_NCCL_GDR`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GdrMode {
    #[default]
    Auto,
    /// `0`: host memory only.
    Off,
    /// `1`: fail unless every device has GPUDirect RDMA.
    Required,
}

impl GdrMode {
    /// The `HA_NCCL_GDR` spellings, in the order of [`GdrMode::ALL`].
    pub const NAMES: &'static [&'static str] = &["auto", "0", "1"];
    pub const ALL: [GdrMode; 3] = [GdrMode::Auto, GdrMode::Off, GdrMode::Required];

    pub fn name(self) -> &'static str {
        match self {
            GdrMode::Auto => "auto",
            GdrMode::Off => "0",
            GdrMode::Required => "1",
        }
    }
}

/// The process-wide facts, gathered once when the fabric opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostGdr {
    pub mode: GdrMode,
    pub cuda: CudaStatus,
    pub peermem: Peermem,
}

impl HostGdr {
    /// Look at the CUDA driver (`load`: the real `DlCuda::load` in production) and the peer-
    /// memory client under `root`. With `HA_NCCL_GDR=0` nothing is looked at.
    pub fn gather(
        mode: GdrMode,
        root: &Path,
        load: impl FnOnce() -> Result<&'static dyn CudaDriver, String>,
    ) -> HostGdr {
        if mode == GdrMode::Off {
            return HostGdr {
                mode,
                cuda: CudaStatus::Skipped,
                peermem: Peermem::Absent,
            };
        }
        let cuda = match load() {
            Ok(d) => cuda::summarize(d),
            Err(e) => CudaStatus::NotFound(e),
        };
        HostGdr {
            mode,
            cuda,
            peermem: peermem::check(root),
        }
    }

    /// The real host: `/` and `libcuda.so.1`.
    pub fn gather_system(mode: GdrMode) -> HostGdr {
        Self::gather(mode, Path::new("/"), || {
            cuda::DlCuda::load().map(|d| d as &'static dyn CudaDriver)
        })
    }

    /// Whether a per-device dma-buf probe can change the outcome (no PD is allocated for it
    /// otherwise: a host without CUDA does exactly what it did before GPUDirect support).
    pub fn wants_probe(&self) -> bool {
        self.mode != GdrMode::Off
            && matches!(&self.cuda, CudaStatus::Ready(s) if s.any_gdr() && s.any_dmabuf())
    }

    /// The host-level line: the driver, its GPUs and the peer-memory client.
    pub fn describe(&self) -> String {
        let cuda = match &self.cuda {
            CudaStatus::Skipped => return "GPUDirect RDMA off (HA_NCCL_GDR=0)".into(),
            CudaStatus::NotFound(e) => format!("no CUDA driver ({e})"),
            CudaStatus::Failed(m) => format!("CUDA driver unusable: {m}"),
            CudaStatus::Ready(s) => s.describe(),
        };
        let pm = match &self.peermem {
            Peermem::Loaded(p) => format!("nvidia-peermem loaded ({})", p.display()),
            Peermem::Absent => "nvidia-peermem not loaded".into(),
        };
        format!("GPUDirect: {cuda}; {pm}; HA_NCCL_GDR={}", self.mode.name())
    }
}

/// What one device offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceGdr {
    /// `NCCL_PTR_*` bits (always `PTR_HOST`).
    pub ptr_support: i32,
    /// Why (the text after "GPU Direct RDMA enabled/disabled").
    pub reason: String,
}

impl DeviceGdr {
    pub fn enabled(&self) -> bool {
        self.ptr_support & (PTR_CUDA | PTR_DMABUF) != 0
    }

    /// `GPU Direct RDMA enabled via dma-buf (probe errno EBADF); nvidia-peermem not loaded`.
    pub fn line(&self) -> String {
        format!(
            "GPU Direct RDMA {} {}",
            if self.enabled() {
                "enabled via"
            } else {
                "disabled:"
            },
            self.reason
        )
    }

    /// Host memory only, for `reason`.
    fn host_only(reason: String) -> DeviceGdr {
        DeviceGdr {
            ptr_support: PTR_HOST,
            reason,
        }
    }
}

/// What a device with dma-buf probe result `probe` (`None`: not probed) offers on `host`.
pub fn assess(host: &HostGdr, probe: Option<Probe>) -> DeviceGdr {
    let s = match (&host.mode, &host.cuda) {
        (GdrMode::Off, _) | (_, CudaStatus::Skipped) => {
            return DeviceGdr::host_only("HA_NCCL_GDR=0".into())
        }
        (_, CudaStatus::NotFound(e)) => {
            return DeviceGdr::host_only(format!("no CUDA driver ({e})"))
        }
        (_, CudaStatus::Failed(m)) => {
            return DeviceGdr::host_only(format!("CUDA driver unusable: {m}"))
        }
        (_, CudaStatus::Ready(s)) => s,
    };
    if !s.any_gdr() {
        return DeviceGdr::host_only(
            "no GPU supports GPUDirect RDMA (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED is 0 on every GPU)"
                .into(),
        );
    }
    let mut bits = PTR_HOST;
    let mut via = Vec::new();
    let mut not = Vec::new();
    match &host.peermem {
        Peermem::Loaded(p) => {
            bits |= PTR_CUDA;
            via.push(format!("nvidia-peermem ({})", p.display()));
        }
        Peermem::Absent => not.push(format!(
            "nvidia-peermem not loaded (none of {} exists)",
            peermem::describe_paths()
        )),
    }
    if s.version < cuda::DMABUF_MIN_DRIVER {
        not.push(format!(
            "dma-buf: CUDA driver {} is older than {}",
            s.version,
            cuda::DMABUF_MIN_DRIVER
        ));
    } else if !s.any_dmabuf() {
        not.push("dma-buf: no GPU reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED".into());
    } else {
        match probe {
            Some(p) if p.supported() => {
                bits |= PTR_DMABUF;
                via.push(format!("dma-buf ({})", p.describe()));
            }
            Some(p) => not.push(format!("dma-buf: {}", p.describe())),
            None => not.push("dma-buf: the device could not be probed".into()),
        }
    }
    let reason = if via.is_empty() {
        not.join("; ")
    } else if not.is_empty() {
        via.join(" and ")
    } else {
        format!("{}; {}", via.join(" and "), not.join("; "))
    };
    DeviceGdr {
        ptr_support: bits,
        reason,
    }
}

/// `HA_NCCL_GDR=1`: an error naming every device without GPUDirect RDMA, if any.
pub fn require(mode: GdrMode, devices: &[(String, DeviceGdr)]) -> Result<(), String> {
    if mode != GdrMode::Required {
        return Ok(());
    }
    let missing: Vec<String> = devices
        .iter()
        .filter(|(_, g)| !g.enabled())
        .map(|(n, g)| format!("{n}: {}", g.reason))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "HA_NCCL_GDR=1 requires GPU Direct RDMA on every device, and it is not available on {}. \
         Set HA_NCCL_GDR=auto to run with host-memory staging instead",
        missing.join("; ")
    ))
}

#[cfg(test)]
mod tests;
