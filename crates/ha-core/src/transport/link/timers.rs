//! The periodic duties of a link, run by the pumps at most every [`DUTIES_EVERY`]: port events and the soft timeout of the
//! active path, the failover deadline, standby heartbeats, keep-alive probes of a waiting
//! connection, the re-arm of a failed path (the sender starts it), and where traffic belongs
//! (drains, return home: `placement.rs`).
//!
//! Soft signals (a stalled work request, a port event, a probe left without completion, a
//! failover the peer does not finish) may move traffic to a verified standby; they never end a
//! connection. A stall on a link the fabric says still answers below the peer's threads
//! (`QueuePair::link_alive`: `sock`'s TCP acknowledgements) is the peer being slow or stopped:
//! it is waited out without touching the standby. With nothing to move to, the connection waits as plain RC would: only a hard
//! error (an error completion, the peer's explicit failure) ends it. A tick that comes late —
//! this process (or NCCL's caller) did not run for a while — restarts the soft timers instead
//! of counting the time it was away as a miss ([`SoftClock`]).

use super::{Event, Failing, Link, Phase, Role};
use crate::fabric::WcStatus;
use crate::transport::path::Health;
use std::time::{Duration, Instant};

/// The clock of the soft timers: a timer started at `t` has run for `now - max(t, resumed)`,
/// where `resumed` is the last tick that came more than `late` after the one before it.
#[derive(Clone, Copy, Debug)]
pub struct SoftClock {
    last_tick: Instant,
    resumed: Instant,
    late: Duration,
}

impl SoftClock {
    pub fn new(now: Instant, late: Duration) -> SoftClock {
        SoftClock {
            last_tick: now,
            resumed: now,
            late,
        }
    }

    /// Record a tick at `now`; true when it came late (the timers restart).
    pub fn tick(&mut self, now: Instant) -> bool {
        let late = now.saturating_duration_since(self.last_tick) > self.late;
        self.last_tick = now;
        if late {
            self.resumed = now;
        }
        late
    }

    /// When the last tick was (the time of this call, for work done right after a pump).
    pub fn last_tick(&self) -> Instant {
        self.last_tick
    }

    /// How long a soft timer started at `t` has run by `now`, not counting time before the
    /// last late tick.
    pub fn elapsed(&self, t: Instant, now: Instant) -> Duration {
        now.saturating_duration_since(t.max(self.resumed))
    }
}

/// How far the fence of a failover has flushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Everything posted on the fenced path completed: what it delivered is final.
    Drained,
    /// Still flushing.
    Waiting,
    /// Not flushed after the failover deadline: the connection must end.
    Overdue,
}

/// How often [`Link::tick`]'s duties run at most. Every timer they serve counts in
/// milliseconds (the silence check samples every sixteenth of its window, 1.5 ms at the
/// smallest default), while a polling caller ticks per `test()`, millions of times a second.
pub const DUTIES_EVERY: Duration = Duration::from_micros(50);

impl Link {
    /// Periodic duties, in order: the active path (or the failover deadline), the standby,
    /// the re-arm of a failed path, where traffic belongs; at most every [`DUTIES_EVERY`].
    pub fn tick(&mut self) -> Event {
        let now = Instant::now();
        if self.clock.tick(now) {
            self.stats.late_ticks.inc();
            tracing::debug!(
                "NET/HA : {}: tick came late: soft timers restart (this process or its caller did not run)",
                self.name
            );
        }
        if now < self.next_duties {
            return Event::Nothing;
        }
        self.next_duties = now + DUTIES_EVERY;
        if let Some(c) = self.rto.tick(now) {
            tracing::info!(
                "NET/HA : {}: soft timeout back to {:?} from {:?}: no false alarm for {:?} (HA_NCCL_RTO_ADAPTIVE)",
                self.name,
                c.to,
                c.from,
                ha_proto::rto::QUIET
            );
        }
        let ev = match &self.phase {
            Phase::Dead => return Event::Nothing,
            Phase::Failing(f) => {
                let f = f.clone();
                self.note_slow_failover(&f, now);
                Event::Nothing
            }
            Phase::Planned(p) => {
                let p = p.clone();
                self.note_slow_plan(&p, now);
                self.check_active(now)
            }
            Phase::Normal => self.check_active(now),
        };
        if !matches!(ev, Event::Nothing) {
            return ev;
        }
        let ev = self.check_standby(now);
        if !matches!(ev, Event::Nothing) {
            return ev;
        }
        if self.role == Role::Send && matches!(self.phase, Phase::Normal) {
            self.maybe_rearm(now);
        }
        self.steer(now)
    }

    /// The active path: a port event, else the soft timeout (checked only when this pump
    /// drained the inboxes, so a completion waiting behind `max_poll` others is no stall).
    /// Either moves traffic to a standby when there is one to move to; at most one of them
    /// acts per tick (the first fences the path and starts the failover).
    fn check_active(&mut self, now: Instant) -> Event {
        let a = self.active;
        if self.paths.len() > 1 && !self.port_healthy(a) {
            let cause = format!(
                "port of device {} is down (asynchronous event)",
                self.path(a).device().dev
            );
            return self.soft_failover(a, cause, false);
        }
        let ev = self.check_silence(a, now);
        if !matches!(ev, Event::Nothing) {
            return ev;
        }
        if !self.backlog && self.stalled(a, now) {
            let rto = self.rto.current();
            let cause = if self.rto.adapted() {
                format!("no completion for {rto:?} (HA_NCCL_RTO_MS, widened after false alarms)")
            } else {
                format!("no completion for {rto:?} (HA_NCCL_RTO_MS)")
            };
            if self.path(a).qp.link_alive() == Some(true) {
                // The link answers below the peer's threads: the peer is slow or stopped, and a
                // standby to the same peer would not cure that (it would only cost redundancy).
                return self.wait_noted(a, format!("{cause}, the link answers"));
            }
            if self.move_target(a, true).is_some() {
                // If this path re-arms at the first attempt, this was a false alarm.
                self.soft_lost = Some(a);
            }
            return self.soft_failover(a, cause, true);
        }
        self.stall_noted = false;
        Event::Nothing
    }

    /// The soft timeout in force (`HA_NCCL_RTO_MS`, widened after false alarms).
    #[cfg(test)]
    pub(crate) fn soft_timeout(&self) -> std::time::Duration {
        self.rto.current()
    }

    /// The oldest signaled work request of path `i` has waited longer than the soft timeout.
    fn stalled(&self, i: usize, now: Instant) -> bool {
        self.path(i)
            .oldest_outstanding()
            .is_some_and(|t| self.clock.elapsed(t, now) > self.rto.current())
    }

    /// The path traffic could move to from `from`: usable, port up, and (for a soft timeout,
    /// `verified`) proven by a completion since it was (re)connected.
    pub(super) fn move_target(&self, from: usize, verified: bool) -> Option<usize> {
        (0..self.paths.len()).find(|&i| {
            i != from
                && self.usable(i)
                && self.port_healthy(i)
                && (!verified || self.path(i).health == Health::Healthy)
        })
    }

    /// A soft signal on the active path `i`: fail over when there is a standby to move to,
    /// else keep waiting (said once per episode).
    pub(super) fn soft_failover(&mut self, i: usize, cause: String, verified: bool) -> Event {
        if self.move_target(i, verified).is_some() {
            return self.path_error(i, WcStatus::RetryExcErr, cause);
        }
        self.wait_noted(i, format!("{cause}; no verified standby to move to"))
    }

    /// Keep waiting on path `i`, saying why once per episode.
    fn wait_noted(&mut self, i: usize, why: String) -> Event {
        if !self.stall_noted {
            self.stall_noted = true;
            tracing::info!(
                "NET/HA : {}: path {i}: {why}: waiting (only an error completion ends the connection)",
                self.name
            );
        }
        Event::Nothing
    }

    /// A failover the peer has not finished by the deadline is said once; the connection
    /// waits (a stopped peer finishes it when it runs again; a dead path fails hard).
    fn note_slow_failover(&mut self, f: &Failing, now: Instant) {
        let deadline = self.cfg.failover_deadline();
        if self.slow_noted || self.clock.elapsed(f.since, now) <= deadline {
            return;
        }
        self.slow_noted = true;
        tracing::warn!(
            "NET/HA : {}: failover to path {} not finished after {deadline:?}: waiting for the peer (stopped or slow?); only an error completion ends the connection",
            self.name,
            f.to
        );
    }

    /// Heartbeats of the idle standby (a standby whose port is down is lost at once). The
    /// re-armed path is not probed before something completed on it (a probe into a queue pair
    /// whose other end is not connected yet fails on verbs).
    fn check_standby(&mut self, now: Instant) -> Event {
        for i in 0..self.paths.len() {
            if i == self.active || !self.usable(i) {
                continue;
            }
            if !self.port_healthy(i) {
                let cause = "its port is down (asynchronous event)".to_string();
                let ev = self.path_error(i, WcStatus::RetryExcErr, cause);
                if !matches!(ev, Event::Nothing) {
                    return ev;
                }
                continue;
            }
            if self.rearmed.contains(&i) && self.path(i).health != Health::Healthy {
                // Nothing completed on it yet: the other end may not be connected (on verbs a
                // probe into such a queue pair fails). Once `RearmDone` went through, probes
                // find an end that died before answering (a failed re-arm).
                continue;
            }
            let hb = self.cfg.heartbeat;
            let addr = self.peer_addr;
            let p = self.path_mut(i);
            if p.probe_due(now, hb) {
                if let Err(e) = p.probe(addr) {
                    let ev = self.path_error(i, WcStatus::LocQpOpErr, format!("probe: {e}"));
                    if !matches!(ev, Event::Nothing) {
                        return ev;
                    }
                }
            }
        }
        Event::Nothing
    }

    /// Keep-alive: while the connection waits on its peer, probe the active path now and then
    /// (a dead link then fails the waiting request instead of hanging it). Called right after
    /// a pump: its tick's time is now.
    pub fn keepalive(&mut self, waiting: bool) -> Event {
        if !waiting {
            self.waiting_since = None;
            return Event::Nothing;
        }
        let now = self.clock.last_tick();
        let since = *self.waiting_since.get_or_insert(now);
        if now.duration_since(since) < self.cfg.keepalive || !matches!(self.phase, Phase::Normal) {
            return Event::Nothing;
        }
        let (a, ka, addr) = (self.active, self.cfg.keepalive, self.peer_addr);
        let p = self.path_mut(a);
        if p.probe_due(now, ka) {
            if let Err(e) = p.probe(addr) {
                return self.path_error(a, WcStatus::LocQpOpErr, format!("keep-alive probe: {e}"));
            }
        }
        Event::Nothing
    }

    /// How far the fenced path of failover `f` has flushed.
    pub fn drain_state(&self, f: &Failing) -> Drain {
        if self.paths[f.from].as_ref().is_none_or(|p| p.drained()) {
            Drain::Drained
        } else if self.clock.elapsed(f.since, Instant::now()) > self.cfg.failover_deadline() {
            Drain::Overdue
        } else {
            Drain::Waiting
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SoftClock;
    use std::time::{Duration, Instant};

    #[test]
    fn a_late_tick_restarts_the_soft_timers_and_a_timely_one_does_not() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = SoftClock::new(t0, ms(150));
        // Work posted at t0; ticks every 100 ms: nothing is late, its time keeps counting.
        assert!(!c.tick(t0 + ms(100)));
        assert!(!c.tick(t0 + ms(200)));
        assert_eq!(c.elapsed(t0, t0 + ms(200)), ms(200));
        // The process stops for 900 ms: the next tick is late and the timers restart there,
        // so the work has waited 0 ms (not 1100) at that tick, and 5 ms just after.
        assert!(c.tick(t0 + ms(1100)));
        assert_eq!(c.last_tick(), t0 + ms(1100));
        assert_eq!(c.elapsed(t0, t0 + ms(1100)), Duration::ZERO);
        assert_eq!(c.elapsed(t0, t0 + ms(1105)), ms(5));
        // Work posted after the restart counts from its own post.
        assert_eq!(c.elapsed(t0 + ms(1102), t0 + ms(1105)), ms(3));
        // Exactly the late threshold is not late; a millisecond more is.
        assert!(!c.tick(t0 + ms(1250)));
        assert_eq!(c.elapsed(t0, t0 + ms(1250)), ms(150));
        assert!(c.tick(t0 + ms(1401)));
        assert_eq!(c.elapsed(t0, t0 + ms(1401)), Duration::ZERO);
    }
}
