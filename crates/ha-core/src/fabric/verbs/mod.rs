//! `verbs` fabric: real InfiniBand / RoCE through `ibverbs-sys` (libibverbs).
//!
//! * Discovery ([`discovery`]): every port of every device; the fabric offers the ACTIVE
//!   InfiniBand/Ethernet ports that pass `NCCL_IB_HCA` ([`hca_filter`]), one fabric device
//!   per port, named `dev:port`. [`VerbsFabric::ports`] lists all of them, with the reason a
//!   port is not offered.
//! * Objects: one PD per `open_pd`; the device context is shared by the PDs of its ports
//!   and stays open while any PD, CQ, QP or MR of it lives. Each open device runs an
//!   async-event thread ([`hca`]) and each CQ a completion-channel thread ([`cq`]) that rings
//!   the engine's doorbell; all stop when the objects are dropped.
//! * Queue pairs ([`qp`]): RC, NCCL's attributes (`rnr_retry` 7, `min_rnr_timer` 12,
//!   `hop_limit` 255), `timeout`/`retry_cnt` from [`VerbsConfig`], traffic class and service
//!   level from `NCCL_IB_TC`/`NCCL_IB_SL`, GID chosen ([`gid`]) from the live table at every
//!   QP creation (`NCCL_IB_GID_INDEX` overrides). The endpoint blob is [`endpoint`].
//! * Health ([`events`]): [`VerbsFabric::port_events`] gives each device's health flag,
//!   event counter and recent async events.
//! * Memory ([`gdr`]): host memory always; GPU memory (`NCCL_PTR_CUDA` through
//!   nvidia-peermem, `NCCL_PTR_DMABUF` through dma-buf fds) where detection finds it, per
//!   device, with one INFO line per device saying whether GPU Direct RDMA is enabled and why.

pub mod apm;
pub mod config;
pub mod context;
mod cq;
pub mod discovery;
mod domain;
pub mod endpoint;
pub mod events;
mod ffi;
pub mod gdr;
pub mod gid;
mod hca;
pub mod hca_filter;
mod inline;
mod mr;
mod pd;
mod qp;
mod threads;

use super::{DeviceInfo, Fabric, FabricError, ProtectionDomain, Result};
pub use config::VerbsConfig;
use config::{process_env, Resolved};
use context::DeviceList;
use discovery::PortInfo;
pub use events::{AsyncEvent, AsyncEventKind, PortEvents};
use gdr::{DeviceGdr, HostGdr};
use hca::Hca;
use parking_lot::Mutex;
use pd::VerbsPd;
pub use qp::inline_sends;
use std::sync::{Arc, Weak};
pub use threads::live_threads;

/// The verbs fabric.
pub struct VerbsFabric {
    cfg: Resolved,
    /// Every discovered port (offered or not).
    ports: Vec<PortInfo>,
    /// Offered ports: index into `ports`, per fabric device.
    offered: Vec<usize>,
    devices: Vec<DeviceInfo>,
    /// GPUDirect RDMA per fabric device, and the host facts it was decided from.
    gdr: Vec<DeviceGdr>,
    host_gdr: HostGdr,
    events: Vec<Arc<PortEvents>>,
    /// Open devices by libibverbs index.
    hcas: Mutex<Vec<Weak<Hca>>>,
    list: DeviceList,
}

/// Open the verbs fabric (the plugin's entry point). Fails with `NoDevice` when the host
/// has no usable RDMA port.
pub fn open(cfg: &VerbsConfig) -> Result<Arc<dyn Fabric>> {
    Ok(open_verbs(cfg)?)
}

/// Open the verbs fabric with its concrete type (health and discovery details).
pub fn open_verbs(cfg: &VerbsConfig) -> Result<Arc<VerbsFabric>> {
    let cfg = cfg.resolve(&process_env)?;
    // The CUDA side first: on a GPU host without RDMA NICs the log then says what GPUDirect
    // would have had before the fabric reports that there is no device.
    let host_gdr = HostGdr::gather_system(cfg.gdr);
    tracing::info!(init = true, "NET/HA verbs: {}", host_gdr.describe());
    let list = DeviceList::get()?;
    if list.is_empty() {
        tracing::info!(
            init = true,
            "NET/HA verbs: GPU Direct RDMA disabled: no RDMA device"
        );
        return Err(FabricError::NoDevice(
            "no RDMA device (libibverbs lists none)".into(),
        ));
    }
    let ports = discovery::discover(&list, &cfg.hca);
    for p in &ports {
        tracing::info!("NET/HA verbs: {}", discovery::describe(p));
    }
    let offered: Vec<usize> = (0..ports.len())
        .filter(|&i| ports[i].excluded.is_none())
        .collect();
    if offered.is_empty() {
        let seen: Vec<String> = ports.iter().map(discovery::describe).collect();
        return Err(FabricError::NoDevice(format!(
            "no usable RDMA port among: {}",
            if seen.is_empty() {
                "(none could be queried)".to_string()
            } else {
                seen.join("; ")
            }
        )));
    }
    let gdr = detect_gdr(&list, &ports, &offered, &host_gdr);
    let named: Vec<(String, DeviceGdr)> = offered
        .iter()
        .zip(&gdr)
        .map(|(&i, g)| (ports[i].name(), g.clone()))
        .collect();
    gdr::require(cfg.gdr, &named).map_err(FabricError::System)?;
    let devices: Vec<DeviceInfo> = offered
        .iter()
        .zip(&gdr)
        .map(|(&i, g)| DeviceInfo {
            ptr_support: g.ptr_support,
            ..ports[i].device_info()
        })
        .collect();
    let events = offered
        .iter()
        .map(|&i| Arc::new(PortEvents::new(ports[i].name(), true)))
        .collect();
    Ok(Arc::new(VerbsFabric {
        cfg,
        hcas: Mutex::new((0..list.len()).map(|_| Weak::new()).collect()),
        ports,
        offered,
        devices,
        gdr,
        host_gdr,
        events,
        list,
    }))
}

/// GPUDirect RDMA of each offered port: the dma-buf probe runs once per device (HCA), and
/// only when its answer can matter. One INFO line per port.
fn detect_gdr(
    list: &DeviceList,
    ports: &[PortInfo],
    offered: &[usize],
    host: &HostGdr,
) -> Vec<DeviceGdr> {
    let mut probes: Vec<(usize, Option<gdr::dmabuf::Probe>)> = Vec::new();
    offered
        .iter()
        .map(|&i| {
            let p = &ports[i];
            let probe = if !host.wants_probe() {
                None
            } else if let Some((_, r)) = probes.iter().find(|(h, _)| *h == p.hca_index) {
                *r
            } else {
                let r = gdr::dmabuf::probe_device(list, p.hca_index)
                    .map_err(|e| tracing::warn!("NET/HA verbs: {}: dma-buf probe: {e}", p.hca))
                    .ok();
                probes.push((p.hca_index, r));
                r
            };
            let g = gdr::assess(host, probe);
            tracing::info!(init = true, "NET/HA verbs: {}: {}", p.name(), g.line());
            g
        })
        .collect()
}

impl VerbsFabric {
    /// Every discovered port, including those not offered (`excluded` says why).
    pub fn ports(&self) -> &[PortInfo] {
        &self.ports
    }

    /// Discovery details of fabric device `dev`.
    pub fn port_info(&self, dev: usize) -> Option<&PortInfo> {
        self.offered.get(dev).map(|&i| &self.ports[i])
    }

    /// Health flag, event counter and recent async events of fabric device `dev`. Events
    /// are read while the device is open (some PD of it lives); opening a PD refreshes the
    /// flag from the port state.
    pub fn port_events(&self, dev: usize) -> Option<Arc<PortEvents>> {
        self.events.get(dev).cloned()
    }

    /// GPUDirect RDMA of fabric device `dev` (what its `ptr_support` says, and why).
    pub fn gdr(&self, dev: usize) -> Option<&DeviceGdr> {
        self.gdr.get(dev)
    }

    /// The process-wide GPUDirect facts (CUDA driver, peer-memory client, `HA_NCCL_GDR`).
    pub fn host_gdr(&self) -> &HostGdr {
        &self.host_gdr
    }

    /// The validated configuration in effect.
    pub fn config(&self) -> &Resolved {
        &self.cfg
    }

    /// The GID (index, value) a queue pair created now on `dev` would use.
    pub fn current_gid(&self, dev: usize) -> Result<(u32, [u8; 16])> {
        let p = self
            .port_info(dev)
            .ok_or_else(|| FabricError::InvalidArgument(format!("no verbs device {dev}")))?;
        let hca = self.hca(p.hca_index)?;
        let pa = hca.ctx.query_port(p.port)?;
        let table = hca
            .ctx
            .gid_table(p.port, hca.attr.phys_port_cnt, pa.gid_tbl_len)?;
        let ll = p.link_layer.unwrap_or(super::LinkLayer::InfiniBand);
        let g = gid::select_gid(&table, ll, self.cfg.gid_index)
            .map_err(|e| FabricError::System(format!("{}: {e}", p.name())))?;
        Ok((g.index, g.gid))
    }

    /// The open device `hca_index`, opening it (and starting its event thread) if needed.
    fn hca(&self, hca_index: usize) -> Result<Arc<Hca>> {
        let mut hcas = self.hcas.lock();
        if let Some(h) = hcas[hca_index].upgrade() {
            return Ok(h);
        }
        let ports: Vec<_> = self
            .offered
            .iter()
            .zip(&self.events)
            .filter(|(&i, _)| self.ports[i].hca_index == hca_index)
            .map(|(&i, e)| (self.ports[i].port, e.clone()))
            .collect();
        let h = Arc::new(Hca::open(&self.list, hca_index, ports)?);
        hcas[hca_index] = Arc::downgrade(&h);
        Ok(h)
    }
}

impl Fabric for VerbsFabric {
    fn kind(&self) -> &'static str {
        "verbs"
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn port_healthy(&self, dev: usize) -> bool {
        self.events.get(dev).is_none_or(|e| e.healthy())
    }

    fn open_pd(&self, dev: usize) -> Result<Arc<dyn ProtectionDomain>> {
        let p = self
            .port_info(dev)
            .ok_or_else(|| FabricError::InvalidArgument(format!("no verbs device {dev}")))?;
        let hca = self.hca(p.hca_index)?;
        Ok(Arc::new(VerbsPd::open(
            hca,
            dev,
            p.name(),
            p.port,
            self.cfg.clone(),
            self.events[dev].clone(),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_devices_reports_no_device() {
        if !DeviceList::get().map(|l| l.is_empty()).unwrap_or(true) {
            eprintln!("skipped: this host has RDMA devices (covered by tests/verbs_rxe/)");
            return;
        }
        match open(&VerbsConfig::default()) {
            Err(FabricError::NoDevice(msg)) => assert!(msg.contains("no RDMA device"), "{msg}"),
            Err(e) => panic!("expected NoDevice, got {e}"),
            Ok(_) => panic!("expected NoDevice, got a fabric"),
        }
    }

    #[test]
    fn bad_configuration_is_rejected_before_discovery() {
        let cfg = VerbsConfig {
            qp_retry_cnt: 9,
            ..Default::default()
        };
        assert!(matches!(open(&cfg), Err(FabricError::InvalidArgument(_))));
    }
}
