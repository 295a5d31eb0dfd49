//! Completion queues of the `sock` fabric: a lock-free queue filled by I/O threads, with a
//! doorbell rung after each push, and a registry that maps the `Arc<dyn CompletionQueue>`
//! handed to `create_qp` back to the concrete queue.

use crate::fabric::counters::{Held, Resource};
use crate::fabric::{Completion, CompletionQueue, Doorbell, FabricError, Result};
use crossbeam_queue::SegQueue;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

pub struct SockCq {
    q: SegQueue<Completion>,
    bell: Arc<Doorbell>,
    _held: Held,
}

/// Live queues by address (control path only).
static REGISTRY: Mutex<Vec<(usize, Weak<SockCq>)>> = Mutex::new(Vec::new());

impl SockCq {
    pub fn create(bell: Arc<Doorbell>) -> Arc<SockCq> {
        let cq = Arc::new(SockCq {
            q: SegQueue::new(),
            bell,
            _held: Held::new(Resource::Cq),
        });
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
        self.q.push(c);
        self.bell.ring();
    }
}

impl CompletionQueue for SockCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut n = 0;
        while n < max {
            match self.q.pop() {
                Some(c) => {
                    out.push(c);
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}

impl Drop for SockCq {
    fn drop(&mut self) {
        let me = self as *const SockCq as usize;
        REGISTRY.lock().retain(|(a, _)| *a != me);
    }
}
