//! The data protocol driven with no fabric: a tiny in-memory "wire" moves CTS slots, payload
//! writes and completion records between a `SendSide` and a `RecvSide`.

use super::layout::*;
use super::recv::{RecvPost, RecvSide};
use super::send::{SendArgs, SendBatch, SendSide};
use super::{ProtoError, ReqId};
use crate::rc::{Completion, WcOpcode, WcStatus};
use proptest::prelude::*;
use std::collections::HashMap;

/// Receiver memory: buffers keyed by their fake address.
struct Wire {
    fifo: SharedWords,
    records: SharedWords,
    mem: HashMap<u64, Vec<u8>>,
}

impl Wire {
    fn new() -> Self {
        Wire {
            fifo: SharedWords::new(CTS_FIFO_WORDS),
            records: SharedWords::new(FIFO_DEPTH * RECORD_WORDS),
            mem: HashMap::new(),
        }
    }
    /// The receiver's CTS write lands in the sender's FIFO.
    fn deliver_cts(&self, p: &RecvPost) {
        let base = p.fifo_word;
        for (i, w) in p.cts.iter().enumerate() {
            self.fifo.store(base + i, *w);
        }
    }
    /// The sender's batch lands: payloads (from `src`), then the record; returns the
    /// receiver's completion.
    fn deliver_batch(&mut self, b: &SendBatch, src: &HashMap<u64, Vec<u8>>) -> Completion {
        for w in &b.writes {
            let data = &src[&w.local_addr][..w.len as usize];
            let dst = self.mem.get_mut(&w.remote_addr).expect("remote buffer");
            dst[..data.len()].copy_from_slice(data);
        }
        if b.fast {
            // The record is the immediate: nothing lands in the slot.
            return Completion {
                imm: Some(b.imm()),
                byte_len: b.writes[0].len as u32,
                ..recv_completion(b.seq)
            };
        }
        for (i, w) in b.record.iter().enumerate() {
            self.records.store(b.slot() * RECORD_WORDS + i, *w);
        }
        recv_completion(b.seq)
    }
}

fn recv_completion(seq: u64) -> Completion {
    Completion {
        wr_id: wr_id(WrKind::Recv, seq, 0),
        qp_num: 1,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: RECORD_BYTES as u32,
        imm: Some(data_imm(seq)),
    }
}

fn send_completion(b: &SendBatch, status: WcStatus) -> Completion {
    Completion {
        wr_id: b.record_wr_id,
        qp_num: 2,
        status,
        opcode: WcOpcode::RdmaWrite,
        byte_len: RECORD_BYTES as u32,
        imm: None,
    }
}

fn entry(addr: u64, size: u64, tag: i32) -> CtsEntry {
    CtsEntry {
        addr,
        size,
        rkey: 9,
        tag,
    }
}

fn args(addr: u64, size: u64, tag: i32) -> SendArgs {
    SendArgs {
        addr,
        size,
        tag,
        lkey: 3,
    }
}

/// One receive of `cap` bytes at `addr` (tag `tag`), its clear-to-send landed, matched by a
/// send of `size` bytes from 0x9000: the receive, the send and the batch to post.
fn one_to_one(
    w: &mut Wire,
    r: &mut RecvSide,
    s: &mut SendSide,
    (addr, cap, tag): (u64, u64, i32),
    size: u64,
) -> (ReqId, ReqId, SendBatch) {
    w.mem.insert(addr, vec![0; cap as usize]);
    let (rid, post) = r.post(&[entry(addr, cap, tag)]).unwrap().unwrap();
    w.deliver_cts(&post);
    let (sid, b) = s.isend(&w.fifo, args(0x9000, size, tag)).unwrap().unwrap();
    (rid, sid, b.unwrap())
}

/// A send to a single receive is one operation: its payload write carries the record in a
/// fast immediate, nothing lands in the record slot, and the receive's size is the byte
/// count of the completion. A multi-receive, a truncated send and an empty send keep the
/// record.
#[test]
fn a_single_receive_gets_one_operation_and_its_size_from_the_byte_count() {
    let mut w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    let mut src = HashMap::new();
    src.insert(0x9000, vec![0xab; 60]);
    let (rid, sid, b) = one_to_one(&mut w, &mut r, &mut s, (0x1000, 100, 7), 60);
    assert!(b.fast, "one receive, not truncated: one operation");
    assert_eq!(b.writes.len(), 1);
    assert_eq!(b.imm(), fast_imm(b.seq));
    assert!(is_fast(b.imm()) && ctrl_slot(b.imm()).is_none());
    let c = w.deliver_batch(&b, &src);
    assert_eq!(c.byte_len, 60);
    assert!(
        (0..RECORD_WORDS).all(|i| w.records.load(b.slot() * RECORD_WORDS + i) == 0),
        "no record was written"
    );
    assert_eq!(r.on_completion(&c, &w.records), None);
    assert_eq!(r.test(rid).unwrap(), Some(vec![60]));
    assert!(w.mem[&0x1000][..60].iter().all(|&x| x == 0xab));
    s.on_completion(&send_completion(&b, WcStatus::Success));
    assert_eq!(s.test(sid).unwrap(), Some(60));
    // A replayed fast immediate of a receive already delivered is a duplicate.
    assert_eq!(r.on_completion(&c, &w.records), None);
    assert_eq!(r.duplicates(), 1);

    // More bytes than the buffer holds in a fast immediate, and no bytes at all (a device that
    // reports no byte count): a corrupt record, not a delivery.
    for (addr, tag, byte_len) in [(0x2000, 8, 11), (0x4000, 9, 0)] {
        let (rid, _, b) = one_to_one(&mut w, &mut r, &mut s, (addr, 10, tag), 10);
        assert!(b.fast);
        let c = Completion {
            byte_len,
            ..w.deliver_batch(&b, &src)
        };
        assert_eq!(r.on_completion(&c, &w.records), None);
        assert!(matches!(r.test(rid), Err(ProtoError::CorruptRecord { .. })));
    }

    // Truncated and empty sends keep the record.
    let mut w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    let (_, _, b) = one_to_one(&mut w, &mut r, &mut s, (0x1000, 4, 1), 8);
    assert!(!b.fast, "a truncated send needs the record to say so");
    let (_, _, b) = one_to_one(&mut w, &mut r, &mut s, (0x3000, 4, 2), 0);
    assert!(
        !b.fast && b.writes.is_empty(),
        "an empty send has no write to carry it"
    );
}

#[test]
fn send_before_receive_is_retried_later() {
    let w = Wire::new();
    let mut s = SendSide::new();
    assert_eq!(s.isend(&w.fifo, args(1, 8, 0)).unwrap(), None);
    assert_eq!(s.live_requests(), 0, "a try-later send holds no request");
}

#[test]
fn multi_recv_matches_tags_in_any_order_and_completes_together() {
    let mut w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    let tags = [10, 11, 12, 13];
    let bufs: Vec<CtsEntry> = tags
        .iter()
        .enumerate()
        .map(|(i, &t)| entry(0x1000 * (i as u64 + 1), 100, t))
        .collect();
    for b in &bufs {
        w.mem.insert(b.addr, vec![0; 100]);
    }
    let (rid, post) = r.post(&bufs).unwrap().unwrap();
    w.deliver_cts(&post);
    // Sends arrive in reverse tag order, with different sizes.
    let mut src = HashMap::new();
    let mut sids = Vec::new();
    let mut batch = None;
    for (k, &t) in tags.iter().rev().enumerate() {
        let addr = 0x9000 + k as u64;
        src.insert(addr, vec![t as u8; 50 + t as usize]);
        let (id, b) = s
            .isend(&w.fifo, args(addr, 50 + t as u64, t))
            .unwrap()
            .unwrap();
        sids.push((id, 50 + t as u64));
        assert_eq!(
            b.is_some(),
            k == tags.len() - 1,
            "posted only when all matched"
        );
        batch = b;
    }
    let batch = batch.unwrap();
    assert_eq!(batch.writes.len(), 4);
    // Nothing completes before the wire does.
    assert_eq!(s.test(sids[0].0).unwrap(), None);
    assert_eq!(r.test(rid).unwrap(), None);
    let c = w.deliver_batch(&batch, &src);
    assert_eq!(r.on_completion(&c, &w.records), None);
    assert_eq!(r.test(rid).unwrap(), Some(vec![60, 61, 62, 63]));
    for (i, &t) in tags.iter().enumerate() {
        let buf = &w.mem[&bufs[i].addr];
        assert!(buf[..50 + t as usize].iter().all(|&x| x == t as u8));
        assert!(
            buf[50 + t as usize..].iter().all(|&x| x == 0),
            "no byte past the send"
        );
    }
    s.on_completion(&send_completion(&batch, WcStatus::Success));
    for (id, size) in sids {
        assert_eq!(s.test(id).unwrap(), Some(size));
        assert_eq!(s.test(id), Err(ProtoError::BadRequest), "tested after done");
    }
    assert_eq!(r.test(rid), Err(ProtoError::BadRequest));
    assert_eq!((s.live_requests(), r.live_requests()), (0, 0));
}

#[test]
fn oversized_send_fails_both_requests_and_writes_nothing() {
    let mut w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    w.mem.insert(0x1000, vec![7; 16]);
    let (rid, post) = r.post(&[entry(0x1000, 16, 1)]).unwrap().unwrap();
    w.deliver_cts(&post);
    let src = HashMap::from([(0x2000u64, vec![1u8; 32])]);
    let (sid, batch) = s.isend(&w.fifo, args(0x2000, 32, 1)).unwrap().unwrap();
    let batch = batch.unwrap();
    assert!(batch.writes.is_empty());
    assert_eq!(
        s.test(sid),
        Err(ProtoError::Truncated { send: 32, recv: 16 })
    );
    let c = w.deliver_batch(&batch, &src);
    assert_eq!(r.on_completion(&c, &w.records), None);
    assert_eq!(r.test(rid), Err(ProtoError::PeerTruncated));
    assert_eq!(w.mem[&0x1000], vec![7; 16], "receive buffer untouched");
    // The connection goes on: the next exchange works.
    s.on_completion(&send_completion(&batch, WcStatus::Success));
    let (rid2, post2) = r.post(&[entry(0x1000, 16, 1)]).unwrap().unwrap();
    w.deliver_cts(&post2);
    let src = HashMap::from([(0x2000u64, vec![5u8; 16])]);
    let (sid2, b2) = s.isend(&w.fifo, args(0x2000, 16, 1)).unwrap().unwrap();
    let c = w.deliver_batch(b2.as_ref().unwrap(), &src);
    assert_eq!(r.on_completion(&c, &w.records), None);
    s.on_completion(&send_completion(b2.as_ref().unwrap(), WcStatus::Success));
    assert_eq!(r.test(rid2).unwrap(), Some(vec![16]));
    assert_eq!(s.test(sid2).unwrap(), Some(16));
}

#[test]
fn unknown_tag_is_a_usage_error() {
    let w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    let (_, post) = r.post(&[entry(0x1000, 16, 1)]).unwrap().unwrap();
    w.deliver_cts(&post);
    assert_eq!(
        s.isend(&w.fifo, args(0, 8, 2)),
        Err(ProtoError::TagMismatch(2))
    );
}

#[test]
fn duplicate_completion_is_dropped_and_counted() {
    let mut w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    w.mem.insert(0x1000, vec![0; 8]);
    let (rid, post) = r.post(&[entry(0x1000, 8, 0)]).unwrap().unwrap();
    w.deliver_cts(&post);
    let src = HashMap::from([(0x2000u64, vec![3u8; 8])]);
    let (_, b) = s.isend(&w.fifo, args(0x2000, 8, 0)).unwrap().unwrap();
    let c = w.deliver_batch(b.as_ref().unwrap(), &src);
    assert_eq!(r.on_completion(&c, &w.records), None);
    assert_eq!(r.on_completion(&c, &w.records), None); // replayed immediate
    assert_eq!(r.duplicates(), 1);
    assert_eq!(r.test(rid).unwrap(), Some(vec![8]));
    assert_eq!(r.on_completion(&c, &w.records), None); // after the request was returned
    assert_eq!(r.duplicates(), 2);
}

#[test]
fn error_completion_fails_the_tested_request_and_later_calls() {
    let mut w = Wire::new();
    let mut r = RecvSide::new();
    let mut s = SendSide::new();
    w.mem.insert(0x1000, vec![0; 8]);
    let (rid, post) = r.post(&[entry(0x1000, 8, 0)]).unwrap().unwrap();
    w.deliver_cts(&post);
    let (sid, b) = s.isend(&w.fifo, args(0x2000, 8, 0)).unwrap().unwrap();
    s.on_completion(&send_completion(b.as_ref().unwrap(), WcStatus::RetryExcErr));
    let e = s.test(sid).unwrap_err();
    assert_eq!(
        e,
        ProtoError::Failed {
            status: WcStatus::RetryExcErr,
            // A single receive: the message's one operation, payload and record together.
            what: "payload RDMA write (with its record)"
        }
    );
    assert_eq!(e.class(), super::ErrorClass::Remote);
    assert!(s.isend(&w.fifo, args(0x2000, 8, 0)).is_err());
    let flush = Completion {
        status: WcStatus::WrFlushErr,
        ..recv_completion(1)
    };
    assert_eq!(r.on_completion(&flush, &w.records), None);
    assert!(matches!(r.test(rid), Err(ProtoError::Failed { .. })));
    assert!(r.post(&[entry(0x1000, 8, 0)]).is_err());
}

#[test]
fn corrupt_record_is_detected() {
    let w = Wire::new();
    let mut r = RecvSide::new();
    let (rid, _) = r.post(&[entry(0x1000, 8, 0)]).unwrap().unwrap();
    // Record slot 1 still holds zeros: seq mismatch.
    assert_eq!(r.on_completion(&recv_completion(1), &w.records), None);
    assert!(matches!(r.test(rid), Err(ProtoError::CorruptRecord { .. })));
}

#[test]
fn forged_request_ids_are_rejected() {
    let mut s = SendSide::new();
    let mut r = RecvSide::new();
    let bogus = ReqId { index: 3, gen: 99 };
    assert_eq!(s.test(bogus), Err(ProtoError::BadRequest));
    assert_eq!(r.test(bogus), Err(ProtoError::BadRequest));
    let bogus = ReqId {
        index: 60000,
        gen: 1,
    };
    assert_eq!(r.test(bogus), Err(ProtoError::BadRequest));
}

#[test]
fn at_most_32_receives_outstanding() {
    let mut r = RecvSide::new();
    let ids: Vec<_> = (0..FIFO_DEPTH)
        .map(|i| r.post(&[entry(i as u64, 8, 0)]).unwrap().unwrap().0)
        .collect();
    assert_eq!(r.post(&[entry(99, 8, 0)]).unwrap(), None);
    assert_eq!(ids.len(), 32);
}

proptest! {
    /// Random sizes, receive counts and completion orders over many FIFO wraps: every
    /// request completes exactly once, in order, with the right sizes and bytes.
    #[test]
    fn random_exchanges_complete_exactly_once(
        rounds in proptest::collection::vec((1usize..=MAX_RECVS, 0u64..64, any::<u64>()), 1..120),
        lag in 0usize..31,
    ) {
        let mut w = Wire::new();
        let mut r = RecvSide::new();
        let mut s = SendSide::new();
        let mut pending_sender: std::collections::VecDeque<(SendBatch, Vec<(ReqId, u64)>)> = Default::default();
        let mut src = HashMap::new();
        for (round, &(n, base, seed)) in rounds.iter().enumerate() {
            let bufs: Vec<CtsEntry> = (0..n)
                .map(|i| entry(((round as u64) << 8) | i as u64, 64, i as i32))
                .collect();
            for b in &bufs { w.mem.insert(b.addr, vec![0; 64]); }
            let (rid, post) = r.post(&bufs).unwrap().unwrap();
            w.deliver_cts(&post);
            let mut order: Vec<usize> = (0..n).collect();
            order.rotate_left((seed % n as u64) as usize);
            let mut ids = Vec::new();
            let mut batch = None;
            for &i in &order {
                let size = (base + i as u64 * 7) % 65;
                let addr = (1u64 << 40) | ((round as u64) << 8) | i as u64;
                src.insert(addr, vec![(round + i) as u8; size as usize]);
                let (id, b) = s.isend(&w.fifo, args(addr, size, i as i32)).unwrap().unwrap();
                ids.push((id, size));
                if b.is_some() { batch = b; }
            }
            let batch = batch.unwrap();
            let c = w.deliver_batch(&batch, &src);
            assert_eq!(r.on_completion(&c, &w.records), None);
            let sizes = r.test(rid).unwrap().unwrap();
            for &i in &order {
                let size = (base + i as u64 * 7) % 65;
                prop_assert_eq!(sizes[i], size);
                let got = &w.mem[&bufs[i].addr];
                prop_assert!(got[..size as usize].iter().all(|&x| x == (round + i) as u8));
            }
            // Sender completions arrive with some lag.
            pending_sender.push_back((batch, ids));
            while pending_sender.len() > lag {
                let (b, ids) = pending_sender.pop_front().unwrap();
                s.on_completion(&send_completion(&b, WcStatus::Success));
                for (id, size) in ids { prop_assert_eq!(s.test(id).unwrap(), Some(size)); }
            }
        }
        while let Some((b, ids)) = pending_sender.pop_front() {
            s.on_completion(&send_completion(&b, WcStatus::Success));
            for (id, size) in ids { prop_assert_eq!(s.test(id).unwrap(), Some(size)); }
        }
        prop_assert_eq!(s.live_requests(), 0);
        prop_assert_eq!(r.live_requests(), 0);
        prop_assert_eq!(r.duplicates(), 0);
    }
}
