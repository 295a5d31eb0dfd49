//! Hard failures of a path and the end of a switch: a path that failed is fenced; the active
//! one fails over when the other path is usable, else the connection is lost. A switch ends
//! only from `Failing` (a connection that died meanwhile stays dead), and a fenced path that
//! never flushes ends the connection rather than letting it guess what was delivered.
//!
//! During a planned switch: a failure of the path being left is an ordinary failover (it
//! replaces the plan); a failure of the target is handled by `planned.rs` (the plan is
//! abandoned, or — once the receiver may already have switched — its answer awaited). A
//! failed path's re-arm schedule starts (`rearm.rs`); a failure of the preferred path soon
//! after traffic returned to it lengthens the next return's hold (hysteresis).

use super::{Event, Failing, Link, Phase};
use crate::fabric::WcStatus;
use crate::transport::stats::SwitchKind;
use ha_proto::data::ProtoError;
use std::time::Instant;

impl Link {
    /// Path `i` failed with `status`: fence it; fail over if it was the active path and the
    /// other one is usable, else the connection is dead.
    pub fn path_error(&mut self, i: usize, status: WcStatus, cause: String) -> Event {
        if matches!(self.phase, Phase::Dead) {
            return Event::Nothing;
        }
        if let Some(p) = self.paths[i].as_mut() {
            p.fence();
        }
        let now = Instant::now();
        self.verified_at[i] = None;
        if i == self.home {
            if let Some(hold) = self.ret.home_failed(now) {
                tracing::info!(
                    "NET/HA : {}: preferred path {i} failed soon after traffic returned to it: the next return waits {hold:?} of health (flapping link)",
                    self.name
                );
            }
        }
        let other = 1 - i.min(1);
        let failing_to = self.failing().map(|f| f.to);
        if i != self.active && failing_to != Some(i) {
            let ev = self.plan_target_lost(i, &cause);
            if self.rearmed.contains(&i) {
                self.rearmed.retain(|&d| d != i);
                self.stats.rearm_failed.inc();
                self.rearm_attempt_failed(i, now, &format!("it did not verify: {cause}"));
                return ev;
            }
            self.backoff.lost(now);
            self.stats.lost_standby(i, &cause);
            tracing::warn!(
                "NET/HA : {}: standby path {i} lost ({cause}); redundancy lost until it is re-armed",
                self.name
            );
            return ev;
        }
        if failing_to.is_none() && self.paths.len() > 1 && self.usable(other) {
            self.backoff.lost(now);
            if let Phase::Planned(p) = &self.phase {
                self.stats.plans_aborted.inc();
                tracing::info!(
                    "NET/HA : {}: planned switch from path {} to path {} replaced by a failover",
                    self.name,
                    p.from,
                    p.to
                );
            }
            if self.drained(other) {
                tracing::info!(
                    "NET/HA : {}: failing over to path {other} although its device is drained (no other path)",
                    self.name
                );
            }
            tracing::info!(
                "NET/HA : {}: path {i} failed ({cause}); failing over to path {other}",
                self.name
            );
            self.stall_noted = false;
            self.slow_noted = false;
            let waiting = self.paths[i].as_ref().and_then(|p| p.oldest_outstanding());
            self.stats.detected(waiting);
            self.phase = Phase::Failing(Failing {
                from: i,
                to: other,
                since: Instant::now(),
                cause,
                requested: false,
                switch: None,
            });
            return Event::Nothing;
        }
        self.die(
            status,
            format!("path {i} failed ({cause}) and no other path is usable"),
        )
    }

    /// The connection is lost: log why once and tell the side.
    fn die(&mut self, status: WcStatus, why: String) -> Event {
        self.phase = Phase::Dead;
        tracing::warn!("NET/HA : {}: {why}: connection lost", self.name);
        self.publish();
        self.stats.lost(&why);
        Event::Fatal(ProtoError::Failed {
            status,
            what: if self.paths.len() > 1 {
                "every path of the connection"
            } else {
                "the connection's only path"
            },
        })
    }

    /// A request on path `i`, which carries the traffic, completed with a status that says the
    /// request itself was wrong (`StatusClass::Bug`: protection, access, length, invalid
    /// request). Replayed on the standby it would fail the same way after a needless switch
    /// that hides the cause, so the connection ends here, naming the status and the request.
    pub fn fail_request_bug(&mut self, i: usize, status: WcStatus, why: String) -> Event {
        if matches!(self.phase, Phase::Dead) {
            return Event::Nothing;
        }
        self.phase = Phase::Dead;
        tracing::warn!(
            "NET/HA : {}: path {i}: {why}: a protection, access, length or invalid-request error is not a link failure, so it is not failed over (a replay on the standby would fail the same way): connection lost",
            self.name
        );
        self.publish();
        self.stats
            .lost(&format!("path {i}: {why} (not a link failure)"));
        Event::Fatal(ProtoError::Failed {
            status,
            what: "a request of the connection (not a link failure: not replayed on the standby)",
        })
    }

    /// The peer reported a failure of the active path: fence it and fail over.
    pub fn peer_failover(&mut self) -> Event {
        let a = self.active;
        self.path_error(a, WcStatus::WrFlushErr, "the peer's path failed".into())
    }

    /// The fenced path of failover `f` did not flush in time: what it delivered is unknown, so
    /// the connection ends (a replay could write into a buffer whose receive completed).
    pub fn fail_undrained(&mut self, f: &Failing) -> Event {
        let why = format!(
            "the fenced path {} did not flush within {:?} (completions lost?); cannot tell what was delivered",
            f.from,
            self.cfg.failover_deadline()
        );
        self.die(WcStatus::WrFlushErr, why)
    }

    /// The switch is done: `to` is the active path. Only a failover in progress switches: a
    /// connection that died meanwhile (say, while re-posting on the new path) stays dead.
    pub fn finish_switch(&mut self, to: usize, replayed: usize) {
        let Phase::Failing(f) = &self.phase else {
            return;
        };
        let f = f.clone();
        self.phase = Phase::Normal;
        self.active = to;
        self.epoch += 1;
        self.slow_noted = false;
        self.left_for_drain = false;
        self.switched();
        let took_us = self
            .stats
            .failover(f.from, to, &f.cause, f.since, replayed as u64);
        self.publish();
        tracing::warn!(
            "NET/HA : failover {}: path {} (dev {}) -> path {} (dev {}), cause: {}, replayed {}, took {} us",
            self.name,
            f.from,
            self.holds[f.from].dev.dev,
            to,
            self.holds[to].dev.dev,
            f.cause,
            replayed,
            took_us
        );
        self.switch_event(SwitchKind::Failover, f.from, to, took_us);
    }
}
