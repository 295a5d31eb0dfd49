//! Failover of the data protocol, driven with no fabric: a simulated path (ordered, with
//! payloads, immediates, completion records and ACKs in flight) fails at a random step, up to
//! three times in a row; a random prefix of what was in flight still lands ("late packets")
//! before each side fences, and stale clear-to-sends of the old path may even land after the
//! re-keyed ones (the sender fences later than the receiver); then the switch handshake runs
//! over the new path (re-posted clear-to-sends, `Switch{H}`) and the sender replays. Up to 48
//! (multi-)receives of 1..=8 buffers, sizes from 0, so FIFO slots are reused; sequence numbers
//! start at 1 or just below the immediate's (2^29 sequence bits; 2^31 crosses that wrap too) or
//! the work-request id's (2^48) wrap-around. With eager sends on (single receives), sends may go
//! before their receive is posted, into the receiver's eager ring, and are copied out of it.
//! Checked: every request completes exactly once with the right size, every buffer holds
//! exactly its bytes, nothing is written into a buffer after its receive completed, and each
//! path only ever sees keys valid on that path.

use super::layout::*;
use super::recv::EagerCopy;
use super::recv::RecvSide;
use super::send::{EagerCfg, SendArgs, SendSide};
use super::ReqId;
use crate::rc::{Completion, WcOpcode, WcStatus};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet, VecDeque};

/// The keys valid on the path of epoch `e`.
pub(super) fn key_of(epoch: u32) -> u32 {
    epoch + 1
}

#[derive(Clone, Debug)]
pub(super) enum Msg {
    Cts {
        word: usize,
        words: [u64; CTS_SLOT_WORDS],
    },
    Data {
        addr: u64,
        rkey: u32,
        bytes: Vec<u8>,
    },
    /// The completion record, or (`fast`) the immediate that is the record: the receive
    /// completes with `imm` and `len` bytes and nothing lands in the record slot. `eager`:
    /// the record is an eager slot's header, landing at that address of the region.
    Record {
        slot: usize,
        words: [u64; RECORD_WORDS],
        seq: u64,
        imm: u32,
        len: u32,
        fast: bool,
        eager: Option<u64>,
    },
    Ack {
        seq: u64,
    },
}

#[derive(Default)]
pub(super) struct Wire {
    pub(super) to_s: VecDeque<Msg>,
    pub(super) to_r: VecDeque<Msg>,
    pub(super) acks: VecDeque<Msg>,
}

struct Round {
    bufs: Vec<CtsEntry>,
    msgs: Vec<Vec<u8>>,
    rid: Option<ReqId>,
    sids: Vec<(ReqId, u64)>,
    next_send: usize,
    recv_done: bool,
    sends_done: usize,
}

pub(super) struct Sim {
    pub(super) s: SendSide,
    pub(super) r: RecvSide,
    pub(super) fifo: SharedWords,
    records: SharedWords,
    pub(super) wire: Wire,
    pub(super) key: u32,
    mem: HashMap<u64, Vec<u8>>,
    completed: HashSet<u64>,
    rounds: Vec<Round>,
    posted: usize,
    pub(super) violations: Vec<String>,
    /// Eager sends on: sends may go before their receive is posted.
    eager: bool,
}

/// Where the receiver's region lies in the simulated address space (eager writes land there).
const REGION: u64 = 1 << 50;

fn write_bytes(w: &SharedWords, off: usize, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        let o = off + i;
        let mut word = w.load(o / 8).to_le_bytes();
        word[o % 8] = *b;
        w.store(o / 8, u64::from_le_bytes(word));
    }
}

fn read_bytes(w: &SharedWords, off: usize, len: usize) -> Vec<u8> {
    (off..off + len)
        .map(|o| w.load(o / 8).to_le_bytes()[o % 8])
        .collect()
}

fn completion(seq: u64) -> Completion {
    Completion {
        wr_id: wr_id(WrKind::Recv, 0, 0),
        qp_num: 1,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: RECORD_BYTES as u32,
        imm: Some(data_imm(seq)),
    }
}

impl Sim {
    pub(super) fn new(plan: &[(usize, u64)], start: u64) -> Sim {
        let rounds = plan
            .iter()
            .enumerate()
            .map(|(k, &(n, seed))| {
                let bufs = (0..n)
                    .map(|i| CtsEntry {
                        addr: ((k as u64) << 8) | i as u64,
                        size: 48,
                        rkey: 0,
                        tag: i as i32,
                    })
                    .collect();
                let msgs = (0..n)
                    .map(|i| {
                        let len = ((seed >> (i * 6)) % 49) as usize;
                        (0..len).map(|b| (k * 31 + i * 7 + b) as u8).collect()
                    })
                    .collect();
                Round {
                    bufs,
                    msgs,
                    rid: None,
                    sids: Vec::new(),
                    next_send: 0,
                    recv_done: false,
                    sends_done: 0,
                }
            })
            .collect();
        Sim {
            s: SendSide::starting_at(start),
            r: RecvSide::starting_at(start),
            fifo: SharedWords::new(SEND_REGION_WORDS),
            records: SharedWords::new(RECV_REGION_WORDS),
            wire: Wire::default(),
            key: key_of(0),
            mem: HashMap::new(),
            completed: HashSet::new(),
            rounds,
            posted: 0,
            violations: Vec::new(),
            eager: false,
        }
    }

    /// Single receives (`plan`'s counts are ignored), eager sends of at most `max` bytes.
    pub(super) fn with_eager(plan: &[(usize, u64)], start: u64, max: u64) -> Sim {
        let single: Vec<(usize, u64)> = plan.iter().map(|&(_, seed)| (1, seed)).collect();
        let mut sim = Sim::new(&single, start);
        sim.records = SharedWords::new(RECV_REGION_EAGER_WORDS);
        sim.r.enable_eager();
        sim.s.enable_eager(EagerCfg {
            region_addr: REGION,
            max,
        });
        sim.eager = true;
        sim
    }

    /// The receiver copies an eager send out of its ring into the receive's buffer.
    fn copy(&mut self, c: Option<EagerCopy>) {
        let Some(c) = c else { return };
        if self.completed.contains(&c.to) {
            self.violations
                .push(format!("copy into {:#x} after its receive completed", c.to));
        }
        let bytes = read_bytes(&self.records, c.from, c.len);
        self.mem.get_mut(&c.to).expect("buffer")[..c.len].copy_from_slice(&bytes);
    }

    pub(super) fn post_recv(&mut self) {
        let outstanding = self.rounds[..self.posted]
            .iter()
            .filter(|r| !r.recv_done)
            .count();
        if self.posted == self.rounds.len() || outstanding >= 8 {
            return;
        }
        let key = self.key;
        let round = &mut self.rounds[self.posted];
        let bufs: Vec<CtsEntry> = round
            .bufs
            .iter()
            .map(|b| CtsEntry { rkey: key, ..*b })
            .collect();
        for b in &bufs {
            self.mem.insert(b.addr, vec![0; b.size as usize]);
        }
        let (rid, p) = self.r.post(&bufs).unwrap().expect("slot free");
        round.rid = Some(rid);
        let copy = p.copy;
        self.wire.to_s.push_back(Msg::Cts {
            word: p.fifo_word,
            words: p.cts,
        });
        self.posted += 1;
        self.copy(copy);
    }

    /// The clear-to-send's WRITE lands: only the words it carries (`cts_written`).
    pub(super) fn land_cts(&mut self, word: usize, words: &[u64; CTS_SLOT_WORDS]) {
        self.fifo.land_cts(word, words);
    }

    fn isend(&mut self) {
        let key = self.key;
        // With eager sends, a send may go before its receive is posted.
        let upto = if self.eager {
            self.rounds.len()
        } else {
            self.posted
        };
        let Some(k) = self.rounds[..upto]
            .iter()
            .position(|r| r.next_send < r.msgs.len())
        else {
            return;
        };
        let round = &mut self.rounds[k];
        // Sends of a multi-recv go out in reverse tag order.
        let i = round.msgs.len() - 1 - round.next_send;
        let args = SendArgs {
            addr: (1 << 40) | round.bufs[i].addr,
            size: round.msgs[i].len() as u64,
            tag: i as i32,
            lkey: key,
        };
        match self.s.isend(&self.fifo, args).unwrap() {
            None => {}
            Some((id, batch)) => {
                round.sids.push((id, args.size));
                round.next_send += 1;
                if let Some(b) = batch {
                    self.enqueue_batch(&b);
                }
            }
        }
    }

    fn enqueue_batch(&mut self, b: &super::send::SendBatch) {
        for w in &b.writes {
            let (k, i) = ((w.local_addr & 0xffff_ffff) >> 8, w.local_addr & 0xff);
            if w.lkey != self.key {
                self.violations.push(format!(
                    "seq {} posted with lkey {} on path {}",
                    b.seq, w.lkey, self.key
                ));
            }
            let bytes = self.rounds[k as usize].msgs[i as usize][..w.len as usize].to_vec();
            self.wire.to_r.push_back(Msg::Data {
                addr: w.remote_addr,
                // An eager write uses the key of the receiver's region on this path (the
                // driver's part).
                rkey: if b.eager.is_some() { self.key } else { w.rkey },
                bytes,
            });
        }
        self.wire.to_r.push_back(Msg::Record {
            slot: b.slot(),
            words: b.record,
            seq: b.seq,
            imm: b.imm(),
            len: if b.fast {
                b.writes[0].len as u32
            } else {
                RECORD_BYTES as u32
            },
            fast: b.fast,
            eager: b.eager,
        });
    }

    /// Land one message on the receiver.
    pub(super) fn land_at_r(&mut self, m: Msg) {
        match m {
            Msg::Data { addr, rkey, bytes } => {
                if rkey != self.key {
                    self.violations.push(format!(
                        "write to {addr:#x} with key {rkey} on path {}",
                        self.key
                    ));
                    return;
                }
                if addr >= REGION {
                    write_bytes(&self.records, (addr - REGION) as usize, &bytes);
                    return;
                }
                if self.completed.contains(&addr) {
                    self.violations
                        .push(format!("write into {addr:#x} after its receive completed"));
                }
                self.mem.get_mut(&addr).expect("buffer")[..bytes.len()].copy_from_slice(&bytes);
            }
            Msg::Record {
                slot,
                words,
                seq,
                imm,
                len,
                fast,
                eager,
            } => {
                if let Some(at) = eager {
                    let header = &words[..EagerHeader::WORDS];
                    for (i, w) in header.iter().enumerate() {
                        self.records.store((at - REGION) as usize / 8 + i, *w);
                    }
                } else if !fast {
                    for (i, w) in words.iter().enumerate() {
                        self.records.store(slot * RECORD_WORDS + i, *w);
                    }
                }
                let c = Completion {
                    imm: Some(imm),
                    byte_len: len,
                    ..completion(seq)
                };
                let copy = self.r.on_completion(&c, &self.records);
                self.copy(copy);
                self.wire.acks.push_back(Msg::Ack { seq });
            }
            _ => unreachable!(),
        }
    }

    pub(super) fn ack(&mut self, seq: u64) {
        self.s.on_completion(&Completion {
            wr_id: wr_id(WrKind::Record, seq, 0),
            qp_num: 2,
            status: WcStatus::Success,
            opcode: WcOpcode::RdmaWrite,
            byte_len: RECORD_BYTES as u32,
            imm: None,
        });
    }

    fn test_recv(&mut self) {
        let Some(k) = self.rounds[..self.posted].iter().position(|r| !r.recv_done) else {
            return;
        };
        let round = &mut self.rounds[k];
        if let Some(sizes) = self.r.test(round.rid.unwrap()).unwrap() {
            round.recv_done = true;
            for (i, b) in round.bufs.iter().enumerate() {
                let want = &round.msgs[i];
                if sizes[i] != want.len() as u64 {
                    self.violations
                        .push(format!("round {k} buf {i}: size {}", sizes[i]));
                }
                if &self.mem[&b.addr][..want.len()] != want.as_slice() {
                    self.violations
                        .push(format!("round {k} buf {i}: bytes differ"));
                }
                self.completed.insert(b.addr);
            }
        }
    }

    fn test_send(&mut self) {
        self.s.confirm_eager(&self.fifo);
        for round in self.rounds.iter_mut() {
            let mut still = Vec::new();
            for (id, size) in round.sids.drain(..) {
                match self.s.test(id).unwrap() {
                    Some(got) => {
                        assert_eq!(got, size);
                        round.sends_done += 1;
                    }
                    None => still.push((id, size)),
                }
            }
            round.sids = still;
        }
    }

    pub(super) fn step(&mut self, choice: u8) {
        match choice % 7 {
            0 => self.post_recv(),
            1 => {
                if let Some(Msg::Cts { word, words }) = self.wire.to_s.pop_front() {
                    self.land_cts(word, &words);
                }
            }
            2 => self.isend(),
            3 => {
                if let Some(m) = self.wire.to_r.pop_front() {
                    self.land_at_r(m);
                }
            }
            4 => {
                if let Some(Msg::Ack { seq }) = self.wire.acks.pop_front() {
                    self.ack(seq);
                }
            }
            5 => self.test_recv(),
            _ => self.test_send(),
        }
    }

    /// The path dies: `late_*` messages still land before each side fences, the rest is lost,
    /// except up to `stale_cts` clear-to-sends of the old path that reach the sender after the
    /// receiver re-posted them with new keys (the sender has not fenced yet). Then the switch
    /// handshake over the new path and the replay.
    pub(super) fn fail_and_switch(
        &mut self,
        late_cts: usize,
        late_data: usize,
        late_acks: usize,
        stale_cts: usize,
    ) {
        let mut old = std::mem::take(&mut self.wire);
        for _ in 0..late_data.min(old.to_r.len()) {
            let m = old.to_r.pop_front().unwrap();
            self.land_at_r(m);
        }
        // Acks of records that landed late may also arrive.
        old.acks.extend(self.wire.acks.drain(..));
        for _ in 0..late_cts.min(old.to_s.len()) {
            if let Some(Msg::Cts { word, words }) = old.to_s.pop_front() {
                self.land_cts(word, &words);
            }
        }
        for _ in 0..late_acks.min(old.acks.len()) {
            if let Some(Msg::Ack { seq }) = old.acks.pop_front() {
                self.ack(seq);
            }
        }
        // The receiver fenced and drained: re-post open clear-to-sends with the new path's
        // keys (next epoch), then Switch{H}.
        let h = self.r.delivered();
        self.r.next_epoch();
        let new_key = key_of(self.r.epoch());
        for (seq, _slot, entries) in self.r.open_requests() {
            let rekeyed: Vec<CtsEntry> = entries
                .iter()
                .map(|e| CtsEntry {
                    rkey: new_key,
                    ..*e
                })
                .collect();
            let (words, word) = self.r.repost(seq, &rekeyed);
            self.land_cts(word, &words);
        }
        // Stale clear-to-sends of the old path land after the re-keyed ones.
        for _ in 0..stale_cts.min(old.to_s.len()) {
            if let Some(Msg::Cts { word, words }) = old.to_s.pop_front() {
                self.land_cts(word, &words);
            }
        }
        // The sender fenced and drained too: it applies the switch. Receives posted later use
        // the new keys (self.key).
        self.key = new_key;
        let batches = self
            .s
            .apply_switch(&self.fifo, h, |_, _, _, _| Some(new_key))
            .unwrap();
        assert_eq!(self.s.epoch(), self.r.epoch());
        for b in &batches {
            self.enqueue_batch(b);
        }
    }

    pub(super) fn all_done(&self) -> bool {
        self.posted == self.rounds.len()
            && self
                .rounds
                .iter()
                .all(|r| r.recv_done && r.sends_done == r.msgs.len())
    }
}

/// A failure of the path at a step: (step, (late clear-to-sends, late data, late acks, stale
/// clear-to-sends)), see [`Sim::fail_and_switch`].
type Failure = (usize, (usize, usize, usize, usize));

/// Run `steps` with the path failing at the given steps, then to completion; check it.
fn run_with_failures(mut sim: Sim, steps: &[u8], fails: &[Failure]) -> Result<(), TestCaseError> {
    let mut at = fails.to_vec();
    at.sort_by_key(|f| f.0);
    let mut next = 0;
    for (i, &c) in steps.iter().enumerate() {
        while next < at.len() && at[next].0 == i {
            let (a, b, c2, d) = at[next].1;
            sim.fail_and_switch(a, b, c2, d);
            next += 1;
        }
        sim.step(c);
    }
    while next < at.len() {
        let (a, b, c2, d) = at[next].1;
        sim.fail_and_switch(a, b, c2, d);
        next += 1;
    }
    // Drive to completion on the (reliable) last path.
    let mut guard = 0;
    while !sim.all_done() {
        for c in 0..7 {
            sim.step(c);
        }
        guard += 1;
        prop_assert!(guard < 20_000, "no progress after failover");
    }
    prop_assert!(sim.violations.is_empty(), "{:?}", sim.violations);
    prop_assert_eq!(sim.r.duplicates(), 0);
    prop_assert_eq!(sim.s.live_requests(), 0);
    prop_assert_eq!(sim.r.live_requests(), 0);
    prop_assert_eq!(sim.s.epoch(), fails.len() as u32);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn failovers_at_any_points_complete_everything_exactly_once(
        plan in proptest::collection::vec((1usize..=8, any::<u64>()), 1..48),
        start in prop_oneof![Just(1u64), Just((1u64 << 31) - 5), Just((1u64 << 48) - 5)],
        steps in proptest::collection::vec(any::<u8>(), 0..600),
        fails in proptest::collection::vec(
            (0usize..600, (0usize..6, 0usize..12, 0usize..6, 0usize..4)),
            1..=3,
        ),
    ) {
        run_with_failures(Sim::new(&plan, start), &steps, &fails)?;
    }

    /// The same with eager sends of up to 24 bytes (sizes 0..=48: both kinds mixed), which
    /// may go before their receive is posted; over 100 messages the eager ring's 64 slots
    /// wrap, so a slot is reused only once a clear-to-send proved it free.
    #[test]
    fn failovers_with_eager_sends_complete_everything_exactly_once(
        plan in proptest::collection::vec((1usize..=1, any::<u64>()), 1..100),
        start in prop_oneof![Just(1u64), Just((1u64 << 31) - 5), Just((1u64 << 48) - 5)],
        steps in proptest::collection::vec(any::<u8>(), 0..900),
        fails in proptest::collection::vec(
            (0usize..900, (0usize..6, 0usize..12, 0usize..6, 0usize..4)),
            0..=3,
        ),
    ) {
        run_with_failures(Sim::with_eager(&plan, start, 24), &steps, &fails)?;
    }
}

/// A clear-to-send of the old path that lands after the re-keyed one of the same sequence
/// number (the receiver fenced first, the sender had not yet) must not be what the sender
/// replays with: before the epoch was carried in the clear-to-send (and the FIFO banked by
/// it), the stale one overwrote the re-keyed one and the replay used the old path's key (a
/// NAK on the new path: connection lost).
#[test]
fn a_stale_clear_to_send_landing_late_never_overwrites_the_rekeyed_one() {
    let mut sim = Sim::new(&[(2, 0x0102_0304_0506), (1, 77)], 1);
    // Receive 1 posted and its CTS in flight on the primary; receive 2 posted and landed.
    sim.post_recv();
    sim.post_recv();
    let stale = sim.wire.to_s.pop_front().unwrap();
    if let Some(Msg::Cts { word, words }) = sim.wire.to_s.pop_front() {
        sim.land_cts(word, &words);
    }
    sim.wire.to_s.push_front(stale);
    // The primary dies now: nothing landed late before the fences, the stale CTS of receive 1
    // lands after the re-keyed one.
    sim.fail_and_switch(0, 0, 0, 1);
    let mut guard = 0;
    while !sim.all_done() {
        for c in 0..7 {
            sim.step(c);
        }
        guard += 1;
        assert!(guard < 1000, "no progress");
    }
    assert!(sim.violations.is_empty(), "{:?}", sim.violations);
}
