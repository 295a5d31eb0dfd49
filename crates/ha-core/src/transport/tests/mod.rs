//! Tests of the connection layer (`link/`, `send.rs`, `recv.rs`): a real two-rail `sock`
//! connection in one process, wrapped so that the test controls port health and completions
//! ([`ctl_fabric`]), drives `tick()`, failovers, the drain of a fence, epochs and re-arms
//! deterministically where it can, and checks every message byte by byte ([`pair::Flow`]).
//! `planned.rs` drives the planned switch and real failures in its middle, `home.rs` the
//! return home, its hysteresis, drains and skew between the two ends, `outage.rs` a long
//! outage (hundreds of re-arm attempts, resources flat).

mod ctl_fabric;
mod drain;
mod eager;
mod home;
mod inline;
mod limits;
mod live_stats;
mod outage;
mod pair;
mod planned;
mod poll;
mod rearm;
mod silence;
mod status;
mod tick;

use crate::fabric::sock::tests::TEST_LOCK;
use crate::fabric::{Completion, WcOpcode, WcStatus};
use crate::transport::ha::{HaCfg, HomeCfg};
use crate::transport::link::Phase;
use ha_proto::data::layout::{wr_id, WrKind};
use pair::{cfg, Flow, Pair};
use std::time::{Duration, Instant};

/// An error completion of queue pair `qpn` (a probe, as a dead link would fail it).
fn error_completion(qpn: u32, status: WcStatus) -> Completion {
    Completion {
        wr_id: wr_id(WrKind::Probe, 999_999, 0),
        qp_num: qpn,
        status,
        opcode: WcOpcode::RdmaWrite,
        byte_len: 0,
        imm: None,
    }
}

fn is_failing(p: &Phase) -> bool {
    matches!(p, Phase::Failing(_))
}

/// Pump both sides (through `flow`, tolerating its errors) until `done` holds, or fail with
/// `what` at `within`.
fn pump_until(
    p: &mut Pair,
    flow: &mut Flow,
    within: Duration,
    what: &str,
    mut done: impl FnMut(&Pair) -> bool,
) {
    let deadline = Instant::now() + within;
    while !done(p) {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        let _ = flow.step(p);
        std::thread::yield_now();
    }
}

/// `cfg()` with traffic returning home after `hold` of health (hysteresis bound 60 s).
fn home_cfg(hold: Duration) -> HaCfg {
    HaCfg {
        home: HomeCfg {
            return_hold: hold,
            return_hold_max: Duration::from_secs(60),
            ..HomeCfg::default()
        },
        ..cfg()
    }
}

/// Fail path `i` of the sender (`send`) or receiver with an error completion and wait until
/// both sides switched (one epoch further).
fn fail_path(p: &mut Pair, flow: &mut Flow, send: bool, i: usize) {
    let (es, er) = (p.send.link.epoch, p.recv.link.epoch);
    let qpn = p.qpn(send, i);
    let ctl = if send { &p.ctl } else { &p.ctl_r };
    ctl.inject(error_completion(qpn, WcStatus::RetryExcErr));
    pump_until(p, flow, Duration::from_secs(10), "failover", |p| {
        p.send.link.epoch == es + 1 && p.recv.link.epoch == er + 1
    });
}

/// Both sides' path `i` re-armed `n` times in all.
fn rearmed(p: &Pair, n: u64) -> bool {
    p.send.stats().rearms >= n && p.recv.stats().rearms >= n
}

/// Both sides on path `i`, at the same epoch, switching nothing.
fn settled_on(p: &Pair, i: usize) -> bool {
    p.send.link.active == i
        && p.recv.link.active == i
        && p.send.link.epoch == p.recv.link.epoch
        && matches!(p.send.link.phase, Phase::Normal)
        && matches!(p.recv.link.phase, Phase::Normal)
}

/// A fresh path for a test's stats file.
fn stats_path(what: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("ha-stats-{}-{what}.json", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The switch event lines of a stats file: (role, kind, from, to, bytes).
fn switch_events(file: &std::path::Path) -> Vec<(String, String, usize, usize, [u64; 2])> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let field = |l: &str, k: &str| -> String {
        let i = l.find(&format!("\"{k}\":")).map(|i| i + k.len() + 3);
        i.map(|i| {
            l[i..]
                .trim_start_matches('"')
                .split(['"', ',', '}'])
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
    };
    text.lines()
        .filter(|l| l.contains("\"event\":\"switch\""))
        .map(|l| {
            let b = l.split("\"bytes\":[").nth(1).unwrap_or("0,0]");
            let mut b = b.split([',', ']']).map(|v| v.parse::<u64>().unwrap_or(0));
            (
                field(l, "role"),
                field(l, "kind"),
                field(l, "from").parse().unwrap_or(9),
                field(l, "to").parse().unwrap_or(9),
                [b.next().unwrap_or(0), b.next().unwrap_or(0)],
            )
        })
        .collect()
}
