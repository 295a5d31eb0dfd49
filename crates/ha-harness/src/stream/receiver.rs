//! Side B of a stream: poisons a free slot for each operation, posts its `irecv` (one part per
//! message, a multi-receive for groups), keeps up to `window` receives in flight, tests the
//! oldest first, and classifies every completed part (see [`super::tracker`]), recording the
//! completion time of every operation.

use super::link::{ErrorKind, ReceiverLink, SideError};
use super::message::{self, GUARD};
use super::schedule::{self, Op, Schedule};
use super::slot::{self, Slot};
use super::tracker::Tracker;
use super::Ctx;
use crate::backoff::Backoff;
use crate::conn::Endpoint;
use nccl_net_loader::{Mr, NcclError, Request};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One completed receive operation: when (ns since the receiver's clock start), how many
/// messages it held and their bytes (as reported by `test`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub t_ns: u64,
    pub messages: u32,
    pub bytes: u64,
}

/// What the receiver saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecvReport {
    /// `CLOCK_MONOTONIC` of the receiver's clock start (its times are relative to it).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Messages whose receives were posted.
    pub posted: u64,
    pub messages: u64,
    pub bytes: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub first_problem: Option<String>,
    pub completions: Vec<Completion>,
    pub error: Option<SideError>,
}

struct Posted {
    op: Op,
    slot: usize,
    offs: Vec<usize>,
}

/// Runs side B to its end.
pub fn run(ep: &Endpoint<'_>, ctx: &Ctx<'_>, link: &mut dyn ReceiverLink) -> RecvReport {
    let (cfg, clock) = (ctx.cfg, ctx.clock);
    let mut rep = RecvReport {
        start_ns: clock.start_ns(),
        ..RecvReport::default()
    };
    let mut tracker = Tracker::new();
    let len = schedule::slot_len(cfg.max_size, cfg.multi_max, GUARD);
    let regs = if cfg.shared_mr { 1 } else { cfg.multi_max };
    match slot::register_all(ep.plugin, &ep.recv, cfg.window, len, regs) {
        Err(e) => rep.error = Some(SideError::new(clock.elapsed_ns(), ErrorKind::Setup, e)),
        Ok(mut slots) => match recv_loop(ep, ctx, link, &mut slots, &mut rep, &mut tracker) {
            Ok(()) => {
                if let Err(e) = slot::deregister_all(ep.plugin, &ep.recv, slots) {
                    rep.error = Some(SideError::new(clock.elapsed_ns(), ErrorKind::Setup, e));
                }
            }
            Err(e) => {
                rep.error = Some(e);
                slot::leak(slots);
            }
        },
    }
    rep.end_ns = clock.elapsed_ns();
    let clean = rep.error.is_none();
    rep.messages = tracker.messages;
    rep.bytes = tracker.bytes;
    rep.duplicated = tracker.duplicated;
    rep.reordered = tracker.reordered;
    rep.corrupted = tracker.corrupted;
    rep.lost = tracker.lost(tracker.horizon(clean, rep.posted));
    rep.first_problem = tracker.first_problem.take();
    rep
}

fn poison(slot: &mut Slot, op: &Op, offs: &[usize], seed: u64) {
    let bytes = slot.bytes_mut();
    for (p, &o) in op.parts.iter().zip(offs) {
        message::poison(&mut bytes[o..o + p.size + GUARD], seed, p.seq, p.size);
    }
}

/// Posts the receive of `op`; part `j` uses the slot's registration `j`.
fn post(
    ep: &Endpoint<'_>,
    slot: &mut Slot,
    op: &Op,
    offs: &[usize],
) -> Result<Option<Request>, NcclError> {
    let ptrs: Vec<*mut u8> = offs.iter().map(|&o| slot.ptr(o)).collect();
    let sizes: Vec<i32> = op
        .parts
        .iter()
        .map(|p| i32::try_from(p.size).unwrap_or(i32::MAX))
        .collect();
    let tags: Vec<i32> = op.parts.iter().map(|p| p.tag).collect();
    let mrs: Vec<&Mr> = (0..op.parts.len()).map(|j| slot.mr(j)).collect();
    ep.plugin.irecv(&ep.recv, &ptrs, &sizes, &tags, &mrs)
}

fn recv_loop(
    ep: &Endpoint<'_>,
    ctx: &Ctx<'_>,
    link: &mut dyn ReceiverLink,
    slots: &mut [Slot],
    rep: &mut RecvReport,
    tracker: &mut Tracker,
) -> Result<(), SideError> {
    let (cfg, clock, abort) = (ctx.cfg, ctx.clock, ctx.abort);
    let mut sched = Schedule::new(cfg.seed, cfg.max_size, cfg.multi_max, cfg.total_messages());
    let mut free: Vec<usize> = (0..slots.len()).rev().collect();
    let mut reqs: VecDeque<(Request, Posted)> = VecDeque::new();
    let mut pending: Option<Posted> = None;
    let (mut limit, mut exhausted, mut posted_ops) = (None::<u64>, false, 0u64);
    let timeout = Duration::from_secs(cfg.timeout_s);
    let mut last_progress = Instant::now();
    let mut backoff = Backoff::new(true);
    let err = |kind: ErrorKind, what: String| SideError::new(clock.elapsed_ns(), kind, what);
    loop {
        (ctx.beat)();
        if abort.load(Ordering::Relaxed) {
            return Err(err(ErrorKind::Aborted, "aborted: the sender failed".into()));
        }
        let mut moved = false;
        if limit.is_none() {
            if let Some(started) = link.stop_request() {
                let l = started.max(posted_ops);
                limit = Some(l);
                link.reply_stop(l).map_err(|e| err(ErrorKind::Setup, e))?;
                moved = true;
            }
        }
        while reqs.len() < cfg.window {
            let p = match pending.take() {
                Some(p) => p,
                None => {
                    if exhausted || limit.is_some_and(|l| sched.ops() >= l) {
                        break;
                    }
                    let Some(slot) = free.pop() else { break };
                    let Some(op) = sched.next_op() else {
                        exhausted = true;
                        free.push(slot);
                        break;
                    };
                    let offs = schedule::layout(&op.parts, GUARD);
                    poison(&mut slots[slot], &op, &offs, cfg.seed);
                    Posted { op, slot, offs }
                }
            };
            if limit.is_some_and(|l| p.op.index >= l) {
                // Generated before the stop was agreed; the sender will not send it.
                free.push(p.slot);
                break;
            }
            match post(ep, &mut slots[p.slot], &p.op, &p.offs) {
                Ok(Some(req)) => {
                    posted_ops += 1;
                    rep.posted += p.op.parts.len() as u64;
                    reqs.push_back((req, p));
                    moved = true;
                }
                Ok(None) => {
                    pending = Some(p);
                    break;
                }
                Err(e) => {
                    return Err(SideError::request(
                        clock.elapsed_ns(),
                        format!(
                            "irecv(op {}, {} message(s) from {})",
                            p.op.index,
                            p.op.parts.len(),
                            p.op.parts[0].seq
                        ),
                        e,
                    ))
                }
            }
        }
        while let Some((req, p)) = reqs.front() {
            let n = p.op.parts.len();
            let mut sizes_buf = [-1i32; super::opts::MAX_MULTI];
            let sizes = &mut sizes_buf[..n];
            match ep.plugin.test(req, sizes) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    return Err(SideError::request(
                        clock.elapsed_ns(),
                        format!("test(recv, op {})", p.op.index),
                        e,
                    ))
                }
            }
            let t_ns = clock.elapsed_ns();
            let bytes = slots[p.slot].bytes();
            let mut op_bytes = 0u64;
            for ((part, &off), &reported) in p.op.parts.iter().zip(&p.offs).zip(sizes.iter()) {
                let slot = &bytes[off..off + part.size + GUARD];
                let id = message::identify(slot, reported, cfg.seed, part.seq, part.size);
                let got = usize::try_from(reported).unwrap_or(0);
                tracker.record(part.seq, &id, got);
                op_bytes += got as u64;
            }
            rep.completions.push(Completion {
                t_ns,
                messages: n as u32,
                bytes: op_bytes,
            });
            free.push(p.slot);
            reqs.pop_front();
            moved = true;
        }
        let all_posted = exhausted || limit.is_some_and(|l| posted_ops >= l);
        if all_posted && pending.is_none() && reqs.is_empty() {
            return Ok(());
        }
        if moved {
            last_progress = Instant::now();
            backoff.reset();
            continue;
        }
        if last_progress.elapsed() > timeout {
            return Err(err(
                ErrorKind::Stall,
                format!(
                    "no progress for {}s ({} receives in flight, {} messages posted)",
                    cfg.timeout_s,
                    reqs.len(),
                    rep.posted
                ),
            ));
        }
        backoff.snooze();
    }
}
