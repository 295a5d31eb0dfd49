//! `maxComms` against a device's real limits: connections opened up to the budget that
//! `getProperties` reports, each running a full window (32 grouped receives of 8 buffers
//! and the 256 sends that fill them, every byte checked), fail neither for lack of queue pairs
//! nor of completion-queue entries; beyond the budget, what fails first does so with a clear
//! error, and nothing hangs or leaks. Each scenario runs in a process of its own (the
//! configuration is read once per process), with eager sends off (`HA_NCCL_SOCK_EAGER=0`):
//! grouped receives are the worst case a queue pair reserves for (8 writes and a record per
//! receive; an eager send is 2 writes):
//!
//! * `sock`, two loopback rails emulating `max_qp` 40 (`HA_NCCL_SOCK_MAX_QP`): budget
//!   (40 - 1/8) / 2 = 17 connections per device. Connections fill both devices to the budget
//!   and run full windows; then more are opened until one fails: the queue pair that does not
//!   fit is refused with the device's `max_qp` in the error, well past the budget (the 1/8
//!   spare and the standby accounting), and once everything is closed every queue pair is
//!   given back.
//! * `sock`, completion queues of at most 2048 entries (`HA_NCCL_SOCK_MAX_CQE`): each queue
//!   pair reserves what it can owe (`CQES_PER_QP`), so a queue holds 2048 / CQES_PER_QP of
//!   them and the engine opens another when none has room. With polling paused (a consumer
//!   that is not scheduled), 2 to 16 connections per device post a full window and are then
//!   closed, which flushes everything still posted into the queues: the worst pile-up a port
//!   failure makes. Nothing overruns, and the device has as many queues as its queue pairs
//!   need.
//! * `verbs` (Soft-RoCE, `scripts/softroce/run-in-vm.sh`): the rxe devices' own limits; full
//!   windows on a number of connections (`HA_BUDGET_VERBS_COMMS`, default 16) within the
//!   budget.

mod common;

use common::{eventually, until_token, wait_done};
use ha_core::api::log::{ensure_subscriber, install, Level, LogSink};
use ha_core::api::ops::{self, RecvBuf};
use ha_core::fabric::counters;
use ha_core::fabric::sock;
use ha_core::transport::budget::Budget;
use ha_core::transport::path::CQES_PER_QP;
use ha_core::transport::recv::CTS_SIGNAL_EVERY;
use parking_lot::Mutex;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLOTS: usize = 32;
const PER_SLOT: usize = 8;
const MSG: usize = 256;
const SCENARIO_VAR: &str = "HA_BUDGET_SCENARIO";

/// Log lines of the plugin, kept for assertions.
struct Capture(Mutex<Vec<String>>);

impl LogSink for Capture {
    fn log(&self, level: Level, _init: bool, _file: &str, _line: u32, msg: &str) {
        self.0.lock().push(format!("{} {msg}", level.as_str()));
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

/// A connection (send comm, receive comm) with one registered buffer per side.
struct Pair {
    send: u64,
    recv: u64,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    smr: u64,
    rmr: u64,
}

/// Open one connection listening on `listen_dev` and connecting from `connect_dev`.
fn open(listen_dev: i32, connect_dev: i32) -> Result<Pair, String> {
    let mut handle = [0u8; 128];
    let listen = ops::listen(listen_dev, &mut handle).map_err(|e| e.msg)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut send, mut recv) = (0, 0);
    let got = loop {
        if send == 0 {
            match ops::connect(connect_dev, &mut handle) {
                Ok(t) => send = t,
                Err(e) => break Err(e.msg),
            }
        }
        if recv == 0 {
            match ops::accept(listen) {
                Ok(t) => recv = t,
                Err(e) => break Err(e.msg),
            }
        }
        if send != 0 && recv != 0 {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err("handshake did not finish".into());
        }
        std::thread::yield_now();
    };
    ops::close_listen(listen).expect("closeListen");
    if let Err(e) = got {
        // The half that was made goes; the other side's error is the one to report.
        if send != 0 {
            ops::close_send(send).expect("closeSend");
        }
        if recv != 0 {
            ops::close_recv(recv).expect("closeRecv");
        }
        return Err(e);
    }
    let n = SLOTS * PER_SLOT * MSG;
    let sbuf = vec![0u8; n];
    let mut rbuf = vec![0u8; n];
    let smr = ops::reg_mr(send, sbuf.as_ptr() as usize, n, 1).expect("regMr send");
    let rmr = ops::reg_mr(recv, rbuf.as_mut_ptr() as usize, n, 1).expect("regMr recv");
    Ok(Pair {
        send,
        recv,
        sbuf,
        rbuf,
        smr,
        rmr,
    })
}

/// Post a full window on every pair: 32 receives of 8 buffers, then the 256 sends that fill
/// them (each a distinct pattern). Returns the requests (send, receive) per pair.
fn post_windows(pairs: &mut [Pair], seed: usize) -> Vec<(Vec<u64>, Vec<u64>)> {
    let mut reqs = Vec::new();
    for (p, pair) in pairs.iter_mut().enumerate() {
        for (i, chunk) in pair.sbuf.chunks_mut(MSG).enumerate() {
            chunk.copy_from_slice(&pattern(seed + p * 1000 + i, MSG));
        }
        pair.rbuf.iter_mut().for_each(|b| *b = 0);
        let base = pair.rbuf.as_mut_ptr() as usize;
        let recvs: Vec<u64> = (0..SLOTS)
            .map(|s| {
                let bufs: Vec<RecvBuf> = (0..PER_SLOT)
                    .map(|j| RecvBuf {
                        addr: base + (s * PER_SLOT + j) * MSG,
                        size: MSG as i64,
                        tag: j as i32,
                        mr: pair.rmr,
                    })
                    .collect();
                until_token("irecv", || ops::irecv(pair.recv, &bufs).expect("irecv"))
            })
            .collect();
        reqs.push((Vec::new(), recvs));
    }
    for (p, pair) in pairs.iter().enumerate() {
        let base = pair.sbuf.as_ptr() as usize;
        for i in 0..SLOTS * PER_SLOT {
            let tag = (i % PER_SLOT) as i32;
            let t = until_token("isend", || {
                ops::isend(pair.send, base + i * MSG, MSG as i64, tag, pair.smr).expect("isend")
            });
            reqs[p].0.push(t);
        }
    }
    reqs
}

/// A full window on every pair, completed and checked byte for byte.
fn full_windows(pairs: &mut [Pair], seed: usize) {
    let reqs = post_windows(pairs, seed);
    for (p, (sends, recvs)) in reqs.iter().enumerate() {
        for &s in sends {
            assert_eq!(wait_done(s), vec![MSG as u64]);
        }
        for &r in recvs {
            assert_eq!(wait_done(r), vec![MSG as u64; PER_SLOT]);
        }
        assert!(
            pairs[p].rbuf == pairs[p].sbuf,
            "pair {p}: bytes of the window"
        );
    }
}

fn close(pairs: Vec<Pair>) {
    for p in pairs {
        ops::dereg_mr(p.send, p.smr).expect("deregMr");
        ops::dereg_mr(p.recv, p.rmr).expect("deregMr");
        ops::close_send(p.send).expect("closeSend");
        ops::close_recv(p.recv).expect("closeRecv");
        drop((p.sbuf, p.rbuf));
    }
}

/// Init with the log captured; checks the budget line `getProperties` logs once per device.
fn start() -> (Arc<Capture>, Vec<Budget>) {
    let cap = Arc::new(Capture(Mutex::new(Vec::new())));
    install(cap.clone());
    ensure_subscriber();
    ops::init().expect("init");
    let n = ops::devices().unwrap();
    let budgets: Vec<Budget> = (0..n)
        .map(|d| {
            let b = ops::comm_budget(d).unwrap();
            assert_eq!(ops::max_comms(d).unwrap() as u32, b.max_comms);
            b
        })
        .collect();
    let lines: Vec<String> = cap
        .0
        .lock()
        .iter()
        .filter(|l| l.contains("maxComms"))
        .cloned()
        .collect();
    assert_eq!(
        lines.len(),
        n as usize,
        "one budget line per device: {lines:?}"
    );
    for (d, b) in budgets.iter().enumerate() {
        println!("device {d}: {}", b.describe());
        assert!(
            lines[d].starts_with(&format!("INFO NET/HA : device {d} (")),
            "{}",
            lines[d]
        );
        assert!(
            lines[d].contains(&format!("maxComms {}", b.max_comms)),
            "{}",
            lines[d]
        );
    }
    (cap, budgets)
}

/// Connections at the budget on both sock rails: each device then carries `max_comms`
/// comms' primaries (pairs listen and connect on it, so both comms are its) and its
/// partner's standbys.
fn open_at_budget(max_comms: u32) -> Vec<Pair> {
    (0..max_comms / 2)
        .flat_map(|_| [0, 1])
        .map(|d| open(d, d).expect("a connection within the budget"))
        .collect()
}

fn all_closed() -> bool {
    counters::snapshot() == counters::Resources::default()
}

fn scenario_qp() {
    let (_cap, budgets) = start();
    let m = budgets[0].max_comms;
    assert_eq!((m, budgets[0].by_qps), (17, Some(17)), "(40 - 5) / 2");
    let mut pairs = open_at_budget(m);
    let now = counters::snapshot();
    assert_eq!(now.connections, 2 * pairs.len());
    assert_eq!(now.qps, 4 * pairs.len(), "two paths per comm: {now:?}");
    println!(
        "{} connections, {} queue pairs ({} per device)",
        now.connections,
        now.qps,
        now.qps / 2
    );
    full_windows(&mut pairs, 1);
    // Beyond the budget: connections on device 0 until a queue pair does not fit.
    let mut extra = 0;
    let err = loop {
        match open(0, 0) {
            Ok(p) => {
                pairs.push(p);
                extra += 1;
                assert!(extra < 40, "max_qp 40 never ran out");
            }
            Err(e) => break e,
        }
    };
    println!("connection {} beyond the budget failed: {err}", extra + 1);
    assert!(err.contains("cannot create a queue pair"), "{err}");
    assert!(err.contains("max_qp 40 (HA_NCCL_SOCK_MAX_QP)"), "{err}");
    // Each pair on device 0 holds two of its queue pairs and two of device 1's: 16 pairs at
    // the budget use 32 of each; 4 more fit.
    assert_eq!(extra, 4);
    let comms_on_0 = 2 * (m / 2 + extra);
    assert!(
        comms_on_0 > m,
        "the first failure comes past the budget ({comms_on_0} > {m})"
    );
    // What was opened still works.
    full_windows(&mut pairs, 2);
    close(pairs);
    assert!(
        eventually(30, all_closed),
        "leftovers: {:?}",
        counters::snapshot()
    );
    // Every queue pair came back: the budget fits again.
    let mut again = open_at_budget(m);
    full_windows(&mut again, 3);
    close(again);
    assert!(
        eventually(30, all_closed),
        "leftovers: {:?}",
        counters::snapshot()
    );
}

/// Per device: `per_dev` connections' full windows posted with polling paused, then every
/// connection closed (flushing what is still posted). Returns the most entries a completion
/// queue held and whether one overran.
fn pile_up(per_dev: usize, seed: usize) -> (usize, bool) {
    let mut pairs: Vec<Pair> = (0..per_dev)
        .flat_map(|_| [0, 1])
        .map(|d| open(d, d).expect("connection"))
        .collect();
    full_windows(&mut pairs, seed);
    let per_cq = (2048 / CQES_PER_QP) as usize;
    let want_cqs = 2 * (4 * per_dev).div_ceil(per_cq);
    let cqs = counters::snapshot().cqs;
    assert!(
        cqs >= want_cqs,
        "{} queue pairs per device need {want_cqs} queues in all, {cqs} open",
        4 * per_dev
    );
    sock::reset_cq_stats();
    sock::pause_polling(true);
    let _reqs = post_windows(&mut pairs, seed + 1);
    // Every window's records and data immediates reach the queues, and its signaled
    // clear-to-sends (one in CTS_SIGNAL_EVERY: a window is SLOTS consecutive sequence numbers).
    let cts = SLOTS / CTS_SIGNAL_EVERY as usize;
    let want = pairs.len() * (2 * SLOTS + cts);
    let arrived = eventually(60, || {
        let s = sock::cq_stats();
        s.pending >= want || s.overruns > 0
    });
    assert!(arrived, "{:?}, want {want} entries", sock::cq_stats());
    close(pairs);
    let s = sock::cq_stats();
    sock::pause_polling(false);
    assert!(
        eventually(30, all_closed),
        "leftovers: {:?}",
        counters::snapshot()
    );
    (s.high_water, s.overruns > 0)
}

fn scenario_cq() {
    let (_cap, budgets) = start();
    let b = budgets[0];
    assert_eq!(
        b.cq_size, 2048,
        "the device's max_cqe caps the engine's queues"
    );
    let per_cq = b.qps_per_cq as usize;
    assert_eq!(per_cq, 2048 / CQES_PER_QP as usize);
    for per_dev in [1, 2, 4, 8] {
        // `per_dev` pairs listen and connect on each device: each device then carries 2 *
        // per_dev comms' primaries and as many standbys, 4 * per_dev queue pairs.
        let (high, overran) = pile_up(per_dev, per_dev * 10);
        let qps = 4 * per_dev;
        println!(
            "{} comms per device ({qps} queue pairs): fullest completion queue held {high} of 2048",
            2 * per_dev
        );
        assert!(
            !overran && high <= 2048,
            "{qps} queue pairs overran: {high}"
        );
        assert!(
            high >= 64 * per_dev.min(per_cq),
            "the flush piled up: {high}"
        );
    }
    // The queues the engine opened for the largest pile-up were given back with it.
    assert!(
        eventually(30, all_closed),
        "leftovers: {:?}",
        counters::snapshot()
    );
}

fn env_dev(name: &str, default: i32) -> i32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Soft-RoCE: the rxe devices' own limits. Connections listen on `HA_TEST_LISTEN_DEV` and
/// connect from `HA_TEST_CONNECT_DEV`, so the connecting device carries one comm per pair.
fn scenario_verbs() {
    let (_cap, budgets) = start();
    let (ld, cd) = (
        env_dev("HA_TEST_LISTEN_DEV", 1),
        env_dev("HA_TEST_CONNECT_DEV", 0),
    );
    assert!(budgets
        .iter()
        .all(|b| b.limits.max_qp.is_some() && b.limits.max_cqe.is_some()));
    // rxe's budget is tens of thousands of connections: open a number the guest can carry.
    let want = env_dev("HA_BUDGET_VERBS_COMMS", 16) as u32;
    let m = budgets[cd as usize].max_comms.min(want);
    let mut pairs: Vec<Pair> = (0..m)
        .map(|_| open(ld, cd).expect("connection within the budget"))
        .collect();
    println!(
        "{m} connections from device {cd} to device {ld}: {:?}",
        counters::snapshot()
    );
    for round in 0..2 {
        full_windows(&mut pairs, round);
    }
    close(pairs);
    assert!(
        eventually(60, all_closed),
        "leftovers: {:?}",
        counters::snapshot()
    );
}

/// Run `scenario` in a child process (this binary, running only [`child`]).
fn in_child(scenario: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO_VAR, scenario)
        .env("HA_NCCL_FABRIC", "sock")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("HA_NCCL_SOCK_RAILS", "127.0.0.1,127.0.0.2")
        .env("HA_NCCL_ENABLE_BACKUP", "1")
        .env("HA_NCCL_SOCK_EAGER", "0")
        .env("NCCL_DEBUG", "INFO");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the scenario's child process");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "scenario {scenario} failed");
    assert!(
        text.contains(&format!("scenario {scenario} passed")),
        "scenario {scenario} did not run"
    );
}

#[test]
fn sock_queue_pair_budget() {
    if std::env::var("HA_NCCL_FABRIC").is_ok_and(|f| f == "verbs") {
        return; // the verbs run (Soft-RoCE) is `child` with the scenario set
    }
    in_child("qp", &[("HA_NCCL_SOCK_MAX_QP", "40")]);
}

#[test]
fn sock_completion_queue_budget() {
    if std::env::var("HA_NCCL_FABRIC").is_ok_and(|f| f == "verbs") {
        return;
    }
    in_child("cq", &[("HA_NCCL_SOCK_MAX_CQE", "2048")]);
}

/// The body of every scenario; does nothing unless started with `HA_BUDGET_SCENARIO`.
#[test]
fn child() {
    let Ok(scenario) = std::env::var(SCENARIO_VAR) else {
        return;
    };
    match scenario.as_str() {
        "qp" => scenario_qp(),
        "cq" => scenario_cq(),
        "verbs" => scenario_verbs(),
        other => panic!("unknown scenario {other}"),
    }
    println!("scenario {scenario} passed");
}
