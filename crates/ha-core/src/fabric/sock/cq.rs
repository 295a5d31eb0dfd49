//! Completion queues of the `sock` fabric: a lock-free queue filled by I/O threads, with a
//! doorbell rung for the first push after the consumer armed the queue (as a verbs completion
//! channel: while the progress thread or a `test()` loop is polling, completions wake no
//! thread), and a registry that maps the `Arc<dyn CompletionQueue>`
//! handed to `create_qp` back to the concrete queue.
//!
//! With `HA_NCCL_SOCK_MAX_CQE` a queue holds at most its depth (clamped to that limit) of
//! unpolled entries, as an RDMA completion queue does: one more overruns it, which loses the
//! entry and leaves the queue in error (every later poll fails), as after `IBV_EVENT_CQ_ERR`.
//! [`stats`] reports the most entries any such queue held and the overruns;
//! [`pause_polling`] stops every poll (a consumer that is not scheduled), so tests can pile up
//! everything the queue pairs produce.

use crate::fabric::counters::{Held, Resource};
use crate::fabric::doorbell::Arm;
use crate::fabric::{Completion, CompletionQueue, Doorbell, FabricError, Result};
use crossbeam_queue::SegQueue;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

pub struct SockCq {
    q: SegQueue<Completion>,
    bell: Arc<Doorbell>,
    /// Entries the queue holds (`None`: unbounded) and, under the lock, how many it holds now.
    bound: Option<(usize, Mutex<usize>)>,
    overrun: AtomicBool,
    /// Ring the doorbell for the next push (set by [`Arm::arm`], cleared by that push).
    armed: AtomicBool,
    _held: Held,
}

static HIGH_WATER: AtomicUsize = AtomicUsize::new(0);
static PENDING: AtomicUsize = AtomicUsize::new(0);
static OVERRUNS: AtomicU64 = AtomicU64::new(0);
static PAUSED: AtomicBool = AtomicBool::new(false);

/// What the bounded completion queues saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqStats {
    /// The most unpolled entries one bounded queue held (since [`reset_stats`]).
    pub high_water: usize,
    /// Queues that overran (since [`reset_stats`]).
    pub overruns: u64,
    /// Unpolled entries in all bounded queues now.
    pub pending: usize,
}

/// The bounded queues' high-water mark and overruns.
pub fn stats() -> CqStats {
    CqStats {
        high_water: HIGH_WATER.load(Ordering::SeqCst),
        overruns: OVERRUNS.load(Ordering::SeqCst),
        pending: PENDING.load(Ordering::SeqCst),
    }
}

/// Start counting [`stats`] afresh.
pub fn reset_stats() {
    HIGH_WATER.store(0, Ordering::SeqCst);
    OVERRUNS.store(0, Ordering::SeqCst);
}

/// While `true`, every `sock` completion queue answers polls with nothing (entries stay
/// queued), as if the consumer were not scheduled.
pub fn pause_polling(paused: bool) {
    PAUSED.store(paused, Ordering::SeqCst);
}

/// Live queues by address (control path only).
static REGISTRY: Mutex<Vec<(usize, Weak<SockCq>)>> = Mutex::new(Vec::new());

impl SockCq {
    /// Move up to `max` completions into `out`. An empty queue is told by two loads
    /// (`SegQueue::pop` alone also pays a full fence to say so).
    fn drain(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut n = 0;
        while n < max && !self.q.is_empty() {
            match self.q.pop() {
                Some(c) => {
                    out.push(c);
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// A queue holding at most `capacity` unpolled entries (`None`: unbounded).
    pub fn create(bell: Arc<Doorbell>, capacity: Option<usize>) -> Arc<SockCq> {
        let cq = Arc::new(SockCq {
            q: SegQueue::new(),
            bell,
            bound: capacity.map(|c| (c, Mutex::new(0))),
            overrun: AtomicBool::new(false),
            // Armed from the start: the first completion wakes a consumer that never polled.
            armed: AtomicBool::new(true),
            _held: Held::new(Resource::Cq),
        });
        let arm: Weak<dyn Arm> = Arc::downgrade(&cq) as Weak<dyn Arm>;
        cq.bell.add_arm(arm);
        REGISTRY
            .lock()
            .push((Arc::as_ptr(&cq) as usize, Arc::downgrade(&cq)));
        cq
    }

    /// The concrete queue behind a handle this fabric made.
    pub fn resolve(cq: &Arc<dyn CompletionQueue>) -> Result<Arc<SockCq>> {
        let addr = Arc::as_ptr(cq) as *const () as usize;
        REGISTRY
            .lock()
            .iter()
            .find(|(a, _)| *a == addr)
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| {
                FabricError::InvalidArgument(
                    "completion queue not created by the sock fabric".into(),
                )
            })
    }

    pub fn push(&self, c: Completion) {
        if let Some((cap, held)) = &self.bound {
            let mut held = held.lock();
            if *held >= *cap || self.overrun.load(Ordering::SeqCst) {
                if !self.overrun.swap(true, Ordering::SeqCst) {
                    OVERRUNS.fetch_add(1, Ordering::SeqCst);
                    tracing::warn!(
                        "NET/HA sock: completion queue overrun: {} entries unpolled, it holds {cap} (HA_NCCL_SOCK_MAX_CQE); its completions are lost from now on",
                        *held + 1
                    );
                }
            } else {
                *held += 1;
                PENDING.fetch_add(1, Ordering::SeqCst);
                HIGH_WATER.fetch_max(*held, Ordering::SeqCst);
                self.q.push(c);
            }
        } else {
            self.q.push(c);
        }
        // After the push: a consumer arming concurrently either sees this entry on the poll
        // it makes after arming, or its arm is what this swap takes (and rings).
        if self.armed.swap(false, Ordering::SeqCst) {
            self.bell.ring();
        }
    }
}

impl Arm for SockCq {
    fn arm(&self) -> bool {
        !self.armed.swap(true, Ordering::SeqCst)
    }
}

impl CompletionQueue for SockCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        if let Some((cap, held)) = &self.bound {
            if self.overrun.load(Ordering::SeqCst) {
                return Err(FabricError::System(format!(
                    "sock: completion queue overran its {cap} entries (HA_NCCL_SOCK_MAX_CQE)"
                )));
            }
            // An empty queue is told by two loads (`pop` alone also pays a full fence), and
            // then nothing is counted.
            if PAUSED.load(Ordering::SeqCst) || self.q.is_empty() {
                return Ok(0);
            }
            let mut held = held.lock();
            let n = self.drain(out, max);
            *held -= n;
            PENDING.fetch_sub(n, Ordering::SeqCst);
            if n > 0 {
                crate::fabric::stages::mark("cq_poll", n as u64);
            }
            return Ok(n);
        }
        if PAUSED.load(Ordering::SeqCst) {
            return Ok(0);
        }
        let n = self.drain(out, max);
        if n > 0 {
            crate::fabric::stages::mark("cq_poll", n as u64);
        }
        Ok(n)
    }
}

impl Drop for SockCq {
    fn drop(&mut self) {
        if let Some((_, held)) = &self.bound {
            PENDING.fetch_sub(*held.lock(), Ordering::SeqCst);
        }
        let me = self as *const SockCq as usize;
        REGISTRY.lock().retain(|(a, _)| *a != me);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{WcOpcode, WcStatus};

    fn comp(wr_id: u64) -> Completion {
        Completion {
            wr_id,
            qp_num: 7,
            status: WcStatus::Success,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 0,
            imm: None,
        }
    }

    /// A bounded queue holds its capacity of unpolled entries; one more overruns it for good.
    /// (The only test touching the process-wide stats, so it may reset them.)
    #[test]
    fn bounded_queue_overruns_past_its_capacity() {
        reset_stats();
        let cq = SockCq::create(Arc::new(Doorbell::new()), Some(3));
        for i in 0..3 {
            cq.push(comp(i));
        }
        let mut out = Vec::new();
        assert_eq!(cq.poll(&mut out, 2).unwrap(), 2);
        cq.push(comp(3));
        cq.push(comp(4));
        assert_eq!(
            stats(),
            CqStats {
                high_water: 3,
                overruns: 0,
                pending: 3
            }
        );
        cq.push(comp(5)); // the fourth unpolled entry
        assert_eq!(stats().overruns, 1);
        let e = cq.poll(&mut out, 8).unwrap_err().to_string();
        assert!(e.contains("overran its 3 entries"), "{e}");
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1]);
        cq.push(comp(6));
        assert_eq!(stats().overruns, 1, "one overrun per queue");
        drop(cq);
        assert_eq!(stats().pending, 0, "a destroyed queue holds nothing");
        // An unbounded queue never overruns.
        let free = SockCq::create(Arc::new(Doorbell::new()), None);
        for i in 0..10_000 {
            free.push(comp(i));
        }
        let mut out = Vec::new();
        assert_eq!(free.poll(&mut out, 20_000).unwrap(), 10_000);
        // Paused: polls see nothing until resumed, and the entries are all still there.
        let cq = SockCq::create(Arc::new(Doorbell::new()), Some(8));
        cq.push(comp(1));
        pause_polling(true);
        let mut out = Vec::new();
        let paused = cq.poll(&mut out, 8).unwrap();
        pause_polling(false);
        assert_eq!(paused, 0);
        assert_eq!(cq.poll(&mut out, 8).unwrap(), 1);
    }
}
