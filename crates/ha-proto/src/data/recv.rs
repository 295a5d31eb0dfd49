//! Receiver side of the data protocol: advertise buffers with CTS entries, complete
//! receives from WRITE_WITH_IMM completions and the sender's completion records. A
//! completion whose sequence number is not pending (already done) is dropped and counted.
//! With an eager ring, a small send may arrive before its receive is posted: it waits in its
//! eager slot, and the receive takes it (an [`EagerCopy`] for the driver) when it is posted.

use super::layout::{
    cts_word, data_imm, decode_wr_id, eager_imm, eager_slot_offset, encode_cts, fast_imm, is_eager,
    is_fast, read_record, wr_id, CtsEntry, EagerHeader, SharedWords, WrKind, CTS_SLOT_WORDS,
    EAGER_HEADER_BYTES, EAGER_MAX, EAGER_SLOTS, FIFO_DEPTH, MAX_RECVS, RECV_REGION_EAGER_WORDS,
    SIZE_TRUNCATED,
};
use super::{ProtoError, ReqId, Slab};
use crate::rc::{Completion, WcStatus};

/// What to post for one receive: a zero-length RECV with `recv_wr_id`, then an RDMA WRITE of
/// `cts` into the sender's FIFO at word `fifo_word` (slot `slot` of the current epoch's bank;
/// signaled, `cts_wr_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvPost {
    pub seq: u64,
    pub slot: usize,
    pub fifo_word: usize,
    pub cts: [u64; CTS_SLOT_WORDS],
    pub recv_wr_id: u64,
    pub cts_wr_id: u64,
    /// An eager send of this sequence number had already arrived: copy it now (the receive is
    /// done; the clear-to-send still goes, it tells the sender the eager slot is free).
    pub copy: Option<EagerCopy>,
}

/// A copy the driver makes before the receive it completes is reported: `len` bytes from byte
/// `from` of this side's region (an eager slot's payload) to address `to` (the receive's
/// buffer, host memory inside its registration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerCopy {
    /// The receive's FIFO slot (where the driver keeps its registration).
    pub slot: usize,
    pub from: usize,
    pub to: u64,
    pub len: usize,
}

enum State {
    Pending { seq: u64, entries: Vec<CtsEntry> },
    Done(Vec<u64>),
    Failed(ProtoError),
}

pub struct RecvSide {
    next_seq: u64,
    /// Path epoch: switches so far (which CTS bank, see the layout).
    epoch: u32,
    /// Request id occupying each FIFO slot.
    by_slot: Vec<Option<ReqId>>,
    reqs: Slab<State>,
    failed: Option<ProtoError>,
    duplicates: u64,
    /// Highest sequence number whose immediate arrived (deliveries are in order).
    delivered: u64,
    /// This side offered an eager ring.
    eager: bool,
    /// Eager sends delivered before their receive was posted, by eager slot.
    early: Vec<Option<EagerHeader>>,
}

impl Default for RecvSide {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvSide {
    pub fn new() -> Self {
        Self::starting_at(1)
    }

    /// A machine whose first sequence number is `seq` (≥ 1; tests start near wrap-arounds).
    pub fn starting_at(seq: u64) -> Self {
        let seq = seq.max(1);
        RecvSide {
            next_seq: seq,
            epoch: 0,
            by_slot: vec![None; FIFO_DEPTH],
            reqs: Slab::new(FIFO_DEPTH),
            failed: None,
            duplicates: 0,
            delivered: seq - 1,
            eager: false,
            early: vec![None; EAGER_SLOTS],
        }
    }

    /// This side's region holds an eager ring: small sends may arrive there.
    pub fn enable_eager(&mut self) {
        self.eager = true;
    }

    /// Whether this side offered an eager ring (then it takes one buffer per receive).
    pub fn eager(&self) -> bool {
        self.eager
    }

    pub fn failure(&self) -> Option<&ProtoError> {
        self.failed.as_ref()
    }

    pub fn fail(&mut self, e: ProtoError) {
        if self.failed.is_none() {
            self.failed = Some(e);
        }
    }

    /// Completions dropped because their sequence number was already done.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Highest sequence number delivered (its immediate arrived).
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Highest sequence number posted.
    pub fn posted_upto(&self) -> u64 {
        self.next_seq - 1
    }

    /// Receives posted but not delivered, in order: (seq, FIFO slot, advertised entries).
    /// After a switch of path their clear-to-sends are re-posted with the new path's keys.
    pub fn open_requests(&self) -> Vec<(u64, usize, Vec<CtsEntry>)> {
        let mut open: Vec<(u64, usize, Vec<CtsEntry>)> = self
            .by_slot
            .iter()
            .enumerate()
            .filter_map(|(slot, id)| {
                let id = (*id)?;
                match self.reqs.get(id)? {
                    State::Pending { seq, entries } if *seq > self.delivered => {
                        Some((*seq, slot, entries.clone()))
                    }
                    _ => None,
                }
            })
            .collect();
        open.sort_by_key(|o| o.0);
        open
    }

    /// Path epoch: how many switches this side went through.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// A switch of path begins (the old one is fenced and drained): clear-to-sends from now on,
    /// the re-posted ones first, belong to the next epoch (the other FIFO bank).
    pub fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Encode a re-posted clear-to-send for `seq` with `entries` (new keys) in the current
    /// epoch: the words and where they go in the sender's FIFO.
    pub fn repost(&self, seq: u64, entries: &[CtsEntry]) -> ([u64; CTS_SLOT_WORDS], usize) {
        let slot = (seq % FIFO_DEPTH as u64) as usize;
        (
            encode_cts(entries, seq, self.epoch),
            cts_word(self.epoch, slot),
        )
    }

    pub fn live_requests(&self) -> usize {
        self.reqs.live()
    }

    /// Post a (multi-)receive of 1..=8 buffers. `Ok(None)`: 32 receives outstanding, try later.
    pub fn post(&mut self, bufs: &[CtsEntry]) -> Result<Option<(ReqId, RecvPost)>, ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        assert!(
            (1..=MAX_RECVS).contains(&bufs.len()),
            "caller validates the receive count"
        );
        let seq = self.next_seq;
        let slot = (seq % FIFO_DEPTH as u64) as usize;
        if self.by_slot[slot].is_some() {
            return Ok(None);
        }
        let Some(id) = self.reqs.insert(State::Pending {
            seq,
            entries: bufs.to_vec(),
        }) else {
            return Ok(None);
        };
        self.by_slot[slot] = Some(id);
        self.next_seq += 1;
        let early = &mut self.early[(seq % EAGER_SLOTS as u64) as usize];
        let copy = match early.take_if(|h| h.seq == seq) {
            Some(h) => {
                let (state, copy) = take_eager(bufs, &h);
                *self.reqs.get_mut(id).expect("live") = state;
                copy
            }
            None => None,
        };
        Ok(Some((
            id,
            RecvPost {
                seq,
                slot,
                fifo_word: cts_word(self.epoch, slot),
                cts: encode_cts(bufs, seq, self.epoch),
                recv_wr_id: wr_id(WrKind::Recv, seq, 0),
                cts_wr_id: wr_id(WrKind::Cts, seq, 0),
                copy,
            },
        )))
    }

    /// An eager send arrived (`imm` is eager): its header is in `region`'s eager slot.
    fn on_eager(&mut self, imm: u32, region: &SharedWords) -> Option<EagerCopy> {
        let corrupt = |what| Some(ProtoError::CorruptRecord { what });
        if !self.eager || region.len_bytes() < RECV_REGION_EAGER_WORDS * 8 {
            // No ring to read (a peer that should not send eagerly): fail, never index past.
            self.fail(ProtoError::CorruptRecord {
                what: "is eager, but this side offered no eager ring",
            });
            return None;
        }
        let h = EagerHeader::read(region, u64::from(imm));
        let error = if eager_imm(h.seq) != imm {
            corrupt("of an eager send holds another sequence number")
        } else if h.size as usize > EAGER_MAX {
            corrupt("of an eager send is larger than its slot")
        } else if h.seq > self.posted_upto() + EAGER_SLOTS as u64 {
            corrupt("of an eager send is ahead of every free slot")
        } else {
            None
        };
        if let Some(e) = error {
            self.fail(e);
            return None;
        }
        let seq = h.seq;
        if seq > self.posted_upto() {
            // Not posted yet: it waits in its slot.
            let early = &mut self.early[(seq % EAGER_SLOTS as u64) as usize];
            if early.is_some_and(|e| e.seq == seq) {
                self.duplicates += 1;
                return None;
            }
            *early = Some(h);
            self.delivered = self.delivered.max(seq);
            return None;
        }
        let slot = (seq % FIFO_DEPTH as u64) as usize;
        let Some(id) = self.by_slot[slot] else {
            self.duplicates += 1;
            return None;
        };
        let Some(State::Pending { seq: s, entries }) = self.reqs.get(id) else {
            self.duplicates += 1;
            return None;
        };
        if *s != seq {
            self.duplicates += 1;
            return None;
        }
        let (state, copy) = take_eager(entries, &h);
        self.delivered = self.delivered.max(seq);
        *self.reqs.get_mut(id).expect("live") = state;
        copy
    }

    /// Apply one completion; `records` is this side's region (completion records first, the
    /// eager ring last). An eager send completing a receive gives the copy to make before the
    /// receive is reported.
    #[must_use = "an eager send's copy must be made before its receive is reported"]
    pub fn on_completion(&mut self, c: &Completion, records: &SharedWords) -> Option<EagerCopy> {
        let (kind, _, _) = decode_wr_id(c.wr_id);
        if c.status != WcStatus::Success {
            let what = match kind {
                Some(WrKind::Cts) => "clear-to-send write",
                Some(WrKind::Recv) => "receive",
                Some(WrKind::Probe) => "keep-alive probe of the peer",
                _ => "receive-side work request",
            };
            self.fail(ProtoError::Failed {
                status: c.status,
                what,
            });
            return None;
        }
        if kind != Some(WrKind::Recv) {
            return None;
        }
        let Some(imm) = c.imm else {
            self.fail(ProtoError::CorruptRecord {
                what: "arrived without an immediate",
            });
            return None;
        };
        if is_eager(imm) {
            return self.on_eager(imm, records);
        }
        let slot = imm as usize % FIFO_DEPTH;
        let Some(id) = self.by_slot[slot] else {
            self.duplicates += 1;
            return None;
        };
        let Some(State::Pending { seq, entries }) = self.reqs.get_mut(id) else {
            self.duplicates += 1;
            return None;
        };
        let fast = is_fast(imm);
        let expected = if fast { fast_imm(*seq) } else { data_imm(*seq) };
        if expected != imm {
            self.duplicates += 1;
            return None;
        }
        let seq = *seq;
        let caps: Vec<u64> = entries.iter().map(|e| e.size).collect();
        self.delivered = self.delivered.max(seq);
        if fast {
            // No record: a single receive, whose size is the bytes the write carried.
            let got = u64::from(c.byte_len);
            let next = if caps.len() != 1 {
                State::Failed(ProtoError::CorruptRecord {
                    what: "came in the immediate for a multi-receive",
                })
            } else if got == 0 {
                // A fast send is never empty: a device that reports no byte count must not
                // make NCCL see an empty receive (and skip its flush).
                State::Failed(ProtoError::CorruptRecord {
                    what: "came in the immediate with no bytes",
                })
            } else if got > caps[0] {
                State::Failed(ProtoError::CorruptRecord {
                    what: "reports more bytes than the buffer holds",
                })
            } else {
                State::Done(vec![got])
            };
            *self.reqs.get_mut(id).expect("live") = next;
            return None;
        }
        let rec = read_record(records, slot);
        let next = if rec.seq != seq {
            State::Failed(ProtoError::CorruptRecord {
                what: "holds another sequence number",
            })
        } else if rec.nreqs as usize != caps.len() {
            State::Failed(ProtoError::CorruptRecord {
                what: "has a wrong receive count",
            })
        } else if rec.sizes[..caps.len()].contains(&SIZE_TRUNCATED) {
            State::Failed(ProtoError::PeerTruncated)
        } else if rec.sizes.iter().zip(&caps).any(|(s, c)| s > c) {
            State::Failed(ProtoError::CorruptRecord {
                what: "reports more bytes than the buffer holds",
            })
        } else {
            State::Done(rec.sizes[..caps.len()].to_vec())
        };
        *self.reqs.get_mut(id).expect("live") = next;
        None
    }

    /// The driver could not make the copy of an eager send into the receive of FIFO slot
    /// `slot`: that receive fails (it must not be reported done), and the connection with it.
    pub fn copy_failed(&mut self, slot: usize) {
        let e = ProtoError::Failed {
            status: WcStatus::LocProtErr,
            what: "copying an eager send into its receive buffer",
        };
        if let Some(id) = self.by_slot.get(slot).copied().flatten() {
            if let Some(r) = self.reqs.get_mut(id) {
                *r = State::Failed(e.clone());
            }
        }
        self.fail(e);
    }

    /// `Ok(Some(sizes))` when done; an error completes the request.
    pub fn test(&mut self, id: ReqId) -> Result<Option<Vec<u64>>, ProtoError> {
        let outcome = match self.reqs.get_mut(id).ok_or(ProtoError::BadRequest)? {
            State::Pending { .. } => match &self.failed {
                None => return Ok(None),
                Some(e) => Err(e.clone()),
            },
            State::Done(sizes) => Ok(Some(std::mem::take(sizes))),
            State::Failed(e) => Err(e.clone()),
        };
        self.reqs.remove(id);
        if let Some(s) = self.by_slot.iter_mut().find(|s| **s == Some(id)) {
            *s = None;
        }
        outcome
    }
}

/// Match an eager send (header `h`) against receive buffers `bufs`: the receive's outcome,
/// and the copy into its buffer.
fn take_eager(bufs: &[CtsEntry], h: &EagerHeader) -> (State, Option<EagerCopy>) {
    let size = u64::from(h.size);
    let state = if bufs.len() != 1 {
        State::Failed(ProtoError::CorruptRecord {
            what:
                "of an eager send is for a multi-receive (eager sends need one buffer per receive)",
        })
    } else if bufs[0].tag != h.tag {
        State::Failed(ProtoError::TagMismatch(h.tag))
    } else if size > bufs[0].size {
        // This side's error when the sender's send is larger (as without eager sends); the
        // eager send itself completes (see `send/eager.rs`).
        State::Failed(ProtoError::PeerTruncated)
    } else {
        let copy = (size > 0).then(|| EagerCopy {
            slot: (h.seq % FIFO_DEPTH as u64) as usize,
            from: eager_slot_offset(h.seq) + EAGER_HEADER_BYTES,
            to: bufs[0].addr,
            len: size as usize,
        });
        return (State::Done(vec![size]), copy);
    };
    (state, None)
}
