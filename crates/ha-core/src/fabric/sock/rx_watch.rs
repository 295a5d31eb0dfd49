//! How a thread reading a `sock` queue pair's inbound stream (its responder, or a lane's)
//! treats time: a request stalled mid-way is waited for while the link lives.

use super::liveness::{LinkWatch, Liveness};
use super::mr::MrEntry;
use super::qp_state::QpShared;
use super::reader::{Abort, Watch};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The responder's view of time: a request stalled in the middle is waited for as long as the
/// link is alive (a stopped peer resumes where it stopped), except on a dead link, and for at
/// most the retry window while its target region is being deregistered (so `dereg_mr` waits for
/// a placement in progress, but not for a peer that stopped in the middle of one).
pub(super) struct RxWatch<'a> {
    pub(super) qp: &'a QpShared,
    pub(super) link: &'a mut LinkWatch,
    pub(super) fd: RawFd,
    /// The region being written into, if any.
    pub(super) region: Option<&'a MrEntry>,
}

impl Watch for RxWatch<'_> {
    fn idle(&mut self, idle: Duration, mid_frame: bool) -> Result<(), Abort> {
        if self.qp.dead() {
            return Err(Abort::Stop);
        }
        let live = self.link.check(self.fd, Instant::now());
        if !mid_frame {
            return Ok(());
        }
        if idle > self.qp.pd.tun.retry_timeout {
            if self.region.is_some_and(|m| m.dying()) {
                return Err(Abort::Expired);
            }
            if let Liveness::Dead(why) = live {
                tracing::info!("sock: qp {}: inbound link dead: {why}", self.qp.qpn);
                return Err(Abort::Expired);
            }
        }
        Ok(())
    }
    fn alive(&self) -> bool {
        !self.qp.dead()
    }
    fn quiet(&self) -> bool {
        // Between frames nothing is stalled: the timer only samples the link.
        self.region.is_none()
    }
}
