//! Building a connection's paths and memory, shared by the connector and the acceptor: the
//! primary on NCCL's device, the standby on another device (`ha::standby_for`), the side's
//! regions registered on both, and the parameters offered to the peer.

use super::error::{Error, Result};
use super::ha::{parse_standby_map, standby_for, HaCfg};
use super::link::{Link, LinkParts, Role};
use super::path::Path;
use super::region::Region;
use crate::engine::Engine;
use crate::fabric::Access;
use ha_proto::data::layout::{
    CTS_FIFO_WORDS, CTS_SLOT_WORDS, FIFO_DEPTH, MAILBOX_WORDS, RECORD_WORDS,
    RECV_REGION_EAGER_WORDS, RECV_REGION_WORDS, SEND_REGION_WORDS,
};
use ha_proto::handle::flags;
use ha_proto::handshake::{Params, PathParams};
use std::sync::Arc;

/// A side's paths and memory before the peer's parameters are known.
pub struct Half {
    pub role: Role,
    pub paths: Vec<Path>,
    pub region: Region,
    pub stage: Region,
    pub ctrl_stage: Region,
    /// Traffic class of the paths (offered to the peer in the handshake).
    pub traffic_class: Option<u8>,
    /// The receive side's region ends with an eager ring (offered in the handshake).
    pub eager: bool,
}

impl Half {
    /// Open the paths (primary on `dev`, standby if enabled and available) and register.
    /// On rail fabrics the acceptor follows the connector's rails (`peer`), so each path stays
    /// on one rail end to end. The acceptor adopts the connector's traffic class when it
    /// offers one, else uses `cfg`'s.
    pub fn open(
        engine: &Arc<Engine>,
        dev: usize,
        role: Role,
        cfg: &HaCfg,
        peer: Option<&Params>,
    ) -> Result<Half> {
        let devs = engine.fabric().devices();
        let mut chosen = vec![dev];
        if cfg.enable_backup {
            let map = parse_standby_map(&cfg.standby_map, devs.len()).map_err(Error::Usage)?;
            if let Some(s) = standby_for(dev, devs, &map) {
                chosen.push(s);
            }
        }
        if let Some(p) = peer.filter(|_| engine.fabric().rail_affine()) {
            let theirs: Vec<usize> = p.paths.iter().map(|x| x.dev as usize).collect();
            let distinct = theirs.first() != theirs.get(1);
            if theirs.iter().all(|&d| d < devs.len()) && distinct {
                chosen = theirs;
                chosen.truncate(if cfg.enable_backup { 2 } else { 1 });
            }
        }
        let traffic_class = peer
            .and_then(|p| flags::traffic_class(p.flags))
            .or(cfg.traffic_class);
        let mut paths = Vec::with_capacity(chosen.len());
        for d in chosen {
            paths.push(Path::open(engine.lease(d)?, traffic_class)?);
        }
        let eager = role == Role::Recv && cfg.eager_ring(engine.fabric().kind());
        let (region_words, stage_words) = match role {
            Role::Send => (SEND_REGION_WORDS, FIFO_DEPTH * RECORD_WORDS),
            Role::Recv if eager => (RECV_REGION_EAGER_WORDS, FIFO_DEPTH * CTS_SLOT_WORDS),
            Role::Recv => (RECV_REGION_WORDS, FIFO_DEPTH * CTS_SLOT_WORDS),
        };
        let mut region = Region::new(region_words);
        let mut stage = Region::new(stage_words);
        let mut ctrl_stage = Region::new(MAILBOX_WORDS);
        for (i, p) in paths.iter().enumerate() {
            let pd = &*p.device().pd;
            region.register(i, pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
            stage.register(i, pd, Access::LOCAL_WRITE)?;
            ctrl_stage.register(i, pd, Access::LOCAL_WRITE)?;
        }
        Ok(Half {
            role,
            paths,
            region,
            stage,
            ctrl_stage,
            traffic_class,
            eager,
        })
    }

    /// What this side offers the peer.
    pub fn params(&self) -> Params {
        Params {
            flags: flags::with_traffic_class(
                if self.paths.len() > 1 { flags::HA } else { 0 }
                    | if self.eager { flags::EAGER } else { 0 },
                self.traffic_class,
            ),
            paths: self
                .paths
                .iter()
                .enumerate()
                .map(|(i, p)| PathParams {
                    endpoint: p.qp.local_endpoint(),
                    rkey: self.region.keys(i).rkey,
                    dev: p.device().dev as u16,
                })
                .collect(),
            addr: self.region.addr() as u64,
            len: self.region.len_bytes() as u32,
        }
    }

    /// Keep as many paths as both sides have, and connect them to the peer's.
    pub fn connect(&mut self, peer: &Params, who: &str) -> Result<()> {
        let need = match self.role {
            Role::Send if peer.flags & flags::EAGER != 0 => RECV_REGION_EAGER_WORDS * 8,
            Role::Send => RECV_REGION_WORDS * 8,
            Role::Recv => SEND_REGION_WORDS * 8,
        };
        if (peer.len as usize) < need {
            return Err(Error::Usage(format!(
                "peer {who} offered a region of {} bytes ({need} needed)",
                peer.len
            )));
        }
        let n = self.paths.len().min(peer.paths.len());
        if n < self.paths.len() {
            tracing::info!("NET/HA : peer {who} has no standby path: one path per connection");
        }
        self.paths.truncate(n);
        for (p, pp) in self.paths.iter_mut().zip(&peer.paths) {
            p.connect(pp)?;
        }
        Ok(())
    }

    /// The established link.
    pub fn into_link(self, peer: &Params, cfg: &HaCfg, stats_file: &str) -> Link {
        let (mailbox_base, peer_mailbox_off) = match self.role {
            Role::Send => (CTS_FIFO_WORDS, (FIFO_DEPTH * RECORD_WORDS * 8) as u64),
            Role::Recv => (FIFO_DEPTH * RECORD_WORDS, (CTS_FIFO_WORDS * 8) as u64),
        };
        Link::new(LinkParts {
            paths: self.paths,
            region: self.region,
            stage: self.stage,
            ctrl_stage: self.ctrl_stage,
            mailbox_base,
            peer_addr: peer.addr,
            peer_mailbox_off,
            role: self.role,
            cfg: HaCfg {
                traffic_class: self.traffic_class,
                ..cfg.clone()
            },
            stats_file: stats_file.to_string(),
        })
    }
}
