//! Eager sends (the sender's part): a small send whose clear-to-send is not there yet goes at
//! once into the receiver's eager slot `seq % EAGER_SLOTS`, if the last clear-to-send this side
//! read (a single buffer) had the send's tag and room for it: NCCL posts receives of one
//! size and tag per connection, so the guess holds there, and a first send of a connection
//! always waits for its clear-to-send (so a mismatch is found there, with the same errors as
//! without eager sends). Should a guess be wrong, the receiver fails its receive
//! (`PeerTruncated`, `TagMismatch`) and the send completes, as with NCCL's Socket transport.
//! An eager send completes once its write is acknowledged **and** its receive's clear-to-send
//! (or a later one in the same FIFO slot: the receiver took it and posted again) was seen —
//! only the clear-to-send's sequence number (and epoch) is read, never its entries, which the
//! receiver may overwrite at any time once it took the send (they could be read torn; a torn
//! sequence number or epoch only reads as an older one or none: the send waits a poll more).

use super::super::layout::{
    cts_seq, eager_slot_offset, wr_id, EagerHeader, SharedWords, WrKind, EAGER_HEADER_BYTES,
    EAGER_SLOTS, FIFO_DEPTH, RECORD_WORDS,
};
use super::SendSide;
use super::{DataWrite, EagerCfg, GroupState, ProtoError, ReqId, SendArgs, SendBatch, SendReq};

impl SendSide {
    /// Send `a` as sequence number `seq` without its clear-to-send, when eager sends are on,
    /// `a` is small enough and its slot is free: the slot's last use (`seq - EAGER_SLOTS`)
    /// was received, which a clear-to-send of `seq - FIFO_DEPTH` or later proves (the receiver
    /// posts a receive only once the one `FIFO_DEPTH` before is done; the FIFO slot of `seq`
    /// holds that clear-to-send until `seq`'s own arrives).
    pub(super) fn try_eager(
        &mut self,
        fifo: &SharedWords,
        seq: u64,
        a: SendArgs,
    ) -> Option<(ReqId, Option<SendBatch>)> {
        let cfg = self.eager?;
        let (tag, room) = self.last_cts?;
        if a.size > cfg.max || a.size > room || a.tag != tag {
            return None;
        }
        let slot = (seq % FIFO_DEPTH as u64) as usize;
        let q = cts_seq(fifo, self.epoch, slot);
        if q < seq {
            self.cts_seen = self.cts_seen.max(q);
        }
        let free = seq < self.first + EAGER_SLOTS as u64
            || self.cts_seen + (EAGER_SLOTS - FIFO_DEPTH) as u64 >= seq;
        if !free {
            return None;
        }
        let id = self.reqs.insert(SendReq {
            seq,
            size: a.size,
            error: None,
        })?;
        let g = &mut self.groups[slot];
        g.seq = seq;
        g.state = GroupState::Posted;
        g.live = 1;
        g.matched.clear();
        g.matched.push(a);
        g.eager = true;
        g.awaiting_cts = true;
        g.acked = false;
        self.awaiting += 1;
        self.next_seq += 1;
        Some((id, Some(eager_batch(cfg, seq, &a))))
    }

    /// Look for the clear-to-sends of eager sends still waiting for theirs (their last word
    /// only): a send completes once its write is acknowledged too. Also tells how far the
    /// receiver has posted (slots free again).
    pub fn confirm_eager(&mut self, fifo: &SharedWords) {
        if self.awaiting == 0 {
            return;
        }
        for slot in 0..FIFO_DEPTH {
            let g = &self.groups[slot];
            if g.state != GroupState::Posted || !g.awaiting_cts {
                continue;
            }
            let q = cts_seq(fifo, self.epoch, slot);
            if q < g.seq {
                continue;
            }
            self.cts_seen = self.cts_seen.max(q);
            let g = &mut self.groups[slot];
            g.awaiting_cts = false;
            self.awaiting -= 1;
            if g.acked {
                g.complete();
            }
        }
    }

    /// Eager sends whose receive's clear-to-send is not seen yet (they cannot complete).
    pub fn awaiting_cts(&self) -> usize {
        self.awaiting
    }

    /// The replay of the eager group in FIFO slot `i` after a switch: into the same eager slot
    /// (reserved until it is received), with the new path's key for the send's buffer.
    pub(super) fn replay_eager(
        &mut self,
        i: usize,
        lkey: &mut impl FnMut(usize, usize, u64, u64) -> Option<u32>,
    ) -> Result<SendBatch, ProtoError> {
        let cfg = self
            .eager
            .expect("an eager group was sent with eager sends on");
        let g = &mut self.groups[i];
        g.acked = false;
        let mut a = g.matched[0];
        if a.size > 0 {
            match lkey(i, 0, a.addr, a.size) {
                Some(key) => a.lkey = key,
                None => return Err(self.key_refused("registering a replayed send on the new path")),
            }
        }
        Ok(eager_batch(cfg, g.seq, &a))
    }
}

/// The payload write into eager slot `seq % EAGER_SLOTS` of the receiver, then its header
/// (`record[..EagerHeader::WORDS]`) with the WRITE_WITH_IMM.
fn eager_batch(cfg: EagerCfg, seq: u64, a: &SendArgs) -> SendBatch {
    let header = cfg.region_addr + eager_slot_offset(seq) as u64;
    let mut record = [0u64; RECORD_WORDS];
    record[..EagerHeader::WORDS].copy_from_slice(
        &EagerHeader {
            seq,
            tag: a.tag,
            size: a.size as u32,
        }
        .encode(),
    );
    let writes = (a.size > 0)
        .then(|| DataWrite {
            wr_id: wr_id(WrKind::Data, seq, 0),
            local_addr: a.addr,
            len: a.size,
            lkey: a.lkey,
            remote_addr: header + EAGER_HEADER_BYTES as u64,
            rkey: 0,
        })
        .into_iter()
        .collect();
    SendBatch {
        seq,
        writes,
        record,
        // Index 2: the record is an eager slot's header (errors name the eager write).
        record_wr_id: wr_id(WrKind::Record, seq, 2),
        fast: false,
        eager: Some(header),
    }
}
