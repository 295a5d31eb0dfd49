//! High-availability policy shared by both sides: knobs (including what happens after a
//! failover: re-arm backoff, return home, drain), and the choice of the standby device.

use super::drain_list::DrainList;
use crate::fabric::DeviceInfo;
use std::sync::Arc;
use std::time::Duration;

/// The knobs a connection runs with.
#[derive(Clone, Debug)]
pub struct HaCfg {
    pub max_poll: usize,
    pub keepalive: Duration,
    pub enable_backup: bool,
    pub standby_map: String,
    pub rto: Duration,
    /// `HA_NCCL_SILENCE_MS`: how long the active link may leave data unacknowledged before the
    /// standby is asked whether the peer answers there (zero: off).
    pub silence: Duration,
    pub heartbeat: Duration,
    pub failback: bool,
    pub rearm_hold: Duration,
    pub handshake_timeout: Duration,
    /// Traffic class of the connection's queue pairs (`None`: the fabric's default). The
    /// connector offers its own in the handshake and the acceptor adopts it, as NCCL's IB
    /// transport does.
    pub traffic_class: Option<u8>,
    /// After the storm: re-arm backoff, return home, drain.
    pub home: HomeCfg,
    /// `HA_NCCL_SOCK_EAGER`: the largest eager send, and whether receive connections offer
    /// an eager ring (0: neither). `sock` only (see [`HaCfg::eager_ring`]).
    pub eager_bytes: usize,
}

/// What happens after a failover: how re-arm attempts back off, when traffic returns to the
/// preferred path, and the operators' drain list.
#[derive(Clone, Debug)]
pub struct HomeCfg {
    /// Cap of the re-arm attempts' doubling wait (`HA_NCCL_REARM_BACKOFF_MAX_MS`).
    pub rearm_backoff_max: Duration,
    /// Return to the preferred path once it is healthy again (`HA_NCCL_RETURN_HOME`).
    pub return_home: bool,
    /// `HA_NCCL_RETURN_HOLD_MS`.
    pub return_hold: Duration,
    /// `HA_NCCL_RETURN_HOLD_MAX_MS`.
    pub return_hold_max: Duration,
    /// The drain list (`HA_NCCL_DRAIN_FILE`; `None`: no drain control).
    pub drain: Option<Arc<DrainList>>,
    /// The soft timeout widens after false alarms (`HA_NCCL_RTO_ADAPTIVE`).
    pub rto_adaptive: bool,
}

impl Default for HomeCfg {
    /// The configuration table's defaults, without a drain list.
    fn default() -> HomeCfg {
        HomeCfg {
            rearm_backoff_max: Duration::from_secs(60),
            return_home: true,
            return_hold: Duration::from_secs(5),
            return_hold_max: Duration::from_secs(300),
            drain: None,
            rto_adaptive: true,
        }
    }
}

impl HaCfg {
    /// Whether a receive connection on `fabric` offers an eager ring: on `sock`, whose memory
    /// is always the host's (a copy out of the ring is a `memcpy`), with eager sends on.
    pub fn eager_ring(&self, fabric: &str) -> bool {
        self.eager_bytes > 0 && fabric == "sock"
    }

    /// How long a failover may take before it is reported as slow (a soft deadline: the
    /// connection keeps waiting), and how long a fenced path may take to flush before the
    /// connection ends (the flush is local: one that does not come means lost completions).
    pub fn failover_deadline(&self) -> Duration {
        self.rto * 4 + Duration::from_secs(2)
    }
    /// A tick that comes this long after the previous one came late: the process (or NCCL,
    /// which drives the ticks) did not run meanwhile, and the soft timers restart.
    pub fn late_tick(&self) -> Duration {
        (self.rto / 2).max(Duration::from_millis(100))
    }
}

/// Parse `HA_NCCL_STANDBY_MAP` (`p:s,p:s`); errors name the bad pair.
pub fn parse_standby_map(map: &str, ndev: usize) -> Result<Vec<(usize, usize)>, String> {
    let mut out = Vec::new();
    for pair in map.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = pair
            .split_once(':')
            .ok_or_else(|| format!("HA_NCCL_STANDBY_MAP: {pair:?} is not primary:standby"))?;
        let parse = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&d| d < ndev)
                .ok_or_else(|| {
                    format!("HA_NCCL_STANDBY_MAP: {v:?} in {pair:?} is not a device (0..{ndev})")
                })
        };
        let (a, b) = (parse(a)?, parse(b)?);
        if a == b {
            return Err(format!(
                "HA_NCCL_STANDBY_MAP: {pair:?} maps a device to itself"
            ));
        }
        out.push((a, b));
    }
    Ok(out)
}

/// The standby device for `primary`: the map's choice, else the other device of the same link
/// layer whose PCI path shares the longest prefix with the primary's (nearest in the PCI
/// tree), ties broken by the next index after the primary. `None` with a single device.
pub fn standby_for(primary: usize, devs: &[DeviceInfo], map: &[(usize, usize)]) -> Option<usize> {
    if let Some(&(_, s)) = map.iter().find(|(p, _)| *p == primary) {
        return Some(s);
    }
    let me = devs.get(primary)?;
    let n = devs.len();
    (1..n)
        .map(|k| (primary + k) % n)
        .filter(|&d| devs[d].link_layer == me.link_layer)
        .max_by_key(|&d| {
            let shared = match (&me.pci_path, &devs[d].pci_path) {
                (Some(a), Some(b)) => a
                    .split('/')
                    .zip(b.split('/'))
                    .take_while(|(x, y)| x == y)
                    .count(),
                _ => 0,
            };
            // Higher shared prefix first; among equals the nearest next index wins.
            (shared, n - (d + n - primary) % n)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::LinkLayer;

    fn dev(pci: Option<&str>, ll: LinkLayer) -> DeviceInfo {
        DeviceInfo {
            name: "d".into(),
            pci_path: pci.map(String::from),
            guid: 0,
            speed_mbps: 100_000,
            port: 1,
            link_layer: ll,
            limits: Default::default(),
            ptr_support: 1,
            max_msg_bytes: 1 << 30,
        }
    }

    #[test]
    fn nearest_pci_neighbour_of_the_same_link_layer() {
        let e = LinkLayer::Ethernet;
        let devs = vec![
            dev(Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"), e),
            dev(Some("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"), e),
            dev(Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1"), e),
            dev(
                Some("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.2"),
                LinkLayer::InfiniBand,
            ),
        ];
        assert_eq!(
            standby_for(0, &devs, &[]),
            Some(2),
            "same switch, same link layer"
        );
        assert_eq!(standby_for(2, &devs, &[]), Some(0));
        assert_eq!(
            standby_for(1, &devs, &[]),
            Some(2),
            "no close one: next index"
        );
        assert_eq!(standby_for(3, &devs, &[]), None, "only IB device");
    }

    #[test]
    fn rails_without_pci_pair_up_cyclically_and_map_overrides() {
        let e = LinkLayer::Ethernet;
        let devs = vec![dev(None, e), dev(None, e), dev(None, e)];
        assert_eq!(standby_for(0, &devs, &[]), Some(1));
        assert_eq!(standby_for(2, &devs, &[]), Some(0));
        assert_eq!(standby_for(0, &devs[..1], &[]), None);
        let map = parse_standby_map("0:2, 2:1", 3).unwrap();
        assert_eq!(standby_for(0, &devs, &map), Some(2));
        assert_eq!(standby_for(1, &devs, &map), Some(2));
        assert!(parse_standby_map("0:0", 3).is_err());
        assert!(parse_standby_map("0:5", 3)
            .unwrap_err()
            .contains("not a device"));
        assert!(parse_standby_map("01", 3).is_err());
    }
}
