//! The verbs fabric's background threads (device event readers, completion-channel
//! waiters): spawned with a name and counted, so tests can check they all stop.

use super::super::counters::{Held, Resource};
use super::super::{FabricError, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Threads of the verbs fabric currently running, process-wide.
pub fn live_threads() -> usize {
    LIVE.load(Ordering::SeqCst)
}

struct Count;

impl Drop for Count {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Spawn a counted thread.
pub fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    LIVE.fetch_add(1, Ordering::SeqCst);
    let count = Count;
    let held = Held::new(Resource::Thread);
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let _count = count;
            let _held = held;
            f()
        })
        .map_err(|e| FabricError::io(format!("spawning thread {name}"), e))
}
