//! The background progress thread: polls every completion queue and moves completions into
//! the connections' inboxes. It busy-polls for `spin` after the last completion, then sleeps
//! on the doorbell the fabrics ring.
//!
//! While consumers poll the queues themselves (a `test()` loop finding its inbox empty polls;
//! see `inbox.rs`) it sleeps without arming the queues: completions then cost no wake-up of
//! any thread. Once a whole sleep passes without a consumer poll it arms them (through
//! `Doorbell::wait`) and sleeps until the next completion.

use super::router::Router;
use crate::fabric::counters::{Held, Resource};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    router: Arc<Router>,
    handle: Option<JoinHandle<()>>,
}

impl ProgressThread {
    pub fn start(router: Arc<Router>, spin: Duration) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, r) = (stop.clone(), router.clone());
        let held = Held::new(Resource::Thread);
        let handle = std::thread::Builder::new()
            .name("ha-progress".into())
            .spawn(move || {
                let _held = held;
                run(&r, &s, spin)
            })?;
        Ok(ProgressThread {
            stop,
            router,
            handle: Some(handle),
        })
    }
}

/// Longest sleep; also how long consumer polls keep the queues unarmed after the last one.
const SLEEP: Duration = Duration::from_millis(20);

fn run(router: &Router, stop: &AtomicBool, spin: Duration) {
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        if router.poll_once(64) > 0 {
            last = Instant::now();
        } else if last.elapsed() < spin {
            std::hint::spin_loop();
        } else {
            if router.take_consumer_polled() {
                // A consumer polled since the last look: it sees new completions itself.
                router.doorbell.sleep(SLEEP);
                crate::fabric::stages::mark("progress_wake", 0);
            } else {
                // Woken by the fabric's doorbell; the timeout only bounds how long a stop or
                // a fabric that cannot ring (polled hardware queues) waits.
                router.doorbell.wait(SLEEP);
                crate::fabric::stages::mark("progress_wake", 1);
            }
            last = Instant::now() - spin;
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.router.doorbell.ring();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
