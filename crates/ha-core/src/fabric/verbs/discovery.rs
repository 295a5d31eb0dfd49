//! Device discovery: every port of every RDMA device, its state, link layer, MTU, speed,
//! GUID and PCI path; which of them the fabric offers (active, IB or Ethernet, passing
//! `NCCL_IB_HCA`) and the `DeviceInfo` NCCL sees for each.

use super::super::{DeviceInfo, DeviceLimits, LinkLayer, Result};
use super::context::{Context, DevAttr, DeviceList};
use super::ffi;
use super::hca_filter::HcaFilter;
use ibverbs_sys as sys;

use crate::fabric::PTR_HOST;

/// One port as discovered.
#[derive(Clone, Debug)]
pub struct PortInfo {
    /// Index of the device in libibverbs' list.
    pub hca_index: usize,
    pub hca: String,
    pub port: u8,
    /// `ibv_port_state` (4 = ACTIVE).
    pub state: u32,
    pub link_layer: Option<LinkLayer>,
    /// Active MTU, `ibv_mtu` enum value.
    pub active_mtu: u32,
    pub speed_mbps: i32,
    pub lid: u16,
    pub gid_tbl_len: i32,
    /// `max_msg_sz` of the port.
    pub max_msg_sz: u32,
    pub guid: u64,
    pub pci_path: Option<String>,
    pub attr: DevAttr,
    /// Why the fabric does not offer this port, `None` if it does.
    pub excluded: Option<String>,
}

impl PortInfo {
    pub fn name(&self) -> String {
        format!("{}:{}", self.hca, self.port)
    }

    pub fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.name(),
            pci_path: self.pci_path.clone(),
            guid: self.guid,
            speed_mbps: self.speed_mbps,
            port: i32::from(self.port),
            link_layer: self.link_layer.unwrap_or(LinkLayer::InfiniBand),
            limits: DeviceLimits {
                max_qp: u32::try_from(self.attr.max_qp).ok(),
                max_cqe: u32::try_from(self.attr.max_cqe).ok(),
            },
            // Host memory; the fabric adds the GPU bits GPUDirect detection finds (`gdr`).
            ptr_support: PTR_HOST,
            max_msg_bytes: u64::from(self.max_msg_sz),
        }
    }
}

/// Port state name as `ibv_devinfo` prints it.
pub(crate) fn state_name(state: u32) -> &'static str {
    match state {
        sys::ibv_port_state::IBV_PORT_DOWN => "DOWN",
        sys::ibv_port_state::IBV_PORT_INIT => "INIT",
        sys::ibv_port_state::IBV_PORT_ARMED => "ARMED",
        sys::ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
        sys::ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// Link speed in Mbit/s from `active_width` × `active_speed`, NCCL's tables (lowest set
/// bit wins; unknown bits fall back to the last entry).
pub fn speed_mbps(active_width: u8, active_speed: u8) -> i32 {
    const WIDTHS: [i32; 5] = [1, 4, 8, 12, 2];
    const SPEEDS: [i32; 9] = [
        2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000,
    ];
    fn first_bit(v: u32, max: usize) -> usize {
        (0..max).find(|&i| v & (1 << i) != 0).unwrap_or(max)
    }
    let w = WIDTHS[first_bit(u32::from(active_width), WIDTHS.len() - 1)];
    let s = SPEEDS[first_bit(u32::from(active_speed), SPEEDS.len() - 1)];
    w * s
}

fn link_layer(raw: u8) -> Option<LinkLayer> {
    match u32::from(raw) {
        // Unspecified is what older InfiniBand drivers report.
        sys::IBV_LINK_LAYER_UNSPECIFIED | sys::IBV_LINK_LAYER_INFINIBAND => {
            Some(LinkLayer::InfiniBand)
        }
        sys::IBV_LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
        _ => None,
    }
}

/// `realpath /sys/class/infiniband/<dev>/device` (absent for virtual devices such as rxe).
pub fn pci_path(dev: &str) -> Option<String> {
    std::fs::canonicalize(format!("/sys/class/infiniband/{dev}/device"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Query every port of every device. Devices that cannot be opened are logged and skipped.
pub fn discover(list: &DeviceList, filter: &HcaFilter) -> Vec<PortInfo> {
    let mut out = Vec::new();
    for i in 0..list.len() {
        let name = list.name(i);
        let ctx = match Context::open(list, i) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("NET/HA verbs: skipping {name}: {e}");
                continue;
            }
        };
        let attr = match ctx.query_device() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("NET/HA verbs: skipping {name}: {e}");
                continue;
            }
        };
        for port in 1..=attr.phys_port_cnt {
            match query_port(list, i, &ctx, &name, port, attr, filter) {
                Ok(p) => out.push(p),
                Err(e) => tracing::warn!("NET/HA verbs: skipping {name}:{port}: {e}"),
            }
        }
    }
    out
}

fn query_port(
    list: &DeviceList,
    i: usize,
    ctx: &Context,
    name: &str,
    port: u8,
    attr: DevAttr,
    filter: &HcaFilter,
) -> Result<PortInfo> {
    let pa = ctx.query_port(port)?;
    let ll = link_layer(pa.link_layer);
    let excluded = if !filter.accepts(name, port) {
        Some("excluded by NCCL_IB_HCA".to_string())
    } else if ll.is_none() {
        Some(format!("unsupported link layer {}", pa.link_layer))
    } else if pa.state != sys::ibv_port_state::IBV_PORT_ACTIVE {
        Some(format!("port {}", state_name(pa.state)))
    } else {
        None
    };
    Ok(PortInfo {
        hca_index: i,
        hca: name.to_string(),
        port,
        state: pa.state,
        link_layer: ll,
        active_mtu: pa.active_mtu,
        speed_mbps: speed_mbps(pa.active_width, pa.active_speed),
        lid: pa.lid,
        gid_tbl_len: pa.gid_tbl_len,
        max_msg_sz: pa.max_msg_sz,
        guid: list.guid(i),
        pci_path: pci_path(name),
        attr,
        excluded,
    })
}

/// One line per port for logs and `NoDevice` messages.
pub fn describe(p: &PortInfo) -> String {
    format!(
        "{} [{}, {:?}, MTU {}, {} Mb/s{}]",
        p.name(),
        state_name(p.state),
        p.link_layer,
        ffi::mtu_bytes(p.active_mtu),
        p.speed_mbps,
        p.excluded
            .as_deref()
            .map(|e| format!(", not used: {e}"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_follow_nccls_tables() {
        // 4x EDR = 100 Gb/s, 4x HDR = 200, 4x NDR = 400, 1x SDR = 2.5, 2x HDR = 100.
        assert_eq!(speed_mbps(2, 32), 100_000);
        assert_eq!(speed_mbps(2, 64), 200_000);
        assert_eq!(speed_mbps(2, 128), 400_000);
        assert_eq!(speed_mbps(1, 1), 2_500);
        assert_eq!(speed_mbps(16, 64), 100_000);
        assert_eq!(speed_mbps(8, 16), 12 * 14_000);
        // Nothing set: last entries (NCCL behaves the same).
        assert_eq!(speed_mbps(0, 0), 2 * 200_000);
    }

    #[test]
    fn link_layers() {
        assert_eq!(link_layer(0), Some(LinkLayer::InfiniBand));
        assert_eq!(link_layer(1), Some(LinkLayer::InfiniBand));
        assert_eq!(link_layer(2), Some(LinkLayer::Ethernet));
        assert_eq!(link_layer(3), None);
    }

    #[test]
    fn device_info_budget() {
        let p = PortInfo {
            hca_index: 0,
            hca: "mlx5_0".into(),
            port: 2,
            state: sys::ibv_port_state::IBV_PORT_ACTIVE,
            link_layer: Some(LinkLayer::Ethernet),
            active_mtu: sys::IBV_MTU_4096,
            speed_mbps: 100_000,
            lid: 0,
            gid_tbl_len: 16,
            max_msg_sz: 1 << 30,
            guid: 0x1234,
            pci_path: Some("/sys/devices/pci0000:00/0000:00:02.0".into()),
            attr: DevAttr {
                max_qp: 131072,
                max_cqe: 4194303,
                ..Default::default()
            },
            excluded: None,
        };
        let d = p.device_info();
        assert_eq!(d.name, "mlx5_0:2");
        assert_eq!(d.port, 2);
        assert_eq!(
            d.limits,
            DeviceLimits {
                max_qp: Some(131072),
                max_cqe: Some(4194303)
            }
        );
        assert_eq!(d.ptr_support, PTR_HOST);
        assert_eq!(d.link_layer, LinkLayer::Ethernet);
        assert_eq!(d.max_msg_bytes, 1 << 30);
        assert!(describe(&p).contains("ACTIVE"));
        assert!(describe(&p).contains("MTU 4096"));
    }
}
