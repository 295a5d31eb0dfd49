//! The planned switch (return home, drain): traffic moves to another *healthy* path with no
//! fence, no replay and no error completion, keeping every guarantee of a failover (exactly
//! once, in order, nothing placed after its request completed). The sender decides
//! (`placement.rs`); both sides then:
//!
//! 1. sender: stops posting new groups (`isend` waits) and lets what it posted on the active
//!    path `from` complete — its completion records acknowledged means the receiver has them;
//! 2. sender: `PlanReq{epoch, a: posted up to, b: to}` over `from`;
//! 3. receiver: stops posting clear-to-sends (`irecv` waits), waits until it delivered
//!    everything up to `a` and its own clear-to-sends on `from` completed — now nothing is in
//!    flight on `from` either way — then switches (epoch + 1, `to` active), re-posts its open
//!    clear-to-sends with `to`'s keys in the next epoch's bank over `to`, and says
//!    `Switch{delivered, posted}` over `to` (ordered after the re-posts, as in a failover);
//!    or, if `to` is down, drained or failed on its side, `PlanNak` over `from`;
//! 4. sender: on `Switch` of this epoch it applies the switch (nothing to replay: everything it
//!    posted completed) and resumes on `to`; on `PlanNak` it resumes on `from`.
//!
//! `from` stays connected and becomes the standby (probed by heartbeats).
//!
//! A real failure in the middle: of `from` — an ordinary failover (fence, drain, replay), which
//! replaces the plan; a `Switch` the receiver sent for the plan then serves as the failover's
//! (nothing to replay either way). Of `to` — before the sender asked, it just abandons the
//! plan; once asked, the receiver abandons it (`PlanNak`) if it had not switched yet, or, if it
//! had, fails over from `to` back to `from` at once (epoch + 2, `Switch` over `from`): the
//! sender, which may never see the first `Switch`, then commits the plan and fails over in a
//! row (`send.rs`). A sender whose target is gone when the `Switch` comes commits and fails
//! over at once too. The data simulation in `ha-proto` (`planned_tests.rs`) and the pair
//! tests (`transport/tests/planned.rs`) drive these cases.

use super::{Event, Link, Phase, Role};
use crate::fabric::WcStatus;
use crate::transport::stats::SwitchKind;
use ha_proto::data::layout::{CtrlKind, CtrlMsg};
use std::time::Instant;

/// Why traffic moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanWhy {
    /// Back to the preferred path, healthy again.
    Home = 0,
    /// Off a drained device (or back after the undrain: `Home`).
    Drain = 1,
}

impl PlanWhy {
    fn from_code(c: u64) -> PlanWhy {
        if c == PlanWhy::Drain as u64 {
            PlanWhy::Drain
        } else {
            PlanWhy::Home
        }
    }
}

/// A planned switch in progress.
#[derive(Clone, Debug)]
pub struct Planned {
    pub from: usize,
    pub to: usize,
    pub since: Instant,
    pub why: PlanWhy,
    /// Sender: `PlanReq` sent (from then on the receiver may switch at any moment).
    /// Receiver: always (it learns of the plan from the request).
    pub requested: bool,
    /// Receiver: the sender's sends up to this sequence number completed on `from`.
    pub upto: u64,
}

/// Why the receiver refused a planned switch (`PlanNak`'s `a`), for the logs.
fn refusal(code: u64) -> &'static str {
    match code {
        1 => "not a standby path",
        2 => "the path is failed on the receiver's side",
        3 => "the path's port is down on the receiver's side",
        4 => "the path's device is drained on the receiver's node",
        5 => "the path failed on the receiver's side during the switch",
        6 => "the receiver's active path did not drain in time",
        _ => "refused",
    }
}

impl Link {
    pub fn planned(&self) -> Option<&Planned> {
        match &self.phase {
            Phase::Planned(p) => Some(p),
            _ => None,
        }
    }

    /// Sender: begin a planned switch from the active path to `to`.
    pub(super) fn start_plan(&mut self, to: usize, why: PlanWhy, now: Instant) {
        let from = self.active;
        tracing::debug!(
            "NET/HA : {}: planned switch ({why:?}) from path {from} to path {to}: draining path {from}",
            self.name
        );
        self.slow_noted = false;
        self.phase = Phase::Planned(Planned {
            from,
            to,
            since: now,
            why,
            requested: false,
            upto: 0,
        });
    }

    /// Sender: once nothing it posted on the path being left is in flight, ask the receiver
    /// to switch (`posted_upto`: its last sequence number). A failure to post is a failure of
    /// that path (a failover replaces the plan).
    pub fn request_plan(&mut self, posted_upto: u64) -> Event {
        let Some(p) = self.planned().filter(|p| !p.requested).cloned() else {
            return Event::Nothing;
        };
        if self.path(p.from).data_in_flight() {
            return Event::Nothing;
        }
        let msg = CtrlMsg {
            kind: CtrlKind::PlanReq,
            epoch: self.epoch,
            a: posted_upto,
            b: p.to as u64 | (p.why as u64) << 8,
            endpoint: Vec::new(),
        };
        match self.send_ctrl(p.from, &msg) {
            Ok(()) => {
                if let Phase::Planned(p) = &mut self.phase {
                    p.requested = true;
                }
                Event::Nothing
            }
            Err(e) => self.path_error(
                p.from,
                WcStatus::LocQpOpErr,
                format!("planned switch request: {e}"),
            ),
        }
    }

    /// Receiver: the sender asks for a planned switch. Accepted when this side is not
    /// switching already and the target is usable here: port up, not drained on this node.
    pub fn on_plan_req(&mut self, m: &CtrlMsg) -> Event {
        if m.epoch != self.epoch || !matches!(self.phase, Phase::Normal) {
            // A failover in progress answers with its own `Switch`, which the sender takes
            // for its plan's (nothing to replay either way).
            tracing::debug!(
                "NET/HA : {}: planned switch request of epoch {} ignored (epoch {}, {:?})",
                self.name,
                m.epoch,
                self.epoch,
                self.phase
            );
            return Event::Nothing;
        }
        let to = (m.b & 0xff) as usize;
        let refused = if to >= self.paths.len() || to == self.active {
            Some(1)
        } else if !self.usable(to) {
            Some(2)
        } else if !self.port_healthy(to) {
            Some(3)
        } else if self.drained_here(to) {
            Some(4)
        } else {
            None
        };
        if let Some(code) = refused {
            return self.refuse_plan(code);
        }
        self.slow_noted = false;
        self.phase = Phase::Planned(Planned {
            from: self.active,
            to,
            since: Instant::now(),
            why: PlanWhy::from_code(m.b >> 8),
            requested: true,
            upto: m.a,
        });
        Event::Nothing
    }

    /// Receiver: say `PlanNak` (reason `code`) over the active path; a plan of this side is
    /// abandoned.
    pub fn refuse_plan(&mut self, code: u64) -> Event {
        if self.planned().is_some() {
            self.abort_plan(refusal(code));
        } else {
            self.stats.plans_aborted.inc();
            tracing::info!(
                "NET/HA : {}: planned switch refused: {}",
                self.name,
                refusal(code)
            );
        }
        let msg = CtrlMsg {
            kind: CtrlKind::PlanNak,
            epoch: self.epoch,
            a: code,
            b: 0,
            endpoint: Vec::new(),
        };
        let a = self.active;
        match self.send_ctrl(a, &msg) {
            Ok(()) => Event::Nothing,
            Err(e) => self.path_error(a, WcStatus::LocQpOpErr, format!("plan refusal: {e}")),
        }
    }

    /// Sender: the receiver refused: resume on the active path; try again after the hold.
    pub fn on_plan_nak(&mut self, m: &CtrlMsg) {
        let asked = self.planned().is_some_and(|p| p.requested);
        if m.epoch != self.epoch || !asked {
            return;
        }
        let now = Instant::now();
        self.plan_retry_at = Some(now + self.ret.hold());
        self.abort_plan(refusal(m.a));
    }

    /// Give up the planned switch in progress: traffic stays on the active path.
    fn abort_plan(&mut self, why: &str) {
        let Phase::Planned(p) = &self.phase else {
            return;
        };
        self.stats.plans_aborted.inc();
        tracing::info!(
            "NET/HA : {}: planned switch from path {} to path {} abandoned ({why}); traffic stays on path {}",
            self.name,
            p.from,
            p.to,
            p.from
        );
        self.phase = Phase::Normal;
    }

    /// The planned switch is done on this side: its target carries traffic, the path left is
    /// the standby. One INFO line and one stats event per switch. A target that failed
    /// meanwhile fails over back at once (the returned event).
    pub fn finish_plan(&mut self, replayed: usize) -> Event {
        let Phase::Planned(p) = &self.phase else {
            return Event::Nothing;
        };
        let p = p.clone();
        let now = Instant::now();
        self.phase = Phase::Normal;
        self.active = p.to;
        self.epoch += 1;
        self.slow_noted = false;
        self.switched();
        let took_us = now.saturating_duration_since(p.since).as_micros() as u64;
        let kind = if p.to == self.home {
            self.ret.returned(now);
            self.left_for_drain = false;
            self.stats.returns.inc();
            SwitchKind::Return
        } else {
            self.left_for_drain |= p.from == self.home && p.why == PlanWhy::Drain;
            self.stats.drains.inc();
            SwitchKind::Drain
        };
        tracing::info!(
            "NET/HA : {} {}: path {} (dev {}) -> path {} (dev {}), planned ({}), replayed {replayed}, took {took_us} us",
            kind.name(),
            self.name,
            p.from,
            self.holds[p.from].dev.dev,
            p.to,
            self.holds[p.to].dev.dev,
            match (kind, p.why) {
                (SwitchKind::Return, PlanWhy::Drain) => "back home after the undrain",
                (SwitchKind::Return, _) => "back home, healthy again",
                _ => "off a drained device",
            }
        );
        self.switch_event(kind, p.from, p.to, took_us);
        if !self.usable(p.to) {
            return self.path_error(
                p.to,
                WcStatus::WrFlushErr,
                "the target of the planned switch failed during it".into(),
            );
        }
        Event::Nothing
    }

    /// Path `i`, which carries no traffic, failed: what that means for a planned switch to it.
    /// The sender abandons a plan it has not asked for yet; once asked, it waits for the
    /// receiver's answer (a `PlanNak`, or a `Switch` it commits and fails over from at once).
    /// The receiver abandons the plan and says so.
    pub(super) fn plan_target_lost(&mut self, i: usize, cause: &str) -> Event {
        let Some(p) = self.planned().filter(|p| p.to == i).cloned() else {
            return Event::Nothing;
        };
        match self.role {
            Role::Send if !p.requested => {
                self.abort_plan(&format!("path {i} failed: {cause}"));
                Event::Nothing
            }
            Role::Send => {
                tracing::debug!(
                    "NET/HA : {}: target path {i} of the planned switch failed ({cause}): waiting for the receiver's answer",
                    self.name
                );
                Event::Nothing
            }
            Role::Recv => self.refuse_plan(5),
        }
    }

    /// A planned switch waiting past the failover deadline (the peer stopped or slow) is said
    /// once; it keeps waiting (only a failure ends it, as for a failover).
    pub(super) fn note_slow_plan(&mut self, p: &Planned, now: Instant) {
        let deadline = self.cfg.failover_deadline();
        if self.slow_noted || self.clock.elapsed(p.since, now) <= deadline {
            return;
        }
        self.slow_noted = true;
        tracing::warn!(
            "NET/HA : {}: planned switch from path {} to path {} not finished after {deadline:?}: waiting for the peer (stopped or slow?)",
            self.name,
            p.from,
            p.to
        );
    }

    /// Receiver: whether the planned switch has waited past the failover deadline for the
    /// path being left to drain (completions lost?): it is then abandoned.
    pub fn plan_overdue(&self, p: &Planned) -> bool {
        self.clock.elapsed(p.since, Instant::now()) > self.cfg.failover_deadline()
    }
}
