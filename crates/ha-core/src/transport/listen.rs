//! Listener and acceptor driver: accepts OOB connections, runs each handshake (several may
//! be in progress), and creates queue pairs only for peers that presented our token. A peer
//! that sends garbage, a wrong token, or stalls past the timeout is dropped; the listener
//! stays usable. Only when every `accept` has run out of descriptors for longer than the
//! handshake timeout does it return an error (NCCL would otherwise call in forever).

use super::error::{Error, Result};
use super::ha::HaCfg;
use super::link::Role;
use super::oob_io::{read_some, write_some};
use super::recv::RecvComm;
use super::setup::Half;
use crate::engine::Engine;
use crate::fabric::fd_limit::{self, WarnLimiter};
use crate::fabric::oob::{OobListener, OobStream};
use ha_proto::handle::{ConnectHandle, HANDLE_SIZE};
use ha_proto::handshake::{Acceptor, Params};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes in progress beyond this are refused (oldest dropped first).
const MAX_PENDING: usize = 64;

pub struct ListenComm {
    engine: Arc<Engine>,
    dev: usize,
    listener: OobListener,
    token: u64,
    pending: Vec<PendingAccept>,
    cfg: HaCfg,
    stats_file: String,
    /// Handshakes dropped (bad token, garbage, timeout): for tests and stats.
    pub rejected: u64,
    accept_failing: AcceptFailing,
}

/// A listener's failing `accept`s: warnings of errors other than exhaustion (NCCL calls in a
/// loop: at most one per [`fd_limit::WARN_EVERY`]), and since when every `accept` has run out
/// of descriptors.
#[derive(Default)]
struct AcceptFailing {
    others: WarnLimiter,
    exhausted_since: Option<Instant>,
}

impl AcceptFailing {
    /// An `accept` failed at `now` with `exhausted` (out of descriptors) or not: `true` when
    /// it has failed so for longer than `limit`, and the listener should give up (the
    /// connection waits in the kernel's queue until a descriptor frees: NCCL would call in
    /// forever).
    fn failed(&mut self, exhausted: bool, now: Instant, limit: Duration) -> bool {
        if !exhausted {
            self.exhausted_since = None;
            return false;
        }
        let since = *self.exhausted_since.get_or_insert(now);
        now.saturating_duration_since(since) > limit
    }

    /// An `accept` succeeded.
    fn ok(&mut self) {
        self.exhausted_since = None;
    }
}

struct PendingAccept {
    stream: OobStream,
    hs: Acceptor,
    peer: String,
    deadline: Instant,
    half: Option<(Half, Params)>,
}

impl ListenComm {
    /// Listen on `ip` for connections to device `dev`; fills NCCL's handle.
    pub fn new(
        engine: &Arc<Engine>,
        dev: usize,
        ip: IpAddr,
        cfg: &HaCfg,
        stats_file: &str,
        handle: &mut [u8; HANDLE_SIZE],
    ) -> Result<ListenComm> {
        let listener =
            OobListener::bind(ip).map_err(|e| Error::io(format!("listening on {ip}"), e))?;
        let token = random_token();
        ConnectHandle {
            flags: 0,
            token,
            addr: listener.local_addr(),
        }
        .encode(handle);
        Ok(ListenComm {
            engine: engine.clone(),
            dev,
            listener,
            token,
            pending: Vec::new(),
            cfg: cfg.clone(),
            stats_file: stats_file.to_string(),
            rejected: 0,
            accept_failing: AcceptFailing::default(),
        })
    }

    /// One non-blocking step: a receive connection once a handshake completes.
    pub fn accept(&mut self) -> Result<Option<RecvComm>> {
        loop {
            match self.listener.try_accept() {
                Ok(Some(stream)) => {
                    self.accept_failing.ok();
                    let peer = stream
                        .peer_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_else(|_| "?".into());
                    if self.pending.len() >= MAX_PENDING {
                        self.pending.remove(0);
                        self.rejected += 1;
                    }
                    self.pending.push(PendingAccept {
                        stream,
                        hs: Acceptor::new(self.token),
                        peer,
                        deadline: Instant::now() + self.cfg.handshake_timeout,
                        half: None,
                    });
                }
                Ok(None) => {
                    // accept allocates a descriptor before it looks at the queue: nothing to
                    // accept means descriptors were there.
                    self.accept_failing.ok();
                    break;
                }
                Err(e) => {
                    let now = Instant::now();
                    let exhausted = fd_limit::is_exhausted(&e);
                    let dev = self.dev;
                    let what = move || format!("accepting a connection on device {dev}'s listener");
                    if self
                        .accept_failing
                        .failed(exhausted, now, self.cfg.handshake_timeout)
                    {
                        return Err(Error::io(
                            format!(
                                "{}: failing for longer than HA_NCCL_HANDSHAKE_TIMEOUT_MS",
                                what()
                            ),
                            e,
                        ));
                    }
                    if exhausted {
                        fd_limit::warn_exhausted(what, &e);
                    } else if self.accept_failing.others.due(now).is_some() {
                        tracing::warn!("NET/HA : {}: {e}", what());
                    }
                    break;
                }
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.step(i) {
                Ok(true) => {
                    let p = self.pending.swap_remove(i);
                    return Ok(Some(self.finish(p)));
                }
                Ok(false) => i += 1,
                Err(e) => {
                    let p = self.pending.swap_remove(i);
                    self.rejected += 1;
                    tracing::warn!("NET/HA dropping connection attempt from {}: {e}", p.peer);
                }
            }
        }
        Ok(None)
    }

    fn step(&mut self, i: usize) -> Result<bool> {
        let (engine, dev, cfg) = (self.engine.clone(), self.dev, self.cfg.clone());
        let p = &mut self.pending[i];
        let n = write_some(&mut p.stream, p.hs.transmit(), &p.peer)?;
        p.hs.advance_tx(n);
        let data = read_some(&mut p.stream, &p.peer)?;
        let got = p.hs.receive(&data).map_err(|source| Error::Handshake {
            peer: p.peer.clone(),
            source,
        })?;
        if let Some(peer) = got {
            // Only a peer that presented our token gets queue pairs.
            let mut half = Half::open(&engine, dev, Role::Recv, &cfg, Some(&peer))?;
            half.connect(&peer, &p.peer)?;
            let local = half.params();
            p.half = Some((half, peer));
            p.hs.local_accept(&local);
            let n = write_some(&mut p.stream, p.hs.transmit(), &p.peer)?;
            p.hs.advance_tx(n);
            // Ready may already be here.
            p.hs.receive(&[]).map_err(|source| Error::Handshake {
                peer: p.peer.clone(),
                source,
            })?;
        }
        if p.hs.is_done() {
            return Ok(true);
        }
        if Instant::now() > p.deadline {
            return Err(Error::Timeout(p.peer.clone()));
        }
        Ok(false)
    }

    fn finish(&self, p: PendingAccept) -> RecvComm {
        let (half, peer) = p.half.expect("handshake done");
        let eager = half.eager;
        RecvComm::new(half.into_link(&peer, &self.cfg, &self.stats_file), eager)
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// 64 random bits from the standard library's per-process random hasher keys.
fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::AcceptFailing;
    use crate::fabric::fd_limit::WARN_EVERY;
    use std::time::{Duration, Instant};

    #[test]
    fn a_listener_out_of_descriptors_gives_up_after_the_limit_and_warns_sparingly() {
        let mut f = AcceptFailing::default();
        let t0 = Instant::now();
        let limit = Duration::from_secs(3);
        let at = |ms| t0 + Duration::from_millis(ms);
        // Exhausted from t0: keeps trying up to the limit, gives up past it.
        assert!(!f.failed(true, at(0), limit));
        assert!(!f.failed(true, at(3000), limit));
        assert!(f.failed(true, at(3001), limit));
        // An accept that succeeds, or another error, starts the count again.
        f.ok();
        assert!(!f.failed(true, at(5000), limit));
        assert!(!f.failed(false, at(9000), limit));
        assert!(!f.failed(true, at(9001), limit));
        assert!(f.failed(true, at(12002), limit));
        // Other errors: one warning per period.
        assert!(f.others.due(at(0)).is_some());
        assert!(f.others.due(at(100)).is_none());
        assert!(f.others.due(t0 + WARN_EVERY).is_some());
    }
}
