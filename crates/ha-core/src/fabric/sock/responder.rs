//! Responder side of a `sock` queue pair: one thread per inbound stream that validates each
//! request against this PD's registrations BEFORE touching memory, places WRITE segments
//! (straight from the socket, last aligned word last with a Release store), consumes receives
//! for WRITE_WITH_IMM (waiting for one, with keep-alives, when none is posted), streams READ
//! responses, and ACKs (cumulative, coalesced while more frames are already buffered; frames
//! marked `QUIET`, unsignaled WRITEs, wait for the next ACK due, at most [`ACK_EVERY`] frames).

use super::lanes::{self, LaneFail};
use super::links::LaneLinks;
use super::liveness::LinkWatch;
use super::mr::{MrEntry, MrPin};
use super::net;
use super::qp_state::{QpShared, Stream};
use super::reader::{Abort, FrameReader};
use super::rx_watch::RxWatch;
use super::sequence::{RequestSeq, Step};
use super::wire::{flags, syndrome, Header, Op, HEADER_LEN};
use crate::fabric::{Access, WcStatus};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When the responder polls its stream instead of blocking (`Tunables::spin`): after the
/// second message in a row (the WRITEs up to and including a WRITE_WITH_IMM) of at most
/// [`SPIN_AFTER_MAX`] bytes; a larger WRITE ends the polling. Small messages in a row are a
/// latency-bound collective's steps, where the next one comes within tens of microseconds;
/// larger ones keep the stream busy by themselves, and a lone small one between them (NCCL's
/// empty sends) is no reason to poll (measured: bench/results/2026-11-27-sock-responder-spin.md).
#[derive(Default)]
struct SpinRule {
    /// Bytes of the WRITEs placed since the last WRITE_WITH_IMM.
    msg_bytes: u64,
    /// The last message was small.
    last_small: bool,
}

/// 8 KiB of payload plus room for the transport's 80-byte record (eager sends, at most 4 KiB,
/// add a 16-byte header): with two ranks, NCCL's LL steps of all_reduce at 8–32 KiB are 8 KiB
/// messages per channel, small messages too. Runs 91–93 of
/// bench/results/2026-11-27-sock-poll-8k.md (two ranks, H100): 8 KiB 12–24 % faster than with
/// 4 KiB, 16 KiB 18 %, 32 KiB 8–16 %; no size slower in the runs with an A/A column.
const SPIN_AFTER_MAX: u64 = (8 << 10) + 128;

impl SpinRule {
    /// A WRITE of `total` bytes starts: `true` when it ends the polling.
    fn write_starts(&self, total: u64) -> bool {
        total > SPIN_AFTER_MAX
    }
    /// A WRITE of `total` bytes was placed in full.
    fn write_done(&mut self, total: u64) {
        self.msg_bytes = self.msg_bytes.saturating_add(total);
    }
    /// Its WRITE_WITH_IMM ended a message: `true` when the responder should poll.
    fn message_done(&mut self) -> bool {
        let small = self.msg_bytes <= SPIN_AFTER_MAX;
        let poll = small && self.last_small;
        self.last_small = small;
        self.msg_bytes = 0;
        poll
    }
}
static ACKS_SENT: AtomicU64 = AtomicU64::new(0);

/// Process-wide: ACK frames the responders have sent.
pub fn acks_sent() -> u64 {
    ACKS_SENT.load(Ordering::Relaxed)
}

/// Retry windows a striped WRITE waits for a lane that never attached.
const LANE_ATTACH_WINDOWS: u32 = 10;

/// Coalesced ACKs are sent at least every this many frames.
const ACK_EVERY: u32 = 64;
/// Keep-alive period while waiting for a receive. The responder does not read its stream
/// meanwhile, so its kernel holds back the acknowledgements of what keeps arriving; each
/// keep-alive carries them, which keeps the sender's link from looking silent
/// ([`super::net::SILENCE_FLOOR`]).
pub const KEEPALIVE: Duration = Duration::from_millis(10);
const _: () = assert!(KEEPALIVE.as_millis() * 2 < super::net::SILENCE_FLOOR.as_millis());

/// Why the responder ends.
enum End {
    /// Stream closed or queue pair stopped: leave the queue pair as it is.
    Quiet,
    /// The stream broke or stalled in the middle of a frame or request: hang up on it.
    /// The queue pair's state is left alone, as a verbs responder's would be (the peer's
    /// requester, or our own on the other stream, reports the failure).
    Broken,
    /// Malformed traffic: the queue pair goes to ERR.
    Garbage(String),
    /// Refuse frame `psn` with `syndrome`, then the queue pair goes to ERR.
    Nak { psn: u32, syndrome: u32 },
}

/// Hold `place` shared and pin `mr` for a copy into or out of it for request `psn`: `Quiet`
/// once the queue pair is dead (the fence has passed or is waiting), a NAK with the access
/// syndrome when the registration went away meanwhile.
fn hold<'q>(
    qp: &'q QpShared,
    mr: Option<&Arc<MrEntry>>,
    psn: u32,
) -> Result<(parking_lot::RwLockReadGuard<'q, ()>, MrPin), End> {
    let g = qp.place.read();
    if qp.dead() {
        return Err(End::Quiet);
    }
    match mr.and_then(|m| m.pin()) {
        Some(pin) => Ok((g, pin)),
        None => Err(End::Nak {
            psn,
            syndrome: syndrome::REMOTE_ACCESS,
        }),
    }
}

/// The WRITE being placed (its sequencing is in [`RequestSeq`]).
struct WriteCtx {
    mr: Option<Arc<MrEntry>>,
    end: u64,
    total: u64,
    /// Start of the last aligned word (stored last); `== end` when there is none.
    tail_start: u64,
    tail: [u8; 8],
    /// Striped: (ordinal, streams). Its last word and completion wait for the lanes.
    stripe: Option<(u32, u16)>,
}

struct Responder<'a> {
    qp: &'a QpShared,
    fd: RawFd,
    rd: FrameReader,
    link: LinkWatch,
    seq: RequestSeq,
    cur: Option<WriteCtx>,
    /// ACK not yet sent: (psn, ended a WR), and how many frames it covers.
    pending: Option<(u32, bool)>,
    pending_frames: u32,
    /// A frame the pending ACK covers is not `QUIET`: send it before waiting for more.
    pending_due: bool,
    spin: SpinRule,
    /// [`flags::PROMPT`] when this stream's kernel caps its delayed ACK (`delack.rs`), else
    /// 0: on every ACK and keep-alive.
    prompt: u8,
}

/// Responder thread body.
pub fn run(qp: Arc<QpShared>, stream: Stream) {
    if !qp.wait_rtr() {
        return;
    }
    let fd = stream.as_raw_fd();
    let mut r = Responder {
        qp: &qp,
        fd,
        rd: FrameReader::new(fd, qp.pd.tun.spin).idle_tick(qp.pd.tun.idle_tick()),
        link: LinkWatch::new(qp.pd.tun.retry_timeout),
        seq: RequestSeq::new(),
        cur: None,
        pending: None,
        pending_frames: 0,
        pending_due: false,
        spin: SpinRule::default(),
        prompt: if super::delack::prompt(fd) {
            flags::PROMPT
        } else {
            0
        },
    };
    let end = r.serve();
    match end {
        End::Quiet => {}
        End::Broken => {
            if !qp.dead() {
                tracing::info!("sock: qp {} inbound stream broke mid-request", qp.qpn);
                net::shutdown(fd);
            }
        }
        End::Garbage(why) => {
            if !qp.dead() {
                tracing::warn!("sock: qp {}: bad request from peer: {why}", qp.qpn);
                qp.fail(None);
            }
        }
        End::Nak { psn, syndrome } => {
            if !qp.dead() {
                let _ = r.flush_ack();
                let mut h = Header::new(Op::Nak);
                h.psn = psn;
                h.imm = syndrome;
                let _ = r.send(&h, 0, 0);
                tracing::info!("sock: qp {} NAK psn {psn} syndrome {syndrome}", qp.qpn);
                qp.fail(None);
            }
        }
    }
    drop(stream);
}

impl Responder<'_> {
    fn serve(&mut self) -> End {
        loop {
            if self.pending.is_some() && !self.rd.header_ready() {
                if self.pending_due {
                    if let Err(e) = self.flush_ack() {
                        return e;
                    }
                } else {
                    // No ACK frame to carry the kernel's acknowledgement of what was read:
                    // have it sent now, not after the delayed-ACK timer (up to 200 ms on a
                    // stream this thread never writes to), or the peer's stream looks silent.
                    net::quickack(self.fd);
                }
            }
            let mut w = RxWatch {
                qp: self.qp,
                link: &mut self.link,
                fd: self.fd,
                region: None,
            };
            let hb = match self.rd.next_header(&mut w) {
                Ok(b) => b,
                Err(a) => return self.abort(a),
            };
            let (h, step) = match self.seq.next(&hb) {
                Ok(v) => v,
                Err(e) => return End::Garbage(e.to_string()),
            };
            let r = match step {
                Step::Write {
                    from,
                    to,
                    first,
                    last,
                    ..
                } => self.on_write(&h, first, from, to, last),
                Step::Read => self.on_read(&h),
            };
            if let Err(e) = r {
                return e;
            }
        }
    }

    fn abort(&self, a: Abort) -> End {
        match a {
            Abort::Stop => End::Quiet,
            Abort::Expired => End::Broken,
            Abort::Eof | Abort::Io(_) if self.cur.is_some() => End::Broken,
            Abort::Eof | Abort::Io(_) => End::Quiet,
        }
    }

    /// Send one frame (header + `len` bytes at `ptr`).
    fn send(&self, h: &Header, ptr: usize, len: usize) -> Result<(), End> {
        let hb = h.to_bytes();
        let mut iovs = [
            net::iov(hb.as_ptr(), HEADER_LEN),
            net::iov(ptr as *const u8, len),
        ];
        let n = if len > 0 { 2 } else { 1 };
        net::sendmsg_all(self.fd, &mut iovs[..n]).map_err(|_| End::Quiet)
    }

    /// Tell the peer this responder lives while it does not read its stream: the pending ACK,
    /// then a keep-alive (both carry the kernel's acknowledgement of what arrived meanwhile).
    fn keep_alive(&mut self) -> Result<(), End> {
        self.flush_ack()?;
        let mut h = Header::new(Op::KeepAlive);
        h.flags = self.prompt;
        self.send(&h, 0, 0)
    }

    fn flush_ack(&mut self) -> Result<(), End> {
        self.pending_due = false;
        if let Some((psn, done)) = self.pending.take() {
            self.pending_frames = 0;
            ACKS_SENT.fetch_add(1, Ordering::Relaxed);
            let mut h = Header::new(Op::Ack);
            h.psn = psn;
            h.flags = self.prompt;
            if done {
                h.flags |= flags::WR_DONE;
            }
            self.send(&h, 0, 0)?;
        }
        Ok(())
    }

    /// The registration `rkey` names, if it grants `access` over `[raddr, raddr+total)`.
    fn validate(&self, h: &Header, access: Access) -> Result<Option<Arc<MrEntry>>, End> {
        if h.total == 0 {
            // Zero-length requests touch no memory and check no key (as in verbs).
            return Ok(None);
        }
        match self.qp.remote_region(h.rkey, h.raddr, h.total, access) {
            Some(e) => Ok(Some(e)),
            None => Err(End::Nak {
                psn: h.psn,
                syndrome: syndrome::REMOTE_ACCESS,
            }),
        }
    }

    /// Place payload bytes `[a, b)` of a WRITE (sequence checked by [`RequestSeq`]).
    fn on_write(&mut self, h: &Header, first: bool, a: u64, b: u64, last: bool) -> Result<(), End> {
        if first {
            if self.spin.write_starts(h.total) {
                self.rd.stop_spinning();
            }
            let mr = self.validate(h, Access::REMOTE_WRITE)?;
            let end = h.raddr + h.total; // no overflow: checked by decode
            let tail_start = if h.total >= 8 && end % 8 == 0 {
                end - 8
            } else {
                end
            };
            self.cur = Some(WriteCtx {
                mr,
                end,
                total: h.total,
                tail_start,
                tail: [0; 8],
                stripe: h.has(flags::STRIPED).then_some((h.imm, h.lanes)),
            });
        }
        let qp = self.qp;
        // `RequestSeq` accepted a non-first segment only inside a WRITE.
        let Some(c) = self.cur.as_mut() else {
            return Err(End::Garbage(format!("WRITE segment {h:?} outside a WRITE")));
        };
        let len = b - a;
        if len > 0 {
            // (A NAK when it was deregistered between two segments of this WRITE.)
            let (g, pin) = hold(qp, c.mr.as_ref(), h.psn)?;
            let body_end = b.min(c.tail_start);
            let mut w = RxWatch {
                qp,
                link: &mut self.link,
                fd: self.fd,
                region: c.mr.as_deref(),
            };
            let mut r = Ok(());
            if a < body_end {
                // SAFETY: [raddr, raddr+total) was checked to lie inside the pinned
                // registration with REMOTE_WRITE (validate) and [a, body_end) is inside it;
                // the pin keeps it registered and `place` (shared) keeps the fence out.
                r = unsafe {
                    self.rd
                        .read_payload(a as *mut u8, (body_end - a) as usize, &mut w)
                };
            }
            if r.is_ok() && b > c.tail_start {
                let from = a.max(c.tail_start);
                let off = (from - c.tail_start) as usize;
                // SAFETY: `off + (b - from) <= 8`: the range is inside the 8-byte tail buffer.
                r = unsafe {
                    self.rd
                        .read_payload(c.tail.as_mut_ptr().add(off), (b - from) as usize, &mut w)
                };
            }
            if r.is_ok() && last && c.stripe.is_none() && c.tail_start < c.end {
                // SAFETY: `tail_start` is 8-byte aligned (end % 8 == 0) and the 8 bytes
                // lie inside the pinned registration (validated); the Release store
                // publishes every byte placed before it.
                let word = unsafe { AtomicU64::from_ptr(c.tail_start as *mut u64) };
                word.store(u64::from_ne_bytes(c.tail), Ordering::Release);
            }
            drop(pin);
            drop(g);
            if let Err(a) = r {
                return Err(match a {
                    Abort::Stop => End::Quiet,
                    _ => End::Broken,
                });
            }
        }
        let total = c.total;
        if let (true, Some((ordinal, streams))) = (last, c.stripe) {
            // The main stream's share is placed (alongside the lanes'); its last word and the
            // completion wait for every lane's.
            let (tail_start, end, tail, mr) = (c.tail_start, c.end, c.tail, c.mr.clone());
            self.wait_for_lanes(ordinal, streams, h.psn)?;
            if tail_start < end {
                let (g, pin) = hold(qp, mr.as_ref(), h.psn)?;
                // SAFETY: as above: aligned, inside the pinned registration, under `place`.
                let word = unsafe { AtomicU64::from_ptr(tail_start as *mut u64) };
                word.store(u64::from_ne_bytes(tail), Ordering::Release);
                drop(pin);
                drop(g);
            }
        }
        if last {
            self.cur = None;
            self.spin.write_done(total);
            if h.has(flags::IMM) {
                self.deliver_imm(h.imm, total)?;
            }
        }
        self.pending = Some((h.psn, last));
        self.pending_frames += 1;
        self.pending_due |= !h.has(flags::QUIET);
        if self.pending_frames >= ACK_EVERY {
            self.flush_ack()?;
        }
        Ok(())
    }

    /// Wait until every lane placed its share of striped WRITE `ordinal` (whose last frame is
    /// `psn`), sending keep-alives meanwhile: this stream is not read while it waits, and its
    /// kernel holds back the acknowledgements of what keeps arriving (as in [`deliver_imm`]).
    /// A lane that never attached ends it after [`LANE_ATTACH_WINDOWS`] retry windows (the
    /// peer opens its lanes before its first striped WRITE), one whose path died below the
    /// peer's threads after a retry window: then the stream is hung up (`End::Broken`).
    fn wait_for_lanes(&mut self, ordinal: u32, streams: u16, psn: u32) -> Result<(), End> {
        let since = Instant::now();
        let mut inbound = LaneLinks::new(self.qp.pd.tun.retry_timeout, false);
        loop {
            match lanes::wait(self.qp, ordinal, streams, KEEPALIVE) {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    self.keep_alive()?;
                    let waited = since.elapsed();
                    let retry = self.qp.pd.tun.retry_timeout;
                    if waited > retry {
                        match lanes::stuck(self.qp, streams, &mut inbound) {
                            Some(lanes::Stuck::Unattached(k))
                                if waited > retry * LANE_ATTACH_WINDOWS =>
                            {
                                return Err(End::Garbage(format!(
                                    "striped WRITE over {streams} streams: lane {k} never attached"
                                )));
                            }
                            Some(lanes::Stuck::Dead(why)) => {
                                tracing::info!("sock: qp {}: {why}", self.qp.qpn);
                                return Err(End::Broken);
                            }
                            _ => {}
                        }
                    }
                }
                Err(lanes::Wait::Stop) => return Err(End::Quiet),
                Err(lanes::Wait::Lane(LaneFail::Access)) => {
                    return Err(End::Nak {
                        psn,
                        syndrome: syndrome::REMOTE_ACCESS,
                    })
                }
                Err(lanes::Wait::Lane(LaneFail::Broken)) => return Err(End::Broken),
                Err(lanes::Wait::Lane(LaneFail::Garbage(g))) => return Err(End::Garbage(g)),
            }
        }
    }

    /// Consume a receive for a WRITE_WITH_IMM whose bytes are all placed; wait for one
    /// (sending keep-alives) while none is posted.
    fn deliver_imm(&mut self, imm: u32, total: u64) -> Result<(), End> {
        let qp = self.qp;
        let mut rq = qp.rq.lock();
        // The clock starts at the first miss: a receive is posted already almost always.
        let mut since = None;
        let mut said = false;
        loop {
            if qp.dead() {
                return Err(End::Quiet);
            }
            let waited = since.map_or(Duration::ZERO, |t: std::time::Instant| t.elapsed());
            if !said && waited > Duration::from_millis(200) {
                said = true;
                parking_lot::MutexGuard::unlocked(&mut rq, || {
                    tracing::info!(
                        "sock: qp {}: a WRITE_WITH_IMM (immediate {imm:#x}, {total} bytes) has waited {waited:?} for a receive; the stream is not read meanwhile",
                        qp.qpn
                    )
                });
                continue;
            }
            if let Some(id) = rq.pop_front() {
                crate::fabric::stages::mark("sock_place", total);
                qp.push_recv(id, WcStatus::Success, Some(imm), total as u32);
                if self.spin.message_done() {
                    crate::fabric::stages::mark("spin_arm", total);
                    self.rd.spin_a_while();
                }
                return Ok(());
            }
            since.get_or_insert_with(std::time::Instant::now);
            if qp.rq_cv.wait_for(&mut rq, KEEPALIVE).timed_out() && !qp.dead() {
                let r = parking_lot::MutexGuard::unlocked(&mut rq, || self.keep_alive());
                r?;
            }
        }
    }

    fn on_read(&mut self, h: &Header) -> Result<(), End> {
        if self.cur.is_some() {
            return Err(End::Garbage("READ inside a WRITE".into()));
        }
        let mr = self.validate(h, Access::REMOTE_READ)?;
        // The READ_RESP frames acknowledge everything before them.
        self.pending = None;
        self.pending_frames = 0;
        self.pending_due = false;
        let qp = self.qp;
        let seg = qp.pd.tun.segment_bytes as u64;
        let mut off = 0u64;
        loop {
            let n = seg.min(h.total - off);
            let mut r = Header::new(Op::ReadResp);
            r.psn = h.psn;
            r.raddr = off;
            r.total = h.total;
            r.len = n as u32;
            if off == 0 {
                r.flags |= flags::FIRST;
            }
            if off + n == h.total {
                r.flags |= flags::LAST;
            }
            if n > 0 {
                let (g, pin) = hold(qp, mr.as_ref(), h.psn)?;
                // The payload is read by sendmsg from [raddr+off, +n), inside the pinned
                // registration with REMOTE_READ (validate).
                let res = self.send(&r, (h.raddr + off) as usize, n as usize);
                drop(pin);
                drop(g);
                res?;
            } else {
                self.send(&r, 0, 0)?;
            }
            off += n;
            if off == h.total {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SpinRule, SPIN_AFTER_MAX};

    /// A message of `writes` (bytes of each WRITE, the last one carrying the immediate):
    /// whether any WRITE ended the polling, and whether the message starts it.
    fn message(r: &mut SpinRule, writes: &[u64]) -> (bool, bool) {
        let mut stops = false;
        for &w in writes {
            stops |= r.write_starts(w);
            r.write_done(w);
        }
        (stops, r.message_done())
    }

    #[test]
    fn polling_starts_at_the_second_small_message_in_a_row() {
        let mut r = SpinRule::default();
        // Fast 8 B sends, eager 4 KiB sends (payload + 16-byte header), records of empty sends.
        assert_eq!(message(&mut r, &[8]), (false, false));
        assert_eq!(message(&mut r, &[8]), (false, true));
        assert_eq!(message(&mut r, &[4096, 16]), (false, true));
        assert_eq!(message(&mut r, &[4096, 80]), (false, true));
        // NCCL's 8 KiB LL steps: with a fast immediate (no record), or followed by the record.
        assert_eq!(message(&mut r, &[8192]), (false, true));
        assert_eq!(message(&mut r, &[8192, 80]), (false, true));
        assert_eq!(message(&mut r, &[0, 80]), (false, true));
        assert_eq!(message(&mut r, &[SPIN_AFTER_MAX]), (false, true));
    }

    #[test]
    fn a_large_message_stops_polling_and_a_lone_small_one_does_not_start_it() {
        let mut r = SpinRule::default();
        message(&mut r, &[16]);
        assert_eq!(message(&mut r, &[16]), (false, true));
        // A large message's payload WRITE ends the polling; its small record does not count
        // it as small.
        assert_eq!(message(&mut r, &[256 << 10, 80]), (true, false));
        // NCCL's empty sends between large messages: never a reason to poll.
        for _ in 0..3 {
            assert_eq!(message(&mut r, &[80]), (false, false));
            assert_eq!(message(&mut r, &[128 << 10, 80]), (true, false));
        }
        // Several small WRITEs adding up to more than the limit make a large message (each
        // after a small one, so a wrong sum would start the polling).
        message(&mut r, &[8]);
        assert_eq!(message(&mut r, &[4096, 4096, 4096, 80]), (false, false));
        message(&mut r, &[8]);
        assert_eq!(message(&mut r, &[4096, 4096, 128]), (false, true));
        assert_eq!(message(&mut r, &[4096, 4096, 129]), (false, false));
        message(&mut r, &[8]);
        assert_eq!(message(&mut r, &[8192, 129]), (false, false));
        assert_eq!(message(&mut r, &[SPIN_AFTER_MAX + 1]), (true, false));
        assert_eq!(message(&mut r, &[8]), (false, false));
        assert_eq!(message(&mut r, &[8]), (false, true));
    }
}
