//! Per-connection statistics, readable while the connection lives: bytes and work requests per
//! path, failovers, replays, duplicates dropped, re-arms, standby losses, stale completions
//! dropped, late ticks, the last failover, which path is active and what the standby is worth.
//!
//! The link counts into a [`ConnStats`] of atomic counters ([`live`]) at the points where it
//! already counted; with `HA_NCCL_STATS_FILE` set, every connection is registered with the
//! process's stats writer ([`writer`]): a thread that lives while some registered connection
//! lives (and stops with the last, as the engine's progress thread does) and appends one
//! `"event":"periodic"` line per connection every `HA_NCCL_STATS_INTERVAL_MS`, also for
//! connections NCCL is not calling into. Events are appended when they happen, by the thread
//! that saw them: `open`, `failover`, `standby_lost`, `rearmed`, `switch` (every change of the
//! active path — `"kind":"failover|return|drain"` — with the data bytes each path had carried
//! then) and, at close, `closed` (with
//! the process's live resource counters, see `fabric::counters`). Every line is one flat JSON
//! object ([`format`]) whose `"event"` field says what it is; readers ignore fields they do not
//! know, so new events (say, a planned return to the preferred path) only add a name.

mod format;
mod live;
mod writer;

#[cfg(test)]
mod tests;

pub use format::{json_str, Field};
pub use live::{
    ConnStats, Counter, LiveStats, PathCounters, PathMeter, Standby, State, SwitchKind,
};
pub use writer::{interval, set_interval};

/// The counters of one connection at one moment (tests and the closing line).
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

/// Wall-clock time now, in ms since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Wall-clock time (ms since the Unix epoch) of the earlier moment `t`.
pub fn unix_ms_at(t: std::time::Instant) -> u64 {
    unix_ms().saturating_sub(t.elapsed().as_millis() as u64)
}
