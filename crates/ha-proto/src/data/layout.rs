//! Memory layouts shared by both ends of a connection, and the words that hold them.
//!
//! * **CTS FIFO** (in the sender, written by the receiver with RDMA WRITE): [`CTS_BANKS`] banks
//!   of [`FIFO_DEPTH`] slots of [`CTS_SLOT_WORDS`] u64 words: room for 8 entries of 4 words
//!   `{addr, size, rkey | tag << 32, 0}`, then `nreqs | epoch << 32`, then `seq` — last, so a
//!   reader that sees the expected `seq` sees the whole clear-to-send (the fabrics place a
//!   WRITE's final aligned word last; the slot's words before [`cts_span`] may be older). A
//!   clear-to-send of `n` entries puts them in the last `n` entry places and writes only
//!   [`cts_span`]`(n)`, `4n + 2` words: 48 bytes for one receive (what NCCL posts almost
//!   always; small enough to go inline on real NICs), 272 for eight. Clear-to-sends of path
//!   epoch `e` (the number of switches so far) go to bank `e % 2` and carry `e`: a stale
//!   clear-to-send of the old path landing late (before the sender fenced that path) lands in
//!   the other bank and can never overwrite the re-keyed one of the same sequence number; the
//!   sender only reads clear-to-sends of its own epoch.
//! * **Completion records** (in the receiver, written by the sender's WRITE_WITH_IMM):
//!   [`FIFO_DEPTH`] records of [`RECORD_WORDS`] words `{seq, nreqs | status << 32, sizes[8]}`.
//!   The immediate carries the low 30 bits of `seq`. A send to a single receive that is not
//!   truncated has no record: its one payload write is itself the WRITE_WITH_IMM, with a
//!   *fast* immediate, and the receive's size is the completion's byte count (one operation
//!   per message instead of two).
//! * **Eager ring** (in the receiver, after its mailbox, when it offers one: the handshake flag
//!   `EAGER`): [`EAGER_SLOTS`] slots of [`EAGER_SLOT_BYTES`]: a header `{seq, tag | size << 32}`
//!   then up to [`EAGER_MAX`] payload bytes. A small send need not wait for its clear-to-send:
//!   the sender writes the payload into slot `seq % EAGER_SLOTS`, then the header with a
//!   WRITE_WITH_IMM whose immediate has the eager bit; the receiver copies the payload into the
//!   receive's buffer when both are there (see `send.rs` for when a slot is free again).
//! * **Immediates**: a data immediate is `seq & 0x1fff_ffff`, with bit 30 set when it is fast
//!   (the record is the immediate) or bit 29 when it is eager (the record is the eager slot's
//!   header); a control immediate has the top bit set:
//!   `1 << 31 | mailbox slot << 24 | control sequence (24 bits)`.
//! * **Control mailbox** (after the FIFO in the sender's region, after the records in the
//!   receiver's): [`MAILBOX_SLOTS`] messages of [`CTRL_WORDS`] words, written with
//!   WRITE_WITH_IMM over whichever path is alive (switch handshake, re-arm, planned switch,
//!   drain state).
//! * `wr_id`: `kind << 56 | index << 48 | seq (48 bits)`.

use std::sync::atomic::{AtomicU64, Ordering};

pub const FIFO_DEPTH: usize = 32;
pub const MAX_RECVS: usize = 8;
pub const CTS_ENTRY_WORDS: usize = 4;
pub const CTS_SLOT_WORDS: usize = MAX_RECVS * CTS_ENTRY_WORDS + 2;
pub const CTS_SLOT_BYTES: usize = CTS_SLOT_WORDS * 8;
pub const RECORD_WORDS: usize = 2 + MAX_RECVS;
pub const RECORD_BYTES: usize = RECORD_WORDS * 8;
/// Record size meaning "this send was larger than the receive buffer".
pub const SIZE_TRUNCATED: u64 = u64::MAX;

pub const MAILBOX_SLOTS: usize = 8;
pub const CTRL_WORDS: usize = 16;
pub const MAILBOX_WORDS: usize = MAILBOX_SLOTS * CTRL_WORDS;
/// Banks of the CTS FIFO (alternating with the path epoch).
pub const CTS_BANKS: usize = 2;
/// Words of the whole CTS FIFO (every bank).
pub const CTS_FIFO_WORDS: usize = CTS_BANKS * FIFO_DEPTH * CTS_SLOT_WORDS;
/// Words of the sender's remotely written region: CTS FIFO, then mailbox.
pub const SEND_REGION_WORDS: usize = CTS_FIFO_WORDS + MAILBOX_WORDS;
/// Words of the receiver's remotely written region: completion records, then mailbox.
pub const RECV_REGION_WORDS: usize = FIFO_DEPTH * RECORD_WORDS + MAILBOX_WORDS;
/// Slots of the eager ring: twice the FIFO, so a slot is free again once a clear-to-send 32
/// sequence numbers later was seen (see `send.rs`).
pub const EAGER_SLOTS: usize = 2 * FIFO_DEPTH;
/// Header bytes of an eager slot (`{seq, tag | size << 32}`, padded to a cache line).
pub const EAGER_HEADER_BYTES: usize = 64;
/// Largest payload an eager slot holds.
pub const EAGER_MAX: usize = 4096;
pub const EAGER_SLOT_BYTES: usize = EAGER_HEADER_BYTES + EAGER_MAX;
/// Words of the eager ring.
pub const EAGER_RING_WORDS: usize = EAGER_SLOTS * EAGER_SLOT_BYTES / 8;
/// Words of the receiver's region with an eager ring (records, mailbox, ring).
pub const RECV_REGION_EAGER_WORDS: usize = RECV_REGION_WORDS + EAGER_RING_WORDS;
const CTRL_BIT: u32 = 1 << 31;
/// A data immediate with this bit carries the whole record (see the module doc).
const FAST_BIT: u32 = 1 << 30;
/// A data immediate with this bit announces an eager slot's header (see the module doc).
const EAGER_BIT: u32 = 1 << 29;
/// Bits of `seq` a data immediate carries.
const SEQ_BITS: u64 = 0x1fff_ffff;

/// The immediate of data sequence number `seq` whose record is in the receiver's slot.
pub fn data_imm(seq: u64) -> u32 {
    (seq & SEQ_BITS) as u32
}

/// The immediate of data sequence number `seq` sent without a record (a single receive; its
/// size is the completion's byte count).
pub fn fast_imm(seq: u64) -> u32 {
    FAST_BIT | data_imm(seq)
}

/// Whether a data immediate is fast (carries the record itself).
pub fn is_fast(imm: u32) -> bool {
    imm & (CTRL_BIT | FAST_BIT | EAGER_BIT) == FAST_BIT
}

/// The immediate of data sequence number `seq` sent eagerly (its header is in eager slot
/// `seq % EAGER_SLOTS`).
pub fn eager_imm(seq: u64) -> u32 {
    EAGER_BIT | data_imm(seq)
}

/// Whether a data immediate is eager.
pub fn is_eager(imm: u32) -> bool {
    imm & (CTRL_BIT | FAST_BIT | EAGER_BIT) == EAGER_BIT
}

/// Byte offset of eager slot `seq % EAGER_SLOTS` in the receiver's region (its header; the
/// payload follows at [`EAGER_HEADER_BYTES`]).
pub fn eager_slot_offset(seq: u64) -> usize {
    RECV_REGION_WORDS * 8 + (seq % EAGER_SLOTS as u64) as usize * EAGER_SLOT_BYTES
}

/// An eager slot's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EagerHeader {
    pub seq: u64,
    pub tag: i32,
    pub size: u32,
}

impl EagerHeader {
    pub const WORDS: usize = 2;
    pub fn encode(&self) -> [u64; Self::WORDS] {
        [
            self.seq,
            u64::from(self.tag as u32) | (u64::from(self.size) << 32),
        ]
    }
    /// The header of eager slot `seq % EAGER_SLOTS` in a receiver's region.
    pub fn read(region: &SharedWords, seq: u64) -> EagerHeader {
        let w = eager_slot_offset(seq) / 8;
        let w1 = region.load(w + 1);
        EagerHeader {
            seq: region.load(w),
            tag: w1 as u32 as i32,
            size: (w1 >> 32) as u32,
        }
    }
}

/// Control immediate for mailbox `slot`, control sequence `n`.
pub fn ctrl_imm(slot: usize, n: u64) -> u32 {
    CTRL_BIT | ((slot as u32 & 7) << 24) | (n as u32 & 0x00ff_ffff)
}

/// `Some(mailbox slot)` when `imm` is a control immediate.
pub fn ctrl_slot(imm: u32) -> Option<usize> {
    (imm & CTRL_BIT != 0).then_some(((imm >> 24) & 7) as usize)
}

/// Kinds of control messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlKind {
    /// Receiver → sender: "my primary is fenced; I delivered up to `a`, posted up to `b`; the
    /// open clear-to-sends were re-posted on the new path".
    Switch = 1,
    /// Sender → receiver: "my path failed, fence yours and tell me what you delivered".
    SwitchReq = 2,
    /// Sender → receiver: "here is a new queue pair for path `a`" (endpoint), attempt `b`.
    Rearm = 3,
    /// Receiver → sender: "my new queue pair for path `a`" (endpoint), answering attempt `b`;
    /// an empty endpoint refuses the attempt (the receiver's port of that path is down).
    RearmAck = 4,
    /// Sender → receiver, over the re-armed path itself: "my end of path `a` is connected"
    /// (attempt `b`). Its completions verify the new path on both sides.
    RearmDone = 5,
    /// Sender → receiver, over the active path once everything it posted there completed:
    /// "I stopped posting on the active path; my sends up to `a` completed there; switch to
    /// path `b`" (a planned switch: no fence, no replay). The receiver answers with `Switch`
    /// over path `b` (after re-posting its open clear-to-sends there) or `PlanNak`.
    PlanReq = 6,
    /// Receiver → sender, over the active path: "not now" (the target is down, drained or
    /// failed on this side; reason code `a`). The sender resumes on the active path.
    PlanNak = 7,
    /// Receiver → sender: "paths in mask `a` are on devices drained on my node" (`b`: a
    /// counter, the highest one wins).
    DrainState = 8,
}

/// A control message (at most 64 endpoint bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtrlMsg {
    pub kind: CtrlKind,
    pub epoch: u32,
    pub a: u64,
    pub b: u64,
    pub endpoint: Vec<u8>,
}

impl CtrlMsg {
    pub fn encode(&self, n: u64) -> [u64; CTRL_WORDS] {
        let mut w = [0u64; CTRL_WORDS];
        w[0] = self.kind as u64 | ((self.epoch as u64) << 32);
        w[1] = self.a;
        w[2] = self.b;
        w[3] = self.endpoint.len().min(64) as u64;
        for (i, chunk) in self.endpoint.chunks(8).take(8).enumerate() {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            w[4 + i] = u64::from_le_bytes(b);
        }
        w[CTRL_WORDS - 1] = n;
        w
    }

    /// Decode mailbox slot `slot` of `region` starting at word `base`; `None` if malformed.
    pub fn read(region: &SharedWords, base: usize, slot: usize) -> Option<CtrlMsg> {
        let b = base + slot * CTRL_WORDS;
        let w0 = region.load(b);
        let kind = match w0 as u32 {
            1 => CtrlKind::Switch,
            2 => CtrlKind::SwitchReq,
            3 => CtrlKind::Rearm,
            4 => CtrlKind::RearmAck,
            5 => CtrlKind::RearmDone,
            6 => CtrlKind::PlanReq,
            7 => CtrlKind::PlanNak,
            8 => CtrlKind::DrainState,
            _ => return None,
        };
        let len = region.load(b + 3) as usize;
        if len > 64 {
            return None;
        }
        let mut endpoint = Vec::with_capacity(len);
        for i in 0..len.div_ceil(8) {
            endpoint.extend_from_slice(&region.load(b + 4 + i).to_le_bytes());
        }
        endpoint.truncate(len);
        Some(CtrlMsg {
            kind,
            epoch: (w0 >> 32) as u32,
            a: region.load(b + 1),
            b: region.load(b + 2),
            endpoint,
        })
    }
}

/// Word-addressed memory shared with the fabric (registered, remotely written or read).
/// Its address never changes while it lives.
pub struct SharedWords {
    words: Box<[AtomicU64]>,
}

impl SharedWords {
    pub fn new(n: usize) -> Self {
        SharedWords {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    pub fn addr(&self) -> usize {
        self.words.as_ptr() as usize
    }
    pub fn len_bytes(&self) -> usize {
        self.words.len() * 8
    }
    pub fn load(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }
    pub fn load_acquire(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Acquire)
    }
    pub fn store(&self, i: usize, v: u64) {
        self.words[i].store(v, Ordering::Relaxed)
    }
    pub fn store_release(&self, i: usize, v: u64) {
        self.words[i].store(v, Ordering::Release)
    }
    /// Land clear-to-send `cts` (from [`encode_cts`]) at word `at` as its WRITE does: only the
    /// words it carries ([`cts_written`]). For simulators of the wire (tests, fuzz targets).
    pub fn land_cts(&self, at: usize, cts: &[u64; CTS_SLOT_WORDS]) {
        for k in cts_written(cts) {
            self.store(at + k, cts[k]);
        }
    }
}

/// One receive buffer as advertised in a CTS entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CtsEntry {
    pub addr: u64,
    pub size: u64,
    pub rkey: u32,
    pub tag: i32,
}

/// First word of FIFO slot `slot` for clear-to-sends of path epoch `epoch`.
pub fn cts_word(epoch: u32, slot: usize) -> usize {
    ((epoch as usize % CTS_BANKS) * FIFO_DEPTH + slot % FIFO_DEPTH) * CTS_SLOT_WORDS
}

/// The words of a CTS slot that a clear-to-send of `n` entries (1..=8) fills, and so the only
/// ones its WRITE carries: its entries (the last `n` entry places), then nreqs and the epoch,
/// then seq. An `n` out of range gives the whole slot.
pub fn cts_span(n: usize) -> std::ops::Range<usize> {
    let n = if (1..=MAX_RECVS).contains(&n) {
        n
    } else {
        MAX_RECVS
    };
    (MAX_RECVS - n) * CTS_ENTRY_WORDS..CTS_SLOT_WORDS
}

/// The words of an encoded clear-to-send (from [`encode_cts`]) that its WRITE carries.
pub fn cts_written(cts: &[u64; CTS_SLOT_WORDS]) -> std::ops::Range<usize> {
    cts_span((cts[CTS_SLOT_WORDS - 2] & 0xffff_ffff) as usize)
}

/// Encode a CTS slot of path epoch `epoch`: the entries in the last `entries.len()` entry
/// places, then nreqs and the epoch, then seq (see [`cts_span`]).
pub fn encode_cts(entries: &[CtsEntry], seq: u64, epoch: u32) -> [u64; CTS_SLOT_WORDS] {
    let mut w = [0u64; CTS_SLOT_WORDS];
    let first = cts_span(entries.len()).start;
    for (i, e) in entries.iter().enumerate() {
        let b = first + i * CTS_ENTRY_WORDS;
        w[b] = e.addr;
        w[b + 1] = e.size;
        w[b + 2] = e.rkey as u64 | ((e.tag as u32 as u64) << 32);
    }
    w[CTS_SLOT_WORDS - 2] = entries.len() as u64 | (u64::from(epoch) << 32);
    w[CTS_SLOT_WORDS - 1] = seq;
    w
}

/// The sequence number in slot `slot` of path epoch `epoch`'s CTS bank (0: none of this epoch
/// yet). Tells the sender how far the receiver has posted without reading the entries.
pub fn cts_seq(fifo: &SharedWords, epoch: u32, slot: usize) -> u64 {
    let base = cts_word(epoch, slot);
    let seq = fifo.load_acquire(base + CTS_SLOT_WORDS - 1);
    if (fifo.load(base + CTS_SLOT_WORDS - 2) >> 32) as u32 != epoch {
        return 0;
    }
    seq
}

/// Read slot `slot` of path epoch `epoch`'s CTS bank if it carries `seq` and `epoch`; `None` if
/// not posted yet (or only by an older path). A slot with an impossible entry count is
/// reported as `Err(nreqs)`.
pub fn read_cts(
    fifo: &SharedWords,
    epoch: u32,
    slot: usize,
    seq: u64,
) -> Result<Option<Vec<CtsEntry>>, u64> {
    let base = cts_word(epoch, slot);
    if fifo.load_acquire(base + CTS_SLOT_WORDS - 1) != seq {
        return Ok(None);
    }
    let w = fifo.load(base + CTS_SLOT_WORDS - 2);
    if (w >> 32) as u32 != epoch {
        return Ok(None);
    }
    let n = w & 0xffff_ffff;
    if n == 0 || n as usize > MAX_RECVS {
        return Err(n);
    }
    let first = base + cts_span(n as usize).start;
    Ok(Some(
        (0..n as usize)
            .map(|i| {
                let b = first + i * CTS_ENTRY_WORDS;
                let w2 = fifo.load(b + 2);
                CtsEntry {
                    addr: fifo.load(b),
                    size: fifo.load(b + 1),
                    rkey: w2 as u32,
                    tag: (w2 >> 32) as u32 as i32,
                }
            })
            .collect(),
    ))
}

/// A completion record as the receiver reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub nreqs: u32,
    pub status: u32,
    pub sizes: [u64; MAX_RECVS],
}

pub fn encode_record(r: &Record) -> [u64; RECORD_WORDS] {
    let mut w = [0u64; RECORD_WORDS];
    w[0] = r.seq;
    w[1] = r.nreqs as u64 | ((r.status as u64) << 32);
    w[2..].copy_from_slice(&r.sizes);
    w
}

pub fn read_record(recs: &SharedWords, slot: usize) -> Record {
    let b = slot * RECORD_WORDS;
    let w1 = recs.load(b + 1);
    let mut sizes = [0u64; MAX_RECVS];
    for (i, s) in sizes.iter_mut().enumerate() {
        *s = recs.load(b + 2 + i);
    }
    Record {
        seq: recs.load(b),
        nreqs: w1 as u32,
        status: (w1 >> 32) as u32,
        sizes,
    }
}

/// What a work request was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrKind {
    Cts = 1,
    Data = 2,
    Record = 3,
    Recv = 4,
    /// A zero-length keep-alive write probing the peer.
    Probe = 5,
    /// A control message (switch handshake, re-arm).
    Ctrl = 6,
}

const SEQ_MASK: u64 = (1 << 48) - 1;

pub fn wr_id(kind: WrKind, seq: u64, index: u8) -> u64 {
    ((kind as u64) << 56) | ((index as u64) << 48) | (seq & SEQ_MASK)
}

/// `(kind, seq (48 bits), index)`; `None` kind for ids this transport never issued.
pub fn decode_wr_id(id: u64) -> (Option<WrKind>, u64, u8) {
    let kind = match id >> 56 {
        1 => Some(WrKind::Cts),
        2 => Some(WrKind::Data),
        3 => Some(WrKind::Record),
        4 => Some(WrKind::Recv),
        5 => Some(WrKind::Probe),
        6 => Some(WrKind::Ctrl),
        _ => None,
    };
    (kind, id & SEQ_MASK, (id >> 48) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cts_roundtrip_through_shared_words() {
        let fifo = SharedWords::new(CTS_FIFO_WORDS);
        let entries = vec![
            CtsEntry {
                addr: 0x1000,
                size: 77,
                rkey: 0xabcd,
                tag: -3,
            },
            CtsEntry {
                addr: 0x2000,
                size: 0,
                rkey: 1,
                tag: 7,
            },
        ];
        let words = encode_cts(&entries, 9, 3);
        for (i, w) in words.iter().enumerate() {
            fifo.store(cts_word(3, 5) + i, *w);
        }
        assert_eq!(
            cts_word(3, 5),
            (FIFO_DEPTH + 5) * CTS_SLOT_WORDS,
            "odd epoch: bank 1"
        );
        assert_eq!(
            read_cts(&fifo, 3, 5, 8),
            Ok(None),
            "wrong seq is not posted"
        );
        assert_eq!(
            read_cts(&fifo, 1, 5, 9),
            Ok(None),
            "another epoch's is not posted"
        );
        assert_eq!(
            read_cts(&fifo, 0, 5, 9),
            Ok(None),
            "the other bank is empty"
        );
        assert_eq!(read_cts(&fifo, 3, 5, 9), Ok(Some(entries)));
        fifo.store(cts_word(3, 5) + CTS_SLOT_WORDS - 2, 9 | 3 << 32);
        assert_eq!(read_cts(&fifo, 3, 5, 9), Err(9));
    }

    #[test]
    fn a_clear_to_send_writes_only_its_entries_and_the_tail_words() {
        let entry = |k: u64| CtsEntry {
            addr: 0x1000 * k,
            size: k,
            rkey: k as u32,
            tag: -(k as i32),
        };
        assert_eq!(cts_span(1), 28..34, "one receive: 6 words, 48 bytes");
        assert_eq!(cts_span(8), 0..CTS_SLOT_WORDS, "eight: the whole slot");
        assert_eq!(
            cts_span(0),
            0..CTS_SLOT_WORDS,
            "out of range: the whole slot"
        );
        assert_eq!(cts_span(9), 0..CTS_SLOT_WORDS);
        let fifo = SharedWords::new(CTS_FIFO_WORDS);
        let base = cts_word(0, 2);
        // The slot last held an eight-receive clear-to-send of an older sequence number.
        let old: Vec<CtsEntry> = (1..=8).map(entry).collect();
        for (i, w) in encode_cts(&old, 2, 0).iter().enumerate() {
            fifo.store(base + i, *w);
        }
        assert_eq!(read_cts(&fifo, 0, 2, 2), Ok(Some(old)));
        for n in 1..=MAX_RECVS {
            let seq = 2 + 32 * n as u64;
            let new: Vec<CtsEntry> = (0..n as u64).map(|k| entry(100 + k)).collect();
            let words = encode_cts(&new, seq, 0);
            let span = cts_span(n);
            assert_eq!(span.len(), CTS_ENTRY_WORDS * n + 2);
            assert!(
                words[..span.start].iter().all(|&w| w == 0),
                "nothing outside the span"
            );
            // Only the span reaches the FIFO; the older words before it stay.
            for i in span {
                fifo.store(base + i, words[i]);
            }
            assert_eq!(read_cts(&fifo, 0, 2, seq), Ok(Some(new)), "{n} receives");
        }
    }

    #[test]
    fn record_and_wr_id_roundtrip() {
        let recs = SharedWords::new(FIFO_DEPTH * RECORD_WORDS);
        let r = Record {
            seq: 1 << 40,
            nreqs: 3,
            status: 0,
            sizes: [1, 2, SIZE_TRUNCATED, 0, 0, 0, 0, 0],
        };
        for (i, w) in encode_record(&r).iter().enumerate() {
            recs.store(31 * RECORD_WORDS + i, *w);
        }
        assert_eq!(read_record(&recs, 31), r);
        let id = wr_id(WrKind::Data, (1 << 47) + 5, 7);
        assert_eq!(decode_wr_id(id), (Some(WrKind::Data), (1 << 47) + 5, 7));
        assert_eq!(decode_wr_id(0).0, None);
    }
}
