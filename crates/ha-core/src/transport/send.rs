//! Send side of an established connection: the `SendSide` machine on a multi-path `Link`.
//! On a failover it fences and drains the old path, asks the receiver what it delivered (or
//! hears it first), then replays the undelivered sends on the new path. On a planned switch
//! (`link/planned.rs`) it stops posting, lets the active path drain, asks the receiver to
//! switch, and applies its `Switch` with nothing to replay.

use super::error::{Error, Result};
use super::link::{Drain, Event, Link, Phase};
use super::mr::{MemKind, MrHandle};
use crate::fabric::{SendOp, SendWr, Sge};
use ha_proto::data::layout::EagerHeader;
use ha_proto::data::layout::{CtrlKind, CtrlMsg, FIFO_DEPTH, RECORD_BYTES, RECORD_WORDS};
use ha_proto::data::send::{DataWrite, EagerCfg, SendArgs, SendBatch, SendSide};
use ha_proto::data::ReqId;
use std::sync::Arc;

pub struct SendComm {
    pub(crate) link: Link,
    pub(crate) machine: SendSide,
    /// Registrations of the sends of each FIFO slot's current group (for a replay).
    slot_mrs: Vec<(u64, Vec<Arc<MrHandle>>)>,
    /// The largest message every device of the connection takes, and the device that limits.
    max_msg: (u64, String),
    /// [`SendComm::pump`]'s events, kept between pumps (empty between them).
    events: Vec<Event>,
    /// [`SendComm::post`]'s work requests, kept between posts.
    wrs: Vec<SendWr>,
}

impl SendComm {
    /// `eager`: the receiver offered an eager ring and this side sends small messages there.
    pub(crate) fn new(link: Link, eager: Option<EagerCfg>) -> SendComm {
        let fabric = link.path(link.active).lease.engine().fabric().clone();
        let max_msg = link
            .paths
            .iter()
            .flatten()
            .filter_map(|p| fabric.devices().get(p.device().dev))
            .map(|i| (i.max_msg_bytes, i.name.clone()))
            .min_by_key(|(m, _)| *m)
            .unwrap_or((u64::MAX, String::new()));
        let mut machine = SendSide::new();
        if let Some(cfg) = eager {
            machine.enable_eager(cfg);
        }
        SendComm {
            link,
            machine,
            slot_mrs: vec![(0, Vec::new()); FIFO_DEPTH],
            max_msg,
            events: Vec::new(),
            wrs: Vec::new(),
        }
    }

    /// Post a send of `[addr, addr+size)`; `Ok(None)` when the receiver has not posted yet
    /// (or a failover is in progress): try later.
    pub fn isend(
        &mut self,
        addr: usize,
        size: usize,
        tag: i32,
        mr: &Arc<MrHandle>,
    ) -> Result<Option<ReqId>> {
        self.pump();
        if let Some(e) = self.machine.failure() {
            return Err(e.clone().into());
        }
        if !matches!(self.link.phase, Phase::Normal) {
            return Ok(None);
        }
        if size > 0 && !mr.contains(addr, size) {
            return Err(Error::Usage(format!(
                "send buffer {addr:#x}+{size} lies outside its registration {:#x}+{}",
                mr.addr, mr.len
            )));
        }
        if size as u64 > self.max_msg.0 {
            // Refused up front: posted, it would fail the path with a length error, fail
            // over, and fail again on the replay (the connection lost for a caller's error).
            return Err(Error::Usage(format!(
                "send of {size} bytes exceeds the largest message device {} takes ({} bytes, max_msg_sz); split it",
                self.max_msg.1, self.max_msg.0
            )));
        }
        let a = self.link.active;
        let lkey = mr.keys_for(self.link.path(a).device())?.lkey;
        let seq = self.machine.posted_upto() + 1;
        let args = SendArgs {
            addr: addr as u64,
            size: size as u64,
            tag,
            lkey,
        };
        match self.machine.isend(&self.link.region.words, args)? {
            None => {
                // No receive posted yet: make sure the peer is still there.
                let ev = self.link.keepalive(true);
                self.on_event(ev);
                Ok(None)
            }
            Some((id, batch)) => {
                let _ = self.link.keepalive(false);
                let slot = &mut self.slot_mrs[(seq % FIFO_DEPTH as u64) as usize];
                if slot.0 != seq {
                    // Reused, not replaced: a send allocates nothing here.
                    slot.0 = seq;
                    slot.1.clear();
                }
                slot.1.push(mr.clone());
                if let Some(b) = batch {
                    // A batch completes at the send of its last entry: a fast one (one entry,
                    // one write) carries this send's bytes.
                    self.post(a, &b, mr.kind == MemKind::Host);
                }
                Ok(Some(id))
            }
        }
    }

    /// Post `b` on path `p`; a failure to post is a failure of that path (the group stays
    /// posted in the machine and is replayed if the connection fails over). `host`: a fast
    /// batch's payload is host memory the CPU may read now (`NCCL_PTR_HOST`), so a small one
    /// may travel inside the work request (verbs `IBV_SEND_INLINE`: the NIC does not fetch it
    /// with a DMA read). GPU memory never does.
    fn post(&mut self, p: usize, b: &SendBatch, host: bool) {
        let mut wrs = std::mem::take(&mut self.wrs);
        wrs.clear();
        if let Some(header) = b.eager {
            // The payload into the receiver's eager slot, then its header with the immediate;
            // both in the receiver's region (its key, not a clear-to-send's).
            let slot = b.slot();
            for (i, w) in b.record[..EagerHeader::WORDS].iter().enumerate() {
                self.link.stage.words.store(slot * RECORD_WORDS + i, *w);
            }
            let rkey = self.link.path(p).peer_rkey;
            wrs.extend(b.writes.iter().map(|w| SendWr {
                rkey,
                inline: host,
                ..payload_wr(w)
            }));
            wrs.push(SendWr {
                wr_id: b.record_wr_id,
                op: SendOp::WriteWithImm(b.imm()),
                local: Sge {
                    addr: self.link.stage.addr() + slot * RECORD_BYTES,
                    len: EagerHeader::WORDS * 8,
                    lkey: self.link.stage.keys(p).lkey,
                },
                remote_addr: header,
                rkey,
                signaled: true,
                inline: true,
            });
        } else if b.fast {
            // One operation: the payload write carries the record in its immediate.
            wrs.push(SendWr {
                wr_id: b.record_wr_id,
                op: SendOp::WriteWithImm(b.imm()),
                signaled: true,
                inline: host,
                ..payload_wr(&b.writes[0])
            });
        } else {
            let slot = b.slot();
            for (i, w) in b.record.iter().enumerate() {
                self.link.stage.words.store(slot * RECORD_WORDS + i, *w);
            }
            wrs.extend(b.writes.iter().map(payload_wr));
            wrs.push(SendWr {
                wr_id: b.record_wr_id,
                op: SendOp::WriteWithImm(b.imm()),
                local: Sge {
                    addr: self.link.stage.addr() + slot * RECORD_BYTES,
                    len: RECORD_BYTES,
                    lkey: self.link.stage.keys(p).lkey,
                },
                remote_addr: self.link.peer_addr + (slot * RECORD_BYTES) as u64,
                rkey: self.link.path(p).peer_rkey,
                signaled: true,
                inline: true,
            });
        }
        let posted = self.link.path_mut(p).post(&wrs);
        self.wrs = wrs;
        if let Err(e) = posted {
            let ev = self.link.path_error(
                p,
                crate::fabric::WcStatus::LocQpOpErr,
                format!("posting payload writes: {e}"),
            );
            self.on_event(ev);
        }
    }

    /// `Ok(Some(size))` once the send completed.
    pub fn test(&mut self, id: ReqId) -> Result<Option<u64>> {
        self.pump();
        let r = self.machine.test(id)?;
        if r.is_none() && self.machine.awaiting_cts() > 0 {
            // An eager send waits for its receive's clear-to-send: make sure the peer is
            // still there.
            let ev = self.link.keepalive(true);
            self.on_event(ev);
        }
        Ok(r)
    }

    /// Drain completions, run the periodic duties, advance a failover.
    pub(super) fn pump(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        self.link.pump_into(&mut events);
        for ev in events.drain(..) {
            self.on_event(ev);
        }
        self.events = events;
        self.machine.confirm_eager(&self.link.region.words);
        self.advance_failover();
        let upto = self.machine.posted_upto();
        let ev = self.link.request_plan(upto);
        self.on_event(ev);
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Data(c) => self.machine.on_completion(&c),
            Event::Ctrl(m) => self.on_ctrl(m),
            Event::Fatal(e) => self.machine.fail(e),
            Event::Nothing => {}
        }
    }

    pub(super) fn on_ctrl(&mut self, m: CtrlMsg) {
        match m.kind {
            CtrlKind::Switch => self.on_switch(&m),
            CtrlKind::RearmAck => self.link.on_rearm_ack(&m),
            // The receiver's answer over the re-armed path: its arrival verified the path.
            CtrlKind::RearmDone => {}
            CtrlKind::PlanNak => self.link.on_plan_nak(&m),
            CtrlKind::DrainState => self.link.on_drain_state(&m),
            _ => tracing::debug!("NET/HA : {}: ignored control {:?}", self.link.name, m),
        }
    }

    /// The receiver's `Switch`: the answer to a planned switch this side asked for, or the
    /// receiver's failover (it fenced the active path: this side fences it too and replays
    /// what was not delivered). One epoch ahead of an asked plan: the receiver switched as
    /// planned and failed back from the target at once — commit, then fail over.
    fn on_switch(&mut self, m: &CtrlMsg) {
        let e = self.link.epoch;
        if self.link.planned().is_some_and(|p| p.requested) {
            if m.epoch == e {
                self.commit_plan(m.a);
                return;
            }
            if m.epoch == e.wrapping_add(1) {
                let upto = self.machine.posted_upto();
                self.commit_plan(upto);
            }
        }
        if m.epoch != self.link.epoch {
            tracing::debug!(
                "NET/HA : {}: switch message of epoch {} ignored (epoch {})",
                self.link.name,
                m.epoch,
                self.link.epoch
            );
            return;
        }
        if matches!(self.link.phase, Phase::Normal | Phase::Planned(_)) {
            let ev = self.link.peer_failover();
            self.on_event(ev);
        }
        if let Phase::Failing(f) = &mut self.link.phase {
            f.switch = Some(m.a);
        }
    }

    /// The receiver switched as planned, having delivered up to `delivered`: everything this
    /// side posted completed before it asked, so nothing is replayed; traffic resumes on the
    /// target.
    fn commit_plan(&mut self, delivered: u64) {
        let Some(p) = self.link.planned().cloned() else {
            return;
        };
        let dev = self.link.path(p.to).device().clone();
        let slot_mrs = &self.slot_mrs;
        let replay =
            self.machine
                .apply_switch(&self.link.region.words, delivered, |slot, _, addr, size| {
                    slot_mrs[slot]
                        .1
                        .iter()
                        .find(|m| m.contains(addr as usize, size as usize))
                        .and_then(|m| m.keys_for(&dev).ok())
                        .map(|k| k.lkey)
                });
        let Ok(replay) = replay else {
            return; // the machine is failed and says why
        };
        debug_assert!(replay.is_empty(), "a planned switch replays nothing");
        for b in &replay {
            self.post(p.to, b, false);
        }
        let ev = self.link.finish_plan(replay.len());
        self.on_event(ev);
    }

    fn advance_failover(&mut self) {
        let Phase::Failing(f) = &self.link.phase else {
            return;
        };
        let f = f.clone();
        match self.link.drain_state(&f) {
            Drain::Waiting => return,
            Drain::Overdue => {
                let ev = self.link.fail_undrained(&f);
                self.on_event(ev);
                return;
            }
            Drain::Drained => {}
        }
        match f.switch {
            Some(delivered) => {
                let dev = self.link.path(f.to).device().clone();
                let slot_mrs = &self.slot_mrs;
                let replay = self.machine.apply_switch(
                    &self.link.region.words,
                    delivered,
                    |slot, _, addr, size| {
                        slot_mrs[slot]
                            .1
                            .iter()
                            .find(|m| m.contains(addr as usize, size as usize))
                            .and_then(|m| m.keys_for(&dev).ok())
                            .map(|k| k.lkey)
                    },
                );
                let Ok(replay) = replay else {
                    return; // the machine is failed and says why
                };
                self.link.active = f.to;
                for b in &replay {
                    self.post(f.to, b, false);
                }
                self.link.finish_switch(f.to, replay.len());
            }
            None if !f.requested => {
                let msg = CtrlMsg {
                    kind: CtrlKind::SwitchReq,
                    epoch: self.link.epoch,
                    a: self.machine.posted_upto(),
                    b: 0,
                    endpoint: Vec::new(),
                };
                match self.link.send_ctrl(f.to, &msg) {
                    Ok(()) => {
                        if let Phase::Failing(f) = &mut self.link.phase {
                            f.requested = true;
                        }
                    }
                    Err(e) => {
                        let ev = self.link.path_error(
                            f.to,
                            crate::fabric::WcStatus::LocQpOpErr,
                            format!("switch request: {e}"),
                        );
                        self.on_event(ev);
                    }
                }
            }
            None => {}
        }
    }

    pub fn device_res(&self) -> &Arc<crate::engine::DeviceRes> {
        self.link.path(self.link.active).device()
    }

    /// Every device of the connection, the active path's first (see `Link::devices`).
    pub fn devices(&self) -> Vec<Arc<crate::engine::DeviceRes>> {
        self.link.devices()
    }

    /// The connection's counters now.
    pub fn stats(&self) -> super::stats::Stats {
        self.link.stats.snapshot(0)
    }
}

impl Drop for SendComm {
    fn drop(&mut self) {
        self.link.report(0);
    }
}

/// The unsignaled RDMA WRITE of one payload (not inline: NCCL's memory, which may be the GPU's;
/// [`SendComm::post`] lets a fast batch's host payload go inline).
fn payload_wr(w: &DataWrite) -> SendWr {
    SendWr {
        wr_id: w.wr_id,
        op: SendOp::Write,
        local: Sge {
            addr: w.local_addr as usize,
            len: w.len as usize,
            lkey: w.lkey,
        },
        remote_addr: w.remote_addr,
        rkey: w.rkey,
        signaled: false,
        inline: false,
    }
}
