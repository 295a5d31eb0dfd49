//! Routing table of the progress thread: which completion queues to poll, and which inbox
//! each queue pair's completions go to. Consumers poll through it too (a connection's pump
//! through [`super::Route::poll_queues`], an empty [`Inbox::pop`]); one poller at a time, so
//! each queue pair's completions reach its inbox in queue order.

use super::inbox::{Inbox, Poller};
use crate::fabric::{Completion, CompletionQueue, Doorbell};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub struct Router {
    /// Held while one thread polls and delivers: the queues and the poll buffer (one lock for
    /// both: a consumer's poll, millions a second, takes one).
    polling: Mutex<Polling>,
    routes: RwLock<HashMap<(u64, u32), Arc<Inbox>>>,
    pub doorbell: Arc<Doorbell>,
    next_cq: AtomicU64,
    /// Completions whose queue pair had no route (closed connection).
    pub unrouted: AtomicU64,
    /// A consumer polled ([`Router::try_poll_once`]) since the progress thread last looked:
    /// its sign that someone else watches the queues. A flag, not a counter: consumers poll
    /// millions of times a second and only write it when it is down (no shared line bouncing
    /// between them on every poll).
    consumer_polled: AtomicBool,
}

/// What the polling thread holds.
struct Polling {
    cqs: Vec<(u64, Arc<dyn CompletionQueue>)>,
    buf: Vec<Completion>,
}

impl Default for Router {
    fn default() -> Self {
        Router {
            polling: Mutex::new(Polling {
                cqs: Vec::new(),
                buf: Vec::with_capacity(64),
            }),
            routes: RwLock::new(HashMap::new()),
            doorbell: Arc::new(Doorbell::new()),
            next_cq: AtomicU64::new(1),
            unrouted: AtomicU64::new(0),
            consumer_polled: AtomicBool::new(false),
        }
    }
}

impl Router {
    pub fn add_cq(&self, cq: Arc<dyn CompletionQueue>) -> u64 {
        let id = self.next_cq.fetch_add(1, Ordering::Relaxed);
        self.polling.lock().cqs.push((id, cq));
        id
    }

    pub fn remove_cq(&self, id: u64) {
        self.polling.lock().cqs.retain(|(i, _)| *i != id);
        self.routes.write().retain(|(c, _), _| *c != id);
    }

    pub fn add_route(&self, cq: u64, qpn: u32, inbox: Arc<Inbox>) {
        self.routes.write().insert((cq, qpn), inbox);
    }

    /// Remove the route of `qpn` on `cq` if it still leads to `inbox`: a queue pair number
    /// can be reused by a new queue pair (verbs devices recycle them) before the old route
    /// goes, and the new queue pair's route must survive the old one's removal.
    pub fn remove_route(&self, cq: u64, qpn: u32, inbox: &Arc<Inbox>) {
        let mut routes = self.routes.write();
        if routes
            .get(&(cq, qpn))
            .is_some_and(|r| Arc::ptr_eq(r, inbox))
        {
            routes.remove(&(cq, qpn));
        }
    }

    /// Poll every queue once and deliver (after any other poller finished); returns how
    /// many completions moved.
    pub fn poll_once(&self, batch: usize) -> usize {
        self.poll_locked(&mut self.polling.lock(), batch)
    }

    /// Whether a consumer polled since the last call (which lowers the flag).
    pub fn take_consumer_polled(&self) -> bool {
        self.consumer_polled.load(Ordering::Relaxed)
            && self.consumer_polled.swap(false, Ordering::Relaxed)
    }

    fn poll_locked(&self, p: &mut Polling, batch: usize) -> usize {
        let mut moved = 0;
        let Polling { cqs, buf } = p;
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

impl Poller for Router {
    /// As [`Router::poll_once`], unless another thread is polling right now (0 then: that
    /// thread delivers whatever is there). Raises the "a consumer polled" flag.
    fn try_poll_once(&self, batch: usize) -> usize {
        match self.polling.try_lock() {
            Some(mut p) => {
                if !self.consumer_polled.load(Ordering::Relaxed) {
                    self.consumer_polled.store(true, Ordering::Relaxed);
                }
                self.poll_locked(&mut p, batch)
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Result, WcOpcode, WcStatus};
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    /// A completion queue the test fills by hand.
    #[derive(Default)]
    struct FakeCq(Mutex<VecDeque<Completion>>);

    impl CompletionQueue for FakeCq {
        fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
            let mut q = self.0.lock();
            let n = max.min(q.len());
            out.extend(q.drain(..n));
            Ok(n)
        }
    }

    fn comp(qp_num: u32, wr_id: u64) -> Completion {
        Completion {
            wr_id,
            qp_num,
            status: WcStatus::Success,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 0,
            imm: None,
        }
    }

    fn setup() -> (Arc<Router>, Arc<FakeCq>, u64) {
        let router = Arc::new(Router::default());
        let cq = Arc::new(FakeCq::default());
        let id = router.add_cq(cq.clone());
        (router, cq, id)
    }

    #[test]
    fn an_empty_inbox_polls_the_queues_itself() {
        let (router, cq, id) = setup();
        let a = Arc::new(Inbox::polled_by(&router));
        let b = Arc::new(Inbox::polled_by(&router));
        let plain = Arc::new(Inbox::new());
        router.add_route(id, 1, a.clone());
        router.add_route(id, 2, b.clone());
        router.add_route(id, 3, plain.clone());
        cq.0.lock()
            .extend([comp(1, 10), comp(2, 20), comp(1, 11), comp(3, 30)]);
        // One poll from a's consumer delivers everything, to every inbox.
        assert_eq!(a.pop().map(|c| c.wr_id), Some(10));
        assert_eq!((a.len(), b.len(), plain.len()), (1, 1, 1));
        assert_eq!(a.pop().map(|c| c.wr_id), Some(11));
        assert_eq!(a.pop(), None);
        assert_eq!(b.pop().map(|c| c.wr_id), Some(20));
        assert_eq!(plain.pop().map(|c| c.wr_id), Some(30));
        // An inbox without a poller waits for the progress thread.
        cq.0.lock().push_back(comp(3, 31));
        assert_eq!(plain.pop(), None);
        assert_eq!(router.poll_once(64), 1);
        assert_eq!(plain.pop().map(|c| c.wr_id), Some(31));
    }

    /// A queue pair number reused by a new queue pair before the old one's route went: the old
    /// route's removal must leave the new queue pair's completions routed (before, removing by
    /// `(cq, qpn)` alone took the new route away and its completions went unrouted).
    #[test]
    fn removing_a_stale_route_keeps_the_reused_numbers_new_route() {
        let (router, cq, id) = setup();
        let old = Arc::new(Inbox::new());
        let new = Arc::new(Inbox::new());
        router.add_route(id, 7, old.clone());
        // The device reuses qpn 7 for a new queue pair; its route replaces the old one.
        router.add_route(id, 7, new.clone());
        // Then the old path's route is dropped.
        router.remove_route(id, 7, &old);
        cq.0.lock().push_back(comp(7, 70));
        assert_eq!(router.poll_once(64), 1);
        assert_eq!(new.pop().map(|c| c.wr_id), Some(70), "new route lost");
        assert_eq!(router.unrouted.load(Ordering::Relaxed), 0);
        // Its own removal does remove it.
        router.remove_route(id, 7, &new);
        cq.0.lock().push_back(comp(7, 71));
        router.poll_once(64);
        assert_eq!(router.unrouted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_consumer_steps_aside_while_another_thread_polls() {
        let (router, cq, id) = setup();
        let a = Arc::new(Inbox::polled_by(&router));
        router.add_route(id, 1, a.clone());
        cq.0.lock().push_back(comp(1, 1));
        {
            let _busy = router.polling.lock();
            assert_eq!(router.try_poll_once(64), 0);
            assert_eq!(a.pop(), None, "no second poller while one polls");
        }
        assert!(
            !router.take_consumer_polled(),
            "a poll that stepped aside is no poll"
        );
        assert_eq!(a.pop().map(|c| c.wr_id), Some(1));
        assert!(router.take_consumer_polled());
        assert!(
            !router.take_consumer_polled(),
            "the flag went down when read"
        );
        router.poll_once(64);
        assert!(
            !router.take_consumer_polled(),
            "the progress thread is no consumer"
        );
        // A router that is gone is not polled (and not kept alive by its inboxes).
        cq.0.lock().push_back(comp(1, 2));
        drop(router);
        assert_eq!(a.pop(), None);
    }

    #[test]
    fn completions_keep_queue_order_with_two_pollers() {
        let (router, cq, id) = setup();
        let a = Arc::new(Inbox::polled_by(&router));
        router.add_route(id, 1, a.clone());
        const N: u64 = 20_000;
        let done = std::sync::atomic::AtomicBool::new(false);
        /// Stops the polling thread however the consumer ends (a failed assertion included).
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            // The "device": completions trickle in.
            s.spawn(|| {
                for i in 0..N {
                    cq.0.lock().push_back(comp(1, i));
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            });
            // The "progress thread".
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    router.poll_once(7);
                }
            });
            let _stop = Stop(&done);
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut next = 0;
            while next < N {
                assert!(Instant::now() < deadline, "stuck at {next}");
                if let Some(c) = a.pop() {
                    assert_eq!(c.wr_id, next, "out of order");
                    next += 1;
                }
            }
        });
        assert_eq!(a.pop(), None);
    }
}
