//! Who reads a `sock` stream's bytes when they arrive: the stream pump of one protection
//! domain. Every queue pair's inbound stream (requests) and outbound stream (their replies)
//! is registered edge-triggered in the domain's epoll set. Whoever polls a completion queue of
//! the domain (NCCL's thread in `test()`, the engine's progress thread) first takes the ready
//! streams off that set and runs their *fast lane* itself: whole small frames already in the
//! socket are placed, acknowledged and completed without blocking and without waking any
//! thread. While nobody polls, the domain's listener thread waits on the set instead and runs
//! the fast lanes (one wake-up per burst, as a blocked reader had). A frame the fast lane cannot
//! finish without blocking (a large payload, a READ, a WRITE_WITH_IMM with no receive posted,
//! a stream that ended) goes to the stream's own thread, which handles it exactly as before.
//!
//! So a small message costs no hand-off while the consumer polls, and at most one otherwise;
//! large transfers keep their blocking reads straight into target memory.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// A consumer that polled within this long is polling: the listener leaves the set to it.
pub const POLLED_RECENTLY: Duration = Duration::from_millis(2);

/// A stream's reader as the pump sees it.
pub trait Lane: Send + Sync {
    /// The stream has new bytes: process what can be processed without blocking.
    fn on_ready(&self);
}

/// Nanoseconds since the first use (a clock the atomics can hold).
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The epoll set of one protection domain and the lanes it holds.
pub struct Pump {
    ep: OwnedFd,
    lanes: RwLock<HashMap<u64, Weak<dyn Lane>>>,
    next: AtomicU64,
    /// When a consumer last polled ([`now_ns`]; 0: never).
    last_poll: AtomicU64,
    /// Serialises registration changes against [`Pump::retire`] callers.
    ctl: Mutex<()>,
}

/// What [`Pump::register`] returns: removes the stream from the set when dropped.
pub struct Registration {
    pump: Arc<Pump>,
    token: u64,
    fd: RawFd,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.pump.remove(self.token, self.fd);
    }
}

impl Pump {
    pub fn new() -> std::io::Result<Arc<Pump>> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let ep = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Arc::new(Pump {
            ep,
            lanes: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
            last_poll: AtomicU64::new(0),
            ctl: Mutex::new(()),
        }))
    }

    /// The set's descriptor (readable while a registered stream has unclaimed events).
    pub fn fd(&self) -> RawFd {
        self.ep.as_raw_fd()
    }

    /// Watch stream `fd` for `lane` until the registration is dropped. The stream must stay
    /// open until then.
    pub fn register(
        self: &Arc<Pump>,
        fd: RawFd,
        lane: Weak<dyn Lane>,
    ) -> std::io::Result<Registration> {
        let _g = self.ctl.lock();
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.lanes.write().insert(token, lane);
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token,
        };
        // SAFETY: `ev` is a valid epoll_event for the call; `fd` is open (caller's contract).
        let r = unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            self.lanes.write().remove(&token);
            return Err(e);
        }
        Ok(Registration {
            pump: self.clone(),
            token,
            fd,
        })
    }

    fn remove(&self, token: u64, fd: RawFd) {
        let _g = self.ctl.lock();
        // SAFETY: EPOLL_CTL_DEL ignores the event pointer; `fd` is still open (the
        // registration is dropped before its stream).
        unsafe {
            libc::epoll_ctl(
                self.ep.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
        self.lanes.write().remove(&token);
    }

    /// A consumer polls: note it, then run the fast lane of every stream with new bytes.
    pub fn poll(&self) {
        self.last_poll.store(now_ns().max(1), Ordering::Relaxed);
        self.run(0);
    }

    /// Whether a consumer polled within [`POLLED_RECENTLY`].
    pub fn polled_recently(&self) -> bool {
        let t = self.last_poll.load(Ordering::Relaxed);
        t != 0 && now_ns().saturating_sub(t) < POLLED_RECENTLY.as_nanos() as u64
    }

    /// Take the ready streams off the set (waiting at most `ms`) and run their fast lanes;
    /// returns how many were ready.
    pub fn run(&self, ms: libc::c_int) -> usize {
        const BATCH: usize = 32;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        let mut total = 0;
        loop {
            // SAFETY: `evs` holds BATCH events; the kernel writes at most that many.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.as_raw_fd(),
                    evs.as_mut_ptr(),
                    BATCH as libc::c_int,
                    if total == 0 { ms } else { 0 },
                )
            };
            if n <= 0 {
                return total;
            }
            let n = n as usize;
            total += n;
            for ev in &evs[..n] {
                let token = ev.u64;
                let lane = self.lanes.read().get(&token).and_then(Weak::upgrade);
                if let Some(l) = lane {
                    l.on_ready();
                }
            }
            if n < BATCH {
                return total;
            }
        }
    }
}

/// The hand-off between a stream's fast lane (run by whoever polls) and the stream's own
/// thread (for what would block): a flag the thread waits on, and the readiness flag that
/// closes the race between a lane that finds the state busy and the holder releasing it.
#[derive(Default)]
pub struct Handoff {
    /// New bytes arrived that nobody processed yet.
    ready: std::sync::atomic::AtomicBool,
    /// The thread has work (set by the fast lane).
    need: Mutex<bool>,
    cv: parking_lot::Condvar,
}

/// What a fast lane came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pumped {
    /// Everything readable was processed.
    Idle,
    /// The next step may block: the stream's thread takes over.
    Thread,
}

impl Handoff {
    /// Run `lane` (the fast lane under the stream state's lock, taken with `try_lock`) for
    /// new bytes; hand over to the thread when it says so.
    pub fn on_ready<S>(&self, state: &Mutex<S>, mut lane: impl FnMut(&mut S) -> Pumped) {
        self.ready.store(true, Ordering::SeqCst);
        loop {
            let Some(mut g) = state.try_lock() else {
                // The holder checks `ready` after it lets go.
                return;
            };
            if !self.ready.swap(false, Ordering::SeqCst) {
                return;
            }
            let r = lane(&mut g);
            drop(g);
            if r == Pumped::Thread {
                self.call_thread();
                return;
            }
            if !self.ready.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Whether bytes arrived that nobody processed (the thread checks after letting go).
    pub fn pending(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Wake the stream's thread for work that may block.
    pub fn call_thread(&self) {
        let mut need = self.need.lock();
        *need = true;
        self.cv.notify_one();
    }

    /// The thread waits for work at most `tick`; true when it has work, false on the tick.
    pub fn wait(&self, tick: Duration) -> bool {
        let mut need = self.need.lock();
        if !*need {
            self.cv.wait_for(&mut need, tick);
        }
        std::mem::replace(&mut *need, false)
    }
}

/// Make `fd` readable-ready for the listener's `poll`: its entry for the pump's set, unless a
/// consumer polls (then the listener must not compete for the events).
pub fn listener_entry(p: &Pump) -> Option<libc::pollfd> {
    (!p.polled_recently()).then(|| libc::pollfd {
        fd: p.fd(),
        events: libc::POLLIN,
        revents: 0,
    })
}
