//! How a polling loop waits: yield while spinning; after many idle rounds, optionally sleep
//! a little (never on latency-sensitive paths).

use std::time::Duration;

/// Polling pace: yield while spinning; after many idle rounds, optionally sleep a little
/// (never on latency-sensitive paths).
pub struct Backoff {
    idle: u32,
    may_sleep: bool,
}

impl Backoff {
    const SPINS_BEFORE_SLEEP: u32 = 2000;

    pub fn new(may_sleep: bool) -> Self {
        Backoff { idle: 0, may_sleep }
    }

    pub fn reset(&mut self) {
        self.idle = 0;
    }

    pub fn snooze(&mut self) {
        self.idle = self.idle.saturating_add(1);
        if self.may_sleep && self.idle > Self::SPINS_BEFORE_SLEEP {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
    }
}
