//! The cases of the `check` suite and how each side plans its sends and receives for a case
//! (a pure function of the case, its index and the side).
//!
//! A case's data pattern is seeded by (case, sending side), size, iteration and tag; receive
//! buffers are poisoned first and a guard zone after each receive slot must stay untouched.

use super::conn::Side;
use super::driver::{RecvOp, RecvPart, SendOp};
use super::pattern;
use super::report::format_size;
use nccl_net_abi::common::NCCL_NET_MAX_REQUESTS;

/// Sizes of the plain send/receive cases (capped by `--max-size`).
pub const CHECK_SIZES: [usize; 9] = [0, 1, 7, 8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
/// Bytes after every receive slot that must stay untouched.
pub const GUARD: usize = 64;
/// Largest multi-receive the suite tries (NCCL's IB transport uses 8).
pub const MAX_MULTI: usize = 8;
/// Message size of the in-flight case (capped by `--max-size`).
pub const INFLIGHT_SIZE: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseKind {
    /// One message each way per iteration.
    SendRecv { size: usize, iters: u32 },
    /// One `irecv` of `n` tagged buffers, matched by `n` sends posted in shuffled tag order.
    MultiRecv {
        n: usize,
        iters: u32,
        max_size: usize,
    },
    /// `count` sends and `count` receives posted at once, sizes up to `size`.
    InFlight { count: usize, size: usize },
    /// A `send`-byte message into a `recv`-byte buffer: test() must report `send`.
    RecvLarger { send: usize, recv: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub name: String,
    pub kind: CaseKind,
}

/// The cases for `--max-size max_size` on a device with `maxRecvs = max_recvs`, plus notes
/// about what was left out.
pub fn plan(max_size: usize, max_recvs: i32) -> (Vec<Case>, Vec<String>) {
    let mut cases = Vec::new();
    let mut notes = Vec::new();
    for &size in CHECK_SIZES.iter().filter(|&&s| s <= max_size) {
        cases.push(Case {
            name: format!("sendrecv size={}", format_size(size)),
            kind: CaseKind::SendRecv {
                size,
                iters: if size <= 1 << 20 { 3 } else { 2 },
            },
        });
    }
    let max_recvs = usize::try_from(max_recvs).unwrap_or(0).max(1);
    for n in 2..=MAX_MULTI.min(max_recvs) {
        cases.push(Case {
            name: format!("multirecv n={n}"),
            kind: CaseKind::MultiRecv {
                n,
                iters: 2,
                max_size,
            },
        });
    }
    if max_recvs < MAX_MULTI {
        notes.push(format!(
            "multirecv n={}..{MAX_MULTI} not run: the device reports maxRecvs={max_recvs}",
            max_recvs + 1
        ));
    }
    let size = INFLIGHT_SIZE.min(max_size);
    cases.push(Case {
        name: format!(
            "inflight n={NCCL_NET_MAX_REQUESTS} size<={}",
            format_size(size)
        ),
        kind: CaseKind::InFlight {
            count: NCCL_NET_MAX_REQUESTS,
            size,
        },
    });
    let mut larger: Vec<(usize, usize)> = [(0, 4 << 10), (1000, 4 << 10), ((1 << 20) - 3, 4 << 20)]
        .into_iter()
        .filter(|&(_, r)| r <= max_size)
        .collect();
    if larger.is_empty() && max_size > 0 {
        larger.push((max_size / 2, max_size));
    }
    for (send, recv) in larger {
        cases.push(Case {
            name: format!("recvlarger send={} recv={}", send, format_size(recv)),
            kind: CaseKind::RecvLarger { send, recv },
        });
    }
    (cases, notes)
}

/// What a receive slot must hold afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    pub size: usize,
    pub seed: u64,
}

/// One `driver::run` of a case on one side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub sends: Vec<SendOp>,
    /// Pattern seed of each send.
    pub send_seeds: Vec<u64>,
    pub recvs: Vec<RecvOp>,
    /// Per receive op, per part.
    pub expect: Vec<Vec<Expect>>,
}

/// One side's buffers and rounds for a case. Receive buffers are `GUARD` bytes longer than
/// the slot posted in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasePlan {
    pub send_buf_lens: Vec<usize>,
    pub recv_buf_lens: Vec<usize>,
    pub rounds: Vec<Round>,
}

/// Seed stream of data sent by `sender` in case `idx`.
pub fn stream(idx: usize, sender: Side) -> u64 {
    ((idx as u64) << 1) | sender.index() as u64
}

fn tag_of_part(j: usize) -> i32 {
    0x100 + 7 * j as i32
}

fn multi_part_size(j: usize, max_size: usize) -> usize {
    (512 * (j + 1) + j).min(max_size)
}

/// Plans case `idx` for `side`. The peer's plan mirrors it: what one sends the other expects.
pub fn plan_case(idx: usize, kind: &CaseKind, side: Side) -> CasePlan {
    let mine = stream(idx, side);
    let theirs = stream(idx, side.peer());
    let single = |buf: usize, size: usize, tag: i32| RecvOp {
        parts: vec![RecvPart {
            buf,
            off: 0,
            size,
            tag,
        }],
    };
    let send = |buf: usize, size: usize, tag: i32| SendOp {
        buf,
        off: 0,
        size,
        tag,
    };
    match *kind {
        CaseKind::SendRecv { size, iters } => CasePlan {
            send_buf_lens: vec![size],
            recv_buf_lens: vec![size + GUARD],
            rounds: (0..iters)
                .map(|it| {
                    let tag = 0x4000 + it as i32;
                    Round {
                        sends: vec![send(0, size, tag)],
                        send_seeds: vec![pattern::seed(mine, size, it, tag)],
                        recvs: vec![single(0, size, tag)],
                        expect: vec![vec![Expect {
                            size,
                            seed: pattern::seed(theirs, size, it, tag),
                        }]],
                    }
                })
                .collect(),
        },
        CaseKind::MultiRecv { n, iters, max_size } => {
            let sizes: Vec<usize> = (0..n).map(|j| multi_part_size(j, max_size)).collect();
            CasePlan {
                send_buf_lens: sizes.clone(),
                recv_buf_lens: sizes.iter().map(|s| s + GUARD).collect(),
                rounds: (0..iters)
                    .map(|it| {
                        let order = pattern::shuffled(n, pattern::seed(mine, n, it, -1));
                        Round {
                            sends: order
                                .iter()
                                .map(|&j| send(j, sizes[j], tag_of_part(j)))
                                .collect(),
                            send_seeds: order
                                .iter()
                                .map(|&j| pattern::seed(mine, sizes[j], it, tag_of_part(j)))
                                .collect(),
                            recvs: vec![RecvOp {
                                parts: (0..n)
                                    .map(|j| RecvPart {
                                        buf: j,
                                        off: 0,
                                        size: sizes[j],
                                        tag: tag_of_part(j),
                                    })
                                    .collect(),
                            }],
                            expect: vec![(0..n)
                                .map(|j| Expect {
                                    size: sizes[j],
                                    seed: pattern::seed(theirs, sizes[j], it, tag_of_part(j)),
                                })
                                .collect()],
                        }
                    })
                    .collect(),
            }
        }
        CaseKind::InFlight { count, size } => {
            let sizes: Vec<usize> = (0..count).map(|i| size * (i + 1) / count).collect();
            CasePlan {
                send_buf_lens: sizes.clone(),
                recv_buf_lens: sizes.iter().map(|s| s + GUARD).collect(),
                rounds: vec![Round {
                    sends: (0..count).map(|i| send(i, sizes[i], i as i32)).collect(),
                    send_seeds: (0..count)
                        .map(|i| pattern::seed(mine, sizes[i], 0, i as i32))
                        .collect(),
                    recvs: (0..count).map(|i| single(i, sizes[i], i as i32)).collect(),
                    expect: (0..count)
                        .map(|i| {
                            vec![Expect {
                                size: sizes[i],
                                seed: pattern::seed(theirs, sizes[i], 0, i as i32),
                            }]
                        })
                        .collect(),
                }],
            }
        }
        CaseKind::RecvLarger { send: s, recv: r } => CasePlan {
            send_buf_lens: vec![s],
            recv_buf_lens: vec![r + GUARD],
            rounds: (0..2)
                .map(|it| Round {
                    sends: vec![send(0, s, 7)],
                    send_seeds: vec![pattern::seed(mine, s, it, 7)],
                    recvs: vec![single(0, r, 7)],
                    expect: vec![vec![Expect {
                        size: s,
                        seed: pattern::seed(theirs, s, it, 7),
                    }]],
                })
                .collect(),
        },
    }
}

/// Checks one received slot: reported size, data, and that nothing was written after the
/// message (up to the end of the slot's guard zone). `slot` starts at the part's offset and
/// ends at the end of the posted size plus `GUARD`.
pub fn verify_slot(slot: &[u8], reported: i32, expect: &Expect) -> Result<(), String> {
    if usize::try_from(reported).ok() != Some(expect.size) {
        return Err(format!(
            "test() reported size {reported}, sent {}",
            expect.size
        ));
    }
    pattern::verify(&slot[..expect.size], expect.seed).map_err(|m| format!("data: {m}"))?;
    pattern::verify_poison_from(&slot[expect.size..], expect.seed, expect.size).map_err(|m| {
        format!(
            "wrote past the {}-byte message: {}",
            expect.size,
            pattern::Mismatch {
                offset: m.offset + expect.size,
                ..m
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(cases: &[Case]) -> Vec<&str> {
        cases.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn full_plan() {
        let (cases, notes) = plan(64 << 20, 8);
        assert!(notes.is_empty());
        assert_eq!(
            names(&cases),
            [
                "sendrecv size=0",
                "sendrecv size=1",
                "sendrecv size=7",
                "sendrecv size=8",
                "sendrecv size=4K",
                "sendrecv size=64K",
                "sendrecv size=1M",
                "sendrecv size=16M",
                "sendrecv size=64M",
                "multirecv n=2",
                "multirecv n=3",
                "multirecv n=4",
                "multirecv n=5",
                "multirecv n=6",
                "multirecv n=7",
                "multirecv n=8",
                "inflight n=32 size<=64K",
                "recvlarger send=0 recv=4K",
                "recvlarger send=1000 recv=4K",
                "recvlarger send=1048573 recv=4M",
            ]
        );
    }

    #[test]
    fn capped_plan() {
        let (cases, notes) = plan(4096, 1);
        assert_eq!(
            names(&cases),
            [
                "sendrecv size=0",
                "sendrecv size=1",
                "sendrecv size=7",
                "sendrecv size=8",
                "sendrecv size=4K",
                "inflight n=32 size<=4K",
                "recvlarger send=0 recv=4K",
                "recvlarger send=1000 recv=4K",
            ]
        );
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("n=2..8") && notes[0].contains("maxRecvs=1"));
        let (cases, _) = plan(100, 0);
        assert_eq!(
            cases.last().unwrap().kind,
            CaseKind::RecvLarger {
                send: 50,
                recv: 100
            }
        );
    }

    /// What one side sends, the other expects: same sizes, tags and seeds.
    #[test]
    fn plans_of_the_two_sides_mirror() {
        let (cases, _) = plan(64 << 20, 8);
        for (idx, case) in cases.iter().enumerate() {
            let a = plan_case(idx, &case.kind, Side::A);
            let b = plan_case(idx, &case.kind, Side::B);
            assert_eq!(a.rounds.len(), b.rounds.len());
            for (ra, rb) in a.rounds.iter().zip(&b.rounds) {
                // Sends of A, grouped by tag, against the parts of B's receives.
                let mut sent: Vec<(i32, usize, u64)> = ra
                    .sends
                    .iter()
                    .zip(&ra.send_seeds)
                    .map(|(s, &seed)| (s.tag, s.size, seed))
                    .collect();
                let mut expected: Vec<(i32, usize, u64)> = rb
                    .recvs
                    .iter()
                    .zip(&rb.expect)
                    .flat_map(|(op, ex)| {
                        op.parts
                            .iter()
                            .zip(ex)
                            .map(|(p, e)| (p.tag, e.size, e.seed))
                    })
                    .collect();
                sent.sort_unstable();
                expected.sort_unstable();
                assert_eq!(sent, expected, "case {}", case.name);
                // Slots fit their buffers (with the guard zone) and hold the message.
                for op in &rb.recvs {
                    for p in &op.parts {
                        assert!(p.off + p.size + GUARD <= b.recv_buf_lens[p.buf]);
                    }
                }
                for (op, ex) in rb.recvs.iter().zip(&rb.expect) {
                    for (p, e) in op.parts.iter().zip(ex) {
                        assert!(e.size <= p.size);
                    }
                }
                for s in &ra.sends {
                    assert!(s.off + s.size <= a.send_buf_lens[s.buf]);
                }
            }
            // The two directions carry different data.
            if let (Some(ra), Some(rb)) = (a.rounds.first(), b.rounds.first()) {
                if let (Some(sa), Some(sb)) = (ra.send_seeds.first(), rb.send_seeds.first()) {
                    assert_ne!(sa, sb);
                }
            }
        }
    }

    #[test]
    fn multirecv_plan_shuffles_sends_and_uses_distinct_tags() {
        let plan = plan_case(
            3,
            &CaseKind::MultiRecv {
                n: 8,
                iters: 2,
                max_size: 1 << 20,
            },
            Side::A,
        );
        let r = &plan.rounds[0];
        assert_eq!(r.recvs.len(), 1);
        assert_eq!(r.recvs[0].parts.len(), 8);
        let tags: Vec<i32> = r.sends.iter().map(|s| s.tag).collect();
        let mut sorted = tags.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        let in_order: Vec<i32> = r.recvs[0].parts.iter().map(|p| p.tag).collect();
        assert_ne!(tags, in_order, "sends are posted in a shuffled order");
        let sizes: std::collections::HashSet<usize> =
            r.recvs[0].parts.iter().map(|p| p.size).collect();
        assert_eq!(sizes.len(), 8, "parts have distinct sizes");
    }

    #[test]
    fn inflight_plan_posts_32_each_way() {
        let plan = plan_case(
            0,
            &CaseKind::InFlight {
                count: 32,
                size: 65536,
            },
            Side::B,
        );
        assert_eq!(plan.rounds.len(), 1);
        assert_eq!(plan.rounds[0].sends.len(), 32);
        assert_eq!(plan.rounds[0].recvs.len(), 32);
        assert_eq!(plan.rounds[0].sends[31].size, 65536);
        assert_eq!(plan.rounds[0].sends[0].size, 2048);
    }

    #[test]
    fn slot_verification() {
        let e = Expect { size: 10, seed: 42 };
        let mut slot = vec![0u8; 10 + GUARD];
        pattern::fill_poison(&mut slot, 42);
        pattern::fill(&mut slot[..10], 42);
        assert_eq!(verify_slot(&slot, 10, &e), Ok(()));
        assert!(verify_slot(&slot, 11, &e)
            .unwrap_err()
            .contains("reported size 11"));
        assert!(verify_slot(&slot, -1, &e)
            .unwrap_err()
            .contains("reported size -1"));
        let mut bad = slot.clone();
        bad[4] ^= 1;
        assert!(verify_slot(&bad, 10, &e)
            .unwrap_err()
            .starts_with("data: byte 4"));
        let mut over = slot.clone();
        over[12] ^= 0xff;
        let err = verify_slot(&over, 10, &e).unwrap_err();
        assert!(
            err.contains("wrote past the 10-byte message: byte 12"),
            "{err}"
        );
        // A zero-byte message: the whole slot must be untouched.
        let z = Expect { size: 0, seed: 5 };
        let mut zs = vec![0u8; GUARD];
        pattern::fill_poison(&mut zs, 5);
        assert_eq!(verify_slot(&zs, 0, &z), Ok(()));
    }
}
