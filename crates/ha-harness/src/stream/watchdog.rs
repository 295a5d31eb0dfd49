//! Last line of defence against a plugin call that never returns: each side's loop beats a
//! heartbeat; a watchdog thread that sees a side silent for longer than its limit prints
//! which side is stuck and ends the process with status 1, so a drill never hangs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Heartbeats of the sides of this process.
pub struct Watchdog {
    start: Instant,
    /// Per side: ms since `start` of the last beat, `u64::MAX` when the side is not running.
    beats: [AtomicU64; 2],
    names: [&'static str; 2],
    limit_ms: u64,
    done: AtomicBool,
}

impl Watchdog {
    /// A side silent for more than `limit` is stuck.
    pub fn new(names: [&'static str; 2], limit: Duration) -> Self {
        Watchdog {
            start: Instant::now(),
            beats: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            names,
            limit_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
            done: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Side `i` is alive (call at least once per loop iteration).
    pub fn beat(&self, i: usize) {
        self.beats[i].store(self.now_ms(), Ordering::Relaxed);
    }

    /// Side `i` finished: no longer watched.
    pub fn idle(&self, i: usize) {
        self.beats[i].store(u64::MAX, Ordering::Relaxed);
    }

    /// The stuck side and for how long (ms), if any, at `now_ms`.
    pub fn stuck_at(&self, now_ms: u64) -> Option<(&'static str, u64)> {
        self.beats.iter().zip(self.names).find_map(|(b, name)| {
            let last = b.load(Ordering::Relaxed);
            let silent = now_ms.saturating_sub(last);
            (last != u64::MAX && silent > self.limit_ms).then_some((name, silent))
        })
    }

    /// Stops [`Watchdog::watch`].
    pub fn stop(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    /// Checks every 200 ms until stopped; when a side is stuck calls `on_stuck` (which is
    /// expected to end the process).
    pub fn watch(&self, on_stuck: &dyn Fn(&str, u64)) {
        while !self.done.load(Ordering::Relaxed) {
            if let Some((name, ms)) = self.stuck_at(self.now_ms()) {
                on_stuck(name, ms);
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_sides_are_reported_idle_ones_are_not() {
        let w = Watchdog::new(["A", "B"], Duration::from_millis(1000));
        assert_eq!(w.stuck_at(u64::MAX - 1), None, "nothing running");
        w.beats[0].store(100, Ordering::Relaxed);
        w.beats[1].store(900, Ordering::Relaxed);
        assert_eq!(w.stuck_at(1000), None);
        assert_eq!(w.stuck_at(1101), Some(("A", 1001)));
        w.idle(0);
        assert_eq!(w.stuck_at(1101), None);
        assert_eq!(w.stuck_at(1950), Some(("B", 1050)));
        w.beat(1);
        assert_eq!(w.stuck_at(w.now_ms()), None);
    }

    #[test]
    fn watch_returns_when_stopped() {
        let w = Watchdog::new(["A", "B"], Duration::from_secs(100));
        w.stop();
        w.watch(&|_, _| panic!("nothing is stuck"));
    }
}
