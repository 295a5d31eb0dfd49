//! Per-connection completion inbox: the progress thread pushes, the connection's `test()`
//! pops. Lock-free (crossbeam `SegQueue`), never blocks either side.

use crate::fabric::Completion;
use crossbeam_queue::SegQueue;

#[derive(Default)]
pub struct Inbox {
    q: SegQueue<Completion>,
}

impl Inbox {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&self, c: Completion) {
        self.q.push(c);
    }
    pub fn pop(&self) -> Option<Completion> {
        self.q.pop()
    }
    pub fn len(&self) -> usize {
        self.q.len()
    }
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}
