//! The listener of a `sock` protection domain: one thread accepting streams on the rail's
//! port, reading each stream's hello and handing the stream to the queue pair it names.
//!
//! Strangers cannot stall it: accepted streams wait for their hello in a bounded pending set,
//! all read without blocking in one `poll` loop, each for at most [`HELLO_WAIT`]; a stream
//! whose first bytes are not a hello is closed at once, and only the hello's own bytes are ever
//! read (what follows belongs to the queue pair). When the set is full the stream that has
//! waited longest is closed: a real peer sends its hello together with its connect, so it
//! spends microseconds in the set, while silent strangers are the ones that linger.

use super::domain::PdShared;
use super::hello::{Hello, HELLO_LEN};
use super::net;
use super::{spawn, Tunables};
use crate::fabric::counters::{self, Counted, Held, Resource};
use crate::fabric::fd_limit;
use crate::fabric::{FabricError, Result};
use std::io::{self, Read};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an accepted stream may take to send its hello.
pub const HELLO_WAIT: Duration = Duration::from_secs(2);
/// A listener turn starting this much later than it meant to was not running in between.
const LATE_SLACK: Duration = Duration::from_millis(100);
/// Streams waiting for their hello, per listener, at most.
pub const MAX_PENDING: usize = 128;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Process-wide: accepted streams still waiting for their hello.
pub fn pending_hellos() -> usize {
    PENDING.load(Ordering::SeqCst)
}

/// Owns the listener thread; alive while the PD handle or any of its queue pairs is.
pub struct PdCore {
    pub shared: Arc<PdShared>,
    stop: Arc<AtomicBool>,
    listener: Counted<TcpListener>,
    thread: Option<JoinHandle<()>>,
    _held: Held,
}

impl Drop for PdCore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        net::shutdown(self.listener.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl PdCore {
    /// Listen on `ip:0` for device `dev` and start the listener thread.
    pub fn open(dev: usize, ip: IpAddr, tun: Tunables) -> Result<PdCore> {
        let listener = net::listen(ip)
            .map(counters::socket)
            .map_err(|e| FabricError::io(format!("sock: listen on {ip}"), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| FabricError::io("sock: listener address", e))?
            .port();
        let shared = Arc::new(PdShared::new(dev, ip, port, tun));
        let stop = Arc::new(AtomicBool::new(false));
        let l2 = listener
            .try_clone()
            .map(counters::socket)
            .map_err(|e| FabricError::io("sock: clone listener", e))?;
        l2.set_nonblocking(true)
            .map_err(|e| FabricError::io("sock: listener non-blocking", e))?;
        let (sh, st) = (shared.clone(), stop.clone());
        let thread = spawn(format!("sock-lsn-{}", shared.id), move || {
            listen_loop(l2, sh, st)
        })?;
        Ok(PdCore {
            shared,
            stop,
            listener,
            thread: Some(thread),
            _held: Held::new(Resource::Pd),
        })
    }
}

/// An accepted stream whose hello has not fully arrived.
struct Pending {
    s: Counted<TcpStream>,
    hello: [u8; HELLO_LEN],
    got: usize,
    deadline: Instant,
}

/// The pending set, counted in [`pending_hellos`].
#[derive(Default)]
struct PendingSet(Vec<Pending>);

impl PendingSet {
    fn push(&mut self, p: Pending) {
        if self.0.len() >= MAX_PENDING {
            // Full: the one waiting longest goes (the set is in arrival order).
            self.remove(0);
        }
        self.0.push(p);
        PENDING.fetch_add(1, Ordering::SeqCst);
    }
    fn remove(&mut self, i: usize) -> Pending {
        PENDING.fetch_sub(1, Ordering::SeqCst);
        self.0.remove(i)
    }

    /// The listener was not running for `late` (this process stopped, or starved of CPU):
    /// every wait is extended by that much — a timer that fires late because this process was
    /// not running is no stream's fault.
    fn postpone(&mut self, late: Duration) {
        if late.is_zero() {
            return;
        }
        for p in &mut self.0 {
            p.deadline += late;
        }
    }

    /// Streams whose wait ended at `now`: each gets one last read first (its hello may be
    /// sitting in the socket, unread because this thread was not running); those whose hello
    /// is complete are returned for hand-over, the others are closed.
    fn expire(&mut self, now: Instant) -> Vec<Pending> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.0.len() {
            if self.0[i].deadline > now {
                i += 1;
                continue;
            }
            let mut p = self.remove(i);
            if let HelloRead::Done = read_hello(&mut p) {
                done.push(p);
            }
        }
        done
    }
}

impl Drop for PendingSet {
    fn drop(&mut self) {
        PENDING.fetch_sub(self.0.len(), Ordering::SeqCst);
    }
}

/// What reading a pending stream came to.
enum HelloRead {
    /// More bytes of the hello are still to come.
    Waiting,
    /// The hello is complete.
    Done,
    /// Closed, failed, or not a hello: drop the stream.
    Drop,
}

fn read_hello(p: &mut Pending) -> HelloRead {
    loop {
        match p.s.read(&mut p.hello[p.got..]) {
            Ok(0) => return HelloRead::Drop,
            Ok(n) => {
                p.got += n;
                if p.got == HELLO_LEN {
                    return HelloRead::Done;
                }
                // The magic comes first: a stream that does not start with it is no peer.
                if !Hello::may_start(&p.hello[..p.got]) {
                    return HelloRead::Drop;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return HelloRead::Waiting,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return HelloRead::Drop,
        }
    }
}

fn listen_loop(l: Counted<TcpListener>, pd: Arc<PdShared>, stop: Arc<AtomicBool>) {
    let mut pending = PendingSet::default();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    // When the previous turn started and how long it meant to wait: a turn that starts much
    // later was not running (a stopped or starved process), which no stream is to blame for.
    let mut prev: Option<(Instant, Duration)> = None;
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if let Some((top, wait)) = prev {
            pending.postpone(now.saturating_duration_since(top + wait + LATE_SLACK));
        }
        for p in pending.expire(now) {
            hand_over(p, &pd);
        }
        fds.clear();
        fds.push(libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(pending.0.iter().map(|p| libc::pollfd {
            fd: p.s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        // Poll at most 200 ms, so a missed shutdown wake-up still ends the loop.
        let wait = pending
            .0
            .iter()
            .map(|p| p.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::MAX)
            .min(Duration::from_millis(200));
        let ms = wait.as_millis().clamp(1, 200) as libc::c_int;
        prev = Some((now, Duration::from_millis(ms as u64)));
        if net::poll_many(&mut fds, ms).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        // Pending streams with something to read (before new ones shift the indices).
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        let mut done = Vec::new();
        let mut i = 0;
        for r in ready {
            if r {
                match read_hello(&mut pending.0[i]) {
                    HelloRead::Waiting => {}
                    HelloRead::Done => {
                        done.push(pending.remove(i));
                        continue;
                    }
                    HelloRead::Drop => {
                        drop(pending.remove(i));
                        continue;
                    }
                }
            }
            i += 1;
        }
        for p in done {
            hand_over(p, &pd);
        }
        if fds[0].revents != 0 {
            accept_all(&l, &mut pending);
        }
    }
}

/// Accept every stream waiting in the backlog into the pending set.
fn accept_all(l: &TcpListener, pending: &mut PendingSet) {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                let s = counters::socket(s);
                if s.set_nonblocking(true).is_err() {
                    continue;
                }
                pending.push(Pending {
                    s,
                    hello: [0; HELLO_LEN],
                    got: 0,
                    deadline: Instant::now() + HELLO_WAIT,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if fd_limit::is_exhausted(&e) {
                    fd_limit::warn_exhausted(|| "sock: accepting a stream".into(), &e);
                } else {
                    tracing::debug!("sock: accept: {e}");
                }
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        }
    }
}

/// Give a stream whose hello arrived to the queue pair it names, or drop (close) it.
fn hand_over(p: Pending, pd: &PdShared) {
    let hello = match Hello::decode(&p.hello) {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!("sock: bad hello: {e}");
            return;
        }
    };
    if p.s.set_nonblocking(false).is_err() {
        return;
    }
    match pd.qp(hello.target_qpn) {
        Some(qp) => {
            if !qp.attach_inbound(p.s, &hello) {
                tracing::debug!("sock: stream for qp {} refused", hello.target_qpn);
            }
        }
        None => tracing::debug!("sock: stream for unknown qp {}", hello.target_qpn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A stream accepted on loopback whose client wrote `bytes`; the client end is returned
    /// too (kept open).
    fn accepted(bytes: &[u8], deadline: Instant) -> (Pending, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.write_all(bytes).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        // The bytes are in the server's socket before the listener looks (loopback).
        let mut peek = [0u8; 1];
        if !bytes.is_empty() {
            s.set_nonblocking(false).unwrap();
            s.peek(&mut peek).unwrap();
            s.set_nonblocking(true).unwrap();
        }
        let p = Pending {
            s: counters::socket(s),
            hello: [0; HELLO_LEN],
            got: 0,
            deadline,
        };
        (p, c)
    }

    /// #13 (a paused receiver lost a re-arm's stream): the listener accepted a stream, then
    /// the process was stopped past the stream's wait; on waking it closed the stream unread,
    /// although the whole hello had arrived meanwhile. A wait that ended is now given one last
    /// read: a complete hello is handed over, a silent stranger is still closed.
    #[test]
    fn an_ended_wait_reads_the_hello_that_arrived_before_closing() {
        let _l = crate::fabric::sock::tests::TEST_LOCK.read();
        let hello = Hello {
            target_qpn: 7,
            source_qpn: 9,
            target_nonce: 0x1234,
            lane: 0,
        }
        .encode();
        let past = Instant::now();
        let (real, _c1) = accepted(&hello, past);
        let (silent, _c2) = accepted(&[], past);
        let mut set = PendingSet::default();
        set.push(real);
        set.push(silent);
        let done = set.expire(past + Duration::from_millis(1));
        assert_eq!(
            done.len(),
            1,
            "the stream whose hello had arrived was closed unread"
        );
        assert_eq!(done[0].hello, hello);
        assert!(set.0.is_empty(), "the silent stream is still pending");
    }

    /// A listener that was not running (stopped process) extends every wait by the time it
    /// lost, so a stream is not closed for the listener's own absence.
    #[test]
    fn a_listener_that_was_not_running_extends_the_waits() {
        let _l = crate::fabric::sock::tests::TEST_LOCK.read();
        let t0 = Instant::now();
        let (silent, _c) = accepted(&[], t0 + HELLO_WAIT);
        let mut set = PendingSet::default();
        set.push(silent);
        set.postpone(Duration::from_secs(3));
        assert!(set
            .expire(t0 + HELLO_WAIT + Duration::from_secs(2))
            .is_empty());
        assert_eq!(set.0.len(), 1, "closed although its wait was extended");
        assert!(set
            .expire(t0 + HELLO_WAIT + Duration::from_secs(4))
            .is_empty());
        assert!(set.0.is_empty(), "kept past its extended wait");
    }
}
