//! Connector driver: opens the send side's path and runs the handshake over OOB TCP, one
//! non-blocking step per NCCL `connect` call.

use super::error::{Error, Result};
use super::oob_io::{read_some, write_some};
use super::path::Path;
use super::send::SendComm;
use crate::engine::Engine;
use crate::fabric::oob::OobStream;
use crate::fabric::{Access, MemoryRegion};
use crate::transport::data::layout::{
    SharedWords, CTS_SLOT_WORDS, FIFO_DEPTH, RECORD_BYTES, RECORD_WORDS,
};
use crate::transport::data::send::SendSide;
use crate::transport::handle::ConnectHandle;
use crate::transport::handshake::{Connector, Params, RemoteBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct PendingConnect {
    path: Path,
    fifo_mr: Box<dyn MemoryRegion>,
    stage_mr: Box<dyn MemoryRegion>,
    fifo: SharedWords,
    stage: SharedWords,
    stream: OobStream,
    hs: Connector,
    peer: String,
    peer_records: Option<RemoteBuf>,
    deadline: Instant,
    max_poll: usize,
    keepalive: Duration,
    _hold: crate::engine::Lease,
}

impl PendingConnect {
    pub fn start(
        engine: &Arc<Engine>,
        dev: usize,
        handle: &ConnectHandle,
        max_poll: usize,
        timeout: Duration,
        keepalive: Duration,
    ) -> Result<PendingConnect> {
        let path = Path::open(engine.lease(dev)?)?;
        let hold = path.lease.clone_lease();
        let fifo = SharedWords::new(FIFO_DEPTH * CTS_SLOT_WORDS);
        let stage = SharedWords::new(FIFO_DEPTH * RECORD_WORDS);
        let fifo_mr = path.register(&fifo, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let stage_mr = path.register(&stage, Access::LOCAL_WRITE)?;
        let local = Params {
            flags: 0,
            paths: vec![path.qp.local_endpoint()],
            buf: RemoteBuf {
                addr: fifo.addr() as u64,
                rkey: fifo_mr.keys().rkey,
                len: fifo.len_bytes() as u32,
            },
        };
        let peer = handle.addr.to_string();
        let stream = OobStream::connect(handle.addr)
            .map_err(|e| Error::io(format!("connecting to {peer}"), e))?;
        Ok(PendingConnect {
            path,
            fifo_mr,
            stage_mr,
            fifo,
            stage,
            stream,
            hs: Connector::new(handle.token, &local),
            peer,
            peer_records: None,
            deadline: Instant::now() + timeout,
            max_poll,
            keepalive,
            _hold: hold,
        })
    }

    /// One non-blocking step; `Ok(true)` once the connection is ready.
    pub fn step(&mut self) -> Result<bool> {
        let connected = self
            .stream
            .poll_connected()
            .map_err(|e| Error::io(format!("connecting to {}", self.peer), e))?;
        if !connected {
            return self.check_deadline();
        }
        let n = write_some(&mut self.stream, self.hs.transmit(), &self.peer)?;
        self.hs.advance_tx(n);
        if self.peer_records.is_none() {
            let data = read_some(&mut self.stream, &self.peer)?;
            let got = self.hs.receive(&data).map_err(|source| Error::Handshake {
                peer: self.peer.clone(),
                source,
            })?;
            if let Some(p) = got {
                if (p.buf.len as usize) < FIFO_DEPTH * RECORD_BYTES {
                    return Err(Error::Usage(format!(
                        "peer {} offered a completion-record area of {} bytes",
                        self.peer, p.buf.len
                    )));
                }
                self.path.qp.to_rtr(&p.paths[0])?;
                self.path.qp.to_rts()?;
                self.peer_records = Some(p.buf);
                self.hs.local_ready();
                let n = write_some(&mut self.stream, self.hs.transmit(), &self.peer)?;
                self.hs.advance_tx(n);
            }
        }
        if self.hs.is_done() {
            return Ok(true);
        }
        self.check_deadline()
    }

    fn check_deadline(&self) -> Result<bool> {
        if Instant::now() > self.deadline {
            return Err(Error::Timeout(self.peer.clone()));
        }
        Ok(false)
    }

    /// The established connection (call once `step` returned true).
    pub fn finish(self) -> SendComm {
        SendComm {
            path: self.path,
            _fifo_mr: self.fifo_mr,
            stage_mr: self.stage_mr,
            fifo: self.fifo,
            stage: self.stage,
            peer_records: self.peer_records.expect("handshake done"),
            machine: SendSide::new(),
            max_poll: self.max_poll,
            keepalive: super::path::Keepalive::new(self.keepalive),
            _hold: self._hold,
        }
    }
}
