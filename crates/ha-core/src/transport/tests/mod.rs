//! Tests of the connection layer (`link/`, `send.rs`, `recv.rs`): a real two-rail `sock`
//! connection in one process, wrapped so that the test controls port health and completions
//! ([`ctl_fabric`]), drives `tick()`, failovers, the drain of a fence, epochs and re-arms
//! deterministically where it can, and checks every message byte by byte ([`pair::Flow`]).

mod ctl_fabric;
mod drain;
mod limits;
mod live_stats;
mod pair;
mod rearm;
mod tick;

use crate::fabric::sock::tests::TEST_LOCK;
use crate::fabric::{Completion, WcOpcode, WcStatus};
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
