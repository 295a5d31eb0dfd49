//! The API side of GPUDirect RDMA: which memory types a device is advertised with, how a
//! registration request is served (host, GPU memory by address, dma-buf), and which buffer
//! an `iflush` reads. Pure functions, unit-tested; `ops` applies them.

use crate::fabric::{DeviceInfo, PTR_CUDA, PTR_DMABUF, PTR_HOST};
use crate::transport::ha::{parse_standby_map, standby_for, HaCfg};
use crate::transport::mr::MemKind;
use std::sync::OnceLock;

/// How a registration is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    Host,
    /// GPU memory by virtual address (nvidia-peermem).
    Cuda,
    /// GPU memory through dma-buf `fd`, the buffer `offset` bytes into it.
    DmaBuf {
        offset: u64,
        fd: i32,
    },
}

impl Plan {
    pub fn kind(self) -> MemKind {
        match self {
            Plan::Host => MemKind::Host,
            Plan::Cuda => MemKind::Cuda,
            Plan::DmaBuf { .. } => MemKind::DmaBuf,
        }
    }
}

/// Serve `regMr(ptr_type)` (`dmabuf` `None`) or `regMrDmaBuf(ptr_type, offset, fd)` on a
/// connection whose devices together support `support` (`NCCL_PTR_*` bits). The error text
/// follows "memory type N is not supported by this device".
///
/// NCCL passes `NCCL_PTR_HOST` or `NCCL_PTR_CUDA` as the type; for `regMrDmaBuf` the fd says
/// whether the GPU memory comes as a dma-buf (fd -1: by address, as `regMr`, which is what
/// NCCL's IB transport does with it). Host memory ignores the fd.
pub fn plan(ptr_type: i32, dmabuf: Option<(u64, i32)>, support: i32) -> Result<Plan, String> {
    let refuse = |why: &str| {
        Err(format!(
            "memory type {ptr_type} is not supported by this device (ptrSupport {support}): {why}"
        ))
    };
    match ptr_type {
        PTR_HOST => Ok(Plan::Host),
        PTR_CUDA => match dmabuf {
            Some((offset, fd)) if fd >= 0 => {
                if support & PTR_DMABUF != 0 {
                    Ok(Plan::DmaBuf { offset, fd })
                } else {
                    refuse(&format!(
                        "a dma-buf registration (fd {fd}) needs NCCL_PTR_DMABUF (GPU Direct RDMA via dma-buf)"
                    ))
                }
            }
            Some((_, fd)) if fd != -1 => refuse(&format!("dma-buf fd {fd} is not a descriptor")),
            _ if support & PTR_CUDA != 0 => Ok(Plan::Cuda),
            _ => refuse(
                "GPU memory without a dma-buf fd needs NCCL_PTR_CUDA (nvidia-peermem loaded)",
            ),
        },
        _ => refuse("NCCL passes NCCL_PTR_HOST (1) or NCCL_PTR_CUDA (2)"),
    }
}

/// The `ptrSupport` device `dev` is advertised with: its own, less what its standby lacks
/// (a GPU registration must be possible on both paths of a connection, or a failover would
/// find the buffer unregistered). Host memory always.
pub fn advertised(devs: &[DeviceInfo], dev: usize, cfg: &HaCfg) -> i32 {
    let own = devs[dev].ptr_support | PTR_HOST;
    if !cfg.enable_backup {
        return own;
    }
    let map = parse_standby_map(&cfg.standby_map, devs.len()).unwrap_or_default();
    match standby_for(dev, devs, &map) {
        Some(s) => (own & devs[s].ptr_support) | PTR_HOST,
        None => own,
    }
}

/// The buffer an `iflush` of these sizes reads: the last non-empty one (NCCL's choice);
/// `None` when every size is 0 (nothing to flush).
pub fn flush_target(sizes: &[i32]) -> Option<usize> {
    sizes.iter().rposition(|&s| s != 0)
}

/// `NCCL_GDR_FLUSH_DISABLE` (NCCL's IB transport variable; any non-zero integer disables),
/// read once.
pub fn flush_disabled() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| flush_disable_value(std::env::var("NCCL_GDR_FLUSH_DISABLE").ok().as_deref()))
}

/// NCCL's reading of `NCCL_GDR_FLUSH_DISABLE`: an integer, non-zero = disabled; unset or
/// not a number = enabled.
fn flush_disable_value(v: Option<&str>) -> bool {
    v.and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|v| v != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::LinkLayer;
    use std::time::Duration;

    const ALL: i32 = PTR_HOST | PTR_CUDA | PTR_DMABUF;

    #[test]
    fn host_memory_is_always_host() {
        assert_eq!(plan(PTR_HOST, None, PTR_HOST), Ok(Plan::Host));
        assert_eq!(plan(PTR_HOST, Some((0, 7)), PTR_HOST), Ok(Plan::Host));
        assert_eq!(plan(PTR_HOST, Some((0, -1)), ALL), Ok(Plan::Host));
    }

    #[test]
    fn gpu_memory_by_address_needs_peermem() {
        assert_eq!(plan(PTR_CUDA, None, PTR_HOST | PTR_CUDA), Ok(Plan::Cuda));
        assert_eq!(plan(PTR_CUDA, Some((0, -1)), ALL), Ok(Plan::Cuda));
        let e = plan(PTR_CUDA, None, PTR_HOST | PTR_DMABUF).unwrap_err();
        assert!(e.starts_with("memory type 2 is not supported by this device (ptrSupport 5)"));
        assert!(e.contains("needs NCCL_PTR_CUDA"), "{e}");
        // The dma-buf fallback NCCL takes when regMrDmaBuf failed: fails cleanly too.
        assert!(plan(PTR_CUDA, Some((0, -1)), PTR_HOST | PTR_DMABUF).is_err());
    }

    #[test]
    fn dmabuf_needs_dmabuf_support_and_a_descriptor() {
        assert_eq!(
            plan(PTR_CUDA, Some((4096, 9)), PTR_HOST | PTR_DMABUF),
            Ok(Plan::DmaBuf {
                offset: 4096,
                fd: 9
            })
        );
        assert_eq!(
            plan(PTR_CUDA, Some((0, 9)), ALL).map(Plan::kind),
            Ok(MemKind::DmaBuf)
        );
        let e = plan(PTR_CUDA, Some((0, 9)), PTR_HOST | PTR_CUDA).unwrap_err();
        assert!(
            e.contains("a dma-buf registration (fd 9) needs NCCL_PTR_DMABUF"),
            "{e}"
        );
        let e = plan(PTR_CUDA, Some((0, -5)), ALL).unwrap_err();
        assert!(e.ends_with("dma-buf fd -5 is not a descriptor"), "{e}");
    }

    #[test]
    fn other_types_are_refused() {
        for t in [0, PTR_DMABUF, 3, -1] {
            let e = plan(t, None, ALL).unwrap_err();
            assert!(
                e.starts_with(&format!("memory type {t} is not supported by this device")),
                "{e}"
            );
        }
    }

    fn dev(support: i32) -> DeviceInfo {
        DeviceInfo {
            name: "d".into(),
            pci_path: None,
            guid: 0,
            speed_mbps: 1,
            port: 1,
            link_layer: LinkLayer::InfiniBand,
            limits: Default::default(),
            ptr_support: support,
            max_msg_bytes: 1 << 30,
        }
    }

    fn cfg(backup: bool, map: &str) -> HaCfg {
        HaCfg {
            max_poll: 1,
            keepalive: Duration::from_secs(1),
            enable_backup: backup,
            standby_map: map.into(),
            rto: Duration::from_secs(1),
            silence: Duration::ZERO,
            heartbeat: Duration::from_secs(1),
            failback: true,
            rearm_hold: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(1),
            traffic_class: None,
            home: Default::default(),
            eager_bytes: 0,
        }
    }

    #[test]
    fn advertised_support_is_what_both_paths_can_do() {
        let devs = vec![dev(ALL), dev(PTR_HOST | PTR_CUDA), dev(ALL)];
        // Standby of 0 is 1 (next index): dma-buf is dropped.
        assert_eq!(advertised(&devs, 0, &cfg(true, "")), PTR_HOST | PTR_CUDA);
        // With the map pointing 0 at 2, both can do everything.
        assert_eq!(advertised(&devs, 0, &cfg(true, "0:2")), ALL);
        // Without a standby, the device's own.
        assert_eq!(advertised(&devs, 0, &cfg(false, "")), ALL);
        assert_eq!(advertised(&devs[..1], 0, &cfg(true, "")), ALL);
        // Host memory is always there.
        assert_eq!(advertised(&[dev(0), dev(0)], 1, &cfg(true, "")), PTR_HOST);
    }

    #[test]
    fn flush_disable_variable() {
        assert!(!flush_disable_value(None));
        assert!(!flush_disable_value(Some("0")));
        assert!(!flush_disable_value(Some("no")));
        assert!(flush_disable_value(Some("1")));
        assert!(flush_disable_value(Some(" 2 ")));
    }

    #[test]
    fn flush_reads_the_last_non_empty_buffer() {
        assert_eq!(flush_target(&[]), None);
        assert_eq!(flush_target(&[0, 0]), None);
        assert_eq!(flush_target(&[8, 0, 4, 0]), Some(2));
        assert_eq!(flush_target(&[5]), Some(0));
    }
}
