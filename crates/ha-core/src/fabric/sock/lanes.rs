//! Lanes of a `sock` queue pair: extra TCP streams to the same peer queue pair that carry the
//! first part of large WRITEs in parallel with the main stream (one stream moves what one core
//! can copy and push through the kernel: bench/results/2026-11-27-sock-lanes.md). Wire rules in
//! `wire.rs` (`STRIPED`, lane hellos).
//!
//! Requester side: the sender thread opens `HA_NCCL_SOCK_LANES - 1` lanes when the first WRITE
//! of at least [`STRIPE_MIN`] bytes reaches the head of the send queue, each with a sender
//! thread writing the frames queued for it; if any lane cannot be opened, the queue pair uses
//! the main stream alone (nothing striped, nothing lost). Responder side: one thread per lane
//! validates and places each frame exactly as the main responder would and counts it; the
//! main responder places its own share meanwhile and waits for every lane's count before it
//! stores the striped WRITE's last word and completes it.
//! The fence and deregistration rules are the main stream's: every copy holds `place` shared
//! and a pin of its registration; `fail` shuts the lanes down with the other streams.

use super::links::LaneLinks;
use super::liveness::Liveness;
use super::net;
use super::qp_state::{QpShared, Stream};
use super::reader::FrameReader;
use super::rx_watch::RxWatch;
use super::wire::{
    flags, psn_le, stripe_share, Header, Op, HEADER_LEN, MAX_LANES, MAX_SEGMENT_BYTES,
};
use crate::fabric::counters::Counted;
use crate::fabric::{Access, WcStatus};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

pub use super::lane_state::{LaneFail, LaneJob};
pub use super::wire::STRIPE_MIN;

static STRIPED: AtomicU64 = AtomicU64::new(0);

/// Process-wide: WRITEs the requesters striped over lanes.
pub fn striped_writes() -> u64 {
    STRIPED.load(Relaxed)
}

pub(super) fn count_striped() {
    STRIPED.fetch_add(1, Relaxed);
}

/// Requester: open `HA_NCCL_SOCK_LANES - 1` lanes (called by the sender thread holding no
/// lock) and return the number of streams to stripe over: all of them, or 1 when any lane
/// could not be opened.
pub fn open(qp: &Arc<QpShared>) -> u16 {
    let want = qp.pd.tun.lanes.min(MAX_LANES);
    let mut streams = Vec::new();
    for lane in 1..want {
        match super::connect::connect_stream(qp, lane as u8) {
            Ok(s) => streams.push(s),
            Err(_) => {
                tracing::info!(
                    "sock: qp {}: lane {lane} could not be opened: WRITEs stay on one stream",
                    qp.qpn
                );
                for s in &streams {
                    net::shutdown(s.as_raw_fd());
                }
                return 1;
            }
        }
    }
    {
        let mut st = qp.lanes.lock();
        st.jobs = (1..want).map(|_| VecDeque::new()).collect();
    }
    for (i, s) in streams.into_iter().enumerate() {
        let lane = i + 1;
        let s: Stream = Arc::new(s);
        let started = qp.add_lane_stream(&s, true)
            && qp.add_thread(format!("sock-ltx-{}-{lane}", qp.qpn), move |q| {
                run_sender(q, lane, s)
            });
        if !started {
            // The queue pair is dying or out of threads: its lanes end with it.
            return 1;
        }
    }
    want
}

/// Requester: queue frames for the lanes, each `(lane, frame)` onto that lane's queue.
pub fn push(qp: &QpShared, jobs: &mut Vec<(usize, LaneJob)>) {
    if jobs.is_empty() {
        return;
    }
    let mut st = qp.lanes.lock();
    for (lane, j) in jobs.drain(..) {
        st.jobs[lane - 1].push_back(j);
    }
    drop(st);
    qp.lane_jobs_cv.notify_all();
}

fn run_sender(qp: Arc<QpShared>, lane: usize, stream: Stream) {
    let fd = stream.as_raw_fd();
    let mut pins = Vec::with_capacity(1);
    loop {
        let job = {
            let mut st = qp.lanes.lock();
            loop {
                if qp.dead() {
                    return;
                }
                if let Some(j) = st.jobs[lane - 1].pop_front() {
                    break j;
                }
                qp.lane_jobs_cv.wait(&mut st);
            }
        };
        let Some(g) = qp.hold_sources(std::slice::from_ref(&job.mr), &mut pins) else {
            return;
        };
        let mut iovs = [
            net::iov(job.hdr.as_ptr(), HEADER_LEN),
            net::iov(job.ptr as *const u8, job.len),
        ];
        let r = net::sendmsg_all(fd, &mut iovs);
        pins.clear();
        drop(g);
        if let Err(e) = r {
            if !qp.dead() {
                tracing::info!("sock: qp {} lane {lane} send: {e}", qp.qpn);
                qp.fail(Some(WcStatus::RetryExcErr));
            }
            return;
        }
    }
}

/// Responder: a lane stream arrived for this queue pair (its hello checked by the caller).
pub fn attach(qp: &Arc<QpShared>, s: Counted<TcpStream>, lane: u8) -> bool {
    let s: Stream = Arc::new(s);
    let bit = 1u8 << (lane - 1);
    {
        let mut st = qp.lanes.lock();
        if st.attached & bit != 0 {
            return false;
        }
        st.attached |= bit;
    }
    if !qp.add_lane_stream(&s, false) {
        return false;
    }
    qp.add_thread(format!("sock-lrx-{}-{lane}", qp.qpn), move |q| {
        run_responder(q, lane as usize, s)
    })
}

fn run_responder(qp: Arc<QpShared>, lane: usize, stream: Stream) {
    if !qp.wait_rtr() {
        return;
    }
    let fd = stream.as_raw_fd();
    let mut rd = FrameReader::new(fd, Duration::ZERO).idle_tick(qp.pd.tun.idle_tick());
    let mut link = super::liveness::LinkWatch::new(qp.pd.tun.retry_timeout);
    let why = loop {
        if qp.dead() {
            return;
        }
        match place_one(&qp, lane, &mut rd, &mut link, fd) {
            Ok(()) => {}
            Err(f) => break f,
        }
    };
    if let LaneFail::Broken = why {
        net::shutdown(fd);
    }
    if let LaneFail::Garbage(g) = &why {
        tracing::warn!("sock: qp {} lane {lane}: bad frame from peer: {g}", qp.qpn);
    }
    qp.lanes.lock().failed.get_or_insert(why);
    qp.lanes_cv.notify_all();
}

/// Read, check and place one lane frame.
fn place_one(
    qp: &QpShared,
    lane: usize,
    rd: &mut FrameReader,
    link: &mut super::liveness::LinkWatch,
    fd: i32,
) -> Result<(), LaneFail> {
    let mut w = RxWatch {
        qp,
        link: &mut *link,
        fd,
        region: None,
    };
    let hb = rd.next_header(&mut w).map_err(|_| LaneFail::Broken)?;
    let h = Header::decode(&hb, MAX_SEGMENT_BYTES).map_err(|e| LaneFail::Garbage(e.to_string()))?;
    let expected = qp.lanes.lock().placed[lane - 1].wrapping_add(1);
    // `decode` checked that the share is one of the WRITE's; it must be this lane's.
    let share = stripe_share(h.total, h.lanes);
    if h.op != Op::Write
        || h.flags != flags::LANE
        || h.psn != expected
        || u64::from(h.imm) / share != lane as u64 - 1
    {
        return Err(LaneFail::Garbage(format!(
            "lane {lane} frame {h:?}, expected ordinal {expected}"
        )));
    }
    // The whole WRITE's range, as the main stream checks it: a WRITE out of bounds is refused
    // by every stream, so none of its bytes land.
    let mr = qp
        .remote_region(h.rkey, h.raddr, h.total, Access::REMOTE_WRITE)
        .ok_or(LaneFail::Access)?;
    let at = h.raddr + u64::from(h.imm);
    {
        let g = qp.place.read();
        if qp.dead() {
            return Err(LaneFail::Broken);
        }
        let Some(pin) = mr.pin() else {
            return Err(LaneFail::Access);
        };
        let mut w = RxWatch {
            qp,
            link,
            fd,
            region: Some(&mr),
        };
        // SAFETY: [at, at + len) lies inside [raddr, raddr + total) (decode), which lies inside
        // the registration (checked above, with REMOTE_WRITE); the pin keeps it registered and
        // `place` (shared) keeps the fence out.
        let r = unsafe { rd.read_payload(at as *mut u8, h.len as usize, &mut w) };
        drop(pin);
        drop(g);
        r.map_err(|_| LaneFail::Broken)?;
    }
    if !rd.header_ready() {
        // This thread never writes to its stream, so nothing carries the kernel's ACK of what
        // it read: have it sent now, not after the delayed-ACK timer (up to 200 ms; the sender
        // would count the wait as a silent link).
        net::quickack(fd);
    }
    qp.lanes.lock().placed[lane - 1] = h.psn;
    qp.lanes_cv.notify_all();
    Ok(())
}

/// Responder: wait until each of the `streams - 1` lanes has placed its frame of striped
/// WRITE `ordinal`, at most `tick`: `Ok(false)` when it has not by then (the caller sends a
/// keep-alive: its stream is not read meanwhile, see `net::SILENCE_FLOOR`).
pub fn wait(qp: &QpShared, ordinal: u32, streams: u16, tick: Duration) -> Result<bool, Wait> {
    let n = usize::from(streams - 1);
    let deadline = std::time::Instant::now() + tick;
    let mut st = qp.lanes.lock();
    loop {
        if qp.dead() {
            return Err(Wait::Stop);
        }
        if (0..n).all(|i| st.attached & (1 << i) != 0 && psn_le(ordinal, st.placed[i])) {
            return Ok(true);
        }
        if let Some(f) = &st.failed {
            return Err(Wait::Lane(f.clone()));
        }
        if qp.lanes_cv.wait_until(&mut st, deadline).timed_out() {
            return Ok(false);
        }
    }
}

/// What keeps [`wait`] waiting, when it is more than a slow peer.
pub enum Stuck {
    /// This lane (1 ..) has not attached.
    Unattached(usize),
    /// An attached lane is dead below the peer's threads: its kernel stopped answering our
    /// keep-alive probes (a lane's path can die alone, e.g. behind a broken ECMP member).
    Dead(String),
}

/// Responder, while [`wait`] waits for the `streams - 1` lanes.
pub fn stuck(qp: &QpShared, streams: u16, inbound: &mut LaneLinks) -> Option<Stuck> {
    let attached = qp.lanes.lock().attached;
    if let Some(k) = (0..usize::from(streams - 1)).find(|k| attached & (1 << k) == 0) {
        return Some(Stuck::Unattached(k + 1));
    }
    match inbound.check(qp, std::time::Instant::now()) {
        Liveness::Dead(why) => Some(Stuck::Dead(why)),
        Liveness::Alive => None,
    }
}

/// Why [`wait`] gave up.
pub enum Wait {
    /// The queue pair is in ERR or dropped.
    Stop,
    Lane(LaneFail),
}
