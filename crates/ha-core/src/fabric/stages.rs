//! Stage timestamps for latency breakdowns (`HA_NCCL_STAGES=<file>`): the API entries, the
//! posts to the fabric, completion-queue polls that found something, the progress thread's
//! wake-ups and the completion-channel events each record `(CLOCK_MONOTONIC ns, stage, value,
//! thread)`. Two processes on one host share the clock, so their records interleave into one
//! timeline (`scripts/stages.py` reads them). Off by default: a disabled mark is one relaxed
//! atomic load. Records go to `<file>.<pid>` when a connection closes and at exit of the
//! recording (at most [`CAP`] records are kept; later ones are counted and dropped).

use parking_lot::Mutex;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Most records kept in memory between two dumps.
pub const CAP: usize = 1 << 20;

static ON: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static PATH: Mutex<Option<String>> = Mutex::new(None);
static BUF: Mutex<Vec<Record>> = Mutex::new(Vec::new());
static NAMES: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());

thread_local! {
    static TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[derive(Clone, Copy)]
struct Record {
    ns: u64,
    stage: &'static str,
    value: u64,
    tid: u64,
}

/// Start recording into `<path>.<pid>` (an empty path records nothing).
pub fn enable(path: &str) {
    if path.is_empty() {
        return;
    }
    *PATH.lock() = Some(path.to_string());
    BUF.lock().reserve(CAP);
    ON.store(true, Ordering::Relaxed);
}

/// Whether stages are being recorded.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn tid() -> u64 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid takes no arguments and cannot fail.
            let id = unsafe { libc::gettid() } as u64;
            t.set(id);
            let name = std::thread::current().name().unwrap_or("main").to_string();
            NAMES.lock().push((id, name));
        }
        t.get()
    })
}

/// Record `stage` now, with a value that says which (a size, a count, an opcode).
#[inline]
pub fn mark(stage: &'static str, value: u64) {
    if !enabled() {
        return;
    }
    let r = Record {
        ns: now_ns(),
        stage,
        value,
        tid: tid(),
    };
    let mut b = BUF.lock();
    if b.len() < CAP {
        b.push(r);
    } else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Append what was recorded to `<path>.<pid>` (`ns stage value tid thread-name` per line).
pub fn dump() {
    if !enabled() {
        return;
    }
    let Some(path) = PATH.lock().clone() else {
        return;
    };
    let recs = std::mem::take(&mut *BUF.lock());
    let names = NAMES.lock().clone();
    let name = |t: u64| {
        names
            .iter()
            .find(|(id, _)| *id == t)
            .map_or("?", |(_, n)| n.as_str())
            .replace(' ', "_")
    };
    let file = format!("{path}.{}", std::process::id());
    let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
    else {
        tracing::warn!("NET/HA : HA_NCCL_STAGES: cannot write {file}");
        return;
    };
    let mut w = std::io::BufWriter::new(f);
    for r in recs {
        let _ = writeln!(
            w,
            "{} {} {} {} {}",
            r.ns,
            r.stage,
            r.value,
            r.tid,
            name(r.tid)
        );
    }
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        let _ = writeln!(w, "# {dropped} records dropped (over {CAP})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_written_in_order_with_the_thread_name() {
        let dir = std::env::temp_dir().join(format!("ha-stages-{}", std::process::id()));
        let path = dir.to_string_lossy().to_string();
        enable(&path);
        mark("a", 1);
        std::thread::Builder::new()
            .name("other".into())
            .spawn(|| mark("b", 2))
            .unwrap()
            .join()
            .unwrap();
        mark("c", 3);
        dump();
        ON.store(false, Ordering::Relaxed);
        let file = format!("{path}.{}", std::process::id());
        let text = std::fs::read_to_string(&file).unwrap();
        let _ = std::fs::remove_file(&file);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
        let mine: Vec<&Vec<&str>> = lines
            .iter()
            .filter(|f| ["a", "b", "c"].contains(&f[1]))
            .collect();
        assert_eq!(mine.len(), 3, "{text}");
        assert_eq!(
            mine.iter().map(|f| f[1]).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(mine[1][4], "other");
        assert_eq!(mine[1][2], "2");
        let ns: Vec<u64> = mine.iter().map(|f| f[0].parse().unwrap()).collect();
        assert!(ns[0] <= ns[1] && ns[1] <= ns[2]);
    }
}
