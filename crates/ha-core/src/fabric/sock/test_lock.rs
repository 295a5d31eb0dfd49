//! The lock `sock` tests share: process-wide figures (`live_threads()`, the readers' long-wait
//! counts) are asserted only by tests that hold it exclusively; every test that opens sock
//! protection domains or readers holds it shared (`TEST_LOCK.read()`).

use parking_lot::RwLock;

/// Sock tests share `live_threads()`: the leak test takes this exclusively. Tests elsewhere
/// in the crate that open sock PDs should hold it shared (`TEST_LOCK.read()`).
pub(crate) static TEST_LOCK: RwLock<()> = RwLock::new(());
