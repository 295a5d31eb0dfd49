//! One path of a connection: a queue pair on a leased device, the route of its completions,
//! a pool of pre-posted receives (immediates of data and control messages), the signaled work
//! requests still outstanding (for draining after a fence and for the soft timeout), and
//! zero-length probe writes (standby heartbeat, keep-alive of a waiting connection).
//! Dropping a path fences its queue pair first.

use super::stats::PathMeter;
use crate::engine::{CqShare, DeviceRes, Lease, Route};
use crate::fabric::{Completion, QpCaps, QueuePair, Result as FabricResult, SendOp, SendWr, Sge};
use ha_proto::data::layout::{decode_wr_id, wr_id, WrKind, FIFO_DEPTH, MAILBOX_SLOTS, MAX_RECVS};
use ha_proto::handshake::PathParams;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

// The per-connection resource numbers (a connection has one queue pair per path; the
// device-level budget of how many connections fit is computed from these).

/// Control messages one path can have in flight (the peer's mailbox slots).
pub const CTRL_IN_FLIGHT: usize = MAILBOX_SLOTS;
/// Probes one path can have in flight (heartbeat and keep-alive share one at a time; one more
/// of headroom).
pub const PROBES_IN_FLIGHT: usize = 2;
/// Spare send work requests beyond the worst case below.
const SPARE_SEND_WRS: usize = 16;
/// Most send work requests one queue pair can have posted at once: a group (8 payload writes
/// and its completion record, or a clear-to-send) for every FIFO slot — a replay re-posts only
/// those — plus control messages and probes. The queue pair refuses more.
pub const MAX_SEND_WR: u32 =
    (FIFO_DEPTH * (MAX_RECVS + 1) + CTRL_IN_FLIGHT + PROBES_IN_FLIGHT + SPARE_SEND_WRS) as u32;
/// Work requests a receive connection may have posted on one path before a new clear-to-send
/// waits (`cts_backlog.rs`): the send queue less room for control messages and probes.
pub const CTS_ROOM: usize = MAX_SEND_WR as usize - CTRL_IN_FLIGHT - PROBES_IN_FLIGHT;
/// Receives kept posted on every path (at most 32 data immediates and 8 control messages are
/// in flight).
pub const RECV_POOL: usize = 64;
/// Completions one queue pair can owe its completion queue at once: a flush completes every
/// posted work request, signaled or not.
pub const CQES_PER_QP: u32 = MAX_SEND_WR + RECV_POOL as u32;

/// Queue sizes of every path's queue pair.
pub const QP_CAPS: QpCaps = QpCaps {
    max_send_wr: MAX_SEND_WR,
    max_recv_wr: RECV_POOL as u32,
    traffic_class: None,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Connected, no probe answered yet.
    Unverified,
    /// A probe or data completed on it.
    Healthy,
    /// Fenced (in ERR): never used again; re-armed with a new queue pair.
    Failed,
}

/// A posted work request still to complete.
struct Pending {
    wr_id: u64,
    at: Instant,
    signaled: bool,
    /// Payload bytes of this work request and the unsignaled ones posted just before it.
    bytes: u64,
}

pub struct Path {
    // Field order is drop order: the queue pair goes (fenced) before its route, its room on
    // the completion queue and its lease. (A route only removes itself if it is still its
    // own: the device may already have given the number to a new queue pair.)
    pub qp: Box<dyn QueuePair>,
    pub route: Route,
    _cq: CqShare,
    pub lease: Lease,
    pub health: Health,
    /// Key of the peer's remotely written region on this path's device.
    pub peer_rkey: u32,
    /// Posted work requests still to complete: every signaled one, and an unsignaled
    /// clear-to-send that ended its post (until a later completion covers it).
    outstanding: VecDeque<Pending>,
    recvs: usize,
    recv_seq: u64,
    probes: u64,
    probe_outstanding: bool,
    last_probe: Option<Instant>,
    /// When a work request posted here last completed successfully.
    last_answer: Option<Instant>,
    /// Where bytes and work requests posted on this path are counted (the link's counters of
    /// this path index, read live by the stats writer).
    pub meter: PathMeter,
}

impl Path {
    /// A queue pair in INIT on `lease`'s device, routed to a fresh inbox, receives posted;
    /// `traffic_class` `None` leaves the fabric's default.
    pub fn open(lease: Lease, traffic_class: Option<u8>) -> FabricResult<Path> {
        let caps = QpCaps {
            traffic_class,
            ..QP_CAPS
        };
        let cq = lease.dev.reserve_cq(CQES_PER_QP)?;
        let qp = lease.dev.pd.create_qp(&cq.cq, caps)?;
        let route = lease.route(cq.id, qp.qp_num());
        qp.to_init()?;
        let mut p = Path {
            qp,
            route,
            _cq: cq,
            lease,
            health: Health::Unverified,
            peer_rkey: 0,
            outstanding: VecDeque::new(),
            recvs: 0,
            recv_seq: 0,
            probes: 0,
            probe_outstanding: false,
            last_probe: None,
            last_answer: None,
            meter: PathMeter::default(),
        };
        p.refill()?;
        Ok(p)
    }

    /// Connect to the peer's queue pair of the same path (RTR, RTS).
    pub fn connect(&mut self, peer: &PathParams) -> FabricResult<()> {
        self.qp.to_rtr(&peer.endpoint)?;
        self.qp.to_rts()?;
        self.peer_rkey = peer.rkey;
        Ok(())
    }

    pub fn device(&self) -> &Arc<DeviceRes> {
        &self.lease.dev
    }

    /// Post send work requests; the last one must be signaled (so draining can be observed),
    /// except a clear-to-send, which is signaled only now and then (as NCCL's IB transport
    /// does): until a later completion of this queue pair covers it, it counts as data in flight
    /// (a planned switch waits for it, [`Path::cover`]) but never as a stall.
    pub fn post(&mut self, wrs: &[SendWr]) -> FabricResult<()> {
        debug_assert!(wrs
            .last()
            .is_some_and(|w| w.signaled || decode_wr_id(w.wr_id).0 == Some(WrKind::Cts)));
        self.qp.post_send(wrs)?;
        let now = Instant::now();
        let (mut bytes, mut ahead) = (0, 0);
        for (k, w) in wrs.iter().enumerate() {
            if is_data(w.wr_id) {
                bytes += w.local.len as u64;
                ahead += w.local.len as u64;
            }
            if w.signaled || k + 1 == wrs.len() {
                self.outstanding.push_back(Pending {
                    wr_id: w.wr_id,
                    at: now,
                    signaled: w.signaled,
                    bytes: std::mem::take(&mut ahead),
                });
            }
        }
        self.meter.bytes.add(bytes);
        self.meter.wrs.add(wrs.len() as u64);
        Ok(())
    }

    /// Keep [`RECV_POOL`] receives posted.
    pub(crate) fn refill(&mut self) -> FabricResult<()> {
        while self.recvs < RECV_POOL {
            self.recv_seq += 1;
            self.qp.post_recv(wr_id(WrKind::Recv, self.recv_seq, 0))?;
            self.recvs += 1;
        }
        Ok(())
    }

    /// Account a send-side completion (success or error).
    pub fn on_send_completion(&mut self, c: &Completion) {
        if self.outstanding.front().is_some_and(|p| p.wr_id == c.wr_id) {
            self.outstanding.pop_front();
        } else if let Some(i) = self.outstanding.iter().position(|p| p.wr_id == c.wr_id) {
            // Completions are in order per queue pair; anything before it is gone too.
            self.outstanding.drain(..=i);
        }
        if decode_wr_id(c.wr_id).0 == Some(WrKind::Probe) {
            self.probe_outstanding = false;
        }
        if c.status.is_ok() {
            self.last_answer = Some(Instant::now());
        }
        self.verified_by(c);
    }

    /// A successful completion verifies the path.
    fn verified_by(&mut self, c: &Completion) {
        if c.status.is_ok() && self.health == Health::Unverified {
            self.health = Health::Healthy;
        }
    }

    /// When a work request posted here last completed successfully: the peer's end answered
    /// over this link (a receive completion proves only the other direction).
    pub fn last_answer(&self) -> Option<Instant> {
        self.last_answer
    }

    /// Whether a probe posted here is still to complete.
    pub fn probe_in_flight(&self) -> bool {
        self.probe_outstanding
    }

    /// Account a receive completion; re-posts while the path is usable.
    pub fn on_recv_completion(&mut self, c: &Completion) -> FabricResult<()> {
        self.recvs = self.recvs.saturating_sub(1);
        self.verified_by(c);
        if self.health != Health::Failed {
            self.refill()?;
        }
        Ok(())
    }

    /// Nothing of this path is still to complete (after a fence: it is fully flushed). An
    /// unsignaled clear-to-send at the tail needs no completion: the queue pair is in ERR, it
    /// places nothing more, and a clear-to-send that still reaches the sender carries the old
    /// epoch.
    pub fn drained(&self) -> bool {
        self.outstanding.iter().all(|p| !p.signaled) && self.recvs == 0
    }

    /// Whether data work requests posted here (completion records, clear-to-sends) are still
    /// to complete: a planned switch waits for none (control messages and probes do not count).
    pub fn data_in_flight(&self) -> bool {
        self.outstanding.iter().any(|p| is_data(p.wr_id))
    }

    /// Work requests posted here that have not completed (an unsignaled one until a later
    /// completion covers it): the send queue's occupancy as far as this side has polled.
    pub fn posted(&self) -> usize {
        self.outstanding.len()
    }

    /// Whether the newest work request posted here is an unsignaled clear-to-send that no
    /// completion will cover unless something signaled is posted after it.
    pub fn needs_cover(&self) -> bool {
        self.outstanding.back().is_some_and(|p| !p.signaled)
    }

    /// Post a probe behind an unsignaled clear-to-send, so that its completion (in order on the
    /// queue pair) says the clear-to-send completed too (a planned switch waits for that).
    pub fn cover(&mut self, peer_addr: u64) -> FabricResult<()> {
        if !self.needs_cover() {
            return Ok(()); // something signaled was posted after it
        }
        self.probe(peer_addr)
    }

    /// When the oldest signaled work request still outstanding was posted.
    pub fn oldest_outstanding(&self) -> Option<Instant> {
        self.outstanding.iter().find(|p| p.signaled).map(|p| p.at)
    }

    /// When the oldest work request still outstanding was posted, signaled or not (an
    /// unsignaled clear-to-send counts: its bytes are on the link too).
    pub fn oldest_posted(&self) -> Option<Instant> {
        self.outstanding.front().map(|p| p.at)
    }

    /// How long this path has had work out with no answer over its link: the time since the
    /// later of its last successful send completion and its oldest outstanding post (zero with
    /// nothing out). `None` while more than `max_ahead` payload bytes are out: a large write
    /// legitimately takes long, and what is posted after it completes after it.
    pub fn unanswered(&self, now: Instant, max_ahead: u64) -> Option<Duration> {
        let Some(oldest) = self.oldest_posted() else {
            return Some(Duration::ZERO);
        };
        if self.outstanding.iter().map(|p| p.bytes).sum::<u64>() > max_ahead {
            return None;
        }
        let from = self.last_answer.map_or(oldest, |t| t.max(oldest));
        Some(now.saturating_duration_since(from))
    }

    /// Fence: ERR, so nothing more is placed through this queue pair; everything posted
    /// completes (flushed).
    pub fn fence(&mut self) {
        self.health = Health::Failed;
        let _ = self.qp.to_err();
    }

    /// A probe is due: usable, idle, none in flight, and `interval` since the last one.
    pub fn probe_due(&self, now: Instant, interval: Duration) -> bool {
        self.health != Health::Failed
            && !self.probe_outstanding
            && self
                .last_probe
                .is_none_or(|t| now.duration_since(t) >= interval)
    }

    /// A zero-length RDMA WRITE to the peer's region: acknowledged by a live peer, an error
    /// completion otherwise.
    pub fn probe(&mut self, peer_addr: u64) -> FabricResult<()> {
        self.probes += 1;
        self.probe_outstanding = true;
        self.last_probe = Some(Instant::now());
        let id = wr_id(WrKind::Probe, self.probes, 0);
        self.post(&[SendWr {
            wr_id: id,
            op: SendOp::Write,
            local: Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            remote_addr: peer_addr,
            rkey: self.peer_rkey,
            signaled: true,
            inline: false,
        }])
    }

    /// Whether `qpn` is this path's queue pair.
    pub fn owns(&self, qpn: u32) -> bool {
        self.qp.qp_num() == qpn
    }
}

impl Drop for Path {
    fn drop(&mut self) {
        // Fence: after this no byte is placed through this queue pair.
        let _ = self.qp.to_err();
    }
}

/// Whether work request `wr_id` carries data (payload, completion record, clear-to-send).
fn is_data(wr_id: u64) -> bool {
    matches!(
        decode_wr_id(wr_id).0,
        Some(WrKind::Data | WrKind::Record | WrKind::Cts)
    )
}
