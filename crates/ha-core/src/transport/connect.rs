//! Connector driver: opens the send side's paths and runs the handshake over OOB TCP, one
//! non-blocking step per NCCL `connect` call.

use super::error::{Error, Result};
use super::ha::HaCfg;
use super::link::Role;
use super::oob_io::{read_some, write_some};
use super::send::SendComm;
use super::setup::Half;
use crate::engine::Engine;
use crate::fabric::oob::OobStream;
use ha_proto::data::send::EagerCfg;
use ha_proto::handle::{flags, ConnectHandle};
use ha_proto::handshake::{Connector, Params};
use std::sync::Arc;
use std::time::Instant;

pub struct PendingConnect {
    half: Option<Half>,
    stream: OobStream,
    hs: Connector,
    peer: String,
    peer_params: Option<Params>,
    deadline: Instant,
    cfg: HaCfg,
    stats_file: String,
}

impl PendingConnect {
    pub fn start(
        engine: &Arc<Engine>,
        dev: usize,
        handle: &ConnectHandle,
        cfg: &HaCfg,
        stats_file: &str,
    ) -> Result<PendingConnect> {
        let half = Half::open(engine, dev, Role::Send, cfg, None)?;
        let peer = handle.addr.to_string();
        let stream = OobStream::connect(handle.addr)
            .map_err(|e| Error::io(format!("connecting to {peer}"), e))?;
        Ok(PendingConnect {
            hs: Connector::new(handle.token, &half.params()),
            half: Some(half),
            stream,
            peer,
            peer_params: None,
            deadline: Instant::now() + cfg.handshake_timeout,
            cfg: cfg.clone(),
            stats_file: stats_file.to_string(),
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
        if self.peer_params.is_none() {
            let data = read_some(&mut self.stream, &self.peer)?;
            let got = self.hs.receive(&data).map_err(|source| Error::Handshake {
                peer: self.peer.clone(),
                source,
            })?;
            if let Some(p) = got {
                self.half.as_mut().expect("half").connect(&p, &self.peer)?;
                self.peer_params = Some(p);
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
    pub fn finish(mut self) -> SendComm {
        let half = self.half.take().expect("half");
        let peer = self.peer_params.take().expect("handshake done");
        // The receiver offers an eager ring; this side's limit says how much goes there.
        let eager =
            (peer.flags & flags::EAGER != 0 && self.cfg.eager_bytes > 0).then_some(EagerCfg {
                region_addr: peer.addr,
                max: self.cfg.eager_bytes as u64,
            });
        SendComm::new(half.into_link(&peer, &self.cfg, &self.stats_file), eager)
    }
}
