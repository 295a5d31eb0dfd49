//! Doorbell: how a fabric wakes the engine's progress thread when it has put completions in
//! a completion queue, so an idle progress thread sleeps instead of spinning.
//!
//! A fabric whose wake-ups cost something per completion (verbs: a completion event, a
//! notifier thread woken, the posting thread preempted) registers an [`Arm`] instead of
//! ringing for every completion: it rings only for the first completion after it was armed,
//! and [`Doorbell::wait`] arms it just before the consumer sleeps. While the consumer is busy
//! (or sleeps with [`Doorbell::sleep`]) no completion costs a wake-up.

use parking_lot::{Condvar, Mutex};
use std::sync::Weak;
use std::time::Duration;

/// A queue that rings the doorbell only once armed (the verbs completion channel).
pub trait Arm: Send + Sync {
    /// Ring for the next completion. Returns true when this call armed it (it was not
    /// armed): completions that arrived before may not ring, so the consumer polls once more.
    fn arm(&self) -> bool;
}

/// A level-triggered wake-up flag with a condition variable.
#[derive(Default)]
pub struct Doorbell {
    rung: Mutex<bool>,
    cv: Condvar,
    arms: Mutex<Vec<Weak<dyn Arm>>>,
}

impl Doorbell {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a queue that [`Doorbell::wait`] arms before sleeping (dropped with the queue).
    pub fn add_arm(&self, arm: Weak<dyn Arm>) {
        self.arms.lock().push(arm);
    }

    /// Arm every registered queue; true when one was not armed (the caller polls again
    /// before sleeping).
    pub fn arm(&self) -> bool {
        let mut armed_now = false;
        self.arms.lock().retain(|w| match w.upgrade() {
            Some(a) => {
                armed_now |= a.arm();
                true
            }
            None => false,
        });
        armed_now
    }

    /// Arm the registered queues, then wait until rung or `timeout` passes. Returns true when
    /// the caller should poll: rung, or a queue was just armed (then it returns at once).
    /// Clears the flag.
    pub fn wait(&self, timeout: Duration) -> bool {
        if self.arm() {
            return true;
        }
        self.sleep(timeout)
    }

    /// Wait until rung or `timeout` passes, arming nothing (the caller knows someone else
    /// polls the queues meanwhile); returns whether it was rung. Clears the flag.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let mut rung = self.rung.lock();
        if !*rung {
            self.cv.wait_for(&mut rung, timeout);
        }
        std::mem::replace(&mut *rung, false)
    }

    /// Wake the waiter (cheap when nobody waits).
    pub fn ring(&self) {
        let mut rung = self.rung.lock();
        if !*rung {
            *rung = true;
            self.cv.notify_one();
        }
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

    /// Counts arm calls; "armed" until `disarm`.
    #[derive(Default)]
    struct Fake {
        armed: Mutex<bool>,
        calls: Mutex<u32>,
    }

    impl Arm for Fake {
        fn arm(&self) -> bool {
            *self.calls.lock() += 1;
            !std::mem::replace(&mut *self.armed.lock(), true)
        }
    }

    #[test]
    fn wait_arms_first_and_polls_again_when_it_just_armed() {
        let d = Doorbell::new();
        let f = Arc::new(Fake::default());
        let weak: Weak<dyn Arm> = Arc::downgrade(&f) as Weak<dyn Arm>;
        d.add_arm(weak);
        // Just armed: no sleep, poll again.
        assert!(d.wait(Duration::from_secs(30)));
        // Already armed: sleeps (here until the timeout).
        assert!(!d.wait(Duration::from_millis(1)));
        assert_eq!(*f.calls.lock(), 2);
        // `sleep` arms nothing.
        *f.armed.lock() = false;
        assert!(!d.sleep(Duration::from_millis(1)));
        assert_eq!(*f.calls.lock(), 2);
        // A dropped queue is forgotten.
        drop(f);
        assert!(!d.arm());
        assert!(d.arms.lock().is_empty());
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
