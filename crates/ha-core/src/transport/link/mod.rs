//! The multi-path core both sides of a connection share: its paths (primary and standby),
//! which one is active, the failover phase, the control channel (mailbox messages written
//! with WRITE_WITH_IMM), and which completions reach the data machines.
//!
//! The periodic duties (soft timeout, port events, standby heartbeats, keep-alive) are in
//! `timers.rs`, hard failures and the switch in `failure.rs`, re-arming a failed path with a
//! fresh queue pair (and its backoff) in `rearm.rs`, the planned switch (no fence, no replay)
//! in `planned.rs`, and which path traffic belongs on — home, unless a device is drained — in
//! `placement.rs`.
//!
//! A failover, seen from here: an error completion (or a port event or stalled work request
//! with a verified standby to move to, or the peer's word) on the active path fences it (ERR)
//! and enters `Failing`; the side-specific driver finishes the switch once the fenced path is
//! drained (see `send.rs`, `recv.rs`). Soft signals never end a connection: with nothing to
//! move to, only a hard error does (an error completion, the peer's explicit failure), as on
//! plain RC. After the switch, completions of any other path are dropped and counted.

use super::ha::HaCfg;
use super::path::{Health, Path};
use super::region::Region;
use super::stats::{ConnStats, LiveStats, Standby, State, SwitchKind};
use crate::engine::Lease;
use crate::fabric::counters::{Held, Resource};
use crate::fabric::{Completion, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use ha_proto::data::layout::{
    ctrl_imm, ctrl_slot, decode_wr_id, wr_id, CtrlMsg, WrKind, CTRL_WORDS, MAILBOX_SLOTS,
};
use ha_proto::data::ProtoError;
use ha_proto::recovery::{Backoff, ReturnHold};
use ha_proto::rto::AdaptiveRto;
use ha_proto::status::StatusClass;
use std::time::Instant;

mod failure;
mod placement;
mod planned;
mod rearm;
mod silence;
mod timers;

pub use planned::{PlanWhy, Planned};
pub use timers::{Drain, SoftClock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Send,
    Recv,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Send => "send",
            Role::Recv => "recv",
        }
    }
}

/// A failover in progress.
#[derive(Clone, Debug)]
pub struct Failing {
    pub from: usize,
    pub to: usize,
    pub since: Instant,
    pub cause: String,
    /// Sender: SwitchReq sent.
    pub requested: bool,
    /// Sender: the receiver's delivery point from its Switch message.
    pub switch: Option<u64>,
}

#[derive(Clone, Debug)]
pub enum Phase {
    Normal,
    /// A planned switch (return home, drain): nothing is fenced, nothing replayed.
    Planned(Planned),
    Failing(Failing),
    Dead,
}

/// What a completion means to the side-specific driver.
pub enum Event {
    /// For the data machine (successful sends, data receives).
    Data(Completion),
    /// A control message from the peer.
    Ctrl(CtrlMsg),
    /// The connection cannot go on.
    Fatal(ProtoError),
    /// Handled here.
    Nothing,
}

/// A re-arm the sender started: path `index`'s new queue pair, offered to the peer in
/// attempt `attempt` at `sent`.
struct Rearming {
    index: usize,
    path: Path,
    attempt: u64,
    sent: Instant,
}

pub struct Link {
    // Drop order: paths (fenced) first, then the memory they may touch, then the leases.
    pub paths: Vec<Option<Path>>,
    rearm: Option<Rearming>,
    pub active: usize,
    /// Own remotely written region (FIFO or records, then the mailbox).
    pub region: Region,
    /// Own staging buffer (completion records or clear-to-sends written to the peer).
    pub stage: Region,
    ctrl_stage: Region,
    ctrl_next: u64,
    mailbox_base: usize,
    pub peer_addr: u64,
    peer_mailbox_off: u64,
    peer_rkeys: Vec<u32>,
    pub epoch: u32,
    pub phase: Phase,
    pub cfg: HaCfg,
    /// Live counters (read by the stats writer while the link lives).
    pub stats: LiveStats,
    pub role: Role,
    /// The preferred path: the one on the device NCCL chose.
    pub home: usize,
    /// When each path was verified (its first successful completion since it was connected);
    /// `None` while unverified or failed.
    verified_at: Vec<Option<Instant>>,
    /// The hold before returning home, with hysteresis.
    ret: ReturnHold,
    /// The schedule of re-arm attempts of the failed path.
    backoff: Backoff,
    /// The soft timeout in force (`HA_NCCL_RTO_MS`, widened after false alarms).
    rto: AdaptiveRto,
    /// The path traffic last left on a soft timeout, until it is re-armed (or lost for good):
    /// if it re-arms at the first attempt, that failover was a false alarm.
    soft_lost: Option<usize>,
    /// The fast check of the active link (`HA_NCCL_SILENCE_MS`).
    pub silence: silence::SilenceWatch,
    /// What the drain lists say of this connection's paths.
    drain: placement::DrainView,
    /// Sender: the failed path's port was seen down (its coming back restarts the backoff).
    rearm_port_down: bool,
    /// Sender: a refused planned switch is not tried again before this.
    plan_retry_at: Option<Instant>,
    /// Traffic left the preferred path for a drain (it goes back after the undrain even
    /// without `HA_NCCL_RETURN_HOME`).
    left_for_drain: bool,
    waiting_since: Option<Instant>,
    /// Re-armed paths not yet verified (receiver: both ways).
    rearmed: Vec<usize>,
    /// Attempts of re-arm started (the sender's; answers must name the current one).
    rearm_attempts: u64,
    /// Soft timers' clock (a late tick does not count as a miss).
    clock: SoftClock,
    /// The timer duties of [`Link::tick`] run again from this instant on.
    next_duties: Instant,
    /// The last poll stopped at `max_poll`: completions may be waiting in the inboxes.
    backlog: bool,
    /// [`Link::pump_into`]'s completions, kept between pumps (empty between them).
    polled: Vec<(Option<usize>, Completion)>,
    /// A soft timeout with nowhere to move was logged (until it clears).
    stall_noted: bool,
    /// A failover waiting on the peer past its deadline was logged.
    slow_noted: bool,
    pub name: String,
    holds: Vec<Lease>,
    /// Counted as a live connection until the link (and everything above) is gone.
    _held: Held,
}

/// Everything a side brings to build its link.
pub struct LinkParts {
    pub paths: Vec<Path>,
    pub region: Region,
    pub stage: Region,
    pub ctrl_stage: Region,
    pub mailbox_base: usize,
    pub peer_addr: u64,
    pub peer_mailbox_off: u64,
    pub role: Role,
    pub cfg: HaCfg,
    pub stats_file: String,
}

impl Link {
    pub fn new(parts: LinkParts) -> Link {
        let holds: Vec<Lease> = parts.paths.iter().map(|p| p.lease.clone_lease()).collect();
        let peer_rkeys = parts.paths.iter().map(|p| p.peer_rkey).collect();
        let names: Vec<String> = parts
            .paths
            .iter()
            .map(|p| format!("dev {} qp {}", p.device().dev, p.qp.qp_num()))
            .collect();
        let name = format!("{} [{}]", parts.role.name(), names.join(" | "));
        let clock = SoftClock::new(Instant::now(), parts.cfg.late_tick());
        let n = parts.paths.len();
        let ret = ReturnHold::new(parts.cfg.home.return_hold, parts.cfg.home.return_hold_max);
        let backoff = Backoff::new(parts.cfg.rearm_hold, parts.cfg.home.rearm_backoff_max);
        let rto = AdaptiveRto::new(parts.cfg.rto, parts.cfg.home.rto_adaptive);
        if parts.paths.len() == 1 {
            tracing::info!("NET/HA : {name}: one path (no standby)");
        }
        let devices = holds
            .iter()
            .map(|h| {
                let fabric = h.engine().fabric();
                let info = fabric.devices().get(h.dev.dev);
                info.map_or_else(|| h.dev.dev.to_string(), |d| d.name.clone())
            })
            .collect();
        let role = parts.role.name();
        let stats = LiveStats::new(ConnStats::new(
            role,
            name.clone(),
            devices,
            &parts.stats_file,
        ));
        let mut paths = parts.paths;
        for (i, p) in paths.iter_mut().enumerate() {
            p.meter = stats.meter(i);
        }
        stats.opened();
        Link {
            paths: paths.into_iter().map(Some).collect(),
            rearm: None,
            active: 0,
            region: parts.region,
            stage: parts.stage,
            ctrl_stage: parts.ctrl_stage,
            ctrl_next: 0,
            mailbox_base: parts.mailbox_base,
            peer_addr: parts.peer_addr,
            peer_mailbox_off: parts.peer_mailbox_off,
            peer_rkeys,
            epoch: 0,
            phase: Phase::Normal,
            cfg: parts.cfg,
            stats,
            role: parts.role,
            home: 0,
            verified_at: vec![None; n],
            ret,
            backoff,
            rto,
            soft_lost: None,
            silence: Default::default(),
            drain: placement::DrainView::default(),
            rearm_port_down: false,
            plan_retry_at: None,
            left_for_drain: false,
            waiting_since: None,
            next_duties: clock.last_tick(),
            rearmed: Vec::new(),
            rearm_attempts: 0,
            clock,
            backlog: false,
            polled: Vec::new(),
            stall_noted: false,
            slow_noted: false,
            name,
            holds,
            _held: Held::new(Resource::Connection),
        }
    }

    pub fn path(&self, i: usize) -> &Path {
        self.paths[i].as_ref().expect("path present")
    }

    pub fn path_mut(&mut self, i: usize) -> &mut Path {
        self.paths[i].as_mut().expect("path present")
    }

    /// Every device this connection has a path on, the active path's first. Failed paths'
    /// devices count: a re-armed path comes back on the same device, and registrations that
    /// cannot be made later (dma-buf) must already be there.
    pub fn devices(&self) -> Vec<std::sync::Arc<crate::engine::DeviceRes>> {
        let mut v = Vec::with_capacity(self.holds.len());
        if let Some(h) = self.holds.get(self.active) {
            v.push(h.dev.clone());
        }
        for (i, h) in self.holds.iter().enumerate() {
            if i != self.active {
                v.push(h.dev.clone());
            }
        }
        v
    }

    /// What the fabric's asynchronous events say of path `i`'s port.
    pub(super) fn port_healthy(&self, i: usize) -> bool {
        let h = &self.holds[i];
        h.engine().fabric().port_healthy(h.dev.dev)
    }

    /// Whether path `i` exists and is not fenced.
    pub fn usable(&self, i: usize) -> bool {
        self.paths
            .get(i)
            .and_then(|p| p.as_ref())
            .is_some_and(|p| p.health != Health::Failed)
    }

    pub fn failing(&self) -> Option<&Failing> {
        match &self.phase {
            Phase::Failing(f) => Some(f),
            _ => None,
        }
    }

    /// The name of path `i`'s device, as the fabric names it (`mlx5_0:1`, `sock:eth1`).
    pub fn device_name(&self, i: usize) -> String {
        let h = &self.holds[i];
        h.engine()
            .fabric()
            .devices()
            .get(h.dev.dev)
            .map_or_else(|| format!("dev {}", h.dev.dev), |d| d.name.clone())
    }

    /// Data bytes each path has carried so far (both path indices, re-armed queue pairs
    /// included).
    pub fn path_bytes(&self) -> [u64; 2] {
        self.stats.snapshot(0).bytes
    }

    /// Append switch `kind` from `from` to `to`, which took `took_us`, to the stats file.
    fn switch_event(&self, kind: SwitchKind, from: usize, to: usize, took_us: u64) {
        self.stats.switched(kind, from, to, self.epoch, took_us);
    }

    /// Drain up to `max_poll` completions and run the periodic duties: what the side must act
    /// on, in order, appended to `events` (`Event::Nothing` left out). This runs per `test()`,
    /// mostly to find nothing: the completions go through a buffer the link keeps, so a pump
    /// allocates nothing once the buffers have grown.
    pub fn pump_into(&mut self, events: &mut Vec<Event>) {
        let mut polled = std::mem::take(&mut self.polled);
        self.poll_into(self.cfg.max_poll, &mut polled);
        self.backlog = polled.len() >= self.cfg.max_poll;
        for (i, c) in polled.drain(..) {
            let ev = self.classify(i, c);
            if !matches!(ev, Event::Nothing) {
                events.push(ev);
            }
        }
        self.polled = polled;
        let ev = self.tick();
        if !matches!(ev, Event::Nothing) {
            events.push(ev);
        }
        self.publish();
    }

    /// Pop up to `max` completions from every path's inbox, each with the path it belongs to
    /// (`None`: the queue pair of a re-arm in progress). The inbox, not the QP number, says
    /// which path: devices number their queue pairs independently. The inboxes are emptied,
    /// then the completion queues polled once (one router serves them all; this runs per
    /// `test()`, mostly to find nothing), then emptied again if that moved anything.
    #[cfg(test)]
    pub fn poll(&mut self, max: usize) -> Vec<(Option<usize>, Completion)> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out);
        out
    }

    /// [`Link::poll`] into `out` (emptied first).
    pub fn poll_into(&mut self, max: usize, out: &mut Vec<(Option<usize>, Completion)>) {
        out.clear();
        for pass in 0..2 {
            for (i, route) in self.routes() {
                while out.len() < max {
                    match route.inbox.pop_queued() {
                        Some(c) => out.push((i, c)),
                        None => break,
                    }
                }
            }
            if pass == 1 || out.len() >= max || !self.poll_routers() {
                break;
            }
        }
    }

    /// Every path's route, then the re-arm in progress's (`None`), borrowed: this runs per
    /// `test()`.
    fn routes(&self) -> impl Iterator<Item = (Option<usize>, &crate::engine::Route)> {
        self.paths
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().map(|p| (Some(i), &p.route)))
            .chain(self.rearm.as_ref().map(|r| (None, &r.path.route)))
    }

    /// Have each router that feeds a path poll its queues once (all paths share one in the
    /// plugin: one poll); true when that moved anything.
    fn poll_routers(&self) -> bool {
        let mut polled = [0usize; 3];
        let mut n = 0;
        let mut moved = false;
        for (_, route) in self.routes() {
            let id = route.router_id();
            if polled[..n].contains(&id) {
                continue;
            }
            if n < polled.len() {
                polled[n] = id;
                n += 1;
            }
            moved |= route.poll_queues();
        }
        moved
    }

    /// Account a completion and say what it means.
    pub(crate) fn classify(&mut self, path: Option<usize>, c: Completion) -> Event {
        let Some(i) = path.filter(|&i| self.paths.get(i).is_some_and(|p| p.is_some())) else {
            // The pending re-arm path: only its receives matter before it is connected.
            if let Some(r) = self.rearm.as_mut() {
                if is_recv(&c) {
                    let _ = r.path.on_recv_completion(&c);
                } else {
                    r.path.on_send_completion(&c);
                }
            }
            return Event::Nothing;
        };
        let recv = is_recv(&c);
        let (kind, _, index) = decode_wr_id(c.wr_id);
        let path = self.path_mut(i);
        let fenced = path.health == Health::Failed;
        let unverified = path.health == Health::Unverified;
        if recv {
            if let Err(e) = path.on_recv_completion(&c) {
                return self.path_error(
                    i,
                    WcStatus::LocQpOpErr,
                    format!("re-posting receives: {e}"),
                );
            }
        } else {
            path.on_send_completion(&c);
        }
        if unverified && self.path(i).health == Health::Healthy {
            self.verified_at[i] = Some(Instant::now());
        }
        // A re-arm verifies when both directions of the new queue pair carried something:
        // the sender's `RearmDone` went out over it and the receiver answers with its own over
        // it — the sender verifies when that answer arrives (a receive), the receiver when its
        // answer completes (a send). One direction alone (a sender that gave the attempt up
        // after `RearmDone` left, a receiver whose connect back timed out) is a failed re-arm,
        // not a lost standby, and never reported verified.
        let verifying = match self.role {
            Role::Send => recv,
            Role::Recv => !recv,
        };
        if c.status.is_ok()
            && verifying
            && self.rearmed.contains(&i)
            && self.path(i).health == Health::Healthy
        {
            self.rearm_verified(i);
        }
        if !c.status.is_ok() {
            if fenced {
                return Event::Nothing; // the flush of a fenced path
            }
            let what = match kind {
                Some(WrKind::Data) => "payload write",
                // Index 1: the message's one operation (payload and record together).
                Some(WrKind::Record) if index == 1 => "payload write",
                Some(WrKind::Record) => "completion-record write",
                Some(WrKind::Cts) => "clear-to-send write",
                Some(WrKind::Probe) => "probe",
                Some(WrKind::Ctrl) => "control message",
                Some(WrKind::Recv) => "receive",
                None => "work request",
            };
            let why = format!("{what} completed with {:?}", c.status);
            let carrying = i == self.active || self.failing().map(|f| f.to) == Some(i);
            if carrying && c.status.class() == StatusClass::Bug {
                return self.fail_request_bug(i, c.status, why);
            }
            return self.path_error(i, c.status, why);
        }
        if recv {
            let imm = c.imm.unwrap_or(0);
            if let Some(slot) = ctrl_slot(imm) {
                return match CtrlMsg::read(&self.region.words, self.mailbox_base, slot) {
                    Some(m) => Event::Ctrl(m),
                    None => {
                        tracing::warn!("NET/HA : {}: malformed control message dropped", self.name);
                        Event::Nothing
                    }
                };
            }
        } else if !matches!(kind, Some(WrKind::Data) | Some(WrKind::Record)) {
            // Clear-to-sends, probes and control messages: nothing for the data machines.
            return Event::Nothing;
        }
        self.data_event(i, c)
    }

    /// A successful data completion (a receive with a data immediate, a payload or record
    /// write) of path `i`: for the data machine only if it comes from the active path (during
    /// a planned switch: the path being left), or from the path being failed over from (what
    /// it completed before the fence). After the
    /// switch nothing of another path may complete a request (the replay, decided by the
    /// drained fence, covers it), so such a completion is dropped and counted.
    fn data_event(&mut self, i: usize, c: Completion) -> Event {
        let from = self.failing().map(|f| f.from);
        if i == self.active || from == Some(i) {
            return Event::Data(c);
        }
        self.stats.stale_dropped.inc();
        tracing::warn!(
            "NET/HA : {}: completion of path {i} after the switch to path {} dropped (wr_id {:#x})",
            self.name,
            self.active,
            c.wr_id
        );
        Event::Nothing
    }

    /// Post a control message to the peer's mailbox over path `via`.
    pub fn send_ctrl(&mut self, via: usize, msg: &CtrlMsg) -> crate::fabric::Result<()> {
        let n = self.ctrl_next;
        self.ctrl_next += 1;
        let slot = (n % MAILBOX_SLOTS as u64) as usize;
        for (k, w) in msg.encode(n).iter().enumerate() {
            self.ctrl_stage.words.store(slot * CTRL_WORDS + k, *w);
        }
        let lkey = self.ctrl_stage.keys(via).lkey;
        let local = self.ctrl_stage.addr() + slot * CTRL_WORDS * 8;
        let remote = self.peer_addr + self.peer_mailbox_off + (slot * CTRL_WORDS * 8) as u64;
        let path = self.path_mut(via);
        let rkey = path.peer_rkey;
        path.post(&[SendWr {
            wr_id: wr_id(WrKind::Ctrl, n, 0),
            op: SendOp::WriteWithImm(ctrl_imm(slot, n)),
            local: Sge {
                addr: local,
                len: CTRL_WORDS * 8,
                lkey,
            },
            remote_addr: remote,
            rkey,
            signaled: true,
            inline: true,
        }])
    }

    /// Log (and write) the statistics; called once at close.
    pub fn report(&mut self, duplicates: u64) {
        self.publish();
        self.stats.close(duplicates);
    }

    /// Tell the live statistics which path is active and what the standby is worth.
    pub(crate) fn publish(&self) {
        let standby = match (0..self.paths.len()).find(|&i| i != self.active) {
            None => Standby::None,
            Some(o) => match self.paths[o].as_ref().map(|p| p.health) {
                Some(Health::Healthy) => Standby::Ok,
                Some(Health::Unverified) => Standby::Verifying,
                _ if self.rearm.is_some() => Standby::Rearming,
                _ => Standby::Lost,
            },
        };
        let phase = match self.phase {
            Phase::Normal => "normal",
            Phase::Failing(_) => "failing",
            Phase::Dead => "dead",
            Phase::Planned(_) => "planned",
        };
        self.stats.rearm_attempts.set(self.rearm_attempts);
        self.stats.publish(State {
            active: self.active,
            phase,
            standby,
        });
    }
}

/// Whether `c` is a receive completion (a peer's WRITE_WITH_IMM).
fn is_recv(c: &Completion) -> bool {
    c.opcode == WcOpcode::RecvRdmaWithImm || decode_wr_id(c.wr_id).0 == Some(WrKind::Recv)
}
