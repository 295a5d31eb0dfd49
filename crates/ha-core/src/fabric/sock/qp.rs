//! Queue pairs of the `sock` fabric: the handle the engine holds (state transitions, posting
//! sends and receives), and how a queue pair takes its inbound stream from the listener. The
//! shared state is in `qp_state.rs`; the I/O threads are the requester (`requester.rs`, started
//! at RTS) and the responder (`responder.rs`, started when the inbound stream arrives).

use super::cq::SockCq;
use super::domain::InboundTarget;
use super::hello::Hello;
use super::limits::QpSlot;
use super::listener::PdCore;
use super::net;
use super::qp_state::{state_to_u8, Control, QpShared, SendQueue, TxState, WrEntry};
use super::{requester, responder, SockEndpoint};
use crate::fabric::counters::{Counted, Held, Resource};
use crate::fabric::{FabricError, QpCaps, QpState, QueuePair, Result, SendOp, SendWr, WcStatus};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, Weak};
use std::time::Instant;

static NEXT_QPN: AtomicU32 = AtomicU32::new(1);

impl InboundTarget for QpShared {
    /// The listener found a stream whose hello names this queue pair.
    fn attach_inbound(self: Arc<Self>, s: Counted<TcpStream>, hello: &Hello) -> bool {
        if hello.target_nonce != self.nonce {
            return false;
        }
        if hello.lane > 0 {
            if self.tune_inbound(&s).is_err() {
                return false;
            }
            return super::lanes::attach(&self, s, hello.lane);
        }
        let clone = {
            let mut ctl = self.ctl.lock();
            if self.dead() || ctl.inbound_attached {
                return false;
            }
            if self.tune_inbound(&s).is_err() {
                return false;
            }
            // One inbound stream per queue pair, ever.
            ctl.inbound_attached = true;
            Arc::new(s)
        };
        tracing::debug!(
            "sock: qp {} inbound stream from qp {}",
            self.qpn,
            hello.source_qpn
        );
        // Spawn first (it waits for RTR), then publish for `fail` under the same check.
        let mut stream = Some(Arc::clone(&clone));
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
}

/// The queue pair handle (`create_qp`).
pub struct SockQp {
    shared: Arc<QpShared>,
    /// The posting thread's frames, pins and iovecs, kept between posts so that a small
    /// message written inline allocates nothing. Used only while holding `shared.tx`.
    inline_scratch: parking_lot::Mutex<requester::Scratch>,
    _core: Arc<PdCore>,
    /// The rail's queue-pair slot this queue pair uses (given back after it is destroyed).
    _slot: Option<QpSlot>,
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
                lane_socks: Vec::new(),
            }),
            ctl_cv: Condvar::new(),
            sq: Mutex::new(SendQueue {
                wrs: VecDeque::with_capacity(caps.max_send_wr.min(4096) as usize),
                next_send: 0,
                next_psn: 0,
                last_progress: Instant::now(),
                link_dead: false,
                tail_pending: false,
                stripe_ordinal: 0,
            }),
            sq_cv: Condvar::new(),
            tx: Mutex::new(TxState::default()),
            out_fd: AtomicI32::new(-1),
            rq: Mutex::new(VecDeque::new()),
            rq_cv: Condvar::new(),
            place: RwLock::new(()),
            fail_mx: Mutex::new(()),
            link: AtomicU8::new(super::qp_state::LINK_UNKNOWN),
            ack_long: AtomicBool::new(false),
            peer_prompt: AtomicBool::new(false),
            ack_kick: std::sync::OnceLock::new(),
            lanes: Mutex::new(Default::default()),
            lanes_cv: Condvar::new(),
            lane_jobs_cv: Condvar::new(),
            _held: Held::new(Resource::Qp),
        });
        let target: Weak<dyn InboundTarget> = Arc::downgrade(&shared) as Weak<dyn InboundTarget>;
        core.shared.register_qp(shared.qpn, target);
        SockQp {
            shared,
            inline_scratch: Default::default(),
            _core: core,
            _slot: None,
        }
    }

    /// Keep `slot` (of the rail's emulated `max_qp`) for this queue pair's life.
    pub(super) fn hold_slot(&mut self, slot: QpSlot) {
        self._slot = Some(slot);
    }

    fn bad_state(&self, op: &'static str) -> FabricError {
        FabricError::BadState {
            state: self.shared.state(),
            op,
        }
    }
}

static INLINE_BATCHES: AtomicU64 = AtomicU64::new(0);
static INLINE_TAILS: AtomicU64 = AtomicU64::new(0);

/// Process-wide: batches a posting thread wrote itself, and how many of those left a tail
/// (bytes the socket did not take at once) for the sender thread.
pub fn inline_stats() -> (u64, u64) {
    (INLINE_BATCHES.load(Relaxed), INLINE_TAILS.load(Relaxed))
}

impl SockQp {
    /// The stream's write right, if the stream is connected and nobody writes it now (never
    /// waits: the sender thread takes `tx` before `sq`), with the frames of the newly posted
    /// WRs taken into the inline scratch batch (kept from post to post: nothing is allocated
    /// once it has grown).
    fn try_take_inline<'a>(
        &'a self,
        sq: &mut SendQueue,
    ) -> Option<parking_lot::MutexGuard<'a, TxState>> {
        let s = &self.shared;
        if s.out_fd.load(SeqCst) < 0 {
            return None;
        }
        let tx = s.tx.try_lock()?;
        if !tx.tail.is_empty() {
            return None;
        }
        let mut sc = self.inline_scratch.lock();
        sc.batch.clear();
        // Pins a write left behind (only if it panicked) release their registrations now.
        sc.pins.clear();
        // Never striped: a posting thread does not wait for lanes to open.
        requester::take_frames(sq, s.pd.tun.segment_bytes as u64, 1, &mut sc.batch);
        Some(tx)
    }

    /// Write the batch taken by [`SockQp::try_take_inline`] without blocking: what the socket
    /// does not take now is copied for the sender thread, which is woken to write it.
    fn write_inline(&self, mut tx: parking_lot::MutexGuard<'_, TxState>) {
        let s = &self.shared;
        let r = {
            // Taken only while holding `tx` (so never contended), and released before `tx`.
            // The write may take `sq` while holding it (a registration gone: `fail`); no one
            // takes the scratch while holding `sq` without `tx`, so that cannot deadlock.
            let mut g = self.inline_scratch.lock();
            if g.batch.is_empty() {
                return;
            }
            let fd = s.out_fd.load(SeqCst);
            INLINE_BATCHES.fetch_add(1, Relaxed);
            let sc = &mut *g;
            let r = requester::write_batch(
                s,
                fd,
                &sc.batch,
                &mut sc.pins,
                &mut sc.iovs.0,
                Some(&mut tx.tail),
            );
            // The frames' registrations are released now, not at the next post.
            sc.batch.clear();
            r
        };
        let left = !tx.tail.is_empty();
        drop(tx);
        match r {
            Ok(()) => {
                if left {
                    INLINE_TAILS.fetch_add(1, Relaxed);
                    s.sq.lock().tail_pending = true;
                    s.sq_cv.notify_all();
                }
            }
            Err(requester::WriteFail::Dead) => {}
            Err(requester::WriteFail::Io(e)) => {
                if !s.dead() {
                    tracing::info!("sock: qp {} send: {e}", s.qpn);
                    s.fail(Some(WcStatus::RetryExcErr));
                }
            }
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
        if crate::fabric::stages::enabled() {
            let v = wrs.first().map_or(0, |w| {
                u64::from(matches!(w.op, SendOp::WriteWithImm(_))) << 32 | w.local.len as u64
            });
            crate::fabric::stages::mark("sock_post", v);
        }
        let bytes = wrs
            .iter()
            .fold(0usize, |b, wr| b.saturating_add(wr.local.len));
        let imm = wrs
            .iter()
            .any(|wr| matches!(wr.op, SendOp::WriteWithImm(_)));
        // Judged outside the send-queue lock, which the sender thread contends for.
        let limit = s.pd.tun.inline_bytes;
        let allowed = match s.pd.tun.inline_gate {
            // Every larger message is noted (inline_gate.rs: they tell who else sends).
            Some(gate) => gate.may_inline(s.qpn, bytes, limit),
            None => bytes <= limit,
        } && limit > 0;
        let mut inline = None;
        let cause = {
            let mut sq = s.sq.lock();
            if s.state() == QpState::Err {
                for wr in wrs {
                    s.push_send(wr, WcStatus::WrFlushErr);
                }
                return Ok(());
            }
            if sq.wrs.len() + wrs.len() > s.caps.max_send_wr as usize {
                // What it holds, for the first few per process (a caller that waits and
                // retries would repeat it at every poll).
                static SAID: AtomicU32 = AtomicU32::new(0);
                if SAID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 8 {
                    // Logged after the lock is released (the sender thread and the ack
                    // reader wait for it).
                    let summary = sq.summary();
                    drop(sq);
                    tracing::info!("sock: qp {}: send queue full: {summary}", s.qpn);
                }
                return Err(FabricError::QueueFull("sock: send queue"));
            }
            // The sender thread has nothing of its own to emit: these WRs come first.
            let idle = sq.next_send == sq.wrs.len() && !sq.tail_pending;
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
            if idle && imm && allowed && !sq.link_dead && requester::has_work(&sq) {
                inline = self.try_take_inline(&mut sq);
            }
            if inline.is_none() || requester::has_work(&sq) {
                s.sq_cv.notify_all();
            }
            if sq.link_dead {
                Some(WcStatus::RetryExcErr)
            } else {
                sq.wrs.front().and_then(|e| e.bad)
            }
        };
        s.kick_ack_reader();
        if let Some(tx) = inline {
            self.write_inline(tx);
        }
        if let Some(c) = cause {
            s.fail(Some(c));
        }
        Ok(())
    }

    fn link_alive(&self) -> Option<bool> {
        use super::qp_state::{LINK_ALIVE, LINK_DEAD};
        match self.shared.link.load(SeqCst) {
            LINK_ALIVE => Some(true),
            LINK_DEAD => Some(false),
            _ => None,
        }
    }

    fn reports_link_silence(&self) -> bool {
        true
    }

    fn silence_floor(&self) -> std::time::Duration {
        super::net::SILENCE_FLOOR
    }

    fn link_silence(&self) -> Option<std::time::Duration> {
        // Under `ctl`, so the stream cannot be closed (and its descriptor reused) meanwhile.
        // The lanes' too: striped bytes may wait there while the main stream's are through.
        let ctl = self.shared.ctl.lock();
        let lanes = ctl.lanes(true);
        let prompt = self
            .shared
            .peer_prompt
            .load(std::sync::atomic::Ordering::Relaxed);
        let main = net::tcp_sample(ctl.out_sock.as_ref()?.as_raw_fd())
            .ok()?
            .silence(prompt);
        Some(lanes.fold(main, |m, s| {
            net::tcp_sample(s.as_raw_fd()).map_or(m, |t| m.max(t.silence(prompt)))
        }))
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
            ctl.lane_socks.clear();
        }
        s.pd.unregister_qp(s.qpn);
    }
}
