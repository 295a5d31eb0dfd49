//! The retry judge's view of a `sock` queue pair's outbound streams: one [`LinkWatch`] for
//! the main stream and one per lane (striped bytes may wait on a lane while the main stream has
//! nothing in flight).

use super::liveness::{LinkWatch, Liveness};
use super::qp_state::QpShared;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// The judge's watches: the main outbound stream's and its lanes'.
pub(super) struct Links {
    main: LinkWatch,
    lanes: Vec<LinkWatch>,
}

impl Links {
    pub(super) fn new(window: Duration) -> Links {
        Links {
            main: LinkWatch::new(window),
            lanes: Vec::new(),
        }
    }

    /// The main stream's verdict, or the first lane's that is dead (striped bytes may wait on
    /// a lane while the main stream has nothing in flight).
    pub(super) fn check(&mut self, qp: &QpShared, fd: RawFd, now: Instant) -> Liveness {
        let live = self.main.check(fd, now);
        if live != Liveness::Alive {
            return live;
        }
        // The lanes' streams stay open until this thread has been joined.
        let ctl = qp.ctl.lock();
        let outs = ctl.lane_socks.iter().filter(|(_, out)| *out);
        for (k, (s, _)) in outs.enumerate() {
            if self.lanes.len() <= k {
                self.lanes.push(LinkWatch::new(self.main.window()));
            }
            if let Liveness::Dead(why) = self.lanes[k].check(s.as_raw_fd(), now) {
                return Liveness::Dead(format!("lane {}: {why}", k + 1));
            }
        }
        Liveness::Alive
    }
}
