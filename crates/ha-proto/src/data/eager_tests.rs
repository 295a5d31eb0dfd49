//! Eager sends driven with no fabric: a small send goes before its clear-to-send into the
//! receiver's eager ring and is copied into the receive's buffer; it completes once acknowledged
//! and matched against its receive's clear-to-send; slots are reused only once a clear-to-send
//! proves them free (even after switches completed sends without one); errors reach both
//! requests by kind; a send the receiver did not get is replayed into its slot after a switch.

use super::layout::*;
use super::recv::{EagerCopy, RecvPost, RecvSide};
use super::send::{EagerCfg, SendArgs, SendBatch, SendSide};
use super::{ProtoError, ReqId};
use crate::rc::{Completion, WcOpcode, WcStatus};

const REGION: u64 = 1 << 50;

struct Ends {
    s: SendSide,
    r: RecvSide,
    fifo: SharedWords,
    region: SharedWords,
    /// The receiver's buffers, by address.
    mem: std::collections::HashMap<u64, Vec<u8>>,
}

fn ends(max: u64) -> Ends {
    let mut s = SendSide::new();
    s.enable_eager(EagerCfg {
        region_addr: REGION,
        max,
    });
    let mut r = RecvSide::new();
    r.enable_eager();
    Ends {
        s,
        r,
        fifo: SharedWords::new(SEND_REGION_WORDS),
        region: SharedWords::new(RECV_REGION_EAGER_WORDS),
        mem: Default::default(),
    }
}

/// `ends(max)` after one message that waited for its clear-to-send (sequence number 1, a
/// receive of `cap` bytes with tag `tag`): what eager sends are then guessed to match.
fn primed(max: u64, tag: i32, cap: u64) -> Ends {
    let mut e = ends(max);
    assert!(
        e.send(1, 8, tag).is_none(),
        "a first send waits for its clear-to-send"
    );
    let (rid, p) = e.post(1, cap, tag);
    e.land_cts(&p);
    let (sid, b) = e.send(1, 8, tag).expect("its clear-to-send is there");
    assert!(b.eager.is_none() && b.fast);
    e.land(&b);
    e.ack(&b);
    assert_eq!(e.r.test(rid), Ok(Some(vec![8])));
    assert_eq!(e.test_send(sid), Ok(Some(8)));
    e
}

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 7 + i) as u8).collect()
}

fn args(seq: u64, len: usize, tag: i32) -> SendArgs {
    SendArgs {
        addr: seq << 16,
        size: len as u64,
        tag,
        lkey: 1,
    }
}

impl Ends {
    /// A send of `len` bytes as the next sequence number `seq`, tag `tag`: its request and
    /// batch.
    fn send(&mut self, seq: u64, len: usize, tag: i32) -> Option<(ReqId, SendBatch)> {
        let (id, b) = self.s.isend(&self.fifo, args(seq, len, tag)).unwrap()?;
        Some((id, b.unwrap()))
    }

    /// The write of `b` is acknowledged at the sender.
    fn ack(&mut self, b: &SendBatch) {
        self.s.on_completion(&Completion {
            wr_id: b.record_wr_id,
            qp_num: 2,
            status: WcStatus::Success,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 16,
            imm: None,
        });
    }

    /// The sender looks for clear-to-sends, then tests send `id`.
    fn test_send(&mut self, id: ReqId) -> Result<Option<u64>, ProtoError> {
        self.s.confirm_eager(&self.fifo);
        self.s.test(id)
    }

    /// The batch lands on the receiver: payload into the ring, header, the completion (a fast
    /// batch: the payload into the receive's buffer, the record in the immediate).
    fn land(&mut self, b: &SendBatch) -> Option<EagerCopy> {
        let Some(at) = b.eager else {
            assert!(b.fast, "a single receive");
            let w = &b.writes[0];
            let bytes = payload(w.local_addr >> 16, w.len as usize);
            self.mem.get_mut(&w.remote_addr).unwrap()[..bytes.len()].copy_from_slice(&bytes);
            return self.arrive(b, w.len as u32);
        };
        for w in &b.writes {
            let bytes = payload(w.local_addr >> 16, w.len as usize);
            let off = (w.remote_addr - REGION) as usize;
            for (i, x) in bytes.iter().enumerate() {
                let o = off + i;
                let mut word = self.region.load(o / 8).to_le_bytes();
                word[o % 8] = *x;
                self.region.store(o / 8, u64::from_le_bytes(word));
            }
        }
        for (i, w) in b.record[..EagerHeader::WORDS].iter().enumerate() {
            self.region.store((at - REGION) as usize / 8 + i, *w);
        }
        self.arrive(b, 16)
    }

    /// The receiver's completion of batch `b`'s WRITE_WITH_IMM (`byte_len` bytes).
    fn arrive(&mut self, b: &SendBatch, byte_len: u32) -> Option<EagerCopy> {
        let c = Completion {
            wr_id: wr_id(WrKind::Recv, b.seq, 0),
            qp_num: 1,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len,
            imm: Some(b.imm()),
        };
        self.r.on_completion(&c, &self.region)
    }

    fn copy(&mut self, c: Option<EagerCopy>) {
        let Some(c) = c else { return };
        let bytes: Vec<u8> = (c.from..c.from + c.len)
            .map(|o| self.region.load(o / 8).to_le_bytes()[o % 8])
            .collect();
        self.mem.get_mut(&c.to).unwrap()[..c.len].copy_from_slice(&bytes);
    }

    /// Post a receive of `cap` bytes (tag `tag`) for `seq` into a buffer at `0x1000 + seq *
    /// 0x100`, making the copy it gives; its clear-to-send not landed yet.
    fn post(&mut self, seq: u64, cap: u64, tag: i32) -> (ReqId, RecvPost) {
        let addr = 0x1000 + seq * 0x100;
        self.mem.insert(addr, vec![0; cap as usize]);
        let e = CtsEntry {
            addr,
            size: cap,
            rkey: 2,
            tag,
        };
        let (id, p) = self.r.post(&[e]).unwrap().unwrap();
        assert_eq!(p.seq, seq);
        self.copy(p.copy);
        (id, p)
    }

    /// The clear-to-send of `p` lands in the sender's FIFO.
    fn land_cts(&mut self, p: &RecvPost) {
        self.fifo.land_cts(p.fifo_word, &p.cts);
    }

    /// [`Ends::post`] with the clear-to-send landed; the receive's outcome.
    fn recv(&mut self, seq: u64, cap: u64, tag: i32) -> Result<Option<Vec<u64>>, ProtoError> {
        let (id, p) = self.post(seq, cap, tag);
        self.land_cts(&p);
        self.r.test(id)
    }
}

#[test]
fn a_small_send_goes_before_its_clear_to_send_and_completes_once_matched() {
    let mut e = primed(64, 5, 100);
    // No receive posted: a 40-byte send goes at once, eagerly.
    let (sid, b) = e
        .send(2, 40, 5)
        .expect("an eager send needs no clear-to-send");
    assert_eq!(b.eager, Some(REGION + eager_slot_offset(2) as u64));
    assert!(is_eager(b.imm()) && !is_fast(b.imm()));
    assert_eq!(b.writes.len(), 1);
    assert_eq!(
        b.writes[0].remote_addr,
        REGION + (eager_slot_offset(2) + EAGER_HEADER_BYTES) as u64
    );
    assert_eq!(
        e.land(&b),
        None,
        "no receive posted yet: it waits in its slot"
    );
    assert_eq!(e.r.delivered(), 2);
    e.ack(&b);
    assert_eq!(
        e.test_send(sid),
        Ok(None),
        "acknowledged, its receive not yet posted"
    );
    // The receive posted later takes it at once; its clear-to-send completes the send.
    assert_eq!(e.recv(2, 100, 5).unwrap(), Some(vec![40]));
    assert_eq!(e.mem[&0x1200][..40], payload(2, 40)[..]);
    assert!(
        e.mem[&0x1200][40..].iter().all(|&x| x == 0),
        "no byte past 40"
    );
    assert_eq!(e.test_send(sid), Ok(Some(40)));
    // A receive posted first, its clear-to-send not yet at the sender: the next send is eager
    // too and completes the receive when it lands; the send completes once both its
    // clear-to-send and its acknowledgement arrived.
    let addr = 0x1300;
    let (rid, cts) = e.post(3, 64, 5);
    let (sid, b) = e.send(3, 64, 5).expect("eager");
    let c = e.land(&b);
    assert!(c.is_some(), "a posted receive gets its copy at once");
    e.copy(c);
    assert_eq!(e.r.test(rid).unwrap(), Some(vec![64]));
    assert_eq!(e.mem[&addr], payload(3, 64));
    e.land_cts(&cts);
    assert_eq!(
        e.test_send(sid),
        Ok(None),
        "its receive posted, not yet acknowledged"
    );
    e.ack(&b);
    assert_eq!(e.test_send(sid), Ok(Some(64)));
    assert_eq!(e.r.duplicates(), 0);
    assert_eq!((e.s.live_requests(), e.r.live_requests()), (0, 0));
}

/// A send goes eagerly only when it fits what the last clear-to-send read offered (tag,
/// room) and the eager limit; the first send of a connection waits for its clear-to-send.
#[test]
fn only_sends_that_fit_the_last_clear_to_send_and_the_limit_go_eagerly() {
    let mut e = ends(64);
    assert!(e.send(1, 8, 0).is_none(), "nothing read yet: wait");
    let mut e = primed(64, 5, 48);
    assert!(e.send(2, 49, 5).is_none(), "larger than the last receive");
    assert!(e.send(2, 8, 6).is_none(), "another tag");
    let mut big = primed(64, 5, 1 << 20);
    assert!(big.send(2, 65, 5).is_none(), "over the eager limit");
    assert!(e.send(2, 48, 5).is_some());
    assert!(big.send(2, 64, 5).is_some());
}

/// A slot is reused only once the receive of its last use is proven done. Normally the
/// completion rule proves it (a send completes once its receive was posted, and the receiver
/// posts a receive only once the one 32 before is done); sends a switch completed (delivered,
/// their receives not posted) prove nothing: after two such switches the sender must not
/// write into slot 2 again while receive 2 has not taken its message.
#[test]
fn an_eager_slot_is_reused_only_once_a_clear_to_send_proves_it_free() {
    let mut e = primed(16, 0, 8);
    for (first, last, delivered) in [(2u64, 33u64, 33u64), (34, 64, 64)] {
        let mut ids = Vec::new();
        for seq in first..=last {
            let (id, b) = e.send(seq, 8, 0).expect("a slot never used");
            assert_eq!(e.land(&b), None);
            e.ack(&b);
            ids.push(id);
        }
        // The path fails: everything was delivered, nothing is replayed, the sends complete.
        e.r.next_epoch();
        let replay =
            e.s.apply_switch(&e.fifo, delivered, |_, _, _, _| Some(1))
                .unwrap();
        assert!(replay.is_empty());
        for id in ids {
            assert_eq!(e.test_send(id), Ok(Some(8)));
        }
    }
    assert!(
        e.send(65, 8, 0).is_none(),
        "no clear-to-send past 1 was seen"
    );
    for seq in 2..=32u64 {
        assert_eq!(e.recv(seq, 8, 0).unwrap(), Some(vec![8]));
    }
    assert!(
        e.send(65, 8, 0).is_none(),
        "clear-to-sends up to 32 prove nothing of slot 1"
    );
    assert_eq!(e.recv(33, 8, 0).unwrap(), Some(vec![8]));
    let (_, b) = e
        .send(65, 8, 0)
        .expect("33's clear-to-send: receive 1 is done");
    assert_eq!(b.eager, Some(REGION + eager_slot_offset(1) as u64));
    assert!(
        e.send(66, 8, 0).is_none(),
        "slot 2: receive 2 is done, but not proven yet"
    );
    assert_eq!(e.recv(34, 8, 0).unwrap(), Some(vec![8]));
    assert!(e.send(66, 8, 0).is_some());
    for seq in 2..=34 {
        assert_eq!(
            e.mem[&(0x1000 + seq * 0x100)],
            payload(seq, 8),
            "receive {seq}"
        );
    }
}

/// A guess that does not hold (the receive has another tag, or less room): the receive fails
/// by kind, nothing is copied, the send completes (as with NCCL's Socket transport), and the
/// connection goes on.
#[test]
fn a_wrong_tag_or_a_too_small_buffer_fails_the_receive_by_kind() {
    let mut e = primed(64, 9, 64);
    let (s2, b) = e.send(2, 32, 9).unwrap();
    e.land(&b);
    e.ack(&b);
    assert_eq!(e.recv(2, 64, 8), Err(ProtoError::TagMismatch(9)));
    assert_eq!(e.test_send(s2), Ok(Some(32)));
    let (s3, b) = e.send(3, 48, 9).unwrap();
    e.land(&b);
    e.ack(&b);
    assert_eq!(e.recv(3, 16, 9), Err(ProtoError::PeerTruncated));
    assert_eq!(
        e.mem[&0x1300],
        vec![0; 16],
        "nothing copied into a failed receive"
    );
    assert_eq!(e.test_send(s3), Ok(Some(48)));
    let (s4, b) = e.send(4, 16, 9).unwrap();
    e.land(&b);
    e.ack(&b);
    assert_eq!(e.recv(4, 16, 9), Ok(Some(vec![16])));
    assert_eq!(e.test_send(s4), Ok(Some(16)));
    // A multi-receive cannot take an eager send (the driver never posts one with eager on).
    let mut e = primed(64, 0, 64);
    let entries: Vec<CtsEntry> = (0..2)
        .map(|i| CtsEntry {
            addr: 0x5000 + i * 0x100,
            size: 64,
            rkey: 2,
            tag: i as i32,
        })
        .collect();
    let (rid, _) = e.r.post(&entries).unwrap().unwrap();
    let (_, b) = e.send(2, 8, 0).unwrap();
    assert_eq!(e.land(&b), None);
    assert!(matches!(
        e.r.test(rid),
        Err(ProtoError::CorruptRecord { .. })
    ));
}

#[test]
fn an_eager_send_the_receiver_did_not_get_is_replayed_into_its_slot() {
    let mut e = primed(64, 0, 64);
    let (s2, b2) = e.send(2, 10, 0).unwrap();
    let (s3, b3) = e.send(3, 20, 0).unwrap();
    e.land(&b2);
    e.ack(&b2);
    // The path fails with send 3 lost; the receiver delivered up to 2 and has no open
    // receive; the switch replays send 3 only, into the same slot, with the new key.
    e.r.next_epoch();
    let replay = e.s.apply_switch(&e.fifo, 2, |_, _, _, _| Some(77)).unwrap();
    assert_eq!(replay.len(), 1);
    let r = &replay[0];
    assert_eq!((r.seq, r.eager), (3, b3.eager));
    assert_eq!(r.writes[0].lkey, 77);
    assert_eq!(r.record, b3.record);
    assert_eq!(e.test_send(s2), Ok(Some(10)), "delivered: complete");
    e.land(r);
    assert_eq!(
        e.test_send(s3),
        Ok(None),
        "the replay is not acknowledged yet"
    );
    e.ack(r);
    assert_eq!(e.recv(2, 64, 0).unwrap(), Some(vec![10]));
    assert_eq!(e.recv(3, 64, 0).unwrap(), Some(vec![20]));
    assert_eq!(e.test_send(s3), Ok(Some(20)));
    assert_eq!(e.mem[&0x1300][..20], payload(3, 20)[..]);
    assert_eq!(e.r.duplicates(), 0);
}

/// The receiver may take an eager send and post `FIFO_DEPTH` more receives before the sender
/// looks at its FIFO: the send's own clear-to-send is overwritten by the later one, which
/// proves the receive done, and the send completes (before, it waited for a clear-to-send
/// that was gone while the receiver waited for data only that send's slot could carry: the
/// harness's stream hung).
#[test]
fn a_send_whose_clear_to_send_was_overwritten_by_a_later_one_completes() {
    let mut e = primed(64, 0, 8);
    let (sid, b) = e.send(2, 8, 0).unwrap();
    e.land(&b);
    e.ack(&b);
    assert_eq!(e.recv(2, 8, 0).unwrap(), Some(vec![8]));
    for seq in 3..=FIFO_DEPTH as u64 + 2 {
        assert_eq!(e.recv(seq, 8, 0).unwrap(), None, "no data for {seq} yet");
    }
    assert_eq!(
        cts_seq(&e.fifo, 0, 2),
        FIFO_DEPTH as u64 + 2,
        "the FIFO slot of 2 now holds 34's"
    );
    assert_eq!(e.test_send(sid), Ok(Some(8)));
}

/// An eager immediate on a connection that offered no ring (a peer that should not send
/// eagerly) fails the connection by name; the missing ring is never read (before, the header
/// was read first, past the region's end: a panic).
#[test]
fn an_eager_immediate_without_a_ring_fails_the_connection() {
    let mut r = RecvSide::new();
    let region = SharedWords::new(RECV_REGION_WORDS);
    let c = Completion {
        wr_id: wr_id(WrKind::Recv, 1, 0),
        qp_num: 1,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: 16,
        imm: Some(eager_imm(1)),
    };
    assert_eq!(r.on_completion(&c, &region), None);
    assert!(matches!(
        r.failure(),
        Some(ProtoError::CorruptRecord { what }) if what.contains("no eager ring")
    ));
}
