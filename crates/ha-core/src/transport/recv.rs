//! Receive side of an established connection: the `RecvSide` machine on a multi-path `Link`.
//! On a failover it fences and drains the old path — after which it knows exactly which
//! sequence numbers were delivered — re-posts the open clear-to-sends with the new path's
//! keys, and tells the sender `Switch{delivered, posted}`. On a planned switch
//! (`link/planned.rs`) nothing is fenced: it stops posting, waits until it delivered what the
//! sender posted and its own clear-to-sends completed, then does the same.

use super::cts_backlog::{CtsBacklog, Deferred};
use super::error::{Error, Result};
use super::flush::Flushes;
use super::link::{Drain, Event, Link, Phase};
use super::mr::MrHandle;
use crate::fabric::{FabricError, SendOp, SendWr, Sge, WcStatus};
use ha_proto::data::layout::{
    cts_written, CtrlKind, CtrlMsg, CtsEntry, CTS_SLOT_WORDS, FIFO_DEPTH, MAX_RECVS,
};
use ha_proto::data::recv::{EagerCopy, RecvSide};
use ha_proto::data::ReqId;
use std::sync::Arc;

/// Clear-to-sends are signaled one in this many (by sequence number); the others complete
/// without a completion to poll.
pub const CTS_SIGNAL_EVERY: u64 = 8;

/// One buffer of a (multi-)receive.
pub struct RecvArg<'a> {
    pub addr: usize,
    pub size: usize,
    pub tag: i32,
    pub mr: &'a Arc<MrHandle>,
}

pub struct RecvComm {
    pub(crate) link: Link,
    pub(crate) machine: RecvSide,
    /// Registrations of each FIFO slot's buffers (re-keyed on a failover).
    slot_mrs: Vec<Vec<Arc<MrHandle>>>,
    /// GPU flushes (`iflush`) and their loopback queue pairs.
    pub(crate) flushes: Flushes,
    /// Clear-to-sends waiting for room in their path's send queue (`cts_backlog.rs`).
    backlog: CtsBacklog,
    /// Clear-to-sends one path keeps posted at most ([`super::path::CTS_ROOM`]; tests lower it).
    pub(crate) cts_room: usize,
    /// [`RecvComm::pump`]'s events, kept between pumps (empty between them).
    events: Vec<Event>,
}

impl RecvComm {
    pub(crate) fn new(link: Link, eager: bool) -> RecvComm {
        let mut machine = RecvSide::new();
        if eager {
            machine.enable_eager();
        }
        RecvComm {
            link,
            machine,
            slot_mrs: vec![Vec::new(); FIFO_DEPTH],
            flushes: Flushes::new(),
            backlog: CtsBacklog::default(),
            cts_room: super::path::CTS_ROOM,
            events: Vec::new(),
        }
    }

    /// Flush received GPU memory: a 1-byte READ of `addr` (in `mr`) on the active path's
    /// device (see `flush.rs`). Complete it with [`test_flush`](Self::test_flush).
    pub fn iflush(&mut self, addr: usize, mr: &Arc<MrHandle>) -> Result<ReqId> {
        self.pump();
        if let Some(e) = self.machine.failure() {
            return Err(e.clone().into());
        }
        let id = self.flushes.add(addr, mr)?;
        self.drive_flushes();
        Ok(id)
    }

    /// `Ok(true)` once flush `id` completed.
    pub fn test_flush(&mut self, id: ReqId) -> Result<bool> {
        self.pump();
        self.drive_flushes();
        self.flushes.take(id)
    }

    /// The flushes and their loopback queue pairs (stats and tests).
    pub fn flushes(&self) -> &Flushes {
        &self.flushes
    }

    fn drive_flushes(&mut self) {
        let dead = self.machine.failure().map(|e| e.to_string());
        self.flushes.drive(&self.link, dead);
    }

    /// Post a receive of 1..=8 buffers; `Ok(None)` when 32 are already outstanding or a
    /// failover is in progress: try later.
    pub fn irecv(&mut self, bufs: &[RecvArg]) -> Result<Option<ReqId>> {
        self.pump();
        if let Some(e) = self.machine.failure() {
            return Err(e.clone().into());
        }
        if !matches!(self.link.phase, Phase::Normal) {
            return Ok(None);
        }
        if self.machine.eager() && bufs.len() > 1 {
            return Err(Error::Usage(format!(
                "irecv of {} buffers on a connection with eager sends (HA_NCCL_SOCK_EAGER): the device advertises one buffer per receive (maxRecvs 1); set HA_NCCL_SOCK_EAGER=0 for grouped receives",
                bufs.len()
            )));
        }
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::Usage(format!(
                "irecv of {} buffers (1..={MAX_RECVS} supported)",
                bufs.len()
            )));
        }
        let a = self.link.active;
        let dev = self.link.path(a).device().clone();
        let mut entries = [CtsEntry::default(); MAX_RECVS];
        for (e, b) in entries.iter_mut().zip(bufs) {
            if b.size > 0 && !b.mr.contains(b.addr, b.size) {
                return Err(Error::Usage(format!(
                    "receive buffer {:#x}+{} lies outside its registration {:#x}+{}",
                    b.addr, b.size, b.mr.addr, b.mr.len
                )));
            }
            *e = CtsEntry {
                addr: b.addr as u64,
                size: b.size as u64,
                rkey: b.mr.keys_for(&dev)?.rkey,
                tag: b.tag,
            };
        }
        let Some((id, p)) = self.machine.post(&entries[..bufs.len()])? else {
            return Ok(None);
        };
        let mrs = &mut self.slot_mrs[p.slot];
        mrs.clear();
        mrs.extend(bufs.iter().map(|b| b.mr.clone()));
        if let Some(c) = p.copy {
            self.copy_eager(c);
        }
        self.post_cts(a, p.seq, p.slot, p.fifo_word, &p.cts);
        Ok(Some(id))
    }

    /// Copy an eager send out of the ring into its receive's buffer, through the active path's
    /// device (which checks the buffer against its registration), before the receive can be
    /// reported done: the machine reports it only after this returns.
    fn copy_eager(&mut self, c: EagerCopy) {
        let dev = self.link.path(self.link.active).device();
        let copied = match self.slot_mrs[c.slot].first().map(|mr| mr.keys_for(dev)) {
            Some(Ok(k)) => dev
                .pd
                .copy_into(
                    k.lkey,
                    c.to as usize,
                    &self.link.region.words,
                    c.from,
                    c.len,
                )
                .map_err(|e| e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("no registration for the receive".into()),
        };
        if let Err(e) = copied {
            tracing::warn!("NET/HA : {}: eager copy failed: {e}", self.link.name);
            self.machine.copy_failed(c.slot);
        }
    }

    /// Write clear-to-send `cts` over `path` to word `fifo_word` of the sender's FIFO, or,
    /// while that path's send queue has no room (or others wait), queue it behind the others.
    fn post_cts(
        &mut self,
        path: usize,
        seq: u64,
        slot: usize,
        fifo_word: usize,
        cts: &[u64; CTS_SLOT_WORDS],
    ) {
        let d = Deferred {
            path,
            seq,
            slot,
            fifo_word,
            cts: *cts,
        };
        if !self.backlog.is_empty() || !self.room(path) {
            self.wait(d);
            return;
        }
        if !self.post_cts_now(&d) {
            // Refused although this side counted room: make sure something completes there.
            self.cover_or_fail(path, "probe behind the clear-to-sends");
            self.wait(d);
        }
    }

    fn wait(&mut self, d: Deferred) {
        if self.backlog.waited == 0 {
            tracing::info!(
                "NET/HA : {}: clear-to-sends wait for room in path {}'s send queue ({} posted, not yet acknowledged as far as this side has polled): the peer's acknowledgements are late",
                self.link.name,
                d.path,
                self.link.path(d.path).posted()
            );
        }
        self.backlog.push(d);
    }

    /// Whether `path`'s send queue has room for a clear-to-send. Without room, an unsignaled
    /// clear-to-send last in it gets a probe behind it, whose completion covers it (else
    /// nothing would ever complete there).
    fn room(&mut self, path: usize) -> bool {
        if self.link.path(path).posted() < self.cts_room {
            return true;
        }
        self.cover_or_fail(path, "probe behind the clear-to-sends");
        false
    }

    /// A post on `path` failed (`why`): the path failed.
    fn fail_path(&mut self, path: usize, why: String) {
        let ev = self.link.path_error(path, WcStatus::LocQpOpErr, why);
        self.on_event(ev);
    }

    /// `Path::cover` on `path`; a failed post fails the path (`what` names it). False then.
    fn cover_or_fail(&mut self, path: usize, what: &str) -> bool {
        let addr = self.link.peer_addr;
        if let Err(e) = self.link.path_mut(path).cover(addr) {
            self.fail_path(path, format!("{what}: {e}"));
            return false;
        }
        true
    }

    /// Post the waiting clear-to-sends that have room now, oldest first. Only in the normal
    /// phase and on the active path: a switch re-posts every open one on its new path.
    fn flush_backlog(&mut self) {
        while let Some(d) = self.backlog.front() {
            if !matches!(self.link.phase, Phase::Normal) {
                return;
            }
            if d.path != self.link.active {
                // Not reached: the active path changes only in a switch, which re-posts every
                // open receive's clear-to-send and empties the backlog first.
                tracing::warn!(
                    "NET/HA : {}: a clear-to-send waiting for path {} dropped: the active path is {} (its switch re-posted what is open)",
                    self.link.name,
                    d.path,
                    self.link.active
                );
                self.backlog.pop_front();
                continue;
            }
            let path = d.path;
            if !self.room(path) {
                return;
            }
            let d = self.backlog.pop_front().expect("front exists");
            if !self.post_cts_now(&d) {
                self.backlog.push_front(d);
                return;
            }
        }
    }

    /// Post clear-to-send `d` (staged in its slot); false when the send queue was full after
    /// all. Any other failure fails the path.
    fn post_cts_now(&mut self, d: &Deferred) -> bool {
        let Deferred {
            path,
            seq,
            slot,
            fifo_word,
            ref cts,
        } = *d;
        // Only the words this clear-to-send fills go out (48 bytes for one receive).
        let span = cts_written(cts);
        let base = slot * CTS_SLOT_WORDS + span.start;
        for (i, w) in cts[span.clone()].iter().enumerate() {
            self.link.stage.words.store(base + i, *w);
        }
        let lkey = self.link.stage.keys(path).lkey;
        let local = self.link.stage.addr() + base * 8;
        let remote = self.link.peer_addr + ((fifo_word + span.start) * 8) as u64;
        let p = self.link.path_mut(path);
        let wr = SendWr {
            wr_id: ha_proto::data::layout::wr_id(ha_proto::data::layout::WrKind::Cts, seq, 0),
            op: SendOp::Write,
            local: Sge {
                addr: local,
                len: span.len() * 8,
                lkey,
            },
            remote_addr: remote,
            rkey: p.peer_rkey,
            // One in CTS_SIGNAL_EVERY: no completion to poll and account per message (the
            // path keeps the others in flight until a later completion covers them).
            signaled: seq % CTS_SIGNAL_EVERY == 0,
            inline: true,
        };
        match p.post(&[wr]) {
            Ok(()) => true,
            Err(FabricError::QueueFull(_)) => false,
            Err(e) => {
                self.fail_path(path, format!("posting a clear-to-send: {e}"));
                true
            }
        }
    }

    /// `Ok(Some(sizes))` once the receive completed.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>> {
        self.pump();
        let r = self.machine.test(id)?;
        // Waiting for data: make sure the sender is still there.
        let ev = self.link.keepalive(r.is_none());
        self.on_event(ev);
        Ok(r)
    }

    pub(super) fn pump(&mut self) {
        let mut events = std::mem::take(&mut self.events);
        self.link.pump_into(&mut events);
        for ev in events.drain(..) {
            self.on_event(ev);
        }
        self.events = events;
        self.advance_failover();
        self.advance_planned();
        self.flush_backlog();
    }

    /// Clear-to-sends that had to wait for room in their path's send queue, since the
    /// connection opened.
    pub fn cts_waited(&self) -> u64 {
        self.backlog.waited
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Data(c) => {
                if let Some(copy) = self.machine.on_completion(&c, &self.link.region.words) {
                    self.copy_eager(copy);
                }
            }
            Event::Ctrl(m) => self.on_ctrl(m),
            Event::Fatal(e) => self.machine.fail(e),
            Event::Nothing => {}
        }
    }

    pub(super) fn on_ctrl(&mut self, m: CtrlMsg) {
        match m.kind {
            CtrlKind::SwitchReq
                if m.epoch == self.link.epoch
                    && matches!(self.link.phase, Phase::Normal | Phase::Planned(_)) =>
            {
                let ev = self.link.peer_failover();
                self.on_event(ev);
            }
            CtrlKind::PlanReq => {
                let ev = self.link.on_plan_req(&m);
                self.on_event(ev);
            }
            CtrlKind::Rearm => self.link.on_rearm(&m),
            CtrlKind::RearmDone => {
                let ev = self.link.on_rearm_done(&m);
                self.on_event(ev);
            }
            _ => tracing::debug!("NET/HA : {}: ignored control {:?}", self.link.name, m),
        }
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
        // The old path is fenced and flushed: `delivered` is final. Re-post what is open with
        // the new path's keys (in the next epoch's FIFO bank), then tell the sender.
        self.machine.next_epoch();
        let Some(reposted) = self.repost_open(f.to) else {
            return; // the new path failed too: the connection is lost
        };
        if self.say_switch(f.to, self.link.epoch) {
            self.link.finish_switch(f.to, reposted);
        }
    }

    /// A planned switch: once everything the sender posted on the path being left was
    /// delivered and this side's clear-to-sends there completed, nothing is in flight on it
    /// either way: switch (the link first: a failure of the target while re-posting is then a
    /// failover from it), re-post what is open with the target's keys in the next epoch's
    /// bank, and tell the sender.
    fn advance_planned(&mut self) {
        let Some(p) = self.link.planned().cloned() else {
            return;
        };
        // An unsignaled clear-to-send last on the path left (it stays the last: none is posted
        // while a plan is on) gets a probe behind it that tells when it completed, in flight
        // while the sender's last messages arrive; `cover` posts nothing otherwise.
        if !self.cover_or_fail(p.from, "probe behind a clear-to-send") {
            return;
        }
        if self.machine.delivered() < p.upto || self.link.path(p.from).data_in_flight() {
            if self.link.plan_overdue(&p) {
                let ev = self.link.refuse_plan(6);
                self.on_event(ev);
            }
            return;
        }
        let epoch = self.link.epoch;
        let ev = self.link.finish_plan(0);
        self.on_event(ev);
        if self.link.active != p.to || !matches!(self.link.phase, Phase::Normal) {
            return;
        }
        self.machine.next_epoch();
        if self.repost_open(p.to).is_some() {
            self.say_switch(p.to, epoch);
        }
    }

    /// Re-post every open receive's clear-to-send on path `to` with its keys (in the machine's
    /// current epoch); how many, or `None` when a post failed (and changed the link's phase).
    fn repost_open(&mut self, to: usize) -> Option<usize> {
        // Every open receive's clear-to-send goes out again below (the waiting ones too),
        // directly on the new path.
        self.backlog.clear();
        let dev = self.link.path(to).device().clone();
        let phase = std::mem::discriminant(&self.link.phase);
        let open = self.machine.open_requests();
        for (seq, slot, entries) in &open {
            let mut rekeyed = entries.clone();
            for (i, e) in rekeyed.iter_mut().enumerate() {
                match self.slot_mrs[*slot].get(i).map(|m| m.keys_for(&dev)) {
                    Some(Ok(k)) => e.rkey = k.rkey,
                    _ => {
                        self.machine.fail(ha_proto::data::ProtoError::Failed {
                            status: WcStatus::LocProtErr,
                            what: "registering a receive buffer on the new path",
                        });
                        return None;
                    }
                }
            }
            let (cts, word) = self.machine.repost(*seq, &rekeyed);
            // Straight onto the new path, never into the backlog: the Switch message that
            // follows must not overtake them (the sender reads them when it applies it). At
            // most FIFO_DEPTH of them, on a path just drained: the queue has room.
            let d = Deferred {
                path: to,
                seq: *seq,
                slot: *slot,
                fifo_word: word,
                cts,
            };
            if !self.post_cts_now(&d) {
                self.fail_path(
                    to,
                    "re-posting a clear-to-send: the send queue is full".into(),
                );
            }
            if std::mem::discriminant(&self.link.phase) != phase {
                return None;
            }
        }
        Some(open.len())
    }

    /// `Switch{delivered, posted}` of `epoch` over path `to`; false when it could not be posted
    /// (a failure of that path, handled).
    fn say_switch(&mut self, to: usize, epoch: u32) -> bool {
        let msg = CtrlMsg {
            kind: CtrlKind::Switch,
            epoch,
            a: self.machine.delivered(),
            b: self.machine.posted_upto(),
            endpoint: Vec::new(),
        };
        if let Err(e) = self.link.send_ctrl(to, &msg) {
            self.fail_path(to, format!("switch message: {e}"));
            return false;
        }
        true
    }

    pub fn device_res(&self) -> &Arc<crate::engine::DeviceRes> {
        self.link.path(self.link.active).device()
    }

    /// Every device of the connection, the active path's first (see `Link::devices`).
    pub fn devices(&self) -> Vec<Arc<crate::engine::DeviceRes>> {
        self.link.devices()
    }

    /// Completions dropped as duplicates.
    pub fn duplicates(&self) -> u64 {
        self.machine.duplicates()
    }

    /// The connection's counters now.
    pub fn stats(&self) -> super::stats::Stats {
        self.link.stats.snapshot(self.machine.duplicates())
    }
}

impl Drop for RecvComm {
    fn drop(&mut self) {
        let d = self.machine.duplicates();
        self.link.report(d);
    }
}
