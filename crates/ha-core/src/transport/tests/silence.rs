//! The fast check of the active link (`HA_NCCL_SILENCE_MS`, `link/silence.rs`): a link that
//! acknowledges nothing moves traffic to a standby that answers, long before the soft timeout;
//! a peer that answers on neither path (stopped) is waited for; a link that answers again
//! before the standby confirms keeps the traffic.

use super::*;

/// Knobs: a soft timeout far above the silence window, so only the silence check can move
/// traffic within the test's bounds.
fn slow_rto() -> HaCfg {
    let mut c = cfg();
    c.rto = Duration::from_secs(5);
    c.home.return_home = false;
    c
}

/// Step both sides for `d`, asserting both stay on path 0 in `Normal`.
fn stays_normal(p: &mut Pair, flow: &mut Flow, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        let _ = flow.step(p);
        for (side, l) in [("sender", &p.send.link), ("receiver", &p.recv.link)] {
            assert!(
                matches!(l.phase, Phase::Normal) && l.active == 0,
                "the {side}'s traffic moved: {:?}",
                l.phase
            );
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_silent_link_moves_to_the_answering_standby_long_before_the_soft_timeout() {
    let _l = TEST_LOCK.read();
    // Seen from the sender only (its own control), so the sender is the one that notices.
    let mut p = Pair::split(slow_rto(), "");
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.link.silence_window(), Duration::from_millis(25));
    // The primary's link dies at the sender's end: nothing completes, nothing is acknowledged.
    p.ctl.hold(p.qpn(true, 0));
    p.ctl.silence(0, true);
    let t0 = Instant::now();
    let mut cause = String::new();
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "failover",
        |p| {
            if let Phase::Failing(f) = &p.send.link.phase {
                cause = f.cause.clone();
            }
            !cause.is_empty()
        },
    );
    let took = t0.elapsed();
    assert!(cause.contains("link silent for"), "{cause}");
    assert!(cause.contains("while path 1 answers"), "{cause}");
    // The soft timeout is 5 s: a move within 1 s can only be the silence check's.
    assert!(took < Duration::from_secs(1), "took {took:?}");
    p.ctl.silence(0, false);
    p.ctl.release(p.qpn(true, 0));
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "re-arm", |p| {
        p.send.stats().rearms == 1 && p.send.link.active == 1 && p.recv.link.active == 1
    });
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 1);
    // The old path re-armed at the first attempt: a false alarm, the window widened with the
    // soft timeout.
    assert_eq!(p.send.link.silence_window(), Duration::from_millis(50));
}

/// A pair seen from the sender only (its own control; the receiver's links are fine) whose
/// peer stopped: nothing completes on either path and the active link looks silent (its
/// kernel delays its acknowledgements); stepped until the sender suspects the link.
fn suspected_with_nothing_answering() -> (Pair, Flow) {
    let mut p = Pair::split(slow_rto(), "");
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    p.ctl.hold(p.qpn(true, 0));
    p.ctl.hold(p.qpn(true, 1));
    p.ctl.silence(0, true);
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "suspicion",
        |p| p.send.link.silence.suspected(),
    );
    (p, flow)
}

#[test]
fn a_peer_that_answers_on_neither_path_is_waited_for() {
    let _l = TEST_LOCK.read();
    let (mut p, mut flow) = suspected_with_nothing_answering();
    stays_normal(&mut p, &mut flow, Duration::from_millis(500));
    // It runs again: both paths answer.
    p.ctl.silence(0, false);
    p.ctl.release(p.qpn(true, 0));
    p.ctl.release(p.qpn(true, 1));
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 0);
    assert!(!p.send.link.silence.suspected());
    assert!(p.send.link.silence.cleared >= 1);
}

#[test]
fn a_link_that_answers_again_before_the_standby_confirms_keeps_the_traffic() {
    let _l = TEST_LOCK.read();
    let (mut p, mut flow) = suspected_with_nothing_answering();
    // The active link acknowledges again, then the standby's answer arrives: the link was
    // only slow, nothing moves (its completions are still held: a slow peer).
    p.ctl.silence(0, false);
    stays_normal(&mut p, &mut flow, Duration::from_millis(30));
    p.ctl.release(p.qpn(true, 1));
    stays_normal(&mut p, &mut flow, Duration::from_millis(300));
    p.ctl.release(p.qpn(true, 0));
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 0);
}

#[test]
fn with_the_check_off_a_silent_link_waits_for_the_other_timers() {
    let _l = TEST_LOCK.read();
    let mut c = slow_rto();
    c.silence = Duration::ZERO;
    let mut p = Pair::split(c, "");
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    p.ctl.hold(p.qpn(true, 0));
    p.ctl.silence(0, true);
    stays_normal(&mut p, &mut flow, Duration::from_millis(500));
    assert!(!p.send.link.silence.suspected());
    p.ctl.silence(0, false);
    p.ctl.release(p.qpn(true, 0));
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 0);
}

/// Where the fabric says nothing of its link (as on verbs: the link state hidden), beats do:
/// the primary stops completing anything — its beats go unanswered — with little payload out,
/// and traffic moves to the standby that answers, long before the soft timeout.
#[test]
fn beats_find_a_dead_link_where_the_fabric_says_nothing() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(slow_rto());
    p.ctl.hide_link_state();
    p.ctl_r.hide_link_state();
    let mut flow = Flow::new(&p, 8, 4 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert!(p.send.link.silence.beats > 0 || p.recv.link.silence.beats > 0);
    p.ctl.hold(p.qpn(true, 0));
    let t0 = Instant::now();
    let mut cause = String::new();
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "failover",
        |p| {
            if let Phase::Failing(f) = &p.send.link.phase {
                cause = f.cause.clone();
            }
            !cause.is_empty()
        },
    );
    let took = t0.elapsed();
    assert!(cause.contains("link silent for"), "{cause}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    p.ctl.release(p.qpn(true, 0));
    flow.run(&mut p, 200, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 1);
}

/// A sender's beat behind a large write would only measure the write: with more than
/// `MAX_AHEAD` payload bytes out, the path's silence is not judged (the receiver's beats are).
#[test]
fn a_large_write_ahead_is_no_silence() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(slow_rto());
    p.ctl.hide_link_state();
    p.ctl_r.hide_link_state();
    let mut flow = Flow::new(&p, 8, 1 << 20);
    flow.run(&mut p, 20, Duration::from_secs(30)).unwrap();
    // The sender's completions stop (a slow link under a large write, as far as it can tell).
    p.ctl.hold(p.qpn(true, 0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while p
        .send
        .link
        .path(0)
        .unanswered(Instant::now(), 64 << 10)
        .is_some()
    {
        assert!(Instant::now() < deadline, "no large write went out");
        flow.step(&mut p).unwrap();
    }
    stays_normal(&mut p, &mut flow, Duration::from_millis(300));
    assert!(!p.send.link.silence.suspected());
    p.ctl.release(p.qpn(true, 0));
    flow.run(&mut p, 20, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 0);
}
