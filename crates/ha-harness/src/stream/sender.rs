//! Side A of a stream: fills each operation's messages into a free slot, posts one `isend`
//! per message (a group's in its shuffled order), keeps up to `window` sends in flight, tests
//! the oldest first, and runs the stop handshake at the end of a `--duration` stream.

use super::link::{ErrorKind, SenderLink, SideError};
use super::message;
use super::schedule::{self, Op, Schedule};
use super::slot::{self, Slot};
use super::Ctx;
use crate::backoff::Backoff;
use crate::conn::Endpoint;
use nccl_net_loader::Request;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Why the sender calls its progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The first operation completed: traffic flows.
    Started,
    /// `--progress` interval.
    Tick,
}

/// What the sender did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Operations whose sends all completed.
    pub ops: u64,
    pub messages: u64,
    pub bytes: u64,
    /// When the sender stopped (ns since its clock's start).
    pub end_ns: u64,
    pub error: Option<SideError>,
}

struct InFlight {
    op: Op,
    slot: usize,
    offs: Vec<usize>,
    /// Parts posted so far (a prefix of `op.send_order`).
    posted: usize,
    done: usize,
}

/// Runs side A to its end. `progress` is called when traffic starts and every
/// `--progress` interval, with the counts so far.
pub fn run(
    ep: &Endpoint<'_>,
    ctx: &Ctx<'_>,
    link: &mut dyn SenderLink,
    progress: &mut dyn FnMut(Progress, &SendReport),
) -> SendReport {
    let (cfg, clock) = (ctx.cfg, ctx.clock);
    let mut rep = SendReport::default();
    let len = schedule::slot_len(cfg.max_size, cfg.multi_max, 0);
    match slot::register_all(ep.plugin, &ep.send, cfg.window, len, 1) {
        Err(e) => rep.error = Some(SideError::new(clock.elapsed_ns(), ErrorKind::Setup, e)),
        Ok(mut slots) => match send_loop(ep, ctx, link, progress, &mut slots, &mut rep) {
            Ok(()) => {
                if let Err(e) = slot::deregister_all(ep.plugin, &ep.send, slots) {
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
    rep
}

fn send_loop(
    ep: &Endpoint<'_>,
    ctx: &Ctx<'_>,
    link: &mut dyn SenderLink,
    progress: &mut dyn FnMut(Progress, &SendReport),
    slots: &mut [Slot],
    rep: &mut SendReport,
) -> Result<(), SideError> {
    let (cfg, clock, abort) = (ctx.cfg, ctx.clock, ctx.abort);
    let plugin = ep.plugin;
    let mut sched = Schedule::new(cfg.seed, cfg.max_size, cfg.multi_max, cfg.total_messages());
    let mut free: Vec<usize> = (0..slots.len()).rev().collect();
    let mut ops: VecDeque<InFlight> = VecDeque::new();
    let mut reqs: VecDeque<(Request, u64)> = VecDeque::new();
    let started_at = Instant::now();
    let deadline = cfg
        .duration_s
        .map(|s| started_at + Duration::from_secs_f64(s));
    let (mut stop_sent, mut limit, mut exhausted) = (false, None::<u64>, false);
    let timeout = Duration::from_secs(cfg.timeout_s);
    let mut last_progress = Instant::now();
    let mut next_report = cfg
        .progress_s
        .map(|s| started_at + Duration::from_secs_f64(s));
    let mut backoff = Backoff::new(true);
    let mut announced = false;
    let err = |kind: ErrorKind, what: String| SideError::new(clock.elapsed_ns(), kind, what);
    loop {
        (ctx.beat)();
        if abort.load(Ordering::Relaxed) {
            return Err(err(
                ErrorKind::Aborted,
                "aborted: the receiver failed".into(),
            ));
        }
        let mut moved = false;
        if let Some(dl) = deadline {
            if !stop_sent && Instant::now() >= dl {
                link.request_stop(sched.ops())
                    .map_err(|e| err(ErrorKind::Setup, e))?;
                stop_sent = true;
            }
            if stop_sent && limit.is_none() {
                limit = link.stop_reply();
                moved |= limit.is_some();
            }
        }
        // Post: finish the current operation's parts, then start new operations.
        while reqs.len() < cfg.window {
            if ops.back().is_none_or(|o| o.posted == o.op.parts.len()) {
                let may_start =
                    !exhausted && (!stop_sent || limit.is_some_and(|l| sched.ops() < l));
                if !may_start {
                    break;
                }
                let Some(slot) = free.pop() else { break };
                let Some(op) = sched.next_op() else {
                    exhausted = true;
                    free.push(slot);
                    break;
                };
                let offs = schedule::layout(&op.parts, 0);
                let bytes = slots[slot].bytes_mut();
                for (p, &o) in op.parts.iter().zip(&offs) {
                    message::fill(&mut bytes[o..o + p.size], cfg.seed, p.seq);
                }
                ops.push_back(InFlight {
                    op,
                    slot,
                    offs,
                    posted: 0,
                    done: 0,
                });
            }
            let Some(st) = ops.back_mut() else { break };
            let j = st.op.send_order[st.posted];
            let part = st.op.parts[j];
            let buf = &mut slots[st.slot];
            let ptr = buf.ptr(st.offs[j]);
            let size = i32::try_from(part.size).unwrap_or(i32::MAX);
            match plugin.isend(&ep.send, ptr, size, part.tag, buf.mr(0)) {
                Ok(Some(req)) => {
                    reqs.push_back((req, st.op.index));
                    st.posted += 1;
                    moved = true;
                }
                Ok(None) => break,
                Err(e) => {
                    return Err(SideError::request(
                        clock.elapsed_ns(),
                        format!(
                            "isend(op {}, message {}, {} bytes, tag {:#x})",
                            st.op.index, part.seq, part.size, part.tag
                        ),
                        e,
                    ))
                }
            }
        }
        // Test the oldest sends.
        while let Some((req, idx)) = reqs.front() {
            let mut size = [0i32];
            match plugin.test(req, &mut size) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    return Err(SideError::request(
                        clock.elapsed_ns(),
                        format!("test(send, op {idx})"),
                        e,
                    ))
                }
            }
            reqs.pop_front();
            moved = true;
            let Some(st) = ops.front_mut() else {
                return Err(err(
                    ErrorKind::Setup,
                    "completion without an operation".into(),
                ));
            };
            st.done += 1;
            if st.done == st.op.parts.len() {
                rep.ops += 1;
                rep.messages += st.op.parts.len() as u64;
                rep.bytes += st.op.bytes() as u64;
                free.push(st.slot);
                ops.pop_front();
            }
        }
        if !announced && rep.ops > 0 {
            announced = true;
            rep.end_ns = clock.elapsed_ns();
            progress(Progress::Started, rep);
        }
        let all_started = match deadline {
            Some(_) => limit.is_some_and(|l| sched.ops() >= l),
            None => exhausted,
        };
        if all_started && ops.is_empty() {
            return Ok(());
        }
        if let Some(at) = next_report {
            if Instant::now() >= at {
                rep.end_ns = clock.elapsed_ns();
                progress(Progress::Tick, rep);
                next_report = cfg.progress_s.map(|s| at + Duration::from_secs_f64(s));
            }
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
                    "no progress for {}s ({} sends in flight, {} operations done)",
                    cfg.timeout_s,
                    reqs.len(),
                    rep.ops
                ),
            ));
        }
        backoff.snooze();
    }
}
