//! GPU flush of received data (NCCL's `iflush`), as NCCL's IB transport does it: a one-byte
//! RDMA READ of the received GPU buffer through a queue pair connected to itself on the NIC,
//! completing into a host word. The READ's completion means every earlier write the NIC made
//! to that GPU memory is visible to the GPU (PCIe: a read response cannot pass posted writes).
//! NCCL asks for it on GPUs and platforms that need it (pre-Hopper, C2C systems, or a device
//! reporting `forceFlush`); `NCCL_GDR_FLUSH_DISABLE=1` turns it off.
//!
//! Per receive comm, one loopback queue pair per path, made at the first flush on that path's
//! device (as NCCL makes one per receive comm and NIC). A flush goes to the path that is active
//! when it is posted: after a failover between a receive and its flush, that is the new path.
//! A flush whose READ fails (the device died under it), or that does not complete within the
//! connection's soft timeout, drops that loopback queue pair and is posted again on whatever
//! path is then active, once the failover (if any) is over: at most [`MAX_ATTEMPTS`] times,
//! then the request fails. A flush never hangs and is never reported done without a READ
//! that completed successfully.

use super::error::{Error, Result};
use super::link::{Link, Phase};
use super::mr::MrHandle;
use super::region::Region;
use crate::engine::{CqShare, Lease, Route};
use crate::fabric::{
    Access, QpCaps, QueuePair, Result as FabricResult, SendOp, SendWr, Sge, WcStatus,
};
use ha_proto::data::ReqId;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flushes one receive comm may have outstanding: NCCL draws receive and flush requests of a
/// comm from one pool of 32 (`NCCL_NET_MAX_REQUESTS`). It also bounds the READ completions a
/// comm's loopback queue pair can put on the device's shared completion queue (see the
/// budget test below).
pub const MAX_FLUSHES: usize = 32;
/// Posts of one flush before it fails.
pub const MAX_ATTEMPTS: u32 = 3;

/// A queue pair connected to itself on one device, with a one-word host sink for the READs.
pub struct FlushQp {
    // Drop order: the queue pair first (nothing is placed in the sink after it), then its
    // route, the sink and the lease.
    qp: Box<dyn QueuePair>,
    route: Route,
    /// This queue pair's share of a completion queue of the device.
    _cq: CqShare,
    sink: Region,
    lease: Lease,
    /// Work request ids posted and not completed, oldest first, with their post time.
    posted: VecDeque<(u64, Instant)>,
}

impl FlushQp {
    /// Create and connect the loopback queue pair on `lease`'s device (RESET → INIT → RTR
    /// aimed at its own endpoint → RTS).
    pub fn open(lease: Lease) -> FabricResult<FlushQp> {
        let caps = QpCaps {
            max_send_wr: MAX_FLUSHES as u32,
            max_recv_wr: 1,
            traffic_class: None,
        };
        // What it can owe: a READ completion per flush in flight, and its one receive's flush.
        let cq = lease.dev.reserve_cq(MAX_FLUSHES as u32 + 1)?;
        let qp = lease.dev.pd.create_qp(&cq.cq, caps)?;
        let route = lease.route(cq.id, qp.qp_num());
        qp.to_init()?;
        let me = qp.local_endpoint();
        qp.to_rtr(&me)?;
        qp.to_rts()?;
        let mut sink = Region::new(1);
        sink.register(0, &*lease.dev.pd, Access::LOCAL_WRITE)?;
        Ok(FlushQp {
            qp,
            route,
            _cq: cq,
            sink,
            lease,
            posted: VecDeque::new(),
        })
    }

    /// One signaled 1-byte READ of `remote_addr` (key `rkey` on this device) into the sink.
    fn post(&mut self, wr_id: u64, remote_addr: u64, rkey: u32) -> FabricResult<()> {
        self.qp.post_send(&[SendWr {
            wr_id,
            op: SendOp::Read,
            local: Sge {
                addr: self.sink.addr(),
                len: 1,
                lkey: self.sink.keys(0).lkey,
            },
            remote_addr,
            rkey,
            signaled: true,
            inline: false,
        }])?;
        self.posted.push_back((wr_id, Instant::now()));
        Ok(())
    }

    /// Fabric device index of this queue pair.
    pub fn device(&self) -> usize {
        self.lease.dev.dev
    }

    /// The queue pair's number (tests look for it among the posts a fake fabric saw).
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }
}

#[derive(Debug)]
enum State {
    /// To be posted on the active path (first time, or again after a failed attempt).
    Waiting,
    Posted {
        path: usize,
        wr_id: u64,
    },
    Done,
    Failed(String),
}

struct Req {
    addr: u64,
    mr: Arc<MrHandle>,
    state: State,
    attempts: u32,
    last_error: String,
}

/// The flush requests of one receive comm and its loopback queue pairs.
pub struct Flushes {
    /// Loopback queue pair per path index, made on first use.
    qps: Vec<Option<FlushQp>>,
    slots: Vec<(u16, Option<Req>)>,
    free: Vec<u16>,
    next_wr: u64,
    /// Flushes posted, by fabric device (for stats and tests).
    pub posted_on: Vec<(usize, u64)>,
}

impl Default for Flushes {
    fn default() -> Self {
        Self::new()
    }
}

impl Flushes {
    pub fn new() -> Flushes {
        Flushes {
            qps: Vec::new(),
            slots: (0..MAX_FLUSHES).map(|_| (0, None)).collect(),
            free: (0..MAX_FLUSHES as u16).rev().collect(),
            next_wr: 0,
            posted_on: Vec::new(),
        }
    }

    /// A new flush of the received buffer at `addr` (registered as `mr`), to be posted by the
    /// next [`drive`](Self::drive). Ids have a non-zero generation.
    pub fn add(&mut self, addr: usize, mr: &Arc<MrHandle>) -> Result<ReqId> {
        let index = self.free.pop().ok_or_else(|| {
            Error::Usage(format!(
                "{MAX_FLUSHES} flushes are outstanding on this receive comm already"
            ))
        })?;
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1).max(1);
        slot.1 = Some(Req {
            addr: addr as u64,
            mr: mr.clone(),
            state: State::Waiting,
            attempts: 0,
            last_error: String::new(),
        });
        Ok(ReqId { index, gen: slot.0 })
    }

    /// `Ok(true)` once flush `id` is done (the request is then gone), an error if it failed.
    pub fn take(&mut self, id: ReqId) -> Result<bool> {
        let slot = self
            .slots
            .get_mut(id.index as usize)
            .filter(|s| s.0 == id.gen && s.1.is_some())
            .ok_or_else(|| Error::Usage(format!("flush request {id:?} is not outstanding")))?;
        let outcome = match &slot.1.as_ref().expect("checked").state {
            State::Done => Ok(true),
            State::Failed(e) => Err(Error::Fabric(crate::fabric::FabricError::System(format!(
                "GPU flush: {e}"
            )))),
            _ => return Ok(false),
        };
        slot.1 = None;
        self.free.push(id.index);
        outcome
    }

    /// Flushes not yet done (posted or waiting).
    pub fn outstanding(&self) -> usize {
        MAX_FLUSHES - self.free.len()
    }

    /// The loopback queue pair of path `path`, if one was made.
    pub fn qp(&self, path: usize) -> Option<&FlushQp> {
        self.qps.get(path).and_then(|q| q.as_ref())
    }

    /// Collect completions, retire stalled queue pairs, and post what waits on `link`'s active
    /// path. `dead` is the connection's failure, if it has one: waiting flushes then fail.
    pub fn drive(&mut self, link: &Link, dead: Option<String>) {
        let now = Instant::now();
        for p in 0..self.qps.len() {
            self.collect(p, now, link.cfg.rto);
        }
        let dead = dead.or_else(|| {
            matches!(link.phase, Phase::Dead).then(|| "the connection failed".to_string())
        });
        if self.slots.iter().all(|(_, r)| {
            !r.as_ref()
                .is_some_and(|r| matches!(r.state, State::Waiting))
        }) {
            return;
        }
        if let Some(why) = dead {
            for r in self.slots.iter_mut().filter_map(|(_, r)| r.as_mut()) {
                if matches!(r.state, State::Waiting) {
                    r.state = State::Failed(format!("{why} before the flush could be posted"));
                }
            }
            return;
        }
        if !matches!(link.phase, Phase::Normal) {
            return; // a failover is under way: post on the path it ends on
        }
        self.post_waiting(link, link.active);
    }

    /// Completions of path `p`'s loopback queue pair; drop it if a READ failed or stalled.
    fn collect(&mut self, p: usize, now: Instant, rto: Duration) {
        let Some(q) = self.qps[p].as_mut() else {
            return;
        };
        let mut broken: Option<String> = None;
        while let Some(c) = q.route.inbox.pop() {
            q.posted.retain(|(id, _)| *id != c.wr_id);
            let Some(r) = self
                .slots
                .iter_mut()
                .filter_map(|(_, r)| r.as_mut())
                .find(|r| matches!(r.state, State::Posted { path, wr_id } if path == p && wr_id == c.wr_id))
            else {
                continue;
            };
            if c.status == WcStatus::Success {
                r.state = State::Done;
            } else {
                let why = format!("READ completed {:?} on device {}", c.status, q.device());
                r.last_error = why.clone();
                r.state = State::Waiting;
                broken.get_or_insert(why);
            }
        }
        if broken.is_none() {
            if let Some((_, t)) = q.posted.front() {
                if now.duration_since(*t) > rto.max(Duration::from_millis(200)) {
                    broken = Some(format!(
                        "no READ completion within {:?} on device {}",
                        rto,
                        q.device()
                    ));
                }
            }
        }
        let Some(why) = broken else {
            return;
        };
        tracing::warn!(
            "NET/HA : GPU flush: {why}; dropping that flush queue pair and posting again on the active path"
        );
        // Everything else posted on it goes again too (it is flushed with the queue pair).
        for r in self.slots.iter_mut().filter_map(|(_, r)| r.as_mut()) {
            if matches!(r.state, State::Posted { path, .. } if path == p) {
                r.last_error = why.clone();
                r.state = State::Waiting;
            }
        }
        self.qps[p] = None;
    }

    fn post_waiting(&mut self, link: &Link, a: usize) {
        let Some(path) = link.paths.get(a).and_then(|p| p.as_ref()) else {
            return;
        };
        while self.qps.len() <= a {
            self.qps.push(None);
        }
        for i in 0..self.slots.len() {
            let waiting = self.slots[i]
                .1
                .as_ref()
                .is_some_and(|r| matches!(r.state, State::Waiting));
            if !waiting {
                continue;
            }
            let r = self.slots[i].1.as_mut().expect("checked");
            if r.attempts >= MAX_ATTEMPTS {
                r.state = State::Failed(format!(
                    "gave up after {} attempts; last: {}",
                    r.attempts, r.last_error
                ));
                continue;
            }
            r.attempts += 1;
            let rkey = match r.mr.keys_for(path.device()) {
                Ok(k) => k.rkey,
                Err(e) => {
                    r.state = State::Failed(format!(
                        "the buffer has no key on device {}: {e}",
                        path.device().dev
                    ));
                    continue;
                }
            };
            if self.qps[a].is_none() {
                match FlushQp::open(path.lease.clone_lease()) {
                    Ok(q) => self.qps[a] = Some(q),
                    Err(e) => {
                        r.last_error =
                            format!("flush queue pair on device {}: {e}", path.device().dev);
                        r.state = State::Waiting;
                        continue;
                    }
                }
            }
            let q = self.qps[a].as_mut().expect("made above");
            self.next_wr += 1;
            let wr_id = self.next_wr;
            match q.post(wr_id, r.addr, rkey) {
                Ok(()) => {
                    r.state = State::Posted { path: a, wr_id };
                    let dev = q.device();
                    match self.posted_on.iter_mut().find(|(d, _)| *d == dev) {
                        Some((_, n)) => *n += 1,
                        None => self.posted_on.push((dev, 1)),
                    }
                }
                Err(e) => {
                    r.last_error = format!("posting on device {}: {e}", q.device());
                    r.state = State::Waiting;
                    // Drop the queue pair; what else was posted on it goes again.
                    self.qps[a] = None;
                    for o in self.slots.iter_mut().filter_map(|(_, o)| o.as_mut()) {
                        if matches!(o.state, State::Posted { path, .. } if path == a) {
                            o.state = State::Waiting;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_queue_pair_fits_a_completion_queue() {
        // The loopback queue pair reserves a READ completion per flush in flight and its one
        // receive on a completion queue of the device, like a path's queue pair.
        assert!((MAX_FLUSHES as u32) < crate::transport::path::CQES_PER_QP);
    }

    #[test]
    fn unknown_ids_are_refused() {
        let mut f = Flushes::new();
        assert_eq!(f.outstanding(), 0);
        for id in [ReqId { index: 0, gen: 1 }, ReqId { index: 999, gen: 1 }] {
            assert!(matches!(f.take(id), Err(Error::Usage(_))), "{id:?}");
        }
    }
}
