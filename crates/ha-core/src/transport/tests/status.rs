//! Which error completions fail over and which end the connection (`ha_proto::status`),
//! through the connection layer: every status of the table injected on the sender's active
//! path of a live, verified stream.

use super::*;
use ha_proto::status::StatusClass;

/// Every verbs status with a code, by class.
fn statuses(class: StatusClass) -> Vec<WcStatus> {
    (1u32..=24)
        .map(WcStatus::from_code)
        .filter(|s| s.class() == class)
        .collect()
}

/// A link-like status on the path carrying traffic: the connection fails over, replays, and
/// the stream goes on byte-exact on the other path.
#[test]
fn link_statuses_fail_over_and_the_stream_goes_on() {
    let _l = TEST_LOCK.read();
    let link = statuses(StatusClass::Link);
    assert_eq!(link.len(), 10, "{link:?}");
    for st in link {
        let mut p = Pair::new(cfg());
        let mut flow = Flow::new(&p, 8, 16 << 10);
        flow.run(&mut p, 30, Duration::from_secs(30)).unwrap();
        let qpn = p.qpn(true, p.send.link.active);
        p.ctl.inject(error_completion(qpn, st));
        pump_until(
            &mut p,
            &mut flow,
            Duration::from_secs(20),
            "failover",
            |p| p.send.link.epoch == 1 && p.recv.link.epoch == 1,
        );
        flow.run(&mut p, 30, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{st:?}: stream after the failover: {e}"));
        assert_eq!(p.send.stats().failovers, 1, "{st:?}");
        assert!(p.send.machine.failure().is_none(), "{st:?}");
    }
}

/// A protection, access, length or invalid-request status on the path carrying traffic: no
/// failover (a replay on the standby would fail the same way), the connection ends with an
/// error naming the status.
#[test]
fn bug_statuses_end_the_connection_naming_the_status_without_a_switch() {
    let _l = TEST_LOCK.read();
    let bugs = statuses(StatusClass::Bug);
    assert_eq!(bugs.len(), 14, "{bugs:?}");
    for st in bugs {
        let mut p = Pair::new(cfg());
        let mut flow = Flow::new(&p, 8, 16 << 10);
        flow.run(&mut p, 30, Duration::from_secs(30)).unwrap();
        let qpn = p.qpn(true, p.send.link.active);
        p.ctl.inject(error_completion(qpn, st));
        pump_until(
            &mut p,
            &mut flow,
            Duration::from_secs(20),
            "sender dead",
            |p| matches!(p.send.link.phase, Phase::Dead),
        );
        assert_eq!(p.send.link.epoch, 0, "{st:?}: switched");
        assert_eq!(p.send.stats().failovers, 0, "{st:?}");
        let e = p
            .send
            .machine
            .failure()
            .unwrap_or_else(|| panic!("{st:?}: no failure"))
            .to_string();
        assert!(e.contains(&format!("{st:?}")), "{st:?}: {e}");
        assert!(e.contains("not a link failure"), "{st:?}: {e}");
    }
}

/// The same status on the idle standby costs only the standby (it is re-armed), never the
/// connection: traffic does not depend on it.
#[test]
fn a_bug_status_on_the_standby_loses_only_the_standby() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 16 << 10);
    flow.run(&mut p, 30, Duration::from_secs(30)).unwrap();
    let standby = 1 - p.send.link.active;
    p.ctl.inject(error_completion(
        p.qpn(true, standby),
        WcStatus::RemAccessErr,
    ));
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(20),
        "standby lost",
        |p| p.send.stats().standby_lost == 1,
    );
    flow.run(&mut p, 30, Duration::from_secs(30)).unwrap();
    assert!(matches!(p.send.link.phase, Phase::Normal));
    assert_eq!(p.send.link.epoch, 0);
}
