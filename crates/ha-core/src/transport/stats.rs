//! Per-connection statistics: bytes and work requests per path, failovers, replays,
//! duplicates dropped, re-arms, standby losses, stale completions dropped, late ticks, the
//! last failover. Logged at close and written as one JSON
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
            "{{\"comm\":\"{comm}\",\"role\":\"{role}\",\"devices\":[{}],\"bytes\":[{},{}],\"wrs\":[{},{}],\"failovers\":{},\"replays\":{},\"duplicates_dropped\":{},\"rearms\":{},\"rearm_failed\":{},\"standby_lost\":{},\"stale_dropped\":{},\"late_ticks\":{},\"last_failover_unix_ms\":{},\"last_failover_us\":{},\"resources\":{}}}",
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
            resources.to_json()
        )
    }

    /// Log at close and append to the stats file (if any).
    pub fn report(&self, comm: &str, role: &str, devices: &[String], file: &str) {
        let json = self.to_json(comm, role, devices, &counters::snapshot());
        tracing::info!("NET/HA : stats {json}");
        if !file.is_empty() {
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(file)
                .and_then(|mut f| writeln!(f, "{json}"));
            if let Err(e) = written {
                tracing::warn!("NET/HA : cannot write HA_NCCL_STATS_FILE={file}: {e}");
            }
        }
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
            "{\"comm\":\"c1\",\"role\":\"send\",\"devices\":[\"sock:a\",\"sock:b\"],\"bytes\":[10,20],\"wrs\":[1,2],\"failovers\":1,\"replays\":3,\"duplicates_dropped\":0,\"rearms\":1,\"rearm_failed\":6,\"standby_lost\":2,\"stale_dropped\":3,\"late_ticks\":4,\"last_failover_unix_ms\":5,\"last_failover_us\":700,\"resources\":{\"pds\":2,\"qps\":4,\"cqs\":2,\"mrs\":3,\"threads\":9,\"sockets\":12,\"connections\":2}}"
        );
    }
}
