//! Listener and acceptor driver: accepts OOB connections, runs each handshake (several may
//! be in progress), and creates queue pairs only for peers that presented our token. A peer
//! that sends garbage, a wrong token, or stalls past the timeout is dropped; the listener
//! stays usable.

use super::error::{Error, Result};
use super::ha::HaCfg;
use super::link::Role;
use super::oob_io::{read_some, write_some};
use super::recv::RecvComm;
use super::setup::Half;
use crate::engine::Engine;
use crate::fabric::fd_limit;
use crate::fabric::oob::{OobListener, OobStream};
use ha_proto::handle::{ConnectHandle, HANDLE_SIZE};
use ha_proto::handshake::{Acceptor, Params};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes in progress beyond this are refused (oldest dropped first).
const MAX_PENDING: usize = 64;

/// A listener whose `accept` keeps failing (out of descriptors: NCCL calls in a loop) warns at
/// most this often, counting the failures in between.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(5);

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
    accept_warnings: AcceptWarnings,
}

/// Failed `accept` calls not yet reported, and when the last warning went out.
#[derive(Default)]
struct AcceptWarnings {
    failures: u64,
    warned: Option<Instant>,
}

impl AcceptWarnings {
    /// Count a failed `accept` of device `dev`'s listener; the warning to log, at most one per
    /// [`ACCEPT_WARN_EVERY`]. Out of descriptors, it names the open-file limit: the connecting
    /// peer only sees its handshake time out.
    fn failed(&mut self, e: &std::io::Error, dev: usize, now: Instant) -> Option<String> {
        self.failures += 1;
        if self
            .warned
            .is_some_and(|t| now.saturating_duration_since(t) < ACCEPT_WARN_EVERY)
        {
            return None;
        }
        let n = std::mem::take(&mut self.failures);
        self.warned = Some(now);
        let why = if fd_limit::is_exhausted(e) {
            format!("{e} ({})", fd_limit::exhausted_note())
        } else {
            e.to_string()
        };
        Some(format!(
            "accept on the OOB listener of device {dev} failed ({n} time(s) since the last \
             warning; peers connecting meanwhile wait, then time out): {why}"
        ))
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
            accept_warnings: AcceptWarnings::default(),
        })
    }

    /// One non-blocking step: a receive connection once a handshake completes.
    pub fn accept(&mut self) -> Result<Option<RecvComm>> {
        loop {
            match self.listener.try_accept() {
                Ok(Some(stream)) => {
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
                Ok(None) => break,
                Err(e) => {
                    if let Some(w) = self.accept_warnings.failed(&e, self.dev, Instant::now()) {
                        tracing::warn!("NET/HA : {w}");
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
    use super::{AcceptWarnings, ACCEPT_WARN_EVERY};
    use std::io;
    use std::time::{Duration, Instant};

    #[test]
    fn a_failing_accept_warns_once_per_period_with_the_count_and_the_limit() {
        let mut w = AcceptWarnings::default();
        let t0 = Instant::now();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let first = w.failed(&emfile, 1, t0).expect("the first failure warns");
        assert!(first.contains("device 1 failed (1 time(s)"), "{first}");
        assert!(
            first.contains("out of file descriptors: open-file limit"),
            "{first}"
        );
        // NCCL calls accept in a loop: the next failures are only counted ...
        for k in 1..=9u64 {
            assert_eq!(
                w.failed(&emfile, 1, t0 + Duration::from_millis(k * 100)),
                None
            );
        }
        // ... until the period is over; the warning counts them, and the one now.
        let next = w
            .failed(&emfile, 1, t0 + ACCEPT_WARN_EVERY)
            .expect("a warning after the period");
        assert!(next.contains("(10 time(s)"), "{next}");
        // Another error kind carries no descriptor note.
        let other = w
            .failed(
                &io::Error::from_raw_os_error(libc::EINVAL),
                1,
                t0 + ACCEPT_WARN_EVERY * 2,
            )
            .expect("a warning after the period");
        assert!(
            other.contains("(1 time(s)") && !other.contains("file descriptors"),
            "{other}"
        );
    }
}
