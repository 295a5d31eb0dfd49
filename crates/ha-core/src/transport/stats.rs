//! Per-connection statistics: bytes and work requests per path, failovers, replays,
//! duplicates dropped, re-arms, standby losses, stale completions dropped, late ticks, the
//! last failover, returns home, drains. Each switch of path is also appended to
//! `HA_NCCL_STATS_FILE` as an event line ([`SwitchEvent`]) when it happens. Logged at close and
//! written as one JSON
//! line per connection to `HA_NCCL_STATS_FILE`, together with the process's live resource
//! counters at that moment (`"resources"`, see `fabric::counters`; the closing connection's
//! own resources are still included).

use crate::fabric::counters::{self, Resources};
use std::io::Write;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub bytes: [u64; 2],
    pub wrs: [u64; 2],
    pub failovers: u64,
    pub replays: u64,
    pub duplicates: u64,
    pub rearms: u64,
    /// Re-armed paths that failed before they verified (a re-arm tried again).
    pub rearm_failed: u64,
    /// Standby paths lost (fenced while not carrying traffic). A drill that never cuts the
    /// standby expects 0: each one is a false alarm.
    pub standby_lost: u64,
    /// Data completions of a path other than the active one after the switch, dropped.
    pub stale_dropped: u64,
    /// Ticks that came late (the process or its caller did not run): soft timers restarted.
    pub late_ticks: u64,
    /// Unix time (ms) of the last failover.
    pub last_failover_unix_ms: u64,
    /// Duration of the last failover (detection to switch), µs.
    pub last_failover_us: u64,
    /// Planned switches back to the preferred path (return home).
    pub returns: u64,
    /// Planned switches off a drained device.
    pub drains: u64,
    /// Planned switches abandoned (refused by the peer, or the target failed first).
    pub plans_aborted: u64,
    /// Re-arm attempts started.
    pub rearm_attempts: u64,
}

/// What moved traffic from one path to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchKind {
    Failover,
    Return,
    Drain,
}

impl SwitchKind {
    pub fn name(self) -> &'static str {
        match self {
            SwitchKind::Failover => "failover",
            SwitchKind::Return => "return",
            SwitchKind::Drain => "drain",
        }
    }
}

/// One switch of a connection, as an event line of the stats file: the data bytes each path
/// had carried when it happened (so a run's lines show bytes per path before a cut, during
/// the failover and after the return).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchEvent<'a> {
    pub comm: &'a str,
    pub role: &'a str,
    pub kind: SwitchKind,
    pub from: usize,
    pub to: usize,
    pub epoch: u32,
    pub took_us: u64,
    pub bytes: [u64; 2],
}

impl SwitchEvent<'_> {
    pub fn to_json(&self, unix_ms: u64) -> String {
        format!(
            "{{\"event\":\"switch\",\"kind\":\"{}\",\"comm\":\"{}\",\"role\":\"{}\",\"from\":{},\"to\":{},\"epoch\":{},\"took_us\":{},\"bytes\":[{},{}],\"unix_ms\":{unix_ms}}}",
            self.kind.name(),
            self.comm.replace('"', ""),
            self.role,
            self.from,
            self.to,
            self.epoch,
            self.took_us,
            self.bytes[0],
            self.bytes[1]
        )
    }

    /// Append the event to the stats file (if any).
    pub fn write(&self, file: &str) {
        append(file, &self.to_json(unix_ms()));
    }
}

impl Stats {
    pub fn to_json(
        &self,
        comm: &str,
        role: &str,
        devices: &[String],
        resources: &Resources,
    ) -> String {
        let devs: Vec<String> = devices
            .iter()
            .map(|d| format!("\"{}\"", d.replace('"', "")))
            .collect();
        format!(
            "{{\"comm\":\"{comm}\",\"role\":\"{role}\",\"devices\":[{}],\"bytes\":[{},{}],\"wrs\":[{},{}],\"failovers\":{},\"replays\":{},\"duplicates_dropped\":{},\"rearms\":{},\"rearm_failed\":{},\"standby_lost\":{},\"stale_dropped\":{},\"late_ticks\":{},\"last_failover_unix_ms\":{},\"last_failover_us\":{},\"returns\":{},\"drains\":{},\"plans_aborted\":{},\"rearm_attempts\":{},\"resources\":{}}}",
            devs.join(","),
            self.bytes[0],
            self.bytes[1],
            self.wrs[0],
            self.wrs[1],
            self.failovers,
            self.replays,
            self.duplicates,
            self.rearms,
            self.rearm_failed,
            self.standby_lost,
            self.stale_dropped,
            self.late_ticks,
            self.last_failover_unix_ms,
            self.last_failover_us,
            self.returns,
            self.drains,
            self.plans_aborted,
            self.rearm_attempts,
            resources.to_json()
        )
    }

    /// Log at close and append to the stats file (if any).
    pub fn report(&self, comm: &str, role: &str, devices: &[String], file: &str) {
        let json = self.to_json(comm, role, devices, &counters::snapshot());
        tracing::info!("NET/HA : stats {json}");
        append(file, &json);
    }
}

/// Append one line to the stats file (none when `file` is empty).
fn append(file: &str, line: &str) {
    if file.is_empty() {
        return;
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        tracing::warn!("NET/HA : cannot write HA_NCCL_STATS_FILE={file}: {e}");
    }
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_every_field() {
        let s = Stats {
            bytes: [10, 20],
            wrs: [1, 2],
            failovers: 1,
            replays: 3,
            duplicates: 0,
            rearms: 1,
            rearm_failed: 6,
            standby_lost: 2,
            stale_dropped: 3,
            late_ticks: 4,
            last_failover_unix_ms: 5,
            last_failover_us: 700,
            returns: 2,
            drains: 1,
            plans_aborted: 3,
            rearm_attempts: 9,
        };
        let r = Resources {
            pds: 2,
            qps: 4,
            cqs: 2,
            mrs: 3,
            threads: 9,
            sockets: 12,
            connections: 2,
        };
        let j = s.to_json("c1", "send", &["sock:a".into(), "sock:b".into()], &r);
        assert_eq!(
            j,
            "{\"comm\":\"c1\",\"role\":\"send\",\"devices\":[\"sock:a\",\"sock:b\"],\"bytes\":[10,20],\"wrs\":[1,2],\"failovers\":1,\"replays\":3,\"duplicates_dropped\":0,\"rearms\":1,\"rearm_failed\":6,\"standby_lost\":2,\"stale_dropped\":3,\"late_ticks\":4,\"last_failover_unix_ms\":5,\"last_failover_us\":700,\"returns\":2,\"drains\":1,\"plans_aborted\":3,\"rearm_attempts\":9,\"resources\":{\"pds\":2,\"qps\":4,\"cqs\":2,\"mrs\":3,\"threads\":9,\"sockets\":12,\"connections\":2}}"
        );
    }

    #[test]
    fn switch_event_line() {
        let e = SwitchEvent {
            comm: "send [dev 0 | dev 1]",
            role: "send",
            kind: SwitchKind::Return,
            from: 1,
            to: 0,
            epoch: 2,
            took_us: 350,
            bytes: [4096, 512],
        };
        assert_eq!(
            e.to_json(17),
            "{\"event\":\"switch\",\"kind\":\"return\",\"comm\":\"send [dev 0 | dev 1]\",\"role\":\"send\",\"from\":1,\"to\":0,\"epoch\":2,\"took_us\":350,\"bytes\":[4096,512],\"unix_ms\":17}"
        );
    }
}
