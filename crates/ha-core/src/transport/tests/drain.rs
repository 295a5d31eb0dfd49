//! The drain of a fence and the end of a switch: the receiver never says `Switch` before its
//! fenced path flushed (it fails the connection rather than guess), completions of another path
//! after the switch are dropped and counted, and a connection that dies during the switch
//! stays dead.

use super::*;
use ha_proto::data::layout::data_imm;

/// Finding (drain watchdog): the failover went on after max(RTO, 200 ms) without a drained
/// fence, so the receiver could say `Switch{delivered}` while the old path could still
/// deliver. Now it waits for the flush, and ends the connection if it never comes.
#[test]
fn the_receiver_never_switches_before_its_fence_drained() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    // The receiver's primary fails; its flush completions are held back (lost).
    let r0 = p.qpn(false, 0);
    p.ctl.hold(r0);
    p.ctl.inject(error_completion(r0, WcStatus::RetryExcErr));
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "receiver fails over",
        |p| is_failing(&p.recv.link.phase),
    );
    // Overdue after the failover deadline of ticks that came in time (a late tick restarts the
    // count, and on a host at load 40 this thread is often off the CPU for longer than a
    // tick): bounded generously, the invariants checked on every step until then.
    let deadline = Instant::now() + (cfg().failover_deadline() * 4).max(Duration::from_secs(90));
    let mut failed = None;
    while Instant::now() < deadline {
        if let Err(e) = flow.step(&mut p) {
            failed = Some(e);
        }
        assert_eq!(
            p.recv.link.epoch, 0,
            "the receiver switched with its fence undrained"
        );
        assert_eq!(
            p.send.link.epoch, 0,
            "the sender got a Switch from an undrained fence"
        );
        if matches!(p.recv.link.phase, Phase::Dead) {
            break;
        }
        std::thread::yield_now();
    }
    assert!(
        matches!(p.recv.link.phase, Phase::Dead),
        "an undrained fence must end the connection: {:?}",
        p.recv.link.phase
    );
    let e = p
        .recv
        .machine
        .failure()
        .expect("receiver failed")
        .to_string();
    assert!(e.contains("WrFlushErr"), "{e}");
    let _ = failed;
    p.ctl.release(r0);
}

/// Finding (classify after the switch): successful completions of the fenced path were still
/// handed to the data machine after the switch, so a late completion for D+1 could complete a
/// receive (whose replay then wrote into the reused buffer). Now they are dropped and counted.
#[test]
fn completions_of_the_old_path_after_the_switch_are_dropped_and_counted() {
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    let r0 = p.qpn(false, 0);
    p.ctl.inject(error_completion(r0, WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(10), "switch", |p| {
        p.recv.link.epoch == 1 && p.send.link.epoch == 1
    });
    // A late "delivery" of the next sequence number on the old path.
    let next = p.recv.machine.delivered() + 1;
    p.ctl.inject(Completion {
        wr_id: wr_id(WrKind::Recv, 1, 0),
        qp_num: r0,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: 0,
        imm: Some(data_imm(next)),
    });
    flow.run(&mut p, 200, Duration::from_secs(30))
        .expect("every message intact: the stale completion completed nothing");
    assert_eq!(p.recv.stats().stale_dropped, 1);
    assert_eq!(p.recv.duplicates(), 0);
}

/// Finding (finish_switch): the phase was set `Normal` before checking it, so a link that went
/// `Dead` while re-posting on the new path came back `Normal` (and re-armed).
#[test]
fn a_connection_that_dies_during_the_switch_stays_dead() {
    use crate::transport::mr::MrHandle;
    use crate::transport::recv::RecvArg;
    let _l = TEST_LOCK.read();
    // No heartbeat due during the test: the only posts on the new path are the switch's.
    let mut p = Pair::new(crate::transport::ha::HaCfg {
        heartbeat: Duration::from_secs(3600),
        ..cfg()
    });
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    // One receive is open (nothing will be sent to it).
    let buf = vec![0u8; 4096];
    let mr = std::sync::Arc::new(
        MrHandle::register(p.recv.device_res(), buf.as_ptr() as usize, buf.len()).unwrap(),
    );
    let arg = RecvArg {
        addr: buf.as_ptr() as usize,
        size: buf.len(),
        tag: 9,
        mr: &mr,
    };
    p.recv.irecv(&[arg]).unwrap().expect("a receive slot");
    // The primary fails; its flush is held until posting on the new path fails.
    let (r0, r1) = (p.qpn(false, 0), p.qpn(false, 1));
    p.ctl.hold(r0);
    p.ctl.inject(error_completion(r0, WcStatus::RetryExcErr));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_failing(&p.recv.link.phase) {
        assert!(Instant::now() < deadline, "no failover");
        p.recv.pump();
    }
    // The first re-post fails (the queue pair goes to ERR; later posts on it are flushed).
    p.ctl.fail_posts(r1, 1);
    p.ctl.release(r0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_failing(&p.recv.link.phase) {
        assert!(Instant::now() < deadline, "the switch never ended");
        p.recv.pump();
    }
    assert!(
        matches!(p.recv.link.phase, Phase::Dead),
        "{:?} at epoch {}",
        p.recv.link.phase,
        p.recv.link.epoch
    );
    assert_eq!(p.recv.link.epoch, 0);
    assert!(p.recv.machine.failure().is_some());
    for _ in 0..50 {
        p.recv.pump();
    }
    assert!(matches!(p.recv.link.phase, Phase::Dead));
}

/// A control message of another epoch (a switch answered twice, a late duplicate) changes
/// nothing.
#[test]
fn switch_messages_of_another_epoch_are_ignored() {
    use ha_proto::data::layout::{CtrlKind, CtrlMsg};
    let _l = TEST_LOCK.read();
    let mut p = Pair::new(cfg());
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 50, Duration::from_secs(30)).unwrap();
    let stale = |kind| CtrlMsg {
        kind,
        epoch: 7,
        a: 0,
        b: 0,
        endpoint: Vec::new(),
    };
    p.send.on_ctrl(stale(CtrlKind::Switch));
    p.recv.on_ctrl(stale(CtrlKind::SwitchReq));
    assert!(matches!(p.send.link.phase, Phase::Normal));
    assert!(matches!(p.recv.link.phase, Phase::Normal));
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.send.stats().failovers, 0);
}
