//! The state a `sock` queue pair's handle and I/O threads share: the RC state machine, the
//! send and receive queues, the streams, the error path (flush + fence) and completions.
//!
//! Lock order: `fail_mx` → `ctl` / `sq` / `rq` → PD key table. `place` is taken shared
//! only around copies into/out of memory, never while calling [`QpShared::fail`], and
//! exclusively only by `fail` (the fence).

use super::cq::SockCq;
use super::domain::PdShared;
use super::lane_state::LaneState;
use super::mr::{MrEntry, MrPin};
use super::net;
use super::wire::psn_le;
use super::{spawn, SockEndpoint};
use crate::fabric::counters::{Counted, Held};
use crate::fabric::{Access, Completion, QpCaps, QpState, SendOp, SendWr, WcOpcode, WcStatus};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(super) fn state_to_u8(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Err => 4,
    }
}

pub(super) fn state_from_u8(v: u8) -> QpState {
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

impl SendQueue {
    /// What the queue holds, for an error that says why it is full.
    pub fn summary(&self) -> String {
        let emitted = self.wrs.iter().filter(|e| e.emitted).count();
        let signaled = self.wrs.iter().filter(|e| e.wr.signaled).count();
        let sig_emitted = self
            .wrs
            .iter()
            .filter(|e| e.wr.signaled && e.emitted)
            .count();
        let front = self.wrs.front().map(|e| {
            format!(
                "front: id {:#x} signaled {} emitted {} psn {} len {}",
                e.wr.wr_id, e.wr.signaled, e.emitted, e.last_psn, e.wr.local.len
            )
        });
        format!(
            "{} WRs ({emitted} emitted, {signaled} signaled of which {sig_emitted} emitted), next_send {}, next_psn {}, last progress {:?} ago, tail_pending {}; {}",
            self.wrs.len(),
            self.next_send,
            self.next_psn,
            self.last_progress.elapsed(),
            self.tail_pending,
            front.unwrap_or_default()
        )
    }

    /// Whether a WR in flight waits for an ACK: one that is signaled or not fully emitted.
    /// Emitted unsignaled WRs (`QUIET`) wait for none: the next ACK due covers them, and
    /// until then they count as done for the retry timer and a broken stream, as they would
    /// have been had each got its own ACK.
    /// WRs start in posting order, so the started ones are a prefix of the queue: the scan
    /// stops at the first one not started (not at the queue's end, which may hold hundreds).
    pub fn awaits_ack(&self) -> bool {
        self.wrs
            .iter()
            .take_while(|e| e.started)
            .any(WrEntry::awaits_ack)
    }

    /// Whether any WR posted, started or not, will wait for an ACK: what keeps the ack reader
    /// off its long tick (one posted and not yet started soon will).
    pub fn any_awaits_ack(&self) -> bool {
        self.wrs.iter().any(WrEntry::awaits_ack)
    }
}

impl WrEntry {
    /// Signaled, or not fully emitted (see [`SendQueue::awaits_ack`]).
    fn awaits_ack(&self) -> bool {
        self.wr.signaled || !self.emitted
    }
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
    /// A posting thread left the rest of its batch in [`TxState::tail`]: the sender thread
    /// writes it.
    pub tail_pending: bool,
    /// Ordinal of the last striped WRITE (`lanes.rs`).
    pub stripe_ordinal: u32,
}

/// The right to write the outbound stream (held by whoever writes frames: the sender thread,
/// or a posting thread that found the stream free), and bytes that must go out first.
#[derive(Default)]
pub struct TxState {
    /// The unsent rest of a batch a posting thread began without blocking (already copied
    /// out of local memory).
    pub tail: Vec<u8>,
}

impl Control {
    /// The lane streams of one direction (`outbound`: the ones this queue pair writes).
    pub(super) fn lanes(&self, outbound: bool) -> impl Iterator<Item = &Stream> {
        self.lane_socks
            .iter()
            .filter(move |(_, out)| *out == outbound)
            .map(|(s, _)| s)
    }
}

pub struct Control {
    pub remote: Option<SockEndpoint>,
    pub(super) threads: Vec<JoinHandle<()>>,
    pub(super) out_sock: Option<Stream>,
    pub(super) in_sock: Option<Stream>,
    pub(super) inbound_attached: bool,
    /// Lane streams (`lanes.rs`), with whether each is outbound.
    pub(super) lane_socks: Vec<(Stream, bool)>,
}

/// A data stream, shared by the thread that reads or writes it and the queue pair's
/// [`Control`] (which shuts it down in `fail` and keeps its descriptor open until the queue
/// pair is dropped): one descriptor, closed when the last holder lets go.
pub type Stream = Arc<Counted<TcpStream>>;

/// Everything a queue pair's threads share.
pub struct QpShared {
    pub qpn: u32,
    pub nonce: u64,
    pub pd: Arc<PdShared>,
    pub cq: Arc<SockCq>,
    pub(super) caps: QpCaps,
    pub(super) state: AtomicU8,
    pub(super) stopped: AtomicBool,
    pub ctl: Mutex<Control>,
    pub ctl_cv: Condvar,
    pub sq: Mutex<SendQueue>,
    pub sq_cv: Condvar,
    /// Lock order: `tx` → `sq` (the sender thread); a posting thread holding `sq` only
    /// `try_lock`s it.
    pub tx: Mutex<TxState>,
    /// The outbound stream's descriptor once connected (-1 before): kept open by
    /// `Control::out_sock` until the queue pair is dropped.
    pub(super) out_fd: AtomicI32,
    pub rq: Mutex<VecDeque<u64>>,
    pub rq_cv: Condvar,
    /// Shared around every copy into or out of memory; exclusive = the `to_err` fence.
    pub place: RwLock<()>,
    pub(super) fail_mx: Mutex<()>,
    /// The ack reader's last word on the link: [`LINK_UNKNOWN`], [`LINK_ALIVE`] or
    /// [`LINK_DEAD`].
    pub(super) link: AtomicU8,
    /// The ack reader waits with its long tick (`reader.rs`): a post kicks it awake.
    pub(super) ack_long: AtomicBool,
    /// The peer's responder said its kernel acknowledges promptly (`flags::PROMPT` on an ACK
    /// or keep-alive): a lone segment's silence counts from the round trip (`delack.rs`).
    pub(super) peer_prompt: AtomicBool,
    /// The eventfd that kick goes to, made at the ack reader's first long wait (None: it
    /// could not be made, and the reader keeps its short tick).
    pub(super) ack_kick: std::sync::OnceLock<Option<super::net::KickFd>>,
    /// Striping over lanes (`lanes.rs`); leaf lock.
    pub lanes: Mutex<LaneState>,
    pub lanes_cv: Condvar,
    pub lane_jobs_cv: Condvar,
    pub(super) _held: Held,
}

pub(super) const LINK_UNKNOWN: u8 = 0;
pub(super) const LINK_ALIVE: u8 = 1;
pub(super) const LINK_DEAD: u8 = 2;

impl QpShared {
    /// Nothing posted waits for an answer ([`SendQueue::any_awaits_ack`]).
    pub(super) fn ack_quiet(&self) -> bool {
        !self.sq.lock().any_awaits_ack()
    }

    /// After a post: wake the ack reader if it waits with its long tick (its watch rechecks
    /// [`QpShared::ack_quiet`] after raising `ack_long`, so a post either is seen there or
    /// finds the flag raised here).
    pub(super) fn kick_ack_reader(&self) {
        if self.ack_long.load(SeqCst) {
            if let Some(Some(k)) = self.ack_kick.get() {
                k.kick();
            }
        }
    }

    /// Tune a stream of this queue pair (main or lane, either direction): its socket options
    /// with receive timeout `tick`, and the traffic class asked at creation (`QpCaps`).
    pub fn tune(&self, s: &TcpStream, tick: Duration) -> std::io::Result<()> {
        net::tune_stream(s, tick)?;
        if let Some(tc) = self.caps.traffic_class {
            net::set_traffic_class(s, tc)?;
        }
        Ok(())
    }

    /// Tune an inbound stream (main or lane) before its reader reads it: [`QpShared::tune`]
    /// with the receive tick, and the delayed-ACK cap the responder announces in its ACKs.
    pub fn tune_inbound(&self, s: &TcpStream) -> std::io::Result<()> {
        self.tune(s, self.pd.tun.rx_tick())?;
        super::delack::cap(s.as_raw_fd(), self.pd.tun.delack_max);
        Ok(())
    }

    /// Wait until the queue pair reaches RTR (a responder places nothing before); `false`
    /// when it died first.
    pub fn wait_rtr(&self) -> bool {
        let mut ctl = self.ctl.lock();
        loop {
            if self.dead() {
                return false;
            }
            if self.state() >= QpState::Rtr {
                return true;
            }
            self.ctl_cv.wait_for(&mut ctl, Duration::from_millis(200));
        }
    }

    pub fn state(&self) -> QpState {
        state_from_u8(self.state.load(SeqCst))
    }

    /// In ERR or being dropped: I/O threads stop.
    pub fn dead(&self) -> bool {
        self.state.load(SeqCst) == state_to_u8(QpState::Err) || self.stopped.load(SeqCst)
    }

    pub(super) fn cas(&self, from: QpState, to: QpState) -> bool {
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
            if sq.next_send == sq.wrs.len() && !sq.awaits_ack() {
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
            let lanes = ctl.lane_socks.iter().map(|(s, _)| s);
            for s in ctl.out_sock.iter().chain(ctl.in_sock.iter()).chain(lanes) {
                net::shutdown(s.as_raw_fd());
            }
            self.ctl_cv.notify_all();
        }
        drop(self.lanes.lock());
        self.lanes_cv.notify_all();
        self.lane_jobs_cv.notify_all();
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
    pub fn set_out_sock(&self, s: Stream) -> bool {
        let mut ctl = self.ctl.lock();
        if self.dead() {
            return false;
        }
        self.out_fd.store(s.as_raw_fd(), SeqCst);
        ctl.out_sock = Some(s);
        true
    }

    /// Keep lane stream `s` (so `fail` can shut it, and link checks see an outbound one);
    /// false if the queue pair is dead.
    pub fn add_lane_stream(&self, s: &Stream, outbound: bool) -> bool {
        let mut ctl = self.ctl.lock();
        if self.dead() {
            return false;
        }
        ctl.lane_socks.push((Arc::clone(s), outbound));
        true
    }

    /// Before reading local memory onto a stream: hold `place` shared (the fence waits for the
    /// copy) and pin each source registration into `pins`. `None` when the queue pair is dead,
    /// or was just failed (`LocProtErr`) because a registration vanished under a posted WR.
    pub(super) fn hold_sources(
        &self,
        mrs: &[Arc<MrEntry>],
        pins: &mut Vec<MrPin>,
    ) -> Option<parking_lot::RwLockReadGuard<'_, ()>> {
        let g = self.place.read();
        if self.dead() {
            return None;
        }
        for m in mrs {
            match m.pin() {
                Some(p) => pins.push(p),
                None => {
                    pins.clear();
                    drop(g);
                    self.fail(Some(WcStatus::LocProtErr));
                    return None;
                }
            }
        }
        Some(g)
    }

    /// The registration `rkey` names, if it grants `access` over `[raddr, raddr + total)`
    /// (what a responder checks before it touches memory for a request).
    pub(super) fn remote_region(
        &self,
        rkey: u32,
        raddr: u64,
        total: u64,
        access: Access,
    ) -> Option<Arc<MrEntry>> {
        self.pd
            .mrs
            .get(rkey)
            .filter(|e| e.access.contains(access) && e.contains(raddr, total))
    }

    /// Local check of a send WR: `(registration, failure status)`.
    pub(super) fn check_local(&self, wr: &SendWr) -> (Option<Arc<MrEntry>>, Option<WcStatus>) {
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
