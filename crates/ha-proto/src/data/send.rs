//! Sender side of the data protocol: match sends to posted receives through the CTS FIFO,
//! decide the writes, complete requests from completions.

use super::layout::{
    encode_record, read_cts, wr_id, CtsEntry, Record, SharedWords, WrKind, EAGER_MAX, FIFO_DEPTH,
    MAX_RECVS, RECORD_WORDS, SIZE_TRUNCATED,
};
use super::{ProtoError, ReqId, Slab};
use crate::rc::{Completion, WcStatus};

mod eager;

/// Local description of a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendArgs {
    pub addr: u64,
    pub size: u64,
    pub tag: i32,
    pub lkey: u32,
}

/// Eager sends to a receiver that offered an eager ring (see the layout): where its region
/// is, and the largest payload sent that way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerCfg {
    /// The receiver's region (its address as the peer sees it).
    pub region_addr: u64,
    /// At most [`EAGER_MAX`].
    pub max: u64,
}

/// One payload RDMA WRITE to post (unsignaled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataWrite {
    pub wr_id: u64,
    pub local_addr: u64,
    pub len: u64,
    pub lkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// Everything to post once all sends of a (multi-)receive are matched: the payload writes,
/// then one signaled WRITE_WITH_IMM of `record` into the receiver's record slot `seq % 32`
/// with immediate [`super::layout::data_imm`]`(seq)`. When `fast`, there is exactly one
/// payload write and no record: that write itself is posted as the signaled WRITE_WITH_IMM,
/// with `record_wr_id` and immediate [`super::layout::fast_imm`]`(seq)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendBatch {
    pub seq: u64,
    pub writes: Vec<DataWrite>,
    pub record: [u64; RECORD_WORDS],
    pub record_wr_id: u64,
    /// The record travels in the immediate (a single receive, one non-empty payload write of
    /// at most `u32::MAX` bytes, not truncated).
    pub fast: bool,
    /// Eager: `writes` (at most one) go into the receiver's eager slot, whose header
    /// (`record[..EagerHeader::WORDS]`) goes with the WRITE_WITH_IMM to this address; every
    /// write of the batch uses the key of the receiver's region, not a clear-to-send's.
    pub eager: Option<u64>,
}

impl SendBatch {
    pub fn slot(&self) -> usize {
        (self.seq % FIFO_DEPTH as u64) as usize
    }
    pub fn imm(&self) -> u32 {
        if self.eager.is_some() {
            super::layout::eager_imm(self.seq)
        } else if self.fast {
            super::layout::fast_imm(self.seq)
        } else {
            super::layout::data_imm(self.seq)
        }
    }
}

struct Matching {
    seq: u64,
    entries: Vec<CtsEntry>,
    /// A switch of path happened since `entries` were read: they carry the old path's keys
    /// and must be read again from the current epoch's bank before the group is built (the
    /// re-posted clear-to-send may land after the switch message, e.g. when a switch is
    /// followed at once by another).
    reread: bool,
    matched: Vec<Option<SendArgs>>,
    /// Requests of this slot already completed (in error) before the slot was posted.
    finished_early: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum GroupState {
    Free,
    Posted,
    Done,
}

struct Group {
    seq: u64,
    state: GroupState,
    /// The matched entries and sends, kept until done for a replay on another path.
    matched: Vec<SendArgs>,
    /// Requests of this group not yet returned done/failed to the caller.
    live: usize,
    /// Sent eagerly (one send, no clear-to-send): a replay goes to the eager slot again.
    eager: bool,
    /// Eager: the receive's clear-to-send is not seen yet (the send completes once it is).
    awaiting_cts: bool,
    /// Eager: the write's completion came while `awaiting_cts`.
    acked: bool,
}

impl Group {
    /// The group's writes are done: free once its requests were all returned.
    fn complete(&mut self) {
        self.state = if self.live == 0 {
            GroupState::Free
        } else {
            GroupState::Done
        };
    }
}

struct SendReq {
    seq: u64,
    size: u64,
    error: Option<ProtoError>,
}

pub struct SendSide {
    next_seq: u64,
    /// Path epoch: switches so far (which clear-to-sends are current, see the layout).
    epoch: u32,
    cur: Option<Matching>,
    groups: Vec<Group>,
    reqs: Slab<SendReq>,
    failed: Option<ProtoError>,
    eager: Option<EagerCfg>,
    /// The first sequence number (eager slots before `first + EAGER_SLOTS` were never used).
    first: u64,
    /// The highest sequence number of a clear-to-send seen: the receiver finished every
    /// receive up to `cts_seen - FIFO_DEPTH` (it posts a receive only once the one 32 before,
    /// in the same FIFO slot, is done).
    cts_seen: u64,
    /// Eager groups whose clear-to-send is not seen yet.
    awaiting: usize,
    /// Tag and size of the last single-buffer clear-to-send read: what an eager send is
    /// guessed to match (see `send/eager.rs`).
    last_cts: Option<(i32, u64)>,
}

impl Default for SendSide {
    fn default() -> Self {
        Self::new()
    }
}

impl SendSide {
    pub fn new() -> Self {
        Self::starting_at(1)
    }

    /// A machine whose first sequence number is `seq` (≥ 1; tests start near wrap-arounds).
    pub fn starting_at(seq: u64) -> Self {
        SendSide {
            next_seq: seq.max(1),
            epoch: 0,
            cur: None,
            groups: (0..FIFO_DEPTH)
                .map(|_| Group {
                    seq: 0,
                    state: GroupState::Free,
                    matched: Vec::new(),
                    live: 0,
                    eager: false,
                    awaiting_cts: false,
                    acked: false,
                })
                .collect(),
            reqs: Slab::new(FIFO_DEPTH * MAX_RECVS),
            failed: None,
            eager: None,
            first: seq.max(1),
            cts_seen: 0,
            awaiting: 0,
            last_cts: None,
        }
    }

    /// Send messages of at most `cfg.max` bytes eagerly when their clear-to-send is not there
    /// yet (the receiver offered an eager ring and takes one buffer per receive).
    pub fn enable_eager(&mut self, cfg: EagerCfg) {
        self.eager = Some(EagerCfg {
            max: cfg.max.min(EAGER_MAX as u64),
            ..cfg
        });
    }

    /// The connection's terminal error, if any.
    pub fn failure(&self) -> Option<&ProtoError> {
        self.failed.as_ref()
    }

    /// Mark the connection failed (every pending and later request errors).
    pub fn fail(&mut self, e: ProtoError) {
        if self.failed.is_none() {
            self.failed = Some(e);
        }
    }

    /// Requests handed out and not yet completed.
    pub fn live_requests(&self) -> usize {
        self.reqs.live()
    }

    /// Try to match a send against the next posted receive. `Ok(None)`: not posted yet, try
    /// later. `Ok(Some((id, Some(batch))))`: the last send of the slot matched — post `batch`.
    pub fn isend(
        &mut self,
        fifo: &SharedWords,
        a: SendArgs,
    ) -> Result<Option<(ReqId, Option<SendBatch>)>, ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.cur.is_none() {
            let seq = self.next_seq;
            let slot = (seq % FIFO_DEPTH as u64) as usize;
            if self.groups[slot].state != GroupState::Free {
                return Ok(None); // previous use of this slot still in flight
            }
            match read_cts(fifo, self.epoch, slot, seq) {
                Ok(None) => return Ok(self.try_eager(fifo, seq, a)),
                Err(n) => {
                    self.fail(ProtoError::BadCts(n));
                    return Err(ProtoError::BadCts(n));
                }
                Ok(Some(entries)) => {
                    self.cts_seen = self.cts_seen.max(seq);
                    self.last_cts = (entries.len() == 1).then(|| (entries[0].tag, entries[0].size));
                    let n = entries.len();
                    self.cur = Some(Matching {
                        seq,
                        entries,
                        reread: false,
                        matched: vec![None; n],
                        finished_early: 0,
                    });
                }
            }
        }
        let epoch = self.epoch;
        let m = self.cur.as_mut().expect("matching slot");
        if m.reread {
            let slot = (m.seq % FIFO_DEPTH as u64) as usize;
            match read_cts(fifo, epoch, slot, m.seq) {
                Ok(None) => return Ok(None),
                Ok(Some(e)) if e.len() == m.entries.len() => {
                    m.entries = e;
                    m.reread = false;
                }
                _ => {
                    let e = ProtoError::BadCts(m.seq);
                    self.fail(e.clone());
                    return Err(e);
                }
            }
        }
        let Some(i) =
            (0..m.entries.len()).find(|&i| m.entries[i].tag == a.tag && m.matched[i].is_none())
        else {
            return Err(ProtoError::TagMismatch(a.tag));
        };
        let error = (a.size > m.entries[i].size).then(|| ProtoError::Truncated {
            send: a.size,
            recv: m.entries[i].size,
        });
        let Some(id) = self.reqs.insert(SendReq {
            seq: m.seq,
            size: a.size,
            error,
        }) else {
            return Ok(None);
        };
        m.matched[i] = Some(a);
        if m.matched.iter().any(|x| x.is_none()) {
            return Ok(Some((id, None)));
        }
        let m = self.cur.take().expect("matching slot");
        let g = &mut self.groups[(m.seq % FIFO_DEPTH as u64) as usize];
        g.seq = m.seq;
        g.state = GroupState::Posted;
        g.live = m.entries.len() - m.finished_early;
        // The group's vector is reused (cleared, not replaced): no allocation per send.
        g.matched.clear();
        g.matched
            .extend(m.matched.iter().map(|a| a.expect("all matched")));
        let batch = Self::batch(m.seq, &m.entries, &g.matched);
        g.eager = false;
        g.awaiting_cts = false;
        self.next_seq += 1;
        Ok(Some((id, Some(batch))))
    }

    fn batch(seq: u64, entries: &[CtsEntry], matched: &[SendArgs]) -> SendBatch {
        let mut sizes = [0u64; MAX_RECVS];
        let mut writes = Vec::new();
        for (i, (e, a)) in entries.iter().zip(matched).enumerate() {
            if a.size > e.size {
                sizes[i] = SIZE_TRUNCATED;
                continue;
            }
            sizes[i] = a.size;
            if a.size > 0 {
                writes.push(DataWrite {
                    wr_id: wr_id(WrKind::Data, seq, i as u8),
                    local_addr: a.addr,
                    len: a.size,
                    lkey: a.lkey,
                    remote_addr: e.addr,
                    rkey: e.rkey,
                });
            }
        }
        let record = encode_record(&Record {
            seq,
            nreqs: entries.len() as u32,
            status: 0,
            sizes,
        });
        let fast = entries.len() == 1
            && writes.len() == 1
            && sizes[0] != SIZE_TRUNCATED
            && sizes[0] <= u64::from(u32::MAX);
        SendBatch {
            seq,
            writes,
            record,
            // Index 1: the record travels with the payload (errors name a payload write).
            record_wr_id: wr_id(WrKind::Record, seq, u8::from(fast)),
            fast,
            eager: None,
        }
    }

    /// Highest sequence number posted so far (the start minus one: none).
    pub fn posted_upto(&self) -> u64 {
        self.next_seq - 1
    }

    /// Path epoch: how many switches this side went through.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The switch to another path, once the old one is fenced and drained: the receiver
    /// delivered everything up to `delivered` and re-posted its open clear-to-sends (with keys
    /// of the new path, in the next epoch's bank) into `fifo`. The epoch advances; groups it
    /// delivered complete; the others are rebuilt from the re-posted entries and returned, in
    /// order, for a replay on the new path. `lkey` gives the new path's key for (slot, entry
    /// index, address, size) of a posted send. Every error also fails the connection (the
    /// caller only stops).
    pub fn apply_switch(
        &mut self,
        fifo: &SharedWords,
        delivered: u64,
        mut lkey: impl FnMut(usize, usize, u64, u64) -> Option<u32>,
    ) -> Result<Vec<SendBatch>, ProtoError> {
        if delivered > self.posted_upto() {
            let e = ProtoError::CorruptRecord {
                what: "of the switch claims more than was sent",
            };
            self.fail(e.clone());
            return Err(e);
        }
        self.epoch = self.epoch.wrapping_add(1);
        let mut posted: Vec<usize> = (0..FIFO_DEPTH)
            .filter(|&i| self.groups[i].state == GroupState::Posted)
            .collect();
        posted.sort_by_key(|&i| self.groups[i].seq);
        let mut replay = Vec::new();
        for i in posted {
            let g = &mut self.groups[i];
            if g.seq <= delivered {
                // Delivered: an eager one's clear-to-send went to the old bank and is not
                // posted again; its completion is certain.
                if std::mem::take(&mut g.awaiting_cts) {
                    self.awaiting -= 1;
                }
                g.complete();
                continue;
            }
            if g.eager {
                let b = self.replay_eager(i, &mut lkey)?;
                replay.push(b);
                continue;
            }
            let entries = match read_cts(fifo, self.epoch, i, g.seq) {
                Ok(Some(e)) if e.len() == g.matched.len() => e,
                _ => {
                    let e = ProtoError::BadCts(g.seq);
                    self.fail(e.clone());
                    return Err(e);
                }
            };
            let mut args = g.matched.clone();
            for (k, a) in args.iter_mut().enumerate() {
                if a.size > 0 && a.size <= entries[k].size {
                    match lkey(i, k, a.addr, a.size) {
                        Some(key) => a.lkey = key,
                        None => {
                            return Err(
                                self.key_refused("registering a replayed send on the new path")
                            )
                        }
                    }
                }
            }
            replay.push(Self::batch(g.seq, &entries, &args));
        }
        // A receive being matched was advertised with the old path's keys: its sends are
        // re-keyed now, its clear-to-send is read again (from the new bank) before its group is
        // built.
        if let Some(m) = self.cur.as_mut() {
            let slot = (m.seq % FIFO_DEPTH as u64) as usize;
            m.reread = true;
            let mut refused = false;
            for (k, a) in m.matched.iter_mut().enumerate() {
                if let Some(a) = a.as_mut().filter(|a| a.size > 0) {
                    match lkey(slot, k, a.addr, a.size) {
                        Some(key) => a.lkey = key,
                        None => refused = true,
                    }
                }
            }
            if refused {
                return Err(self.key_refused("registering a matched send on the new path"));
            }
        }
        Ok(replay)
    }

    /// The new path refused a send's buffer (`what` failed): the connection fails, saying so.
    fn key_refused(&mut self, what: &'static str) -> ProtoError {
        let e = ProtoError::Failed {
            status: WcStatus::LocProtErr,
            what,
        };
        self.fail(e.clone());
        e
    }

    /// Apply one completion of this connection's active path.
    pub fn on_completion(&mut self, c: &Completion) {
        let (kind, seq, index) = super::layout::decode_wr_id(c.wr_id);
        if c.status != WcStatus::Success {
            let what = match kind {
                Some(WrKind::Data) => "payload RDMA write",
                Some(WrKind::Record) if index == 1 => "payload RDMA write (with its record)",
                Some(WrKind::Record) if index == 2 => "eager write (header of a small send)",
                Some(WrKind::Record) => "completion-record write",
                Some(WrKind::Probe) => "keep-alive probe of the peer",
                _ => "send work request",
            };
            self.fail(ProtoError::Failed {
                status: c.status,
                what,
            });
            return;
        }
        if kind == Some(WrKind::Record) {
            let g = &mut self.groups[(seq % FIFO_DEPTH as u64) as usize];
            if g.state == GroupState::Posted && g.seq & ((1 << 48) - 1) == seq {
                if g.awaiting_cts {
                    g.acked = true;
                    return;
                }
                g.complete();
            }
        }
    }

    /// `Ok(Some(size))` when done, `Ok(None)` while pending; an error completes the request.
    pub fn test(&mut self, id: ReqId) -> Result<Option<u64>, ProtoError> {
        let req = self.reqs.get_mut(id).ok_or(ProtoError::BadRequest)?;
        let (seq, size) = (req.seq, req.size);
        let slot = (seq % FIFO_DEPTH as u64) as usize;
        let in_group = self.groups[slot].seq == seq && self.groups[slot].state != GroupState::Free;
        let outcome = if let Some(e) = req.error.clone() {
            Some(Err(e))
        } else if in_group && self.groups[slot].state == GroupState::Done {
            Some(Ok(size))
        } else {
            self.failed.clone().map(Err)
        };
        let Some(outcome) = outcome else {
            return Ok(None);
        };
        self.reqs.remove(id);
        if in_group {
            let g = &mut self.groups[slot];
            g.live -= 1;
            if g.live == 0 && (g.state == GroupState::Done || self.failed.is_some()) {
                g.state = GroupState::Free;
            }
        } else if let Some(m) = self.cur.as_mut().filter(|m| m.seq == seq) {
            m.finished_early += 1;
        }
        outcome.map(Some)
    }
}
