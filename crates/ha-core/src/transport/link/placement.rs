//! Which path traffic belongs on: the preferred one (`home`, on the device NCCL chose) unless
//! a device is drained. The sender decides and starts planned switches (`planned.rs`):
//!
//! - off a drained device: when the active path's device is drained on either node (its own
//!   drain list, or the receiver's, which the receiver tells it with `DrainState`), to a
//!   healthy path that is not drained;
//! - back home: when the preferred path is usable, verified and has been healthy for the
//!   return hold (`HA_NCCL_RETURN_HOLD_MS`, lengthened by flapping: `ha_proto::recovery`), is
//!   not drained, and either `HA_NCCL_RETURN_HOME` is on or traffic left it for a drain.
//!
//! A connection whose active path is drained with nowhere to go keeps running there and is
//! reported once (WARN). A failover may still move traffic onto a drained device when it is
//! the only path left (losing the connection would be worse).

use super::planned::PlanWhy;
use super::{Event, Link, Phase, Role};
use crate::fabric::WcStatus;
use crate::transport::path::Health;
use ha_proto::data::layout::{CtrlKind, CtrlMsg};
use std::time::Instant;

/// What the drain lists say of one connection's paths (bit `i`: path `i`).
#[derive(Debug, Default)]
pub(super) struct DrainView {
    /// Generation of this node's list when `own` was computed.
    generation: Option<u64>,
    /// Paths on devices drained on this node.
    own: u8,
    /// Sender: paths on devices drained on the receiver's node.
    peer: u8,
    /// Sender: counter of the last `DrainState` applied.
    peer_seq: u64,
    /// Receiver: the mask the sender was last told (`None`: to tell again).
    told: Option<u8>,
    /// Receiver: counter of `DrainState` messages.
    told_seq: u64,
    /// A drained active path with nowhere to go was reported.
    pub(super) stuck_noted: bool,
}

impl Link {
    /// Whether path `i`'s device is drained (on this node, or for the sender on the
    /// receiver's).
    pub(super) fn drained(&self, i: usize) -> bool {
        (self.drain.own | self.drain.peer) & (1 << i) != 0
    }

    /// Whether path `i`'s device is drained on this node.
    pub(super) fn drained_here(&self, i: usize) -> bool {
        self.drain.own & (1 << i) != 0
    }

    /// Periodic (every tick): refresh the drain view; the receiver tells the sender, the
    /// sender decides whether traffic should move.
    pub(super) fn steer(&mut self, now: Instant) -> Event {
        self.refresh_drains(now);
        self.ret.settle(now);
        let ev = match self.role {
            Role::Recv => self.tell_drains(),
            Role::Send => {
                if matches!(self.phase, Phase::Normal) && self.paths.len() > 1 {
                    if let Some((to, why)) = self.wanted(now) {
                        self.start_plan(to, why, now);
                    }
                }
                Event::Nothing
            }
        };
        self.note_stuck();
        ev
    }

    /// Recompute which paths this node drains, when its list changed.
    fn refresh_drains(&mut self, now: Instant) {
        let Some(list) = self.cfg.home.drain.clone() else {
            return;
        };
        let g = list.poll(now);
        if self.drain.generation == Some(g) {
            return;
        }
        self.drain.generation = Some(g);
        let mask = (0..self.holds.len())
            .filter(|&i| list.drained(&self.device_name(i)))
            .fold(0u8, |m, i| m | 1 << i);
        if mask != self.drain.own {
            self.drain.own = mask;
            self.drain.stuck_noted = false;
            tracing::info!(
                "NET/HA : {}: drained on this node: {}",
                self.name,
                self.mask_names(mask)
            );
        }
    }

    fn mask_names(&self, mask: u8) -> String {
        let v: Vec<String> = (0..self.holds.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| format!("path {i} ({})", self.device_name(i)))
            .collect();
        if v.is_empty() {
            "no path".into()
        } else {
            v.join(", ")
        }
    }

    /// Sender: where traffic should go now, if not where it is.
    fn wanted(&self, now: Instant) -> Option<(usize, PlanWhy)> {
        let a = self.active;
        let ready = |i: usize| {
            i != a
                && self.usable(i)
                && self.path(i).health == Health::Healthy
                && self.port_healthy(i)
                && !self.drained(i)
        };
        if self.drained(a) {
            return (0..self.paths.len())
                .find(|&i| ready(i))
                .map(|i| (i, PlanWhy::Drain));
        }
        let h = self.home;
        let want_home = self.cfg.home.return_home || self.left_for_drain;
        if a == h || !want_home || !ready(h) || self.plan_retry_at.is_some_and(|t| now < t) {
            return None;
        }
        let since = self.verified_at[h]?;
        let why = if self.left_for_drain {
            PlanWhy::Drain
        } else {
            PlanWhy::Home
        };
        self.ret.ready(since, now).then_some((h, why))
    }

    /// Receiver: tell the sender which paths this node drains (when that changed, and again
    /// after each switch).
    fn tell_drains(&mut self) -> Event {
        let own = self.drain.own;
        if self.drain.told == Some(own) || !matches!(self.phase, Phase::Normal) {
            return Event::Nothing;
        }
        if self.drain.told.is_none() && own == 0 && self.drain.told_seq == 0 {
            // Nothing drained and nothing ever said: the sender assumes as much.
            self.drain.told = Some(0);
            return Event::Nothing;
        }
        self.drain.told_seq += 1;
        let msg = CtrlMsg {
            kind: CtrlKind::DrainState,
            epoch: self.epoch,
            a: own as u64,
            b: self.drain.told_seq,
            endpoint: Vec::new(),
        };
        let a = self.active;
        match self.send_ctrl(a, &msg) {
            Ok(()) => {
                self.drain.told = Some(own);
                Event::Nothing
            }
            Err(e) => self.path_error(a, WcStatus::LocQpOpErr, format!("drain state: {e}")),
        }
    }

    /// Sender: the receiver's drained paths.
    pub fn on_drain_state(&mut self, m: &CtrlMsg) {
        if m.b <= self.drain.peer_seq {
            return;
        }
        self.drain.peer_seq = m.b;
        let mask = m.a as u8;
        if mask != self.drain.peer {
            self.drain.peer = mask;
            self.drain.stuck_noted = false;
            tracing::info!(
                "NET/HA : {}: drained on the receiver's node: {}",
                self.name,
                self.mask_names(mask)
            );
        }
    }

    /// After a switch the receiver says its drains again (a message may have been lost with
    /// the path it went on).
    pub(super) fn switched(&mut self) {
        if self.drain.own != 0 || self.drain.told_seq > 0 {
            self.drain.told = None;
        }
    }

    /// A drained active path with no other path to take is reported once (it keeps running).
    fn note_stuck(&mut self) {
        let a = self.active;
        if !matches!(self.phase, Phase::Normal) || !self.drained(a) {
            return;
        }
        let elsewhere = (0..self.paths.len()).any(|i| i != a && self.usable(i) && !self.drained(i));
        if elsewhere || self.drain.stuck_noted {
            return;
        }
        self.drain.stuck_noted = true;
        let why = if self.paths.len() == 1 {
            "the connection has one path"
        } else {
            "its other path is down or drained too"
        };
        tracing::warn!(
            "NET/HA : {}: active path {a} is on drained device {} but {why}: traffic stays on it",
            self.name,
            self.device_name(a)
        );
    }
}
