//! Process-wide counters of live resources: protection domains, queue pairs, completion
//! queues, memory registrations, threads, sockets (file descriptors) and connections.
//!
//! Each resource holds a [`Held`] token from creation to destruction: making one increments
//! its kind's counter, dropping it decrements it. [`snapshot`] reads all counters; the stats
//! line of every closing connection carries them (`"resources":{...}`), and tests check that
//! they return to their starting values once everything is closed (a leak shows as a count
//! that never comes back).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A protection domain (an opened device).
    Pd,
    /// A queue pair.
    Qp,
    /// A completion queue.
    Cq,
    /// A memory registration on one device.
    Mr,
    /// A background thread of the plugin (counted while its body runs).
    Thread,
    /// A socket file descriptor (data streams, listeners, out-of-band handshake sockets).
    Socket,
    /// An established connection (a send or receive comm).
    Connection,
}

impl Resource {
    /// Every kind, in [`Resources`] field order.
    pub const ALL: [Resource; 7] = [
        Resource::Pd,
        Resource::Qp,
        Resource::Cq,
        Resource::Mr,
        Resource::Thread,
        Resource::Socket,
        Resource::Connection,
    ];

    /// The JSON key of this kind.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Pd => "pds",
            Resource::Qp => "qps",
            Resource::Cq => "cqs",
            Resource::Mr => "mrs",
            Resource::Thread => "threads",
            Resource::Socket => "sockets",
            Resource::Connection => "connections",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

static LIVE: [AtomicUsize; 7] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

/// One live resource of a kind: counted from [`Held::new`] until dropped.
#[derive(Debug)]
pub struct Held(Resource);

impl Held {
    pub fn new(r: Resource) -> Held {
        LIVE[r.index()].fetch_add(1, Ordering::SeqCst);
        Held(r)
    }

    pub fn resource(&self) -> Resource {
        self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        LIVE[self.0.index()].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Live resources of kind `r`, process-wide.
pub fn live(r: Resource) -> usize {
    LIVE[r.index()].load(Ordering::SeqCst)
}

/// All counters at one moment (each read atomically; not one atomic snapshot of all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub pds: usize,
    pub qps: usize,
    pub cqs: usize,
    pub mrs: usize,
    pub threads: usize,
    pub sockets: usize,
    pub connections: usize,
}

impl Resources {
    pub fn get(&self, r: Resource) -> usize {
        match r {
            Resource::Pd => self.pds,
            Resource::Qp => self.qps,
            Resource::Cq => self.cqs,
            Resource::Mr => self.mrs,
            Resource::Thread => self.threads,
            Resource::Socket => self.sockets,
            Resource::Connection => self.connections,
        }
    }

    /// `{"pds":1,"qps":4,...}`, keys in [`Resource::ALL`] order.
    pub fn to_json(&self) -> String {
        let fields: Vec<String> = Resource::ALL
            .iter()
            .map(|&r| format!("\"{}\":{}", r.name(), self.get(r)))
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

/// Read every counter.
pub fn snapshot() -> Resources {
    Resources {
        pds: live(Resource::Pd),
        qps: live(Resource::Qp),
        cqs: live(Resource::Cq),
        mrs: live(Resource::Mr),
        threads: live(Resource::Thread),
        sockets: live(Resource::Socket),
        connections: live(Resource::Connection),
    }
}

/// A value counted as one live resource for as long as it exists (e.g. a socket).
#[derive(Debug)]
pub struct Counted<T> {
    inner: T,
    _held: Held,
}

impl<T> Counted<T> {
    pub fn new(r: Resource, inner: T) -> Counted<T> {
        Counted {
            inner,
            _held: Held::new(r),
        }
    }
}

impl<T> Deref for Counted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for Counted<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// Count `s` as a live socket.
pub fn socket<T>(s: T) -> Counted<T> {
    Counted::new(Resource::Socket, s)
}

/// A counted duplicate of a stream's descriptor.
pub fn try_clone_stream(s: &std::net::TcpStream) -> std::io::Result<Counted<std::net::TcpStream>> {
    s.try_clone().map(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_counts_from_creation_to_drop() {
        // Other tests of this binary may open connections meanwhile: only a lower bound holds.
        let before = live(Resource::Connection);
        let a = Held::new(Resource::Connection);
        let b = Counted::new(Resource::Connection, 5u32);
        assert!(live(Resource::Connection) >= before + 2);
        assert_eq!(*b, 5);
        assert_eq!(a.resource(), Resource::Connection);
        drop((a, b));
        let r = Resources {
            pds: 1,
            qps: 2,
            cqs: 3,
            mrs: 4,
            threads: 5,
            sockets: 6,
            connections: 7,
        };
        assert_eq!(
            r.to_json(),
            "{\"pds\":1,\"qps\":2,\"cqs\":3,\"mrs\":4,\"threads\":5,\"sockets\":6,\"connections\":7}"
        );
        for k in Resource::ALL {
            assert_eq!(r.get(k), k.index() + 1, "{}", k.name());
        }
    }
}
