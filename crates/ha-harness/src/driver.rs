//! Request driver: posts sends and receives on an endpoint and tests them the way NCCL's
//! proxy does. At most `window` (<= NCCL_NET_MAX_REQUESTS) requests are in flight per
//! direction; a NULL request from `isend`/`irecv` means "try again later"; requests are tested
//! oldest first and never again once done. Fails when nothing progresses for the timeout.
//!
//! Buffers are plain `Vec<u8>`s registered with `regMr(NCCL_PTR_HOST)`. While a request is in
//! flight the plugin owns the bytes it was given; after a failure some may still be in flight,
//! so [`leak`] keeps those buffers alive for the rest of the process.

use super::conn::Endpoint;
use crate::backoff::Backoff;
use nccl_net_abi::common::NCCL_PTR_HOST;
use nccl_net_loader::{Comm, Mr, Plugin, Request};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long to wait, when to give up, and how many requests to keep in flight.
pub struct Ctl<'a> {
    /// Longest time without any progress before a run fails.
    pub timeout: Duration,
    /// Set when the peer failed: waiting any longer is pointless.
    pub abort: &'a AtomicBool,
    pub window: usize,
    /// Whether idle polling may sleep (functional tests) or only yield (benchmarks).
    pub may_sleep: bool,
}

/// A host buffer registered on one comm.
pub struct Buf {
    bytes: Vec<u8>,
    mr: Mr,
}

impl Buf {
    /// Allocates `len` zeroed bytes (at least 1, so the address is real) and registers them.
    pub fn register(plugin: &Plugin, comm: &Comm, len: usize) -> Result<Buf, String> {
        let mut bytes = vec![0u8; len.max(1)];
        let mr = plugin
            .reg_mr(comm, bytes.as_mut_ptr(), bytes.len(), NCCL_PTR_HOST)
            .map_err(|e| format!("regMr({} bytes): {e}", bytes.len()))?;
        Ok(Buf { bytes, mr })
    }

    pub fn deregister(self, plugin: &Plugin, comm: &Comm) -> Result<(), String> {
        plugin
            .dereg_mr(comm, self.mr)
            .map_err(|e| format!("deregMr: {e}"))
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Address of byte `off` (panics if `off` is past the end).
    pub fn ptr(&mut self, off: usize) -> *mut u8 {
        self.bytes[off..].as_mut_ptr()
    }

    pub fn mr(&self) -> &Mr {
        &self.mr
    }
}

/// Keeps buffers (and their registrations) alive forever: the plugin may still be writing
/// into them after a failed run.
pub fn leak(bufs: Vec<Buf>) {
    std::mem::forget(bufs);
}

/// One `isend` from `size` bytes at `off` of send buffer `buf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendOp {
    pub buf: usize,
    pub off: usize,
    pub size: usize,
    pub tag: i32,
}

/// One receive slot of an `irecv`: up to `size` bytes at `off` of receive buffer `buf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvPart {
    pub buf: usize,
    pub off: usize,
    pub size: usize,
    pub tag: i32,
}

/// One `irecv` (a multi-receive when it has several parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvOp {
    pub parts: Vec<RecvPart>,
}

fn c_size(n: usize) -> Result<i32, String> {
    i32::try_from(n).map_err(|_| format!("size {n} does not fit a v8 int size"))
}

/// Counts, for error messages.
#[derive(Default)]
struct Progress {
    sends_posted: usize,
    sends_done: usize,
    recvs_posted: usize,
    recvs_done: usize,
}

/// Posts every op (receives first in each round, as a receiver would pre-post) and waits for
/// all of them. Returns, per receive op, the sizes `test` reported for its parts.
pub fn run(
    ep: &Endpoint<'_>,
    sends: &[SendOp],
    send_bufs: &mut [Buf],
    recvs: &[RecvOp],
    recv_bufs: &mut [Buf],
    ctl: &Ctl<'_>,
) -> Result<Vec<Vec<i32>>, String> {
    let plugin = ep.plugin;
    let window = ctl.window.max(1);
    let mut send_q: VecDeque<Request> = VecDeque::new();
    let mut recv_q: VecDeque<(usize, Request)> = VecDeque::new();
    let mut sizes: Vec<Vec<i32>> = recvs.iter().map(|r| vec![-1; r.parts.len()]).collect();
    let mut p = Progress::default();
    let mut backoff = Backoff::new(ctl.may_sleep);
    let mut last_progress = Instant::now();
    while p.sends_done < sends.len() || p.recvs_done < recvs.len() {
        let mut progress = false;
        if let Some(op) = recvs.get(p.recvs_posted).filter(|_| recv_q.len() < window) {
            if let Some(req) = post_recv(plugin, &ep.recv, op, recv_bufs)
                .map_err(|e| format!("irecv #{}: {e}", p.recvs_posted))?
            {
                recv_q.push_back((p.recvs_posted, req));
                p.recvs_posted += 1;
                progress = true;
            }
        }
        if let Some(op) = sends.get(p.sends_posted).filter(|_| send_q.len() < window) {
            let b = &mut send_bufs[op.buf];
            let ptr = b.ptr(op.off);
            if let Some(req) = plugin
                .isend(&ep.send, ptr, c_size(op.size)?, op.tag, b.mr())
                .map_err(|e| {
                    format!(
                        "isend #{} (size {}, tag {}): {e}",
                        p.sends_posted, op.size, op.tag
                    )
                })?
            {
                send_q.push_back(req);
                p.sends_posted += 1;
                progress = true;
            }
        }
        while let Some(req) = send_q.front() {
            let mut size = [0i32];
            let done = plugin
                .test(req, &mut size)
                .map_err(|e| format!("test(send #{}): {e}", p.sends_done))?;
            if !done {
                break;
            }
            send_q.pop_front();
            p.sends_done += 1;
            progress = true;
        }
        while let Some((i, req)) = recv_q.front() {
            let done = plugin
                .test(req, &mut sizes[*i])
                .map_err(|e| format!("test(recv #{i}): {e}"))?;
            if !done {
                break;
            }
            recv_q.pop_front();
            p.recvs_done += 1;
            progress = true;
        }
        if progress {
            last_progress = Instant::now();
            backoff.reset();
            continue;
        }
        if ctl.abort.load(Ordering::Relaxed) {
            return Err(format!(
                "aborted (the peer failed); {}",
                describe(&p, sends, recvs)
            ));
        }
        if last_progress.elapsed() > ctl.timeout {
            return Err(format!(
                "no progress for {}s; {}",
                ctl.timeout.as_secs(),
                describe(&p, sends, recvs)
            ));
        }
        backoff.snooze();
    }
    Ok(sizes)
}

fn describe(p: &Progress, sends: &[SendOp], recvs: &[RecvOp]) -> String {
    format!(
        "sends posted {}/{} done {}, recvs posted {}/{} done {}",
        p.sends_posted,
        sends.len(),
        p.sends_done,
        p.recvs_posted,
        recvs.len(),
        p.recvs_done
    )
}

fn post_recv(
    plugin: &Plugin,
    comm: &Comm,
    op: &RecvOp,
    bufs: &mut [Buf],
) -> Result<Option<Request>, String> {
    let mut ptrs = Vec::with_capacity(op.parts.len());
    let mut sizes = Vec::with_capacity(op.parts.len());
    let mut tags = Vec::with_capacity(op.parts.len());
    for part in &op.parts {
        ptrs.push(bufs[part.buf].ptr(part.off));
        sizes.push(c_size(part.size)?);
        tags.push(part.tag);
    }
    let mrs: Vec<&Mr> = op.parts.iter().map(|part| bufs[part.buf].mr()).collect();
    plugin
        .irecv(comm, &ptrs, &sizes, &tags, &mrs)
        .map_err(|e| e.to_string())
}

/// `isend` of one message, retried until the plugin takes it.
pub fn post_send_one(
    ep: &Endpoint<'_>,
    buf: &mut Buf,
    size: usize,
    tag: i32,
    ctl: &Ctl<'_>,
) -> Result<Request, String> {
    let size_c = c_size(size)?;
    let ptr = buf.ptr(0);
    retry(ctl, "isend", || {
        ep.plugin
            .isend(&ep.send, ptr, size_c, tag, buf.mr())
            .map_err(|e| format!("isend: {e}"))
    })
}

/// `irecv` of one buffer, retried until the plugin takes it.
pub fn post_recv_one(
    ep: &Endpoint<'_>,
    buf: &mut Buf,
    size: usize,
    tag: i32,
    ctl: &Ctl<'_>,
) -> Result<Request, String> {
    let size_c = c_size(size)?;
    let ptr = buf.ptr(0);
    retry(ctl, "irecv", || {
        ep.plugin
            .irecv(&ep.recv, &[ptr], &[size_c], &[tag], &[buf.mr()])
            .map_err(|e| format!("irecv: {e}"))
    })
}

/// Tests `req` until done; `sizes` receives what `test` reports.
pub fn wait(
    ep: &Endpoint<'_>,
    req: Request,
    sizes: &mut [i32],
    ctl: &Ctl<'_>,
) -> Result<(), String> {
    retry(ctl, "test", || {
        let done = ep
            .plugin
            .test(&req, sizes)
            .map_err(|e| format!("test: {e}"))?;
        Ok(done.then_some(()))
    })
}

/// Calls `f` until it yields a value, fails, the peer aborts or the timeout passes.
fn retry<T>(
    ctl: &Ctl<'_>,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let start = Instant::now();
    let mut backoff = Backoff::new(ctl.may_sleep);
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if ctl.abort.load(Ordering::Relaxed) {
            return Err(format!("{what}: aborted (the peer failed)"));
        }
        if start.elapsed() > ctl.timeout {
            return Err(format!(
                "{what}: no completion within {}s",
                ctl.timeout.as_secs()
            ));
        }
        backoff.snooze();
    }
}
