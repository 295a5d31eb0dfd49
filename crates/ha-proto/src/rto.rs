//! The adaptive soft timeout (`HA_NCCL_RTO_ADAPTIVE`), a pure function of the times it is given.
//!
//! The soft RTO (`HA_NCCL_RTO_MS`) moves traffic off a path whose oldest work request has waited
//! that long. Too short for a host or fabric, it fails over healthy paths: each such false alarm
//! costs a stall and a replay, and the standby's redundancy until the old path is re-armed. A
//! failover is judged a false alarm when the path it left proves healthy again at the first
//! re-arm attempt (no port event, nothing to repair: the path only was slow). Each false alarm
//! doubles the timeout, up to [`MAX_FACTOR`] × the configured one; after [`QUIET`] without a
//! false alarm it halves again, step by step, down to the configured value. Disabled, it is the
//! configured value, always.

use std::time::{Duration, Instant};

/// The timeout grows to at most this many times the configured one.
pub const MAX_FACTOR: u32 = 8;
/// A quiet period this long (no false alarm) narrows the timeout one step.
pub const QUIET: Duration = Duration::from_secs(120);

/// The soft timeout of one connection.
#[derive(Clone, Debug)]
pub struct AdaptiveRto {
    base: Duration,
    current: Duration,
    enabled: bool,
    /// The last change (widening or narrowing); quiet periods count from it.
    changed: Option<Instant>,
}

/// A change of the timeout, to be logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtoChange {
    pub from: Duration,
    pub to: Duration,
}

impl AdaptiveRto {
    /// The configured timeout `base`; `enabled` = `HA_NCCL_RTO_ADAPTIVE`.
    pub fn new(base: Duration, enabled: bool) -> AdaptiveRto {
        AdaptiveRto {
            base,
            current: base,
            enabled,
            changed: None,
        }
    }

    /// The timeout in force.
    pub fn current(&self) -> Duration {
        self.current
    }

    /// Whether the timeout in force differs from the configured one.
    pub fn adapted(&self) -> bool {
        self.current != self.base
    }

    /// A soft-timeout failover turned out to be a false alarm at `now`: widen (doubling, up to
    /// [`MAX_FACTOR`] × the configured value). `Some` when the timeout changed.
    pub fn false_alarm(&mut self, now: Instant) -> Option<RtoChange> {
        if !self.enabled {
            return None;
        }
        let cap = self.base * MAX_FACTOR;
        let to = (self.current * 2).min(cap);
        // A false alarm restarts the quiet period even at the cap.
        self.changed = Some(now);
        if to == self.current {
            return None;
        }
        let from = std::mem::replace(&mut self.current, to);
        Some(RtoChange { from, to })
    }

    /// Called as time passes: after [`QUIET`] since the last change, narrow one step (halving,
    /// not below the configured value). `Some` when the timeout changed.
    pub fn tick(&mut self, now: Instant) -> Option<RtoChange> {
        let since = self.changed?;
        if self.current <= self.base || now.saturating_duration_since(since) < QUIET {
            return None;
        }
        let to = (self.current / 2).max(self.base);
        self.changed = Some(now);
        let from = std::mem::replace(&mut self.current, to);
        Some(RtoChange { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn false_alarms_double_the_timeout_up_to_its_bound() {
        let t0 = Instant::now();
        let mut r = AdaptiveRto::new(S, true);
        assert_eq!(r.current(), S);
        assert!(!r.adapted());
        let mut seen = Vec::new();
        for i in 0..6 {
            if let Some(c) = r.false_alarm(t0 + S * i) {
                seen.push((c.from.as_secs(), c.to.as_secs()));
            }
        }
        assert_eq!(seen, [(1, 2), (2, 4), (4, 8)]);
        assert_eq!(r.current(), S * MAX_FACTOR);
        assert!(r.adapted());
    }

    #[test]
    fn a_quiet_period_narrows_step_by_step_back_to_the_configured_value() {
        let t0 = Instant::now();
        let mut r = AdaptiveRto::new(S, true);
        r.false_alarm(t0);
        r.false_alarm(t0);
        assert_eq!(r.current(), 4 * S);
        // Not before a whole quiet period.
        assert_eq!(r.tick(t0 + QUIET - S), None);
        assert_eq!(
            r.tick(t0 + QUIET),
            Some(RtoChange {
                from: 4 * S,
                to: 2 * S
            })
        );
        // The next step needs another quiet period from that change.
        assert_eq!(r.tick(t0 + QUIET + S), None);
        assert_eq!(
            r.tick(t0 + 2 * QUIET),
            Some(RtoChange { from: 2 * S, to: S })
        );
        assert_eq!(r.tick(t0 + 10 * QUIET), None);
        assert_eq!(r.current(), S);
    }

    #[test]
    fn a_false_alarm_during_the_quiet_period_restarts_it() {
        let t0 = Instant::now();
        let mut r = AdaptiveRto::new(S, true);
        r.false_alarm(t0);
        r.false_alarm(t0 + QUIET - S); // 2 s -> 4 s, quiet period from here
        assert_eq!(r.tick(t0 + QUIET + S), None);
        assert_eq!(r.tick(t0 + 2 * QUIET - S).map(|c| c.to), Some(2 * S));
        // At the cap, a false alarm changes nothing but still restarts the quiet period.
        let mut r = AdaptiveRto::new(S, true);
        for _ in 0..4 {
            r.false_alarm(t0);
        }
        assert_eq!(r.false_alarm(t0 + QUIET - S), None);
        assert_eq!(r.tick(t0 + QUIET + S), None);
        assert_eq!(r.tick(t0 + 2 * QUIET).map(|c| c.to), Some(4 * S));
    }

    #[test]
    fn disabled_it_is_the_configured_value_always() {
        let t0 = Instant::now();
        let mut r = AdaptiveRto::new(S, false);
        for i in 0..10 {
            assert_eq!(r.false_alarm(t0 + S * i), None);
            assert_eq!(r.tick(t0 + QUIET * i), None);
        }
        assert_eq!(r.current(), S);
    }
}
