//! What the integration tests that drive the plugin through its API share: waiting for a
//! condition, for a token from a call that may answer "try later", and for a request to
//! complete. Each waits at most [`PATIENCE`] (a loaded host is slow, never a hang).
#![allow(dead_code)]

use ha_core::api::ops;
use std::time::{Duration, Instant};

/// The longest any helper here waits.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Poll `f` until it holds or `secs` pass; the last value of `f` decides.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::yield_now();
    }
    f()
}

/// Retry a call answering 0 ("try later") until it gives a token.
pub fn until_token(what: &str, mut f: impl FnMut() -> u64) -> u64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let t = f();
        if t != 0 {
            return t;
        }
        assert!(Instant::now() < deadline, "{what} kept answering try-later");
        std::thread::yield_now();
    }
}

/// Test `req` until it completes; the sizes it reports.
pub fn wait_done(req: u64) -> Vec<u64> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(sizes) = ops::test(req).expect("test") {
            return sizes;
        }
        assert!(
            Instant::now() < deadline,
            "request {req:#x} did not complete"
        );
        std::thread::yield_now();
    }
}
