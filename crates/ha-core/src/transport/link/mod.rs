//! The multi-path core both sides of a connection share: its paths (primary and standby),
//! which one is active, the failover phase, the control channel (mailbox messages written
//! with WRITE_WITH_IMM), heartbeats of the standby, the soft timeout, keep-alive probes of a
//! waiting connection, and re-arming a failed path with a fresh queue pair.
//!
//! Re-arming a failed path with a fresh queue pair is in `rearm.rs`.
//!
//! A failover, seen from here: an error completion (or a stalled work request, or the peer's
//! word) on the active path fences it (ERR) and enters `Failing`; the side-specific driver
//! finishes the switch once the fenced path is drained (see `send.rs`, `recv.rs`).

use super::ha::HaCfg;
use super::path::{Health, Path};
use super::region::Region;
use super::stats::{unix_ms, Stats};
use crate::engine::Lease;
use crate::fabric::counters::{Held, Resource};
use crate::fabric::{Completion, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use ha_proto::data::layout::{
    ctrl_imm, ctrl_slot, decode_wr_id, wr_id, CtrlMsg, WrKind, CTRL_WORDS, MAILBOX_SLOTS,
};
use ha_proto::data::ProtoError;
use std::time::Instant;

mod rearm;

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

pub struct Link {
    // Drop order: paths (fenced) first, then the memory they may touch, then the leases.
    pub paths: Vec<Option<Path>>,
    rearm: Option<(usize, Path, Instant)>,
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
    pub stats: Stats,
    pub role: Role,
    last_failure: Option<Instant>,
    waiting_since: Option<Instant>,
    /// Re-armed paths not yet verified by a completion.
    rearmed: Vec<usize>,
    pub name: String,
    pub stats_file: String,
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
        if parts.paths.len() == 1 {
            tracing::info!("NET/HA : {name}: one path (no standby)");
        }
        Link {
            paths: parts.paths.into_iter().map(Some).collect(),
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
            stats: Stats::default(),
            role: parts.role,
            last_failure: None,
            waiting_since: None,
            rearmed: Vec::new(),
            name,
            stats_file: parts.stats_file,
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
    fn port_healthy(&self, i: usize) -> bool {
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

    /// Drain up to `max_poll` completions and run the periodic duties: what the side must act
    /// on, in order.
    pub fn pump(&mut self) -> Vec<Event> {
        let mut events: Vec<Event> = self
            .poll(self.cfg.max_poll)
            .into_iter()
            .map(|(i, c)| self.classify(i, c))
            .collect();
        events.push(self.tick());
        events
    }

    /// The fenced path of failover `f` has flushed everything (or its watchdog expired).
    pub fn drained(&self, f: &Failing) -> bool {
        self.paths[f.from].as_ref().is_none_or(|p| p.drained())
            || f.since.elapsed() > self.cfg.drain_watchdog()
    }

    /// Pop up to `max` completions from every path's inbox, each with the path it belongs to
    /// (`None`: the queue pair of a re-arm in progress). The inbox, not the QP number, says
    /// which path: devices number their queue pairs independently.
    pub fn poll(&mut self, max: usize) -> Vec<(Option<usize>, Completion)> {
        let mut out = Vec::new();
        let inboxes = self
            .paths
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().map(|p| (Some(i), p.route.inbox.clone())))
            .chain(self.rearm.as_ref().map(|r| (None, r.1.route.inbox.clone())))
            .collect::<Vec<_>>();
        for (i, inbox) in inboxes {
            while out.len() < max {
                match inbox.pop() {
                    Some(c) => out.push((i, c)),
                    None => break,
                }
            }
        }
        out
    }

    /// Account a completion and say what it means.
    pub(crate) fn classify(&mut self, path: Option<usize>, c: Completion) -> Event {
        let Some(i) = path.filter(|&i| self.paths.get(i).is_some_and(|p| p.is_some())) else {
            // The pending re-arm path: only its receives matter before it is connected.
            if let Some((_, p, _)) = self.rearm.as_mut() {
                if c.opcode == WcOpcode::RecvRdmaWithImm
                    || decode_wr_id(c.wr_id).0 == Some(WrKind::Recv)
                {
                    let _ = p.on_recv_completion(&c);
                } else {
                    p.on_send_completion(&c);
                }
            }
            return Event::Nothing;
        };
        let is_recv =
            c.opcode == WcOpcode::RecvRdmaWithImm || decode_wr_id(c.wr_id).0 == Some(WrKind::Recv);
        let kind = decode_wr_id(c.wr_id).0;
        let path = self.path_mut(i);
        let fenced = path.health == Health::Failed;
        let unverified = path.health == Health::Unverified;
        if is_recv {
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
        if unverified && self.path(i).health == Health::Healthy && self.rearmed.contains(&i) {
            self.rearmed.retain(|&d| d != i);
            self.stats.rearms += 1;
            tracing::info!(
                "NET/HA : {}: path {i} re-armed as the standby (verified)",
                self.name
            );
        }
        if !c.status.is_ok() {
            if fenced {
                return Event::Nothing; // the flush of a fenced path
            }
            let what = match kind {
                Some(WrKind::Data) => "payload write",
                Some(WrKind::Record) => "completion-record write",
                Some(WrKind::Cts) => "clear-to-send write",
                Some(WrKind::Probe) => "probe",
                Some(WrKind::Ctrl) => "control message",
                Some(WrKind::Recv) => "receive",
                None => "work request",
            };
            return self.path_error(i, c.status, format!("{what} completed with {:?}", c.status));
        }
        if is_recv {
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
            return Event::Data(c);
        }
        match kind {
            Some(WrKind::Probe) | Some(WrKind::Ctrl) => Event::Nothing,
            _ => Event::Data(c),
        }
    }

    /// Path `i` failed with `status`: fence it; fail over if it was the active path and the
    /// other one is usable, else the connection is dead.
    pub fn path_error(&mut self, i: usize, status: WcStatus, cause: String) -> Event {
        if matches!(self.phase, Phase::Dead) {
            return Event::Nothing;
        }
        if let Some(p) = self.paths[i].as_mut() {
            p.fence();
        }
        self.last_failure = Some(Instant::now());
        let other = 1 - i.min(1);
        let failing_to = self.failing().map(|f| f.to);
        if i != self.active && failing_to != Some(i) {
            if self.rearmed.contains(&i) {
                self.rearmed.retain(|&d| d != i);
                tracing::debug!(
                    "NET/HA : {}: re-arm of path {i} did not verify ({cause}); retrying after the hold-down",
                    self.name
                );
                return Event::Nothing;
            }
            tracing::warn!(
                "NET/HA : {}: standby path {i} lost ({cause}); redundancy lost until it is re-armed",
                self.name
            );
            return Event::Nothing;
        }
        if failing_to.is_none() && self.paths.len() > 1 && self.usable(other) {
            tracing::info!(
                "NET/HA : {}: path {i} failed ({cause}); failing over to path {other}",
                self.name
            );
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
        self.phase = Phase::Dead;
        tracing::warn!(
            "NET/HA : {}: path {i} failed ({cause}) and no other path is usable: connection lost",
            self.name
        );
        Event::Fatal(ProtoError::Failed {
            status,
            what: if self.paths.len() > 1 {
                "every path of the connection"
            } else {
                "the connection's only path"
            },
        })
    }

    /// The peer reported a failure of the active path: fence it and fail over.
    pub fn peer_failover(&mut self) -> Event {
        let a = self.active;
        self.path_error(a, WcStatus::WrFlushErr, "the peer's path failed".into())
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
        }])
    }

    /// Periodic duties: soft timeout of the active path, standby heartbeats, failover deadline,
    /// re-arm of a failed path (the send side starts it).
    pub fn tick(&mut self) -> Event {
        let now = Instant::now();
        match &self.phase {
            Phase::Dead => return Event::Nothing,
            Phase::Failing(f) => {
                if now.duration_since(f.since) > self.cfg.failover_deadline() {
                    let cause = format!(
                        "failover to path {} did not complete within {:?}",
                        f.to,
                        self.cfg.failover_deadline()
                    );
                    let to = f.to;
                    self.phase = Phase::Normal;
                    self.active = to;
                    return self.path_error(to, WcStatus::RetryExcErr, cause);
                }
            }
            Phase::Normal => {
                let a = self.active;
                if self.paths.len() > 1 && !self.port_healthy(a) {
                    let cause = format!(
                        "port of device {} is down (asynchronous event)",
                        self.path(a).device().dev
                    );
                    let ev = self.path_error(a, WcStatus::RetryExcErr, cause);
                    if !matches!(ev, Event::Nothing) {
                        return ev;
                    }
                }
                if self.paths.len() > 1 && self.path(a).stalled(now, self.cfg.rto) {
                    let cause = format!("no completion for {:?} (HA_NCCL_RTO_MS)", self.cfg.rto);
                    let ev = self.path_error(a, WcStatus::RetryExcErr, cause);
                    if !matches!(ev, Event::Nothing) {
                        return ev;
                    }
                }
            }
        }
        // Heartbeats on the idle standby (a standby whose port is down is lost at once).
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
        if self.role == Role::Send && matches!(self.phase, Phase::Normal) {
            self.maybe_rearm(now);
        }
        Event::Nothing
    }

    /// Keep-alive: while the connection waits on its peer, probe the active path now and then.
    pub fn keepalive(&mut self, waiting: bool) -> Event {
        if !waiting {
            self.waiting_since = None;
            return Event::Nothing;
        }
        let now = Instant::now();
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

    /// The switch is done: `to` is the active path.
    pub fn finish_switch(&mut self, to: usize, replayed: usize) {
        let Phase::Failing(f) = std::mem::replace(&mut self.phase, Phase::Normal) else {
            return;
        };
        self.active = to;
        self.epoch += 1;
        self.stats.failovers += 1;
        self.stats.replays += replayed as u64;
        self.stats.last_failover_unix_ms = unix_ms();
        self.stats.last_failover_us = f.since.elapsed().as_micros() as u64;
        tracing::warn!(
            "NET/HA : failover {}: path {} (dev {}) -> path {} (dev {}), cause: {}, replayed {}, took {} us",
            self.name,
            f.from,
            self.holds[f.from].dev.dev,
            to,
            self.holds[to].dev.dev,
            f.cause,
            replayed,
            self.stats.last_failover_us
        );
    }

    /// Log (and write) the statistics; called once at close.
    pub fn report(&mut self, duplicates: u64) {
        for i in 0..self.paths.len() {
            if let Some(p) = self.paths[i].as_ref() {
                self.stats.bytes[i.min(1)] += p.bytes;
                self.stats.wrs[i.min(1)] += p.wrs;
            }
        }
        self.stats.duplicates = duplicates;
        let devices: Vec<String> = self
            .holds
            .iter()
            .map(|h| format!("{}", h.dev.dev))
            .collect();
        self.stats
            .report(&self.name, self.role.name(), &devices, &self.stats_file);
    }
}
