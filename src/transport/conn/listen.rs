//! Listener and acceptor driver: accepts OOB connections, runs each handshake (several may
//! be in progress), and creates queue pairs only for peers that presented our token. A peer
//! that sends garbage, a wrong token, or stalls past the timeout is dropped; the listener
//! stays usable.

use super::error::{Error, Result};
use super::oob_io::{read_some, write_some};
use super::path::Path;
use super::recv::RecvComm;
use crate::engine::{Engine, Lease};
use crate::fabric::oob::{OobListener, OobStream};
use crate::fabric::{Access, MemoryRegion};
use crate::transport::data::layout::{
    SharedWords, CTS_SLOT_BYTES, CTS_SLOT_WORDS, FIFO_DEPTH, RECORD_WORDS,
};
use crate::transport::data::recv::RecvSide;
use crate::transport::handle::{ConnectHandle, HANDLE_SIZE};
use crate::transport::handshake::{Acceptor, Params, RemoteBuf};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Handshakes in progress beyond this are refused (oldest dropped first).
const MAX_PENDING: usize = 64;

pub struct ListenComm {
    lease: Lease,
    listener: OobListener,
    token: u64,
    pending: Vec<PendingAccept>,
    max_poll: usize,
    timeout: Duration,
    keepalive: Duration,
    /// Handshakes dropped (bad token, garbage, timeout): for tests and stats.
    pub rejected: u64,
}

/// The receive side's resources, created once a valid Hello arrived.
struct Parts {
    path: Path,
    records_mr: Box<dyn MemoryRegion>,
    cts_mr: Box<dyn MemoryRegion>,
    records: SharedWords,
    cts_stage: SharedWords,
    peer_fifo: RemoteBuf,
    hold: Lease,
}

struct PendingAccept {
    stream: OobStream,
    hs: Acceptor,
    peer: String,
    deadline: Instant,
    parts: Option<Parts>,
}

impl ListenComm {
    /// Listen on `ip` for connections to device `dev`; fills NCCL's handle.
    pub fn new(
        engine: &Arc<Engine>,
        dev: usize,
        ip: IpAddr,
        max_poll: usize,
        timeout: Duration,
        keepalive: Duration,
        handle: &mut [u8; HANDLE_SIZE],
    ) -> Result<ListenComm> {
        let lease = engine.lease(dev)?;
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
            lease,
            listener,
            token,
            pending: Vec::new(),
            max_poll,
            timeout,
            keepalive,
            rejected: 0,
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
                        deadline: Instant::now() + self.timeout,
                        parts: None,
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("NET/HA accept on the OOB listener failed: {e}");
                    break;
                }
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            match self.step(i) {
                Ok(true) => {
                    let p = self.pending.swap_remove(i);
                    return Ok(Some(Self::finish(p, self.max_poll, self.keepalive)));
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
        let lease = &self.lease;
        let p = &mut self.pending[i];
        let n = write_some(&mut p.stream, p.hs.transmit(), &p.peer)?;
        p.hs.advance_tx(n);
        let data = read_some(&mut p.stream, &p.peer)?;
        let got = p.hs.receive(&data).map_err(|source| Error::Handshake {
            peer: p.peer.clone(),
            source,
        })?;
        if let Some(peer) = got {
            let parts = Self::open_parts(lease, &peer, &p.peer)?;
            let local = Params {
                flags: 0,
                paths: vec![parts.path.qp.local_endpoint()],
                buf: RemoteBuf {
                    addr: parts.records.addr() as u64,
                    rkey: parts.records_mr.keys().rkey,
                    len: parts.records.len_bytes() as u32,
                },
            };
            p.parts = Some(parts);
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

    fn open_parts(lease: &Lease, peer: &Params, who: &str) -> Result<Parts> {
        if (peer.buf.len as usize) < FIFO_DEPTH * CTS_SLOT_BYTES {
            return Err(Error::Usage(format!(
                "peer {who} offered a clear-to-send FIFO of {} bytes",
                peer.buf.len
            )));
        }
        let path = Path::open(lease.clone_lease())?;
        let hold = lease.clone_lease();
        let records = SharedWords::new(FIFO_DEPTH * RECORD_WORDS);
        let cts_stage = SharedWords::new(FIFO_DEPTH * CTS_SLOT_WORDS);
        let records_mr = path.register(&records, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let cts_mr = path.register(&cts_stage, Access::LOCAL_WRITE)?;
        path.qp.to_rtr(&peer.paths[0])?;
        path.qp.to_rts()?;
        Ok(Parts {
            path,
            records_mr,
            cts_mr,
            records,
            cts_stage,
            peer_fifo: peer.buf,
            hold,
        })
    }

    fn finish(p: PendingAccept, max_poll: usize, keepalive: Duration) -> RecvComm {
        let parts = p.parts.expect("handshake done");
        RecvComm {
            path: parts.path,
            _records_mr: parts.records_mr,
            cts_mr: parts.cts_mr,
            records: parts.records,
            cts_stage: parts.cts_stage,
            peer_fifo: parts.peer_fifo,
            machine: RecvSide::new(),
            max_poll,
            keepalive: super::path::Keepalive::new(keepalive),
            _hold: parts.hold,
        }
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
