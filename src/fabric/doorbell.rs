//! Doorbell: how a fabric wakes the engine's progress thread when it has put completions in
//! a completion queue, so an idle progress thread sleeps instead of spinning.

use parking_lot::{Condvar, Mutex};
use std::time::Duration;

/// A level-triggered wake-up flag with a condition variable.
#[derive(Default)]
pub struct Doorbell {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Doorbell {
    pub fn new() -> Self {
        Self::default()
    }

    /// Wake the waiter (cheap when nobody waits).
    pub fn ring(&self) {
        let mut rung = self.rung.lock();
        if !*rung {
            *rung = true;
            self.cv.notify_one();
        }
    }

    /// Wait until rung or `timeout` passes; returns whether it was rung. Clears the flag.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut rung = self.rung.lock();
        if !*rung {
            self.cv.wait_for(&mut rung, timeout);
        }
        std::mem::replace(&mut *rung, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn ring_before_wait_is_not_lost() {
        let d = Doorbell::new();
        d.ring();
        assert!(d.wait(Duration::from_secs(5)));
        // Consumed: a second wait times out.
        assert!(!d.wait(Duration::from_millis(1)));
    }

    #[test]
    fn ring_from_other_thread_wakes_waiter() {
        let d = Arc::new(Doorbell::new());
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.wait(Duration::from_secs(30)));
        d.ring();
        assert!(t.join().unwrap());
    }
}
