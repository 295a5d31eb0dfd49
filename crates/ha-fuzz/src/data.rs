//! Targets `recv_side` and `send_side`: the data-protocol machines driven by a program read
//! from the input: posts, arbitrary completion records / CTS slots written "by the peer",
//! completions with arbitrary ids, statuses and immediates, tests of real and forged request
//! ids, and (sender) a switch of path with an arbitrary delivered count.

use super::input::Input;
use ha_proto::data::layout::{
    cts_word, data_imm, encode_cts, encode_record, fast_imm, read_cts, CtsEntry, Record,
    SharedWords, CTS_FIFO_WORDS, CTS_SLOT_WORDS, FIFO_DEPTH, MAX_RECVS, RECORD_WORDS,
    SEND_REGION_WORDS, SIZE_TRUNCATED,
};
use ha_proto::data::recv::RecvSide;
use ha_proto::data::send::{SendArgs, SendSide};
use ha_proto::data::{ProtoError, ReqId};
use ha_proto::rc::{Completion, WcOpcode, WcStatus};

/// Operations per input (longer programs add little coverage and cost throughput).
const MAX_OPS: usize = 128;

fn status(inp: &mut Input) -> WcStatus {
    match inp.u8() {
        0..=191 => WcStatus::Success,
        b => WcStatus::from_code((b & 15) as u32),
    }
}

fn completion(wr_id: u64, status: WcStatus, imm: Option<u32>) -> Completion {
    Completion {
        wr_id,
        qp_num: 1,
        status,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: 0,
        imm,
    }
}

fn forged(inp: &mut Input) -> ReqId {
    ReqId {
        index: inp.u8() as u16,
        gen: inp.u8() as u16,
    }
}

/// Receiver: `[op][args...]*`.
pub fn recv_side(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut m = RecvSide::new();
    let records = SharedWords::new(FIFO_DEPTH * RECORD_WORDS);
    let fifo = SharedWords::new(CTS_FIFO_WORDS);
    // Live requests: (id, seq, buffer capacities, recv wr_id).
    let mut live: Vec<(ReqId, u64, Vec<u64>, u64)> = Vec::new();
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 7 {
            6 => {
                // A fast delivery (the record in the immediate) of a live request, its byte
                // count from the input: 0, within, at or past the buffer.
                if live.is_empty() {
                    continue;
                }
                let (_, seq, caps, recv_id) = live[inp.u8() as usize % live.len()].clone();
                let got = match inp.u8() {
                    255 => caps[0] + 1,
                    0 => 0,
                    b => (b as u64 * 16).min(caps[0]),
                };
                let st = status(&mut inp);
                let c = Completion {
                    byte_len: got as u32,
                    ..completion(recv_id, st, Some(fast_imm(seq)))
                };
                // No eager ring here: never a copy to make.
                assert!(m.on_completion(&c, &records).is_none());
            }
            0 => {
                let n = 1 + inp.u8() as usize % MAX_RECVS;
                let bufs: Vec<CtsEntry> = (0..n)
                    .map(|i| CtsEntry {
                        addr: 0x1000 * (i as u64 + 1),
                        size: inp.u8() as u64 * 16,
                        rkey: 5,
                        tag: inp.u8() as i32 - 128,
                    })
                    .collect();
                match m.post(&bufs) {
                    Ok(Some((id, post))) => {
                        assert_eq!(post.slot, (post.seq % FIFO_DEPTH as u64) as usize);
                        assert_eq!(post.fifo_word, cts_word(m.epoch(), post.slot));
                        fifo.land_cts(post.fifo_word, &post.cts);
                        assert_eq!(
                            read_cts(&fifo, m.epoch(), post.slot, post.seq),
                            Ok(Some(bufs.clone()))
                        );
                        live.push((
                            id,
                            post.seq,
                            bufs.iter().map(|b| b.size).collect(),
                            post.recv_wr_id,
                        ));
                    }
                    Ok(None) => assert!(m.live_requests() > 0, "refused a post with nothing live"),
                    Err(_) => assert!(m.failure().is_some()),
                }
            }
            1 => {
                // The peer writes any record words into any slot.
                let slot = inp.u8() as usize % FIFO_DEPTH;
                for k in 0..RECORD_WORDS {
                    records.store(slot * RECORD_WORDS + k, inp.u64());
                }
            }
            2 => {
                // A completion with arbitrary id, status and immediate.
                let id = inp.u64();
                let st = status(&mut inp);
                let imm = (inp.u8() & 1 == 1).then(|| inp.u32());
                assert!(m
                    .on_completion(&completion(id, st, imm), &records)
                    .is_none());
            }
            3 => {
                // A well-formed delivery of a live request, with sizes from the input.
                if live.is_empty() {
                    continue;
                }
                let (_, seq, caps, recv_id) = live[inp.u8() as usize % live.len()].clone();
                let mut sizes = [0u64; MAX_RECVS];
                for (s, cap) in sizes.iter_mut().zip(&caps) {
                    let b = inp.u8();
                    *s = match b {
                        255 => SIZE_TRUNCATED,
                        254 => cap + 1,
                        _ => (b as u64 * 16).min(*cap),
                    };
                }
                let w = encode_record(&Record {
                    seq,
                    nreqs: caps.len() as u32,
                    status: 0,
                    sizes,
                });
                let slot = (seq % FIFO_DEPTH as u64) as usize;
                for (k, x) in w.iter().enumerate() {
                    records.store(slot * RECORD_WORDS + k, *x);
                }
                let st = status(&mut inp);
                let c = completion(recv_id, st, Some(data_imm(seq)));
                assert!(m.on_completion(&c, &records).is_none());
            }
            4 => {
                let (id, caps) = if !live.is_empty() && inp.u8() & 1 == 0 {
                    let k = inp.u8() as usize % live.len();
                    (live[k].0, Some(live[k].2.clone()))
                } else {
                    (forged(&mut inp), None)
                };
                let known = live.iter().position(|l| l.0 == id);
                match m.test(id) {
                    Ok(Some(sizes)) => {
                        let k = known.expect("a forged request id completed");
                        let caps = caps.unwrap_or_else(|| live[k].2.clone());
                        assert_eq!(sizes.len(), caps.len());
                        assert!(sizes.iter().zip(&caps).all(|(s, c)| s <= c));
                        live.remove(k);
                    }
                    Ok(None) => assert!(known.is_some(), "a forged request id is pending"),
                    Err(ProtoError::BadRequest) => assert!(known.is_none()),
                    Err(e) => {
                        assert!(!e.to_string().is_empty());
                        live.remove(known.expect("a forged request id failed"));
                    }
                }
            }
            _ => m.fail(ProtoError::CorruptRecord { what: "fuzz" }),
        }
        assert!(m.delivered() <= m.posted_upto());
        assert_eq!(m.live_requests(), live.len());
        let open = m.open_requests();
        assert!(open.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(open.iter().all(|o| o.0 > m.delivered()));
    }
}

/// Sender: `[op][args...]*`.
pub fn send_side(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut m = SendSide::new();
    let fifo = SharedWords::new(SEND_REGION_WORDS);
    let mut live: Vec<ReqId> = Vec::new();
    let mut records: Vec<u64> = Vec::new();
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 7 {
            0 => {
                // The receiver posts a well-formed CTS for the next sequence number.
                let seq = m.posted_upto() + 1 + (inp.u8() % 2) as u64;
                let n = 1 + inp.u8() as usize % MAX_RECVS;
                let entries: Vec<CtsEntry> = (0..n)
                    .map(|i| CtsEntry {
                        addr: 0x10_0000 * (i as u64 + 1),
                        size: inp.u8() as u64 * 16,
                        rkey: inp.u8() as u32,
                        tag: (inp.u8() % 4) as i32,
                    })
                    .collect();
                let slot = (seq % FIFO_DEPTH as u64) as usize;
                let at = cts_word(m.epoch(), slot);
                let words = encode_cts(&entries, seq, m.epoch());
                fifo.land_cts(at, &words);
            }
            1 => {
                // The peer writes arbitrary words anywhere in the FIFO.
                let at = inp.u32() as usize % CTS_FIFO_WORDS;
                fifo.store(at, inp.u64());
            }
            2 => {
                let a = SendArgs {
                    addr: 0x7000_0000,
                    size: inp.u8() as u64 * 16,
                    tag: (inp.u8() % 4) as i32,
                    lkey: 9,
                };
                match m.isend(&fifo, a) {
                    Ok(Some((id, batch))) => {
                        live.push(id);
                        if let Some(b) = batch {
                            // Keys: 9 as posted, 11 after a switch re-keyed the sends.
                            assert!(b
                                .writes
                                .iter()
                                .all(|w| w.len > 0 && (w.lkey == 9 || w.lkey == 11)));
                            let nreqs = b.record[1] as u32 as usize;
                            assert!((1..=MAX_RECVS).contains(&nreqs));
                            assert_eq!(b.record[0], b.seq);
                            records.push(b.record_wr_id);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
            3 => {
                let id = if !records.is_empty() && inp.u8() & 1 == 0 {
                    records[inp.u8() as usize % records.len()]
                } else {
                    inp.u64()
                };
                let st = status(&mut inp);
                m.on_completion(&completion(id, st, None));
            }
            4 => {
                let id = if !live.is_empty() && inp.u8() & 1 == 0 {
                    live[inp.u8() as usize % live.len()]
                } else {
                    forged(&mut inp)
                };
                let known = live.iter().position(|l| *l == id);
                match m.test(id) {
                    Ok(Some(_)) => {
                        live.remove(known.expect("a forged request id completed"));
                    }
                    Ok(None) => assert!(known.is_some(), "a forged request id is pending"),
                    Err(ProtoError::BadRequest) => assert!(known.is_none()),
                    Err(_) => {
                        live.remove(known.expect("a forged request id failed"));
                    }
                }
            }
            5 => {
                let delivered = match inp.u8() {
                    255 => inp.u64(),
                    d => m.posted_upto().saturating_sub(d as u64 % 4),
                };
                let refuse = inp.u8();
                // The receiver re-posts what is open into the next epoch's bank first.
                repost_all(&fifo, m.epoch());
                let r = m.apply_switch(&fifo, delivered, |_, k, _, _| {
                    (refuse as usize != k + 1).then_some(11)
                });
                match r {
                    Ok(batches) => {
                        assert!(batches.windows(2).all(|w| w[0].seq < w[1].seq));
                        assert!(batches.iter().all(|b| b.seq > delivered));
                    }
                    Err(e) => {
                        assert!(
                            m.failure().is_some(),
                            "apply_switch failed ({e}) but the connection is not failed"
                        );
                    }
                }
            }
            _ => m.fail(ProtoError::CorruptRecord { what: "fuzz" }),
        }
        assert_eq!(m.live_requests(), live.len());
    }
}

/// Copy every clear-to-send of epoch `epoch`'s bank into the next epoch's, re-tagged (what a
/// receiver does with its open receives at a switch).
fn repost_all(fifo: &SharedWords, epoch: u32) {
    for slot in 0..FIFO_DEPTH {
        let (from, to) = (cts_word(epoch, slot), cts_word(epoch.wrapping_add(1), slot));
        for k in 0..CTS_SLOT_WORDS {
            let mut w = fifo.load(from + k);
            if k == CTS_SLOT_WORDS - 2 {
                w = (w & 0xffff_ffff) | (u64::from(epoch.wrapping_add(1)) << 32);
            }
            fifo.store(to + k, w);
        }
    }
}

pub(super) fn recv_seeds() -> Vec<Vec<u8>> {
    vec![
        // post 2 buffers, deliver sizes, test it.
        vec![0, 1, 4, 128, 4, 129, 3, 0, 2, 3, 0, 4, 0, 0],
        // post, corrupt record, completion for seq 1.
        vec![
            0, 0, 8, 128, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 4, 0, 1, 1, 0,
            0, 0, 4, 0, 0,
        ],
    ]
}

pub(super) fn send_seeds() -> Vec<Vec<u8>> {
    vec![
        // CTS for seq 1 (one entry, tag 0), isend tag 0, record completion, test.
        vec![0, 0, 0, 4, 5, 0, 2, 2, 0, 3, 0, 0, 0, 4, 0, 0],
        // CTS, isend, then a switch with delivered = 0 and a refused key.
        vec![0, 0, 1, 4, 5, 0, 4, 5, 1, 2, 2, 0, 2, 2, 1, 5, 1, 2],
    ]
}
