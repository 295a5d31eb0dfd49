//! Opening a `sock` queue pair's outbound streams: connect to the peer's listener from the
//! rail's address and send the hello naming the target queue pair (and lane), retrying within
//! the retry window.

use super::hello::Hello;
use super::net;
use super::qp_state::QpShared;
use crate::fabric::counters::{self, Counted};
use crate::fabric::fd_limit;
use crate::fabric::WcStatus;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Why [`connect_stream`] has no stream.
pub(super) enum NoStream {
    /// The retry window passed, or the queue pair died.
    Failed,
    /// This process ran out of descriptors (warned): its trouble, not the link's.
    OutOfDescriptors,
}

/// Connect the main stream; a failure fails the queue pair: as local when this process ran
/// out of descriptors (no RetryExcErr blaming the peer), else as the link's.
pub(super) fn connect(qp: &QpShared) -> Option<Counted<TcpStream>> {
    if qp.ctl.lock().remote.is_none() {
        qp.fail(Some(WcStatus::LocQpOpErr));
        return None;
    }
    match connect_stream(qp, 0) {
        Ok(s) => Some(s),
        Err(NoStream::OutOfDescriptors) => {
            qp.fail(Some(WcStatus::LocQpOpErr));
            None
        }
        Err(NoStream::Failed) => {
            if !qp.dead() {
                qp.link_failed();
            }
            None
        }
    }
}

/// Connect stream `lane` (0: the main one) to the peer's listener and send its hello,
/// retrying until `retry_timeout` (not when out of descriptors).
pub(super) fn connect_stream(qp: &QpShared, lane: u8) -> Result<Counted<TcpStream>, NoStream> {
    let remote = qp.ctl.lock().remote.ok_or(NoStream::Failed)?;
    let tun = qp.pd.tun;
    let deadline = Instant::now() + tun.retry_timeout;
    let dst = SocketAddr::new(remote.ip, remote.port);
    let hello = Hello {
        target_qpn: remote.qpn,
        source_qpn: qp.qpn,
        target_nonce: remote.nonce,
        lane,
    }
    .encode();
    let mut backoff = Duration::from_millis(2);
    loop {
        if qp.dead() {
            return Err(NoStream::Failed);
        }
        // Each attempt gets a third of the window (at least 100 ms): a SYN lost while the rail
        // was still coming back is retransmitted by the kernel only after a second, so a
        // fresh attempt finds the rail sooner than waiting out the first.
        let step = (tun.retry_timeout / 3).max(Duration::from_millis(100));
        let attempt_deadline = (Instant::now() + step).min(deadline);
        let attempt = net::connect_from(qp.pd.ip, dst, attempt_deadline, &|| qp.dead())
            .map(counters::socket)
            .and_then(|mut s| {
                qp.tune(&s, tun.ack_tick())?;
                s.write_all(&hello)?;
                Ok(s)
            });
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) => {
                if qp.dead() {
                    return Err(NoStream::Failed);
                }
                if fd_limit::is_exhausted(&e) {
                    fd_limit::warn_exhausted(
                        || format!("sock: qp {} connecting stream {lane} to {dst}", qp.qpn),
                        &e,
                    );
                    return Err(NoStream::OutOfDescriptors);
                }
                if Instant::now() >= deadline {
                    tracing::info!("sock: qp {} cannot connect to {dst}: {e}", qp.qpn);
                    return Err(NoStream::Failed);
                }
                let mut sq = qp.sq.lock();
                if !qp.dead() {
                    qp.sq_cv.wait_for(&mut sq, backoff);
                }
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
        }
    }
}
