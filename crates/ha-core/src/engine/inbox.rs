//! Per-connection completion inbox: the progress thread pushes, the connection's `test()`
//! pops. Lock-free (crossbeam `SegQueue`), never blocks either side.
//!
//! An inbox made by the engine ([`Inbox::polled_by`]) also lets its consumer poll: when it is
//! empty, `pop` polls the completion queues itself (unless another thread is polling right
//! now) before answering `None`. A connection with several paths empties its inboxes with
//! [`Inbox::pop_queued`] and has the router poll once (`engine::Route::poll_queues`). A
//! `test()` loop then sees a completion as soon as the device wrote it, without waiting for
//! the progress thread to be woken and scheduled (two thread hand-offs per completion: the
//! fabric's notifier, then the progress thread).

use crate::fabric::Completion;
use crossbeam_queue::SegQueue;
use std::sync::{Arc, Weak};

/// What an empty inbox asks to poll the completion queues: the engine's router, seen through
/// this trait so that the inbox does not depend on the router that fills it.
pub trait Poller: Send + Sync {
    /// Poll every queue once and deliver, unless another thread is polling right now (0
    /// then: that thread delivers whatever is there); returns how many completions moved.
    fn try_poll_once(&self, batch: usize) -> usize;
}

/// Completions one consumer-side poll moves at most.
pub(crate) const POLL_BATCH: usize = 64;

#[derive(Default)]
pub struct Inbox {
    q: SegQueue<Completion>,
    /// Who polls the queues when `pop` finds nothing (weak: the router's routes hold inboxes).
    poller: Option<Weak<dyn Poller>>,
}

impl Inbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// An inbox whose consumer has `poller` poll the queues when it finds the inbox empty.
    pub fn polled_by<P: Poller + 'static>(poller: &Arc<P>) -> Self {
        let weak: Weak<dyn Poller> = Arc::downgrade(poller) as Weak<dyn Poller>;
        Inbox {
            q: SegQueue::new(),
            poller: Some(weak),
        }
    }

    pub fn push(&self, c: Completion) {
        self.q.push(c);
    }

    pub fn pop(&self) -> Option<Completion> {
        if let Some(c) = self.pop_queued() {
            return Some(c);
        }
        let poller = self.poller.as_ref()?.upgrade()?;
        if poller.try_poll_once(POLL_BATCH) == 0 {
            return None;
        }
        self.pop_queued()
    }

    /// The next queued completion, without polling the completion queues. An empty queue is
    /// told by two loads (`SegQueue::pop` alone would also pay a full fence to say so).
    pub fn pop_queued(&self) -> Option<Completion> {
        if self.q.is_empty() {
            return None;
        }
        self.q.pop()
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}
