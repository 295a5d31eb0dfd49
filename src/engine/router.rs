//! Routing table of the progress thread: which completion queues to poll, and which inbox
//! each queue pair's completions go to.

use super::inbox::Inbox;
use crate::fabric::{Completion, CompletionQueue, Doorbell};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub struct Router {
    cqs: RwLock<Vec<(u64, Arc<dyn CompletionQueue>)>>,
    /// One poller at a time (the progress thread or a helping `test()`), so the completions
    /// of one queue pair reach its inbox in the order the queue gave them.
    polling: parking_lot::Mutex<Vec<Completion>>,
    routes: RwLock<HashMap<(u64, u32), Arc<Inbox>>>,
    pub doorbell: Arc<Doorbell>,
    next_cq: AtomicU64,
    /// Completions whose queue pair had no route (closed connection).
    pub unrouted: AtomicU64,
}

impl Default for Router {
    fn default() -> Self {
        Router {
            cqs: RwLock::new(Vec::new()),
            polling: parking_lot::Mutex::new(Vec::with_capacity(64)),
            routes: RwLock::new(HashMap::new()),
            doorbell: Arc::new(Doorbell::new()),
            next_cq: AtomicU64::new(1),
            unrouted: AtomicU64::new(0),
        }
    }
}

impl Router {
    pub fn add_cq(&self, cq: Arc<dyn CompletionQueue>) -> u64 {
        let id = self.next_cq.fetch_add(1, Ordering::Relaxed);
        self.cqs.write().push((id, cq));
        id
    }

    pub fn remove_cq(&self, id: u64) {
        self.cqs.write().retain(|(i, _)| *i != id);
        self.routes.write().retain(|(c, _), _| *c != id);
    }

    pub fn add_route(&self, cq: u64, qpn: u32, inbox: Arc<Inbox>) {
        self.routes.write().insert((cq, qpn), inbox);
    }

    pub fn remove_route(&self, cq: u64, qpn: u32) {
        self.routes.write().remove(&(cq, qpn));
    }

    /// Poll every queue once and deliver, unless someone else is polling right now (then 0).
    pub fn try_poll(&self, batch: usize) -> usize {
        match self.polling.try_lock() {
            Some(mut buf) => self.poll_locked(&mut buf, batch),
            None => 0,
        }
    }

    /// Poll every queue once and deliver; returns how many completions moved.
    pub fn poll_once(&self, batch: usize) -> usize {
        let mut buf = self.polling.lock();
        self.poll_locked(&mut buf, batch)
    }

    fn poll_locked(&self, buf: &mut Vec<Completion>, batch: usize) -> usize {
        let mut moved = 0;
        let cqs = self.cqs.read();
        for (id, cq) in cqs.iter() {
            buf.clear();
            // A failing poll leaves the queue's connections to notice through their QPs.
            let n = cq.poll(buf, batch).unwrap_or(0);
            if n == 0 {
                continue;
            }
            moved += n;
            let routes = self.routes.read();
            for c in buf.drain(..) {
                match routes.get(&(*id, c.qp_num)) {
                    Some(inbox) => inbox.push(c),
                    None => {
                        self.unrouted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        moved
    }
}
