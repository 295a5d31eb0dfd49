//! Requester side of a `sock` queue pair: the sender thread (connect, hello, WRITE segments
//! and READ requests in posting order, gathered into few `sendmsg` calls) and the ack reader
//! thread (ACK/NAK/keep-alive, READ data placed into local memory, the retry timer).
//!
//! PSNs: every frame the requester sends takes the next PSN (one per WRITE segment, one per
//! READ request), starting at 0 on each stream. An ACK for PSN p completes every WR whose
//! last frame is at or before p; READ responses carry their request's PSN. The last frame of
//! an unsignaled WRITE is marked `QUIET`: its ACK may wait for the next one the responder
//! sends (an unsignaled WR has no completion, so nothing waits for it; it leaves the send
//! queue when a later ACK covers it, as on an RC NIC).

use super::ack_watch::AckWatch;
use super::connect::connect;
use super::lanes::{self, LaneJob};
use super::links::Links;
use super::mr::{MrEntry, MrPin};
use super::net;
use super::qp_state::{QpShared, SendQueue, Stream, LINK_ALIVE};
use super::reader::{Abort, FrameReader};
use super::wire::{
    flags, stripe_share, striped_bytes, syndrome, Header, Op, HEADER_LEN, MAX_SEGMENT_BYTES,
};
use crate::fabric::{SendOp, WcStatus};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most frames gathered into one `sendmsg`.
pub(super) const MAX_BATCH: usize = 64;

/// Sender thread body: connect, then emit frames until the queue pair dies.
pub fn run_sender(qp: Arc<QpShared>) {
    let Some(stream) = connect(&qp) else {
        return;
    };
    let stream: Stream = Arc::new(stream);
    if !qp.set_out_sock(Arc::clone(&stream)) {
        return;
    }
    let mut rs = Some(Arc::clone(&stream));
    if !qp.add_thread(format!("sock-ack-{}", qp.qpn), move |q| {
        run_ack_reader(q, rs.take().expect("stream"))
    }) {
        return;
    }
    send_loop(&qp, &stream);
}

/// One frame of a batch: its header and payload (`ptr`, `len`).
pub(super) struct Frame {
    hdr: [u8; HEADER_LEN],
    ptr: usize,
    len: usize,
}

/// Frames taken off the send queue, with the registrations their payloads come from.
#[derive(Default)]
pub(super) struct Batch {
    frames: Vec<Frame>,
    mrs: Vec<Arc<MrEntry>>,
    /// Frames of striped WRITEs for the lanes: (lane, frame).
    lane_jobs: Vec<(usize, LaneJob)>,
}

/// A batch and the buffers writing it needs, reused from one write to the next.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) batch: Batch,
    pub(super) pins: Vec<MrPin>,
    pub(super) iovs: Iovecs,
}

/// The iovecs of one write, kept (as capacity) for the next.
#[derive(Default)]
pub(super) struct Iovecs(pub(super) Vec<libc::iovec>);

// SAFETY: the pointers in these iovecs are dereferenced only by the `sendmsg` of the
// `write_batch` call that filled them (it clears the vector first), on the thread that holds
// the scratch's lock; between writes they are stale and never read.
unsafe impl Send for Iovecs {}

impl Batch {
    fn with_capacity(n: usize) -> Batch {
        Batch {
            frames: Vec::with_capacity(n),
            mrs: Vec::with_capacity(n),
            lane_jobs: Vec::new(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.frames.clear();
        self.mrs.clear();
        self.lane_jobs.clear();
    }

    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }
}

/// Whether the next WR to emit is a WRITE large enough to be striped.
fn next_is_large(sq: &SendQueue) -> bool {
    has_work(sq)
        && sq.wrs[sq.next_send].wr.op != SendOp::Read
        && sq.wrs[sq.next_send].wr.local.len as u64 >= lanes::STRIPE_MIN
}

/// Whether the send queue holds a frame to emit (the next unsent WR passed its local check).
pub(super) fn has_work(sq: &SendQueue) -> bool {
    sq.next_send < sq.wrs.len() && sq.wrs[sq.next_send].bad.is_none()
}

/// Take up to [`MAX_BATCH`] frames (about one segment of payload) off the send queue, in
/// posting order, giving each the next PSN. The caller holds the queue pair's `tx` lock, so
/// frames reach the stream in the order they were taken. With `streams` > 1 a WRITE of at
/// least [`lanes::STRIPE_MIN`] bytes is striped: its lane frames go to `b.lane_jobs` and a
/// `STRIPED` frame starts it on the main stream.
pub(super) fn take_frames(sq: &mut SendQueue, seg: u64, streams: u16, b: &mut Batch) {
    if !sq.awaits_ack() {
        // Nothing was outstanding: the retry timer starts now.
        sq.last_progress = Instant::now();
    }
    let mut bytes = 0u64;
    while b.frames.len() < MAX_BATCH && bytes < seg && sq.next_send < sq.wrs.len() {
        let i = sq.next_send;
        let psn = sq.next_psn;
        let e = &mut sq.wrs[i];
        if e.bad.is_some() {
            break;
        }
        e.started = true;
        let mut h = Header::new(Op::Write);
        h.rkey = e.wr.rkey;
        h.psn = psn;
        let total = e.wr.local.len as u64;
        h.total = total;
        // A WRITE not begun yet goes over the lanes, one share each, if it is large enough.
        let share = if e.sent == 0 {
            stripe_share(total, streams)
        } else {
            0
        };
        let (ptr, len);
        match e.wr.op {
            SendOp::Read => {
                h.op = Op::ReadReq;
                h.raddr = e.wr.remote_addr;
                (ptr, len) = (0, 0);
                e.emitted = true;
            }
            SendOp::Write | SendOp::WriteWithImm(_) if share > 0 => {
                let striped = striped_bytes(total, streams);
                let ordinal = sq.stripe_ordinal.wrapping_add(1);
                sq.stripe_ordinal = ordinal;
                lanes::count_striped();
                let mr = e.mr.as_ref().expect("checked at post");
                for lane in 1..usize::from(streams) {
                    let off = share * (lane as u64 - 1);
                    let mut l = h;
                    l.flags = flags::LANE;
                    (l.psn, l.raddr) = (ordinal, e.wr.remote_addr);
                    (l.len, l.imm, l.lanes) = (share as u32, off as u32, streams);
                    let job = LaneJob {
                        hdr: l.to_bytes(),
                        ptr: e.wr.local.addr + off as usize,
                        len: share as usize,
                        mr: mr.clone(),
                    };
                    b.lane_jobs.push((lane, job));
                }
                h.flags = flags::FIRST | flags::STRIPED;
                (h.raddr, h.imm, h.lanes) = (e.wr.remote_addr, ordinal, streams);
                e.sent = striped;
                (ptr, len) = (0, 0);
            }
            SendOp::Write | SendOp::WriteWithImm(_) => {
                let off = e.sent;
                let n = seg.min(total - off);
                h.raddr = e.wr.remote_addr + off;
                h.len = n as u32;
                if off == 0 {
                    h.flags |= flags::FIRST;
                }
                if off + n == total {
                    h.flags |= flags::LAST;
                    e.emitted = true;
                    match e.wr.op {
                        SendOp::WriteWithImm(imm) => {
                            h.flags |= flags::IMM;
                            h.imm = imm;
                        }
                        // Nobody waits for its completion: its ACK may come with a later one.
                        _ if !e.wr.signaled => h.flags |= flags::QUIET,
                        _ => {}
                    }
                }
                (ptr, len) = (e.wr.local.addr + off as usize, n as usize);
                e.sent = off + n;
                bytes += n;
                if n > 0 {
                    let mr = e.mr.as_ref().expect("checked at post");
                    if !b.mrs.last().is_some_and(|m| Arc::ptr_eq(m, mr)) {
                        b.mrs.push(mr.clone());
                    }
                }
            }
        }
        if e.emitted {
            e.last_psn = psn;
            sq.next_send += 1;
        }
        sq.next_psn = psn.wrapping_add(1);
        b.frames.push(Frame {
            hdr: h.to_bytes(),
            ptr,
            len,
        });
    }
}

/// Why a batch could not be written.
pub(super) enum WriteFail {
    /// The queue pair is in ERR (or a registration vanished and it was failed): stop.
    Dead,
    /// The stream failed: the caller fails the queue pair with `RetryExcErr`.
    Io(std::io::Error),
}

/// Write `b` to the stream `fd`: each source registration pinned and the queue pair's `place`
/// lock held shared (the fence waits for the copy). `tail`: `None` writes it all, blocking;
/// `Some(buf)` writes without blocking what the socket takes now and copies the rest of the
/// batch into `buf` (bytes the sender thread writes before any later frame). Returns `Ok`
/// when every byte was written or kept.
pub(super) fn write_batch(
    qp: &QpShared,
    fd: RawFd,
    b: &Batch,
    pins: &mut Vec<MrPin>,
    iovs: &mut Vec<libc::iovec>,
    tail: Option<&mut Vec<u8>>,
) -> Result<(), WriteFail> {
    let g = qp.hold_sources(&b.mrs, pins).ok_or(WriteFail::Dead)?;
    iovs.clear();
    for f in &b.frames {
        iovs.push(net::iov(f.hdr.as_ptr(), HEADER_LEN));
        if f.len > 0 {
            iovs.push(net::iov(f.ptr as *const u8, f.len));
        }
    }
    let r = match tail {
        None => net::sendmsg_all(fd, iovs),
        Some(buf) => net::sendmsg_now(fd, iovs).map(|()| {
            for v in iovs.iter().filter(|v| v.iov_len > 0) {
                // SAFETY: what is left of each iovec lies inside a frame header of `b` or a
                // payload inside a registration pinned above, read under `place`.
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                });
            }
        }),
    };
    pins.clear();
    drop(g);
    r.map_err(WriteFail::Io)
}

/// Write (blocking) and empty `tail`, the copied rest of a batch a posting thread began.
fn write_tail(fd: RawFd, tail: &mut Vec<u8>) -> Result<(), WriteFail> {
    if tail.is_empty() {
        return Ok(());
    }
    let mut v = [net::iov(tail.as_ptr(), tail.len())];
    let r = net::sendmsg_all(fd, &mut v);
    tail.clear();
    r.map_err(WriteFail::Io)
}

fn send_loop(qp: &Arc<QpShared>, stream: &TcpStream) {
    let fd = stream.as_raw_fd();
    let seg = qp.pd.tun.segment_bytes as u64;
    let mut b = Batch::with_capacity(MAX_BATCH);
    let mut pins: Vec<MrPin> = Vec::with_capacity(MAX_BATCH);
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(2 * MAX_BATCH);
    // Streams to stripe over: 0 until the first large WRITE opens the lanes.
    let mut streams = if qp.pd.tun.lanes > 1 { 0 } else { 1 };
    loop {
        b.clear();
        let open_lanes = {
            // Wait for work without the stream: meanwhile a posting thread may write its
            // small requests itself (`SockQp::post_send`).
            let mut sq = qp.sq.lock();
            loop {
                if qp.dead() {
                    return;
                }
                if sq.tail_pending || has_work(&sq) {
                    break;
                }
                qp.sq_cv.wait(&mut sq);
            }
            streams == 0 && next_is_large(&sq)
        };
        if open_lanes {
            streams = lanes::open(qp);
        }
        let mut tx = qp.tx.lock();
        {
            let mut sq = qp.sq.lock();
            if qp.dead() {
                return;
            }
            sq.tail_pending = false;
            take_frames(&mut sq, seg, streams.max(1), &mut b);
        }
        lanes::push(qp, &mut b.lane_jobs);
        // The rest of a batch a posting thread began goes first.
        let r = write_tail(fd, &mut tx.tail).and_then(|()| {
            if b.is_empty() {
                Ok(())
            } else {
                write_batch(qp, fd, &b, &mut pins, &mut iovs, None)
            }
        });
        drop(tx);
        match r {
            Ok(()) => {}
            Err(WriteFail::Dead) => return,
            Err(WriteFail::Io(e)) => {
                if !qp.dead() {
                    tracing::info!("sock: qp {} send: {e}", qp.qpn);
                    qp.fail(Some(WcStatus::RetryExcErr));
                }
                return;
            }
        }
    }
}

/// Why the ack reader ends.
enum End {
    Abort(Abort),
    /// The peer broke the protocol.
    Garbage(String),
    /// Fail the queue pair with this status on the oldest WR.
    Fail(WcStatus),
}

impl From<Abort> for End {
    fn from(a: Abort) -> End {
        End::Abort(a)
    }
}

/// The READ whose response is being placed.
struct ReadCtx {
    psn: u32,
    addr: usize,
    total: u64,
    off: u64,
    mr: Option<Arc<MrEntry>>,
}

fn run_ack_reader(qp: Arc<QpShared>, stream: Stream) {
    let mut rd =
        FrameReader::new(stream.as_raw_fd(), Duration::ZERO).idle_tick(qp.pd.tun.idle_tick());
    let mut link = Links::new(qp.pd.tun.retry_timeout);
    let end = ack_loop(&qp, &mut rd, &mut link, stream.as_raw_fd());
    match end {
        End::Abort(Abort::Stop) => {}
        End::Abort(Abort::Expired) => {
            tracing::info!("sock: qp {} retry timer expired", qp.qpn);
            qp.fail(Some(WcStatus::RetryExcErr));
        }
        End::Abort(Abort::Eof) => {
            if !qp.dead() {
                tracing::info!("sock: qp {} outbound stream closed by peer", qp.qpn);
                qp.link_failed();
            }
        }
        End::Abort(Abort::Io(e)) => {
            if !qp.dead() {
                tracing::info!("sock: qp {} outbound stream failed: {e}", qp.qpn);
                qp.link_failed();
            }
        }
        End::Garbage(why) => {
            if !qp.dead() {
                tracing::warn!("sock: qp {}: bad frame from peer: {why}", qp.qpn);
                qp.fail(Some(WcStatus::RemOpErr));
            }
        }
        End::Fail(st) => qp.fail(Some(st)),
    }
    drop(stream);
}

fn ack_loop(qp: &QpShared, rd: &mut FrameReader, link: &mut Links, fd: RawFd) -> End {
    let mut cur: Option<ReadCtx> = None;
    loop {
        let mut w = AckWatch {
            qp,
            link: &mut *link,
            fd,
            region: None,
        };
        let hb = match rd.next_header(&mut w) {
            Ok(b) => b,
            Err(a) => return End::Abort(a),
        };
        // A frame from the peer: the link answers.
        qp.link.store(LINK_ALIVE, Ordering::SeqCst);
        let h = match Header::decode(&hb, MAX_SEGMENT_BYTES) {
            Ok(h) if !h.op.is_request() => h,
            Ok(h) => return End::Garbage(format!("request {:?} on a reply stream", h.op)),
            Err(e) => return End::Garbage(e.to_string()),
        };
        let r = match h.op {
            Op::Ack | Op::KeepAlive => {
                if h.has(flags::PROMPT) && !qp.peer_prompt.load(Ordering::Relaxed) {
                    qp.peer_prompt.store(true, Ordering::Relaxed);
                }
                let mut sq = qp.sq.lock();
                sq.last_progress = Instant::now();
                if h.op == Op::Ack {
                    if let Some(st) = qp.retire_through(&mut sq, h.psn) {
                        return End::Fail(st);
                    }
                }
                Ok(())
            }
            Op::Nak => {
                // (Also ends a READ refused midway because its region went away.)
                qp.retire_through(&mut qp.sq.lock(), h.psn.wrapping_sub(1));
                return End::Fail(match h.imm {
                    syndrome::REMOTE_ACCESS => WcStatus::RemAccessErr,
                    _ => WcStatus::RemInvReqErr,
                });
            }
            Op::ReadResp => on_read_resp(qp, rd, &h, &mut cur, link, fd),
            Op::Write | Op::ReadReq => unreachable!("filtered above"),
        };
        if let Err(e) = r {
            return e;
        }
    }
}

fn on_read_resp(
    qp: &QpShared,
    rd: &mut FrameReader,
    h: &Header,
    cur: &mut Option<ReadCtx>,
    link: &mut Links,
    fd: RawFd,
) -> Result<(), End> {
    if h.has(flags::FIRST) {
        if cur.is_some() {
            return Err(End::Garbage("READ_RESP FIRST inside a response".into()));
        }
        let mut sq = qp.sq.lock();
        sq.last_progress = Instant::now();
        if let Some(st) = qp.retire_through(&mut sq, h.psn.wrapping_sub(1)) {
            return Err(End::Fail(st));
        }
        let e = match sq.wrs.front() {
            Some(e)
                if e.wr.op == SendOp::Read
                    && e.emitted
                    && e.last_psn == h.psn
                    && e.wr.local.len as u64 == h.total =>
            {
                e
            }
            _ => {
                return Err(End::Garbage(format!(
                    "READ_RESP psn {} matches no READ",
                    h.psn
                )))
            }
        };
        *cur = Some(ReadCtx {
            psn: h.psn,
            addr: e.wr.local.addr,
            total: h.total,
            off: 0,
            mr: e.mr.clone(),
        });
    } else {
        qp.sq.lock().last_progress = Instant::now();
    }
    let c = match cur.as_mut() {
        Some(c) if c.psn == h.psn && c.total == h.total => c,
        _ => return Err(End::Garbage("READ_RESP outside a response".into())),
    };
    let len = h.len as u64;
    let last = c.off + len == c.total;
    if h.raddr != c.off
        || len > c.total - c.off
        || last != h.has(flags::LAST)
        || (!last && len == 0)
    {
        return Err(End::Garbage(format!(
            "READ_RESP segment {h:?} out of order"
        )));
    }
    if len > 0 {
        let g = qp.place.read();
        if qp.dead() {
            return Err(End::Abort(Abort::Stop));
        }
        let Some(pin) = c.mr.as_ref().and_then(|m| m.pin()) else {
            return Err(End::Fail(WcStatus::LocProtErr));
        };
        let dst = (c.addr + c.off as usize) as *mut u8;
        let mut w = AckWatch {
            qp,
            link,
            fd,
            region: c.mr.as_deref(),
        };
        // SAFETY: the local check at post time put [addr, addr+total) inside the pinned
        // registration (with LOCAL_WRITE) and `off + len <= total`; the pin keeps the
        // registration (hence, by the reg_mr contract, the memory) alive, and holding
        // `place` shared keeps the to_err fence from passing this copy.
        let r = unsafe { rd.read_payload(dst, len as usize, &mut w) };
        drop(pin);
        drop(g);
        r?;
    }
    c.off += len;
    if last {
        *cur = None;
        let mut sq = qp.sq.lock();
        sq.last_progress = Instant::now();
        if let Some(st) = qp.retire_through(&mut sq, h.psn) {
            return Err(End::Fail(st));
        }
    }
    Ok(())
}
