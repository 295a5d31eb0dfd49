//! Re-arming a failed path: the sender offers a fresh queue pair on the failed path's device
//! over the active path (`Rearm`, attempt n), the receiver answers with its own (`RearmAck`,
//! attempt n), the sender connects and says so over the new path itself (`RearmDone`), and
//! the receiver answers with its own `RearmDone` over the new path: the answer's arrival
//! verifies the path on the sender, its completion on the receiver — both directions proven on
//! both sides (a sender that gave the attempt up after `RearmDone` left, or a receiver whose
//! connect back timed out, costs a failed re-arm, never a "verified" standby that one direction
//! cannot reach). So a re-arm verifies without any traffic and the receiver never posts on a
//! queue pair whose other end is not connected yet. Messages of an
//! older epoch (before a switch) or of another attempt are ignored. A receiver whose port of
//! that path is down refuses the attempt (an answer without an endpoint).
//!
//! Attempts follow a [`Backoff`](ha_proto::recovery::Backoff): the first after the hold-down
//! (`HA_NCCL_REARM_HOLD_MS`), each failed one (no answer, refused, not verified) doubling the
//! wait up to `HA_NCCL_REARM_BACKOFF_MAX_MS`, for as long as the connection lives; the port
//! coming back (an asynchronous event) starts over from the hold-down. The log says the first
//! failure of an outage and its end (INFO), each attempt only at DEBUG.

use super::{Event, Link, Rearming};
use crate::fabric::WcStatus;
use crate::transport::path::Path;
use ha_proto::data::layout::{CtrlKind, CtrlMsg};
use ha_proto::handshake::PathParams;
use std::time::Instant;

impl Link {
    pub(super) fn maybe_rearm(&mut self, now: Instant) {
        if !self.cfg.failback || self.paths.len() < 2 {
            return;
        }
        if let Some(r) = &self.rearm {
            if now.duration_since(r.sent) > self.cfg.rearm_hold * 2 + self.cfg.rto {
                let d = r.index;
                self.rearm = None;
                self.rearm_attempt_failed(d, now, "no answer from the peer");
            }
            return;
        }
        let Some(d) = (0..self.paths.len()).find(|&i| !self.usable(i)) else {
            return;
        };
        if !self.port_healthy(d) {
            self.rearm_port_down = true;
            return; // the port is still down (PORT_ACTIVE not seen yet)
        }
        if std::mem::take(&mut self.rearm_port_down) {
            self.backoff.port_up(now);
        }
        if !self.backoff.due(now) {
            return;
        }
        self.backoff.started();
        self.rearm_attempts += 1;
        let attempt = self.rearm_attempts;
        let started =
            Path::open(self.holds[d].clone_lease(), self.cfg.traffic_class).and_then(|p| {
                let msg = CtrlMsg {
                    kind: CtrlKind::Rearm,
                    epoch: self.epoch,
                    a: d as u64,
                    b: attempt,
                    endpoint: p.qp.local_endpoint(),
                };
                let a = self.active;
                self.send_ctrl(a, &msg).map(|_| p)
            });
        match started {
            Ok(path) => {
                self.rearm = Some(Rearming {
                    index: d,
                    path,
                    attempt,
                    sent: now,
                })
            }
            Err(e) => self.rearm_attempt_failed(d, now, &format!("not started: {e}")),
        }
    }

    /// Re-arm attempt of path `d` failed at `now` (`why`): the next waits longer. Said once per
    /// outage at INFO, each time at DEBUG.
    pub(super) fn rearm_attempt_failed(&mut self, d: usize, now: Instant, why: &str) {
        let r = self.backoff.failed(now);
        if r.first {
            tracing::info!(
                "NET/HA : {}: re-arm of path {d} failed ({why}); retrying with backoff up to {:?}, quietly until it works",
                self.name,
                self.cfg.home.rearm_backoff_max.max(self.cfg.rearm_hold)
            );
        } else {
            tracing::debug!(
                "NET/HA : {}: re-arm attempt {} of path {d} failed ({why}); next in {:?}",
                self.name,
                self.backoff.attempts(),
                r.wait
            );
        }
    }

    /// Path `i`'s re-arm verified: it is the standby again.
    pub(super) fn rearm_verified(&mut self, i: usize) {
        self.rearmed.retain(|&d| d != i);
        self.stats.rearmed(i);
        let (attempts, down) = self.backoff.done(Instant::now());
        let after = if attempts > 1 {
            format!(
                " after {attempts} attempts, {:.1} s after it was lost",
                down.as_secs_f64()
            )
        } else {
            String::new()
        };
        tracing::info!(
            "NET/HA : {}: path {i} re-armed as the standby (verified){after}",
            self.name
        );
        if self.soft_lost == Some(i) {
            self.soft_lost = None;
            if was_false_alarm(attempts, down, self.cfg.rearm_hold) {
                if let Some(c) = self.rto.false_alarm(Instant::now()) {
                    tracing::info!(
                        "NET/HA : {}: soft timeout raised to {:?} from {:?}: path {i}, left on a soft timeout, re-armed at the first attempt (a false alarm; HA_NCCL_RTO_ADAPTIVE)",
                        self.name,
                        c.to,
                        c.from
                    );
                }
            }
        }
    }

    /// The re-arm in progress: (path, attempt).
    #[cfg(test)]
    pub(crate) fn rearm_pending(&self) -> Option<(usize, u64)> {
        self.rearm.as_ref().map(|r| (r.index, r.attempt))
    }

    /// The queue pair number of the re-arm in progress.
    #[cfg(test)]
    pub(crate) fn rearm_qpn(&self) -> Option<u32> {
        self.rearm.as_ref().map(|r| r.path.qp.qp_num())
    }

    /// Re-arm attempts started so far.
    #[cfg(test)]
    pub(crate) fn rearm_attempts(&self) -> u64 {
        self.rearm_attempts
    }

    /// The current hold before a return home (hysteresis included).
    #[cfg(test)]
    pub(crate) fn return_hold(&self) -> std::time::Duration {
        self.ret.hold()
    }

    /// Whether a drained active path with nowhere to go was reported.
    #[cfg(test)]
    pub(crate) fn drain_stuck(&self) -> bool {
        self.drain.stuck_noted
    }

    /// Whether a re-arm message belongs to this epoch (not to a path set a switch replaced).
    fn current(&self, msg: &CtrlMsg) -> bool {
        if msg.epoch == self.epoch {
            return true;
        }
        tracing::debug!(
            "NET/HA : {}: {:?} of epoch {} ignored (now {})",
            self.name,
            msg.kind,
            msg.epoch,
            self.epoch
        );
        false
    }

    /// Receiver: the sender offers a new queue pair for path `msg.a`; answer with ours.
    pub fn on_rearm(&mut self, msg: &CtrlMsg) {
        let d = msg.a as usize;
        if d >= self.paths.len() || d == self.active || !self.current(msg) {
            return;
        }
        if !self.port_healthy(d) {
            // The two ends may see the port come back seconds apart.
            self.refuse_rearm(d, msg.b, "its port is down here");
            return;
        }
        let peer = PathParams {
            endpoint: msg.endpoint.clone(),
            rkey: self.peer_rkeys[d],
            dev: self.holds[d].dev.dev as u16,
        };
        let built =
            Path::open(self.holds[d].clone_lease(), self.cfg.traffic_class).and_then(|mut p| {
                p.connect(&peer)?;
                Ok(p)
            });
        match built {
            Ok(p) => {
                let ack = CtrlMsg {
                    kind: CtrlKind::RearmAck,
                    epoch: self.epoch,
                    a: d as u64,
                    b: msg.b,
                    endpoint: p.qp.local_endpoint(),
                };
                self.install(d, p);
                self.rearmed.retain(|&x| x != d);
                self.rearmed.push(d);
                let a = self.active;
                if let Err(e) = self.send_ctrl(a, &ack) {
                    tracing::warn!("NET/HA : {}: re-arm answer not sent: {e}", self.name);
                }
                tracing::debug!(
                    "NET/HA : {}: path {d}: new queue pair (attempt {}), waiting for the sender's",
                    self.name,
                    msg.b
                );
            }
            Err(e) => self.refuse_rearm(d, msg.b, &e.to_string()),
        }
    }

    /// Receiver: the sender's `RearmDone` arrived over the re-armed path `msg.a`: answer over
    /// that path (its completion verifies the path here, its arrival at the sender there).
    pub fn on_rearm_done(&mut self, msg: &CtrlMsg) -> Event {
        let d = msg.a as usize;
        if d >= self.paths.len() || !self.rearmed.contains(&d) || !self.current(msg) {
            return Event::Nothing;
        }
        let answer = CtrlMsg {
            kind: CtrlKind::RearmDone,
            epoch: self.epoch,
            a: d as u64,
            b: msg.b,
            endpoint: Vec::new(),
        };
        match self.send_ctrl(d, &answer) {
            Ok(()) => Event::Nothing,
            Err(e) => self.path_error(
                d,
                WcStatus::LocQpOpErr,
                format!("re-arm answer over the new path: {e}"),
            ),
        }
    }

    /// Receiver: answer re-arm `attempt` of path `d` without an endpoint (refused): the sender
    /// backs off and tries again.
    fn refuse_rearm(&mut self, d: usize, attempt: u64, why: &str) {
        let no = CtrlMsg {
            kind: CtrlKind::RearmAck,
            epoch: self.epoch,
            a: d as u64,
            b: attempt,
            endpoint: Vec::new(),
        };
        let a = self.active;
        if let Err(e) = self.send_ctrl(a, &no) {
            tracing::warn!("NET/HA : {}: re-arm refusal not sent: {e}", self.name);
        }
        tracing::debug!(
            "NET/HA : {}: re-arm of path {d} (attempt {attempt}) refused: {why}",
            self.name
        );
    }

    /// Sender: the receiver's queue pair for the path being re-armed (the answer to the
    /// current attempt only).
    pub fn on_rearm_ack(&mut self, msg: &CtrlMsg) {
        let matches = self
            .rearm
            .as_ref()
            .is_some_and(|r| r.index == msg.a as usize && r.attempt == msg.b);
        if !matches {
            tracing::debug!(
                "NET/HA : {}: re-arm answer for path {} attempt {} ignored (not the attempt in progress)",
                self.name,
                msg.a,
                msg.b
            );
            return;
        }
        if !self.current(msg) {
            return;
        }
        if msg.endpoint.is_empty() {
            let d = msg.a as usize;
            self.rearm = None;
            self.rearm_attempt_failed(
                d,
                Instant::now(),
                "refused by the peer (its port is down, or connecting failed)",
            );
            return;
        }
        let Some(Rearming {
            index: d,
            path: mut p,
            attempt,
            ..
        }) = self.rearm.take()
        else {
            return;
        };
        let peer = PathParams {
            endpoint: msg.endpoint.clone(),
            rkey: self.peer_rkeys[d],
            dev: self.holds[d].dev.dev as u16,
        };
        match p.connect(&peer) {
            Ok(()) => {
                self.install(d, p);
                self.rearmed.retain(|&x| x != d);
                self.rearmed.push(d);
                let done = CtrlMsg {
                    kind: CtrlKind::RearmDone,
                    epoch: self.epoch,
                    a: d as u64,
                    b: attempt,
                    endpoint: Vec::new(),
                };
                if let Err(e) = self.send_ctrl(d, &done) {
                    tracing::info!(
                        "NET/HA : {}: re-arm of path {d}: first message not sent: {e}",
                        self.name
                    );
                }
                tracing::debug!(
                    "NET/HA : {}: path {d}: new queue pair connected (attempt {attempt}), verifying",
                    self.name
                );
            }
            Err(e) => self.rearm_attempt_failed(d, Instant::now(), &format!("connecting: {e}")),
        }
    }

    /// Path `i`'s new queue pair replaces the failed one (and counts where it counted).
    fn install(&mut self, i: usize, mut p: Path) {
        p.meter = self.stats.meter(i);
        self.paths[i] = Some(p);
    }
}

/// Whether a path left on a soft signal and re-armed after `attempts` attempts (this side's),
/// `down` after it was lost, was a false alarm: healthy again at the first attempt, the path was
/// only slow and the timeout too short for it. The receiver makes no attempts of its own (the
/// sender re-arms), so for both sides it must also be back before a second attempt could have
/// been made: the first comes one hold (`HA_NCCL_REARM_HOLD_MS`) after the loss, the second two
/// holds after that.
fn was_false_alarm(attempts: u64, down: std::time::Duration, hold: std::time::Duration) -> bool {
    attempts <= 1 && down < hold * 3
}

#[cfg(test)]
mod false_alarm_tests {
    use super::was_false_alarm;
    use std::time::Duration;

    #[test]
    fn only_a_path_back_at_the_first_attempt_was_a_false_alarm() {
        let hold = Duration::from_secs(2);
        let s = Duration::from_secs_f64;
        // The sender: its first attempt, 2 s after the loss.
        assert!(was_false_alarm(1, s(2.1), hold));
        // The sender needed more attempts: a real outage.
        assert!(!was_false_alarm(2, s(6.2), hold));
        // The receiver counts no attempts: it judges by the time (seen in the Soft-RoCE
        // blackhole drill: back 18 s after the loss, after the sender's fifth attempt).
        assert!(was_false_alarm(0, s(2.3), hold));
        assert!(!was_false_alarm(0, s(18.0), hold));
        assert!(!was_false_alarm(0, s(6.0), hold));
    }
}
