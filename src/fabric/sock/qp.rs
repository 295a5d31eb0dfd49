//! Queue pairs of the `sock` fabric: state machine, send and receive queues, the error path
//! (flush + fence) and the handle the engine holds.
//!
//! Lock order: `fail_mx` → `ctl` / `sq` / `rq` → PD key table. `place` is taken shared
//! only around copies into/out of memory, never while calling [`QpShared::fail`], and
//! exclusively only by `fail` (the fence).

use super::cq::SockCq;
use super::mr::MrEntry;
use super::net;
use super::pd::{PdCore, PdShared};
use super::wire::{psn_le, Hello};
use super::{requester, responder, spawn, SockEndpoint};
use crate::fabric::counters::{self, Counted, Held, Resource};
use crate::fabric::{
    Access, Completion, FabricError, QpCaps, QpState, QueuePair, Result, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

static NEXT_QPN: AtomicU32 = AtomicU32::new(1);

fn state_to_u8(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Err => 4,
    }
}

fn state_from_u8(v: u8) -> QpState {
    match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        _ => QpState::Err,
    }
}

/// One posted send WR until it completes.
pub struct WrEntry {
    pub wr: SendWr,
    /// The local registration (nonzero-length SGE that passed the local check).
    pub mr: Option<Arc<MrEntry>>,
    /// Failed the local check: completes with this status when it reaches the front.
    pub bad: Option<WcStatus>,
    /// Payload bytes already handed to the sender's batch.
    pub sent: u64,
    /// At least one frame emitted (the WR is outstanding).
    pub started: bool,
    /// All frames emitted; `last_psn` is valid.
    pub emitted: bool,
    pub last_psn: u32,
}

pub struct SendQueue {
    /// Posted, not yet completed, in posting order.
    pub wrs: VecDeque<WrEntry>,
    /// Index in `wrs` of the first WR not fully emitted.
    pub next_send: usize,
    pub next_psn: u32,
    /// Last sign of life from the responder (or start of the oldest outstanding WR).
    pub last_progress: Instant,
    /// The outbound stream broke while nothing was outstanding: the next WR fails.
    pub link_dead: bool,
}

pub struct Control {
    pub remote: Option<SockEndpoint>,
    threads: Vec<JoinHandle<()>>,
    out_sock: Option<Counted<TcpStream>>,
    in_sock: Option<Counted<TcpStream>>,
    inbound_attached: bool,
}

/// Everything a queue pair's threads share.
pub struct QpShared {
    pub qpn: u32,
    pub nonce: u64,
    pub pd: Arc<PdShared>,
    pub cq: Arc<SockCq>,
    caps: QpCaps,
    state: AtomicU8,
    stopped: AtomicBool,
    pub ctl: Mutex<Control>,
    pub ctl_cv: Condvar,
    pub sq: Mutex<SendQueue>,
    pub sq_cv: Condvar,
    pub rq: Mutex<VecDeque<u64>>,
    pub rq_cv: Condvar,
    /// Shared around every copy into or out of memory; exclusive = the `to_err` fence.
    pub place: RwLock<()>,
    fail_mx: Mutex<()>,
    _held: Held,
}

impl QpShared {
    /// The traffic class asked at creation (`QpCaps`).
    pub fn traffic_class(&self) -> Option<u8> {
        self.caps.traffic_class
    }

    pub fn state(&self) -> QpState {
        state_from_u8(self.state.load(SeqCst))
    }

    /// In ERR or being dropped: I/O threads stop.
    pub fn dead(&self) -> bool {
        self.state.load(SeqCst) == state_to_u8(QpState::Err) || self.stopped.load(SeqCst)
    }

    fn cas(&self, from: QpState, to: QpState) -> bool {
        self.state
            .compare_exchange(state_to_u8(from), state_to_u8(to), SeqCst, SeqCst)
            .is_ok()
    }

    pub fn push_send(&self, wr: &SendWr, status: WcStatus) {
        self.cq.push(Completion {
            wr_id: wr.wr_id,
            qp_num: self.qpn,
            status,
            opcode: match wr.op {
                SendOp::Read => WcOpcode::RdmaRead,
                _ => WcOpcode::RdmaWrite,
            },
            byte_len: if status.is_ok() {
                wr.local.len as u32
            } else {
                0
            },
            imm: None,
        });
    }

    pub fn push_recv(&self, wr_id: u64, status: WcStatus, imm: Option<u32>, byte_len: u32) {
        self.cq.push(Completion {
            wr_id,
            qp_num: self.qpn,
            status,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len,
            imm,
        });
    }

    /// Complete (Success, signaled only) every emitted WR whose last frame is at or before
    /// `psn`. Returns the status of a failed-local-check WR now at the front, if any.
    pub fn retire_through(&self, sq: &mut SendQueue, psn: u32) -> Option<WcStatus> {
        let mut n = 0;
        while let Some(e) = sq.wrs.front() {
            if !(e.emitted && psn_le(e.last_psn, psn)) {
                break;
            }
            let e = sq.wrs.pop_front().expect("front exists");
            n += 1;
            if e.wr.signaled {
                self.push_send(&e.wr, WcStatus::Success);
            }
        }
        sq.next_send -= n;
        if n > 0 {
            sq.last_progress = Instant::now();
        }
        sq.wrs.front().and_then(|e| e.bad)
    }

    /// The outbound stream is gone: fail now if anything is posted, else arm `link_dead`.
    pub fn link_failed(&self) {
        let fail_now = {
            let mut sq = self.sq.lock();
            if sq.wrs.is_empty() {
                sq.link_dead = true;
                false
            } else {
                true
            }
        };
        if fail_now {
            self.fail(Some(WcStatus::RetryExcErr));
        }
    }

    /// Go to ERR: shut the streams, fence placement, flush every send (the first with
    /// `cause` when this is the transition into ERR) and every receive, in posting order.
    /// Must not be called while holding `place`, `sq`, `rq` or `ctl`.
    pub fn fail(&self, cause: Option<WcStatus>) {
        let _serial = self.fail_mx.lock();
        let prev = self.state.swap(state_to_u8(QpState::Err), SeqCst);
        {
            let ctl = self.ctl.lock();
            for s in ctl.out_sock.iter().chain(ctl.in_sock.iter()) {
                net::shutdown(s.as_raw_fd());
            }
            self.ctl_cv.notify_all();
        }
        // Wake waiters before the fence: the sender and a responder waiting for a receive.
        drop(self.sq.lock());
        self.sq_cv.notify_all();
        drop(self.rq.lock());
        self.rq_cv.notify_all();
        // Fence: every copy in progress finishes; later ones see ERR and do nothing.
        drop(self.place.write());
        let report = !self.stopped.load(SeqCst);
        {
            let mut sq = self.sq.lock();
            let mut cause = if prev != state_to_u8(QpState::Err) {
                cause
            } else {
                None
            };
            while let Some(e) = sq.wrs.pop_front() {
                let st = cause.take().unwrap_or(WcStatus::WrFlushErr);
                if report {
                    self.push_send(&e.wr, st);
                }
            }
            sq.next_send = 0;
        }
        {
            let mut rq = self.rq.lock();
            while let Some(id) = rq.pop_front() {
                if report {
                    self.push_recv(id, WcStatus::WrFlushErr, None, 0);
                }
            }
        }
    }

    /// Spawn a thread of this queue pair unless it is being dropped. A panic in it puts the
    /// queue pair into ERR instead of leaving it hanging.
    pub fn add_thread(
        self: &Arc<Self>,
        name: String,
        f: impl FnOnce(Arc<QpShared>) + Send + 'static,
    ) -> bool {
        let mut ctl = self.ctl.lock();
        if self.stopped.load(SeqCst) {
            return false;
        }
        let qp = self.clone();
        let h = spawn(name, move || {
            let q2 = qp.clone();
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || f(q2))).is_err() {
                tracing::error!("sock: qp {} thread panicked", qp.qpn);
                qp.fail(Some(WcStatus::LocQpOpErr));
            }
        });
        match h {
            Ok(h) => {
                ctl.threads.push(h);
                true
            }
            Err(e) => {
                tracing::error!("sock: qp {}: {e}", self.qpn);
                false
            }
        }
    }

    /// Publish the connected outbound stream (so `fail` can shut it); false if dead.
    pub fn set_out_sock(&self, s: Counted<TcpStream>) -> bool {
        let mut ctl = self.ctl.lock();
        if self.dead() {
            return false;
        }
        ctl.out_sock = Some(s);
        true
    }

    /// The listener found a stream whose hello names this queue pair.
    pub fn attach_inbound(self: &Arc<Self>, s: Counted<TcpStream>, hello: &Hello) -> bool {
        if hello.target_nonce != self.nonce {
            return false;
        }
        let clone = {
            let mut ctl = self.ctl.lock();
            if self.dead() || ctl.inbound_attached {
                return false;
            }
            if net::tune_stream(&s, self.pd.tun.rx_tick()).is_err() {
                return false;
            }
            if let Some(tc) = self.caps.traffic_class {
                if net::set_traffic_class(&s, tc).is_err() {
                    return false;
                }
            }
            match counters::try_clone_stream(&s) {
                Ok(c) => {
                    // One inbound stream per queue pair, ever.
                    ctl.inbound_attached = true;
                    c
                }
                Err(_) => return false,
            }
        };
        tracing::debug!(
            "sock: qp {} inbound stream from qp {}",
            self.qpn,
            hello.source_qpn
        );
        // Spawn first (it waits for RTR), then publish for `fail` under the same check.
        let mut stream = Some(s);
        let ok = self.add_thread(format!("sock-rx-{}", self.qpn), move |qp| {
            responder::run(qp, stream.take().expect("stream"))
        });
        if ok {
            let mut ctl = self.ctl.lock();
            ctl.in_sock = Some(clone);
            if self.dead() {
                // `fail` may have run between the spawn and now: shut it ourselves.
                net::shutdown(ctl.in_sock.as_ref().expect("set").as_raw_fd());
            }
        }
        ok
    }

    /// Local check of a send WR: `(registration, failure status)`.
    fn check_local(&self, wr: &SendWr) -> (Option<Arc<MrEntry>>, Option<WcStatus>) {
        let len = wr.local.len;
        if len > u32::MAX as usize {
            return (None, Some(WcStatus::LocLenErr));
        }
        if wr.remote_addr.checked_add(len as u64).is_none() {
            return (None, Some(WcStatus::RemAccessErr));
        }
        if len == 0 {
            return (None, None);
        }
        match self.pd.mrs.get(wr.local.lkey) {
            Some(e)
                if e.contains(wr.local.addr as u64, len as u64)
                    && (wr.op != SendOp::Read || e.access.contains(Access::LOCAL_WRITE)) =>
            {
                (Some(e), None)
            }
            _ => (None, Some(WcStatus::LocProtErr)),
        }
    }
}

/// The queue pair handle (`create_qp`).
pub struct SockQp {
    shared: Arc<QpShared>,
    _core: Arc<PdCore>,
}

impl SockQp {
    pub fn new(core: Arc<PdCore>, cq: Arc<SockCq>, caps: QpCaps) -> SockQp {
        let qpn = loop {
            let n = NEXT_QPN.fetch_add(1, SeqCst);
            if n != 0 {
                break n;
            }
        };
        let nonce = std::collections::hash_map::RandomState::new().hash_one((qpn, Instant::now()));
        let shared = Arc::new(QpShared {
            qpn,
            nonce,
            pd: core.shared.clone(),
            cq,
            caps,
            state: AtomicU8::new(state_to_u8(QpState::Reset)),
            stopped: AtomicBool::new(false),
            ctl: Mutex::new(Control {
                remote: None,
                threads: Vec::new(),
                out_sock: None,
                in_sock: None,
                inbound_attached: false,
            }),
            ctl_cv: Condvar::new(),
            sq: Mutex::new(SendQueue {
                wrs: VecDeque::with_capacity(caps.max_send_wr.min(4096) as usize),
                next_send: 0,
                next_psn: 0,
                last_progress: Instant::now(),
                link_dead: false,
            }),
            sq_cv: Condvar::new(),
            rq: Mutex::new(VecDeque::new()),
            rq_cv: Condvar::new(),
            place: RwLock::new(()),
            fail_mx: Mutex::new(()),
            _held: Held::new(Resource::Qp),
        });
        core.shared.register_qp(&shared);
        SockQp {
            shared,
            _core: core,
        }
    }

    fn bad_state(&self, op: &'static str) -> FabricError {
        FabricError::BadState {
            state: self.shared.state(),
            op,
        }
    }
}

impl QueuePair for SockQp {
    fn qp_num(&self) -> u32 {
        self.shared.qpn
    }

    fn state(&self) -> QpState {
        self.shared.state()
    }

    fn local_endpoint(&self) -> Vec<u8> {
        SockEndpoint {
            ip: self.shared.pd.ip,
            port: self.shared.pd.port,
            qpn: self.shared.qpn,
            nonce: self.shared.nonce,
        }
        .encode()
    }

    fn to_init(&self) -> Result<()> {
        if self.shared.cas(QpState::Reset, QpState::Init) {
            Ok(())
        } else {
            Err(self.bad_state("to_init"))
        }
    }

    fn to_rtr(&self, remote: &[u8]) -> Result<()> {
        let ep = SockEndpoint::decode(remote)?;
        if ep.ip.is_ipv4() != self.shared.pd.ip.is_ipv4() {
            return Err(FabricError::BadPeerAddress(format!(
                "sock: peer {} and rail {} differ in address family",
                ep.ip, self.shared.pd.ip
            )));
        }
        let s = &self.shared;
        let mut ctl = s.ctl.lock();
        if s.state() != QpState::Init {
            return Err(self.bad_state("to_rtr"));
        }
        ctl.remote = Some(ep);
        if !s.cas(QpState::Init, QpState::Rtr) {
            return Err(self.bad_state("to_rtr"));
        }
        s.ctl_cv.notify_all();
        Ok(())
    }

    fn to_rts(&self) -> Result<()> {
        let s = &self.shared;
        if !s.cas(QpState::Rtr, QpState::Rts) {
            return Err(self.bad_state("to_rts"));
        }
        s.ctl_cv.notify_all();
        if !s.add_thread(format!("sock-tx-{}", s.qpn), requester::run_sender) {
            s.fail(None);
            return Err(FabricError::System(format!(
                "sock: qp {}: cannot start the requester",
                s.qpn
            )));
        }
        Ok(())
    }

    fn to_err(&self) -> Result<()> {
        self.shared.fail(None);
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        let s = &self.shared;
        match s.state() {
            QpState::Rts | QpState::Err => {}
            _ => return Err(self.bad_state("post_send")),
        }
        let cause = {
            let mut sq = s.sq.lock();
            if s.state() == QpState::Err {
                for wr in wrs {
                    s.push_send(wr, WcStatus::WrFlushErr);
                }
                return Ok(());
            }
            if sq.wrs.len() + wrs.len() > s.caps.max_send_wr as usize {
                return Err(FabricError::QueueFull("sock: send queue"));
            }
            for wr in wrs {
                let (mr, bad) = s.check_local(wr);
                sq.wrs.push_back(WrEntry {
                    wr: *wr,
                    mr,
                    bad,
                    sent: 0,
                    started: false,
                    emitted: false,
                    last_psn: 0,
                });
            }
            s.sq_cv.notify_all();
            if sq.link_dead {
                Some(WcStatus::RetryExcErr)
            } else {
                sq.wrs.front().and_then(|e| e.bad)
            }
        };
        if let Some(c) = cause {
            s.fail(Some(c));
        }
        Ok(())
    }

    fn post_recv(&self, wr_id: u64) -> Result<()> {
        let s = &self.shared;
        if s.state() == QpState::Reset {
            return Err(self.bad_state("post_recv"));
        }
        let mut rq = s.rq.lock();
        if s.state() == QpState::Err {
            s.push_recv(wr_id, WcStatus::WrFlushErr, None, 0);
            return Ok(());
        }
        if rq.len() >= s.caps.max_recv_wr as usize {
            return Err(FabricError::QueueFull("sock: receive queue"));
        }
        rq.push_back(wr_id);
        s.rq_cv.notify_all();
        Ok(())
    }
}

impl Drop for SockQp {
    fn drop(&mut self) {
        let s = &self.shared;
        let threads = {
            let mut ctl = s.ctl.lock();
            s.stopped.store(true, SeqCst);
            std::mem::take(&mut ctl.threads)
        };
        // Destroying a queue pair completes nothing: `stopped` silences the flush.
        s.fail(None);
        for t in threads {
            let _ = t.join();
        }
        {
            let mut ctl = s.ctl.lock();
            ctl.out_sock = None;
            ctl.in_sock = None;
        }
        s.pd.unregister_qp(s.qpn);
    }
}
