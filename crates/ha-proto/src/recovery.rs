//! When to try again and when to go home, as pure functions of the time they are given (no
//! clock of their own, so tests drive them through hours in microseconds):
//!
//! - [`Backoff`]: the schedule of re-arm attempts of a failed path. The first attempt waits the
//!   hold-down (`HA_NCCL_REARM_HOLD_MS`) after the failure; each failed attempt doubles the wait,
//!   up to a cap (`HA_NCCL_REARM_BACKOFF_MAX_MS`); attempts never stop while the connection
//!   lives. The port coming back (an asynchronous event) starts the schedule over. It also says
//!   which attempt outcomes are worth a log line: the first failure of an outage and the end of
//!   it, not every attempt.
//! - [`ReturnHold`]: how long the preferred path must have been healthy again before traffic
//!   returns to it (`HA_NCCL_RETURN_HOLD_MS`), with hysteresis: a return followed by a failure of
//!   that path within `HA_NCCL_RETURN_HOLD_MAX_MS` doubles the hold (up to that bound), so a
//!   flapping link does not pull traffic back and forth; a return that lasts that long resets it.

use std::time::{Duration, Instant};

/// Re-arm schedule of one failed path.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    /// Wait after the next failed attempt.
    delay: Duration,
    /// When the next attempt may start (`None`: one is in progress, or the path is fine).
    next: Option<Instant>,
    /// Attempts started since the path was lost.
    attempts: u64,
    /// Attempts that failed since the path was lost.
    failures: u64,
    /// When the path was lost (`None`: the path is fine).
    since: Option<Instant>,
}

/// What a failed attempt means for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Wait before the next attempt.
    pub wait: Duration,
    /// The first failure of this outage (say it once; later ones are quiet).
    pub first: bool,
}

impl Backoff {
    /// A schedule starting at `base` (the hold-down), doubling to `cap` (at least `base`).
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            delay: base,
            next: None,
            attempts: 0,
            failures: 0,
            since: None,
        }
    }

    /// The path failed at `now`: the first attempt after the hold-down. A path lost again
    /// before it was re-armed keeps its outage (and its count).
    pub fn lost(&mut self, now: Instant) {
        if self.since.is_none() {
            self.since = Some(now);
            self.attempts = 0;
            self.failures = 0;
        }
        self.delay = self.base;
        self.next = Some(now + self.base);
    }

    /// Whether an attempt may start at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|t| now >= t)
    }

    /// When the next attempt may start, if one is scheduled.
    pub fn next_at(&self) -> Option<Instant> {
        self.next
    }

    /// An attempt starts at `now` (nothing more is scheduled until it ends).
    pub fn started(&mut self) {
        self.attempts += 1;
        self.next = None;
    }

    /// The attempt in progress (or one that could not start) failed at `now`: the next one
    /// waits the current delay, which doubles up to the cap.
    pub fn failed(&mut self, now: Instant) -> Retry {
        self.failures += 1;
        let wait = self.delay;
        self.next = Some(now + wait);
        self.delay = (self.delay * 2).min(self.cap);
        Retry {
            wait,
            first: self.failures == 1,
        }
    }

    /// The path's port came back up at `now` (an asynchronous event): start over from the
    /// hold-down rather than wait out a long backoff.
    pub fn port_up(&mut self, now: Instant) {
        if self.since.is_none() {
            return;
        }
        self.delay = self.base;
        let soon = now + self.base;
        self.next = Some(self.next.map_or(soon, |t| t.min(soon)));
    }

    /// The path is back (verified): the outage's attempts and duration; the schedule is reset.
    pub fn done(&mut self, now: Instant) -> (u64, Duration) {
        let out = (
            self.attempts,
            self.since
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t)),
        );
        *self = Backoff::new(self.base, self.cap);
        out
    }

    /// Attempts started in this outage.
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    /// The wait the next failure will impose.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

/// The hold before returning to the preferred path, with hysteresis.
#[derive(Clone, Debug)]
pub struct ReturnHold {
    base: Duration,
    max: Duration,
    hold: Duration,
    /// The last return, while it is within the flap window.
    returned_at: Option<Instant>,
}

impl ReturnHold {
    pub fn new(base: Duration, max: Duration) -> ReturnHold {
        ReturnHold {
            base,
            max: max.max(base),
            hold: base,
            returned_at: None,
        }
    }

    /// How long the preferred path must have been healthy before traffic returns to it.
    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// Whether a path healthy since `since` has been healthy long enough at `now`.
    pub fn ready(&self, since: Instant, now: Instant) -> bool {
        now.saturating_duration_since(since) >= self.hold
    }

    /// Traffic returned to the preferred path at `now`.
    pub fn returned(&mut self, now: Instant) {
        self.settle(now);
        self.returned_at = Some(now);
    }

    /// The preferred path failed at `now`: when that is within the flap window of the last
    /// return, the hold doubles (bounded); `Some(new hold)` then.
    pub fn home_failed(&mut self, now: Instant) -> Option<Duration> {
        let t = self.returned_at.take()?;
        if now.saturating_duration_since(t) >= self.max {
            self.hold = self.base;
            return None;
        }
        self.hold = (self.hold * 2).min(self.max);
        Some(self.hold)
    }

    /// A return that lasted the flap window without a failure resets the hold.
    pub fn settle(&mut self, now: Instant) {
        if self
            .returned_at
            .is_some_and(|t| now.saturating_duration_since(t) >= self.max)
        {
            self.returned_at = None;
            self.hold = self.base;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn attempts_back_off_to_the_cap_and_never_stop() {
        let t0 = Instant::now();
        let mut b = Backoff::new(200 * MS, 60_000 * MS);
        b.lost(t0);
        assert!(!b.due(t0 + 199 * MS), "hold-down");
        let mut now = t0 + 200 * MS;
        let mut waits = Vec::new();
        for _ in 0..500 {
            assert!(b.due(now), "an attempt is due at {:?}", now - t0);
            b.started();
            assert!(!b.due(now), "one attempt at a time");
            let r = b.failed(now);
            assert_eq!(r.first, waits.is_empty(), "only the first failure is said");
            waits.push(r.wait);
            now += r.wait;
        }
        assert_eq!(
            &waits[..5],
            &[200 * MS, 400 * MS, 800 * MS, 1600 * MS, 3200 * MS]
        );
        assert_eq!(waits[9], 60_000 * MS, "capped");
        assert!(waits[9..].iter().all(|&w| w == 60_000 * MS));
        assert_eq!(b.attempts(), 500, "never gives up");
        let (attempts, down) = b.done(now);
        assert_eq!(attempts, 500);
        assert_eq!(down, now - t0);
        assert!(
            !b.due(now + 3_600_000 * MS),
            "nothing scheduled once the path is back"
        );
    }

    #[test]
    fn the_port_coming_back_starts_the_schedule_over() {
        let t0 = Instant::now();
        let mut b = Backoff::new(100 * MS, 10_000 * MS);
        b.lost(t0);
        let mut now = t0 + 100 * MS;
        for _ in 0..8 {
            b.started();
            now += b.failed(now).wait;
        }
        assert_eq!(b.delay(), 10_000 * MS);
        b.started();
        assert_eq!(b.failed(now).wait, 10_000 * MS);
        b.port_up(now + 1_000 * MS);
        assert_eq!(
            b.next_at(),
            Some(now + 1_100 * MS),
            "one hold-down after the event"
        );
        assert_eq!(b.delay(), 100 * MS);
        // An event for a path that is fine schedules nothing.
        let mut fine = Backoff::new(100 * MS, 10_000 * MS);
        fine.port_up(t0);
        assert_eq!(fine.next_at(), None);
    }

    #[test]
    fn a_path_lost_again_before_its_rearm_keeps_its_outage() {
        let t0 = Instant::now();
        let mut b = Backoff::new(100 * MS, 1_000 * MS);
        b.lost(t0);
        b.started();
        b.failed(t0 + 100 * MS);
        b.lost(t0 + 500 * MS);
        assert_eq!(b.next_at(), Some(t0 + 600 * MS));
        assert!(
            !b.failed(t0 + 700 * MS).first,
            "the outage was already said"
        );
        assert_eq!(b.done(t0 + 2_000 * MS), (1, 2_000 * MS));
    }

    #[test]
    fn a_return_followed_by_a_failure_doubles_the_hold_up_to_its_bound() {
        let t0 = Instant::now();
        let mut h = ReturnHold::new(5_000 * MS, 60_000 * MS);
        assert!(!h.ready(t0, t0 + 4_999 * MS));
        assert!(h.ready(t0, t0 + 5_000 * MS));
        // A failure of the preferred path with no return before it: no flap.
        assert_eq!(h.home_failed(t0), None);
        let mut now = t0;
        let mut holds = Vec::new();
        for _ in 0..6 {
            now += h.hold();
            h.returned(now);
            now += 1_000 * MS;
            holds.push(h.home_failed(now).expect("a flap"));
        }
        assert_eq!(
            holds,
            [10_000, 20_000, 40_000, 60_000, 60_000, 60_000].map(|m| m * MS)
        );
        // A return that lasts the window resets the hold.
        h.returned(now);
        h.settle(now + 60_000 * MS);
        assert_eq!(h.hold(), 5_000 * MS);
        // So does a failure after the window.
        let mut h = ReturnHold::new(5_000 * MS, 60_000 * MS);
        h.returned(t0);
        h.home_failed(t0 + 1_000 * MS);
        h.returned(t0 + 20_000 * MS);
        assert_eq!(h.home_failed(t0 + 90_000 * MS), None);
        assert_eq!(h.hold(), 5_000 * MS);
    }
}
