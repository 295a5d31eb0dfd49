//! Step 1: GPUDirect detection for real, with the plugin's own code (`ha_core`'s `gdr`).

use crate::Report;
use ha_core::fabric::verbs::context::DeviceList;
use ha_core::fabric::verbs::gdr::cuda::{CudaStatus, CudaSummary};
use ha_core::fabric::verbs::gdr::{GdrMode, HostGdr};
use ha_core::fabric::verbs::{self, VerbsConfig};
use ha_core::fabric::Fabric;

/// What later steps need.
pub struct Facts {
    pub cuda: Option<CudaSummary>,
    pub nics: usize,
}

pub fn run(r: &mut Report, require_gpu: bool, expect_no_nic: bool) -> Facts {
    let host = HostGdr::gather_system(GdrMode::Auto);
    r.info(&host.describe());
    let cuda = match &host.cuda {
        CudaStatus::Ready(s) => {
            r.pass(&format!("CUDA driver found: {}", s.describe()));
            r.check(s.any_gdr(), "some GPU reports GPU_DIRECT_RDMA_SUPPORTED");
            if s.any_dmabuf() {
                r.pass("some GPU can export dma-bufs (driver >= 11070, DMA_BUF_SUPPORTED)");
            } else {
                r.info("no GPU can export dma-bufs");
            }
            Some(s.clone())
        }
        other => {
            let why = format!("no usable CUDA driver: {other:?}");
            if require_gpu {
                r.fail(&why)
            } else {
                r.skip(&why)
            }
            None
        }
    };
    r.info(&format!(
        "nvidia-peermem: {}",
        if host.peermem.loaded() {
            "loaded"
        } else {
            "not loaded"
        }
    ));
    let nics = DeviceList::get().map(|l| l.len()).unwrap_or(0);
    if nics == 0 {
        r.info("no RDMA NIC on this host (libibverbs lists no device): GPU Direct RDMA disabled: no RDMA device");
        r.pass("detection without a NIC: GPU Direct RDMA disabled, reason: no RDMA device");
        return Facts { cuda, nics };
    }
    if expect_no_nic {
        r.fail(&format!("expected no RDMA NIC, found {nics}"));
    }
    match verbs::open_verbs(&VerbsConfig::default()) {
        Ok(f) => {
            for (i, d) in f.devices().iter().enumerate() {
                let g = f.gdr(i).expect("one verdict per device");
                r.info(&format!(
                    "NIC {} (ptrSupport {}): {}",
                    d.name,
                    d.ptr_support,
                    g.line()
                ));
            }
        }
        Err(e) => r.info(&format!("the verbs fabric does not open: {e}")),
    }
    Facts { cuda, nics }
}
