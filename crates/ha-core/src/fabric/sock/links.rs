//! The retry judge's view of a `sock` queue pair's outbound streams: one [`LinkWatch`] for
//! the main stream and one per lane (striped bytes may wait on a lane while the main stream has
//! nothing in flight).

use super::liveness::{LinkWatch, Liveness};
use super::qp_state::QpShared;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// One [`LinkWatch`] per lane stream of one direction of a queue pair.
pub(super) struct LaneLinks {
    window: Duration,
    outbound: bool,
    watches: Vec<LinkWatch>,
}

impl LaneLinks {
    pub(super) fn new(window: Duration, outbound: bool) -> LaneLinks {
        LaneLinks {
            window,
            outbound,
            watches: Vec::new(),
        }
    }

    /// The first of those lanes that is dead below the peer's threads, if any. The lanes'
    /// streams stay open until the queue pair's threads (the caller's) have been joined.
    pub(super) fn check(&mut self, qp: &QpShared, now: Instant) -> Liveness {
        let ctl = qp.ctl.lock();
        for (k, s) in ctl.lanes(self.outbound).enumerate() {
            if self.watches.len() <= k {
                self.watches.push(LinkWatch::new(self.window));
            }
            if let Liveness::Dead(why) = self.watches[k].check(s.as_raw_fd(), now) {
                return Liveness::Dead(format!("lane {}: {why}", k + 1));
            }
        }
        Liveness::Alive
    }
}

/// The judge's watches: the main outbound stream's and its lanes'.
pub(super) struct Links {
    main: LinkWatch,
    lanes: LaneLinks,
}

impl Links {
    pub(super) fn new(window: Duration) -> Links {
        Links {
            main: LinkWatch::new(window),
            lanes: LaneLinks::new(window, true),
        }
    }

    /// The main stream's verdict, or the first lane's that is dead (striped bytes may wait on
    /// a lane while the main stream has nothing in flight).
    pub(super) fn check(&mut self, qp: &QpShared, fd: RawFd, now: Instant) -> Liveness {
        match self.main.check(fd, now) {
            Liveness::Alive => self.lanes.check(qp, now),
            dead => dead,
        }
    }
}
