//! How a `sock` queue pair's ack reader treats time: the retry timer, the link's liveness
//! below the peer's threads (`TCP_INFO`, judged by [`Links`]), and when it may wait with its
//! long tick (nothing posted awaits an answer; a post kicks it awake).

use super::links::Links;
use super::liveness::Liveness;
use super::mr::MrEntry;
use super::net;
use super::qp_state::{QpShared, LINK_ALIVE, LINK_DEAD};
use super::reader::{Abort, Watch};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The ack reader's view of time: the retry timer, and the link's liveness below the peer's
/// threads.
pub(super) struct AckWatch<'a> {
    pub(super) qp: &'a QpShared,
    pub(super) link: &'a mut Links,
    pub(super) fd: RawFd,
    /// The local region a READ response is being placed into, if any.
    pub(super) region: Option<&'a MrEntry>,
}

impl Watch for AckWatch<'_> {
    fn idle(&mut self, idle: Duration, _mid_frame: bool) -> Result<(), Abort> {
        if self.qp.dead() {
            return Err(Abort::Stop);
        }
        if self.region.is_some_and(|m| m.dying()) && idle > self.qp.pd.tun.retry_timeout {
            // A READ response stalled a retry window while its target is being deregistered:
            // let go of it.
            return Err(Abort::Expired);
        }
        // Sampled on every tick, so the judge knows how long TCP has been waiting.
        let live = self.link.check(self.qp, self.fd, Instant::now());
        let word = match live {
            Liveness::Alive => LINK_ALIVE,
            Liveness::Dead(_) => LINK_DEAD,
        };
        self.qp.link.store(word, Ordering::SeqCst);
        // Any byte from the responder (say, inside a large READ response segment) counts
        // as a sign of life, like the frames that set `last_progress`.
        let retry = self.qp.pd.tun.retry_timeout;
        let sq = self.qp.sq.lock();
        if idle > retry && sq.awaits_ack() && sq.last_progress.elapsed() > retry {
            // No ACK from the peer's responder for the retry window. RC retries count the
            // peer's NIC, not its threads: while the peer's kernel still answers TCP (a stopped
            // or slow process), keep waiting; only a link that stopped answering fails.
            if let Liveness::Dead(why) = live {
                tracing::info!("sock: qp {}: link dead: {why}", self.qp.qpn);
                return Err(Abort::Expired);
            }
        }
        Ok(())
    }
    fn alive(&self) -> bool {
        !self.qp.dead()
    }
    fn quiet(&self) -> bool {
        // The retry timer matters only while a WR awaits its ACK or READ response.
        self.region.is_none() && self.qp.ack_quiet()
    }
    fn arm_long(&mut self) -> Option<Option<RawFd>> {
        if self.region.is_some() {
            return None;
        }
        let kick = self
            .qp
            .ack_kick
            .get_or_init(|| net::KickFd::new().ok())
            .as_ref()?
            .raw();
        // Raised before the check: a post after the check finds it raised and kicks.
        self.qp.ack_long.store(true, Ordering::SeqCst);
        if self.qp.ack_quiet() {
            return Some(Some(kick));
        }
        self.qp.ack_long.store(false, Ordering::SeqCst);
        None
    }
    fn disarm_long(&mut self) {
        self.qp.ack_long.store(false, Ordering::SeqCst);
    }
}
