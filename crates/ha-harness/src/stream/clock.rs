//! `CLOCK_MONOTONIC` readings in safe code, so that the stream's timestamps can be compared
//! with those of other processes (the drill script, the receiver in another namespace).
//!
//! On Linux `std::time::Instant` *is* a `CLOCK_MONOTONIC` timespec, but std gives no accessor
//! for its value; its `Debug` form (`Instant { tv_sec: S, tv_nsec: N }`) carries it, and that is
//! what [`instant_ns`] reads. The unit tests pin the format down, so a toolchain that changes it
//! fails loudly here instead of producing wrong timestamps.

use std::time::Instant;

/// Nanoseconds of `CLOCK_MONOTONIC` at `t`, or `None` if this platform's `Instant` does not
/// show a timespec.
pub fn instant_ns(t: Instant) -> Option<u64> {
    let text = format!("{t:?}");
    let sec = field(&text, "tv_sec: ")?;
    let nsec = field(&text, "tv_nsec: ")?;
    if nsec >= 1_000_000_000 {
        return None;
    }
    sec.checked_mul(1_000_000_000)?.checked_add(nsec)
}

/// The decimal number after `key` in `text`.
fn field(text: &str, key: &str) -> Option<u64> {
    let at = text.find(key)? + key.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> Result<u64, String> {
    instant_ns(Instant::now())
        .ok_or_else(|| "cannot read CLOCK_MONOTONIC from std::time::Instant".to_string())
}

/// A side's time base: an `Instant` and the same moment in `CLOCK_MONOTONIC` nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    start_ns: u64,
}

impl Clock {
    pub fn start() -> Result<Clock, String> {
        let start = Instant::now();
        let start_ns = instant_ns(start)
            .ok_or_else(|| "cannot read CLOCK_MONOTONIC from std::time::Instant".to_string())?;
        Ok(Clock { start, start_ns })
    }

    /// `CLOCK_MONOTONIC` at the start, in nanoseconds.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Nanoseconds since the start.
    pub fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn start_instant(&self) -> Instant {
        self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_the_timespec_of_an_instant() {
        let a = Instant::now();
        let b = a + Duration::from_nanos(1_234_567_891);
        let (na, nb) = (instant_ns(a).unwrap(), instant_ns(b).unwrap());
        assert_eq!(nb - na, 1_234_567_891);
        // Monotonic time since boot: positive, and later readings are not smaller.
        assert!(na > 0);
        assert!(now_ns().unwrap() >= na);
    }

    #[test]
    fn parses_the_debug_form() {
        assert_eq!(
            field("Instant { tv_sec: 2368, tv_nsec: 837671870 }", "tv_sec: "),
            Some(2368)
        );
        assert_eq!(field("Instant { tv_nsec: 5 }", "tv_sec: "), None);
        assert_eq!(field("tv_sec: x", "tv_sec: "), None);
    }

    #[test]
    fn clock_start_matches_its_instant() {
        let c = Clock::start().unwrap();
        assert_eq!(instant_ns(c.start_instant()), Some(c.start_ns()));
        let e1 = c.elapsed_ns();
        assert!(c.elapsed_ns() >= e1);
    }
}
