//! The process's stats writer: the registry of live connections that have a stats file, and
//! the thread that appends their periodic lines. The thread starts with the first registered
//! connection and is stopped and joined when the last one goes (so a closed plugin leaves no
//! thread behind, and none runs code of an unloaded library). Every append — periodic lines,
//! events, closing lines — takes one process-wide lock and is one `write` on an `O_APPEND`
//! file, so lines of this process never interleave and a closing line is the last line of its
//! connection.

use super::unix_ms;
use crate::fabric::counters::{Held, Resource};
use parking_lot::{Condvar, Mutex};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// `HA_NCCL_STATS_INTERVAL_MS` of this process (0: no periodic lines).
static INTERVAL_MS: AtomicU64 = AtomicU64::new(0);

/// Set the interval of periodic lines (at init, from the configuration); 0 = none. Applies
/// to a writer started afterwards.
pub fn set_interval(d: Duration) {
    INTERVAL_MS.store(d.as_millis() as u64, Ordering::Relaxed);
}

/// The interval of periodic lines (zero: none).
pub fn interval() -> Duration {
    Duration::from_millis(INTERVAL_MS.load(Ordering::Relaxed))
}

/// What the writer reports: a live connection.
pub trait Source: Send + Sync {
    /// Its stats file.
    fn file(&self) -> &str;
    /// Its periodic line at `now_ms`; `None` once it closed.
    fn periodic(&self, now_ms: u64, interval_ms: u64) -> Option<String>;
}

struct Writer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: JoinHandle<()>,
}

struct Registry {
    conns: Vec<Arc<dyn Source>>,
    writer: Option<Writer>,
}

static REGISTRY: Mutex<Registry> = parking_lot::const_mutex(Registry {
    conns: Vec::new(),
    writer: None,
});

/// Whether the writer thread runs (tests).
#[cfg(test)]
pub(super) fn running() -> bool {
    REGISTRY.lock().writer.is_some()
}

/// Connections registered (tests).
#[cfg(test)]
pub(super) fn registered() -> usize {
    REGISTRY.lock().conns.len()
}

/// Held while appending (see the module comment).
static APPEND: Mutex<()> = parking_lot::const_mutex(());

/// A failure to write was said (once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Add a live connection; starts the writer if it is the first and periodic lines are on.
pub(super) fn register(c: Arc<dyn Source>) {
    let mut r = REGISTRY.lock();
    r.conns.push(c);
    let ms = INTERVAL_MS.load(Ordering::Relaxed);
    if r.writer.is_none() && ms > 0 {
        match start(Duration::from_millis(ms)) {
            Ok(w) => r.writer = Some(w),
            Err(e) => tracing::warn!(
                "NET/HA : cannot start the stats writer thread ({e}): no periodic lines in HA_NCCL_STATS_FILE"
            ),
        }
    }
}

/// Remove a connection; stops (and joins) the writer after the last one.
pub(super) fn unregister(c: &Arc<dyn Source>) {
    let stopping = {
        let mut r = REGISTRY.lock();
        r.conns.retain(|x| !same(x, c));
        if r.conns.is_empty() {
            r.writer.take()
        } else {
            None
        }
    };
    if let Some(w) = stopping {
        *w.stop.0.lock() = true;
        w.stop.1.notify_all();
        let _ = w.handle.join();
    }
}

/// The same connection (compared by address: vtables of one type may differ).
fn same(a: &Arc<dyn Source>, b: &Arc<dyn Source>) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

fn start(every: Duration) -> std::io::Result<Writer> {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let s = stop.clone();
    let held = Held::new(Resource::Thread);
    let handle = std::thread::Builder::new()
        .name("ha-stats".into())
        .spawn(move || {
            let _held = held;
            run(&s, every)
        })?;
    Ok(Writer { stop, handle })
}

fn run(stop: &(Mutex<bool>, Condvar), every: Duration) {
    loop {
        {
            let mut stopped = stop.0.lock();
            if !*stopped {
                stop.1.wait_for(&mut stopped, every);
            }
            if *stopped {
                return;
            }
        }
        write_periodic(every.as_millis() as u64);
    }
}

/// One periodic line per live connection, one append per file.
fn write_periodic(interval_ms: u64) {
    let conns: Vec<Arc<dyn Source>> = REGISTRY.lock().conns.clone();
    let mut files: Vec<&str> = conns.iter().map(|c| c.file()).collect();
    files.sort_unstable();
    files.dedup();
    let _g = APPEND.lock();
    let now = unix_ms();
    for f in files {
        let text: String = conns
            .iter()
            .filter(|c| c.file() == f)
            .filter_map(|c| c.periodic(now, interval_ms))
            .map(|l| l + "\n")
            .collect();
        write_locked(f, &text);
    }
}

/// Append `line` (one line, no newline) to `file`.
pub(super) fn append(file: &str, line: &str) {
    let _g = APPEND.lock();
    write_locked(file, &format!("{line}\n"));
}

fn write_locked(file: &str, text: &str) {
    if text.is_empty() {
        return;
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!("NET/HA : cannot write HA_NCCL_STATS_FILE={file}: {e}");
        }
    }
}
