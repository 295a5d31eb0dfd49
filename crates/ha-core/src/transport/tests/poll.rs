//! What a `test()` costs when nothing happened: one pump polls the completion queues once
//! however many paths the connection has (they share the engine's router), and still delivers
//! what waits there for any path.

use super::*;
use std::sync::atomic::Ordering;

/// Finding (idle-call cost, 2026-11-27): every empty inbox had the router poll all the queues,
/// so a `test()` with the standby on polled them twice (three times during a re-arm).
#[test]
fn one_pump_polls_the_queues_once_whatever_the_paths() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.link.paths.len(), 2, "the standby is on");
    let queues = p.ctl.cq_loads().len() as u64;
    let pumps = 2000u64;
    p.ctl.count_polls_here();
    let before = p.ctl.cq_polls.load(Ordering::Relaxed);
    for _ in 0..pumps {
        // (A late probe or clear-to-send completion may still come: the count is the same.)
        let _ = p.send.link.poll(64);
    }
    let polls = p.ctl.cq_polls.load(Ordering::Relaxed) - before;
    // At most one poll of each queue per pump (fewer when the progress thread was polling at
    // that instant: it delivers then); two per pump before.
    assert!(
        polls <= pumps * queues,
        "{polls} polls of {queues} queues for {pumps} pumps"
    );
    assert!(
        polls >= pumps * queues / 2,
        "{polls} polls: the pumps did not poll"
    );
}

/// A completion that waits in the queue for the standby path is delivered by the pump that
/// finds every inbox empty (emptied, polled once, emptied again).
#[test]
fn a_pump_delivers_what_waits_in_the_queues_for_any_path() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    let standby = p.qpn(true, 1);
    let mut c = error_completion(standby, WcStatus::Success);
    c.wr_id = wr_id(WrKind::Probe, 424_242, 0);
    p.ctl.inject(c);
    // (The progress thread may be polling at that instant and deliver it instead: a few
    // pumps then.)
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(p.send.link.poll(64));
        if got.iter().any(|(_, g)| g.wr_id == c.wr_id) {
            break;
        }
    }
    // (A late completion of the active path may come with it.)
    assert!(
        got.iter()
            .any(|(i, g)| *i == Some(1) && g.qp_num == standby && g.wr_id == c.wr_id),
        "{got:?}"
    );
}
