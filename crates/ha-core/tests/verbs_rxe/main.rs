//! The `verbs` fabric on real kernel verbs: Soft-RoCE (rxe) inside the project's QEMU rig
//! (`scripts/softroce/test-verbs.sh`, or this binary under `scripts/softroce/run-in-vm.sh`).
//! Rail A joins rxe0a and rxe0b, rail B rxe1a and rxe1b, all in one guest; the two "ranks" of
//! every test are two devices of one rail. Without RDMA devices (the host) or without the rig's
//! environment every test prints why it is skipped and passes.
//!
//! Tests share the guest's links, so they take a process-wide lock and run one at a time;
//! those that break a link repair it when they end, pass or fail.

use ha_core::fabric::verbs::{self, VerbsConfig};
use ha_core::fabric::{
    Access, Doorbell, Fabric, FabricError, LinkLayer, QpState, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[macro_use]
mod rig;
mod gdr;
mod immediates;
mod link_failures;
use rig::*;

// ---------------------------------------------------------------- discovery and config

#[test]
fn discovery_lists_the_four_rxe_ports() {
    let rig = rig_or_skip!("discovery_lists_the_four_rxe_ports");
    let f = open(&data_cfg());
    assert_eq!(f.kind(), "verbs");
    let mut n = names(&f);
    n.sort();
    assert_eq!(n, ["rxe0a:1", "rxe0b:1", "rxe1a:1", "rxe1b:1"]);
    for e in [&rig.a.0, &rig.a.1, &rig.b.0, &rig.b.1] {
        let i = dev_index(&f, &e.dev);
        let d = &f.devices()[i];
        assert_eq!(d.port, 1);
        assert_eq!(d.link_layer, LinkLayer::Ethernet);
        assert!(d.speed_mbps > 0, "{d:?}");
        assert!(d.limits.max_qp.is_some_and(|n| n > 0), "{d:?}");
        assert!(d.limits.max_cqe.is_some_and(|n| n > 0), "{d:?}");
        assert_eq!(d.ptr_support, 1, "host memory only");
        assert_eq!(d.pci_path, None, "rxe is a virtual device");
        let p = f.port_info(i).unwrap();
        assert_eq!(p.state, 4, "ACTIVE");
        assert_eq!(p.active_mtu, 3, "1024-byte MTU on 1500-byte veths");
        assert_eq!(d.guid, p.guid);
        assert_ne!(d.guid, 0);
        // Automatic selection finds the rig's RoCE v2 IPv4 GID.
        let (idx, gid) = f.current_gid(i).unwrap();
        assert_eq!(idx, e.gid, "{}", e.dev);
        assert_eq!(gid, e.ip.to_ipv6_mapped().octets());
        assert!(f.port_events(i).unwrap().healthy());
    }
}

#[test]
fn nccl_ib_hca_filters_devices() {
    let _rig = rig_or_skip!("nccl_ib_hca_filters_devices");
    let with = |spec: &str| VerbsConfig {
        ib_hca: Some(spec.into()),
        ..data_cfg()
    };
    assert_eq!(names(&open(&with("=rxe0a"))), ["rxe0a:1"]);
    let mut n = names(&open(&with("^rxe1")));
    n.sort();
    assert_eq!(n, ["rxe0a:1", "rxe0b:1"]);
    assert_eq!(names(&open(&with("rxe1b:1"))).len(), 1);
    // Ports not offered are still listed, with the reason.
    let f = open(&with("rxe1b:1"));
    assert_eq!(f.ports().len(), 4);
    let excluded: Vec<_> = f.ports().iter().filter(|p| p.excluded.is_some()).collect();
    assert_eq!(excluded.len(), 3);
    match verbs::open(&with("rxe1b:2")) {
        Err(FabricError::NoDevice(msg)) => {
            assert!(msg.contains("excluded by NCCL_IB_HCA"), "{msg}")
        }
        Err(e) => panic!("expected NoDevice, got {e}"),
        Ok(_) => panic!("expected NoDevice, got a fabric"),
    }
}

#[test]
fn gid_index_override_is_used_and_checked() {
    let rig = rig_or_skip!("gid_index_override_is_used_and_checked");
    let forced = |g: i32| VerbsConfig {
        gid_index: Some(g),
        ..data_cfg()
    };
    // Index 0 is rxe's default link-local GID: forced, it is taken as is.
    let f = open(&forced(0));
    let i = dev_index(&f, &rig.a.0.dev);
    let (idx, gid) = f.current_gid(i).unwrap();
    assert_eq!((idx, &gid[..2]), (0, &[0xfe, 0x80][..]));
    // An index with no GID: creating a QP fails cleanly.
    let f = open(&forced(200));
    let i = dev_index(&f, &rig.a.0.dev);
    let pd = f.open_pd(i).unwrap();
    let cq = pd.create_cq(16, Arc::new(Doorbell::new())).unwrap();
    match pd.create_qp(&cq, CAPS) {
        Err(FabricError::System(msg)) => assert!(msg.contains("NCCL_IB_GID_INDEX=200"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a QP with a missing GID"),
    }
}

// ---------------------------------------------------------------- state machine

#[test]
fn state_machine_and_peer_address_checks() {
    let rig = rig_or_skip!("state_machine_and_peer_address_checks");
    let f = open(&data_cfg());
    let (a, b) = (
        Side::new(&f, dev_index(&f, &rig.a.0.dev)),
        Side::new(&f, dev_index(&f, &rig.a.1.dev)),
    );
    let bad_state = |r: Result<(), FabricError>| matches!(r, Err(FabricError::BadState { .. }));
    assert!(bad_state(a.qp.post_recv(1)), "post_recv in RESET");
    assert!(
        bad_state(a.qp.to_rtr(&b.qp.local_endpoint())),
        "RTR from RESET"
    );
    a.qp.to_init().unwrap();
    assert!(bad_state(a.qp.to_init()), "INIT twice");
    assert!(bad_state(a.qp.to_rts()), "RTS from INIT");
    let w = SendWr {
        wr_id: 1,
        op: SendOp::Write,
        local: Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        remote_addr: 0,
        rkey: 0,
        signaled: true,
        inline: false,
    };
    assert!(bad_state(a.qp.post_send(&[w])), "post_send in INIT");
    for garbage in [
        vec![],
        vec![0u8; 32],
        vec![0xB7; 64],
        b"10.10.0.2:4791".to_vec(),
    ] {
        assert!(
            matches!(a.qp.to_rtr(&garbage), Err(FabricError::BadPeerAddress(_))),
            "{garbage:?}"
        );
        assert_eq!(a.qp.state(), QpState::Init);
    }
    b.qp.to_init().unwrap();
    a.qp.to_rtr(&b.qp.local_endpoint()).unwrap();
    a.qp.to_rts().unwrap();
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// Automatic Path Migration stays off: every queue pair brought to RTS was checked for an
/// armed alternate path (one check per QP, exactly), and none had one: fresh RC QPs report
/// `MIGRATED` on rxe as the IB spec says for a QP never given an alternate path.
#[test]
fn no_queue_pair_has_an_alternate_path_armed() {
    use ha_core::fabric::verbs::apm;
    let rig = rig_or_skip!("no_queue_pair_has_an_alternate_path_armed");
    let f = open(&data_cfg());
    let before = apm::report();
    let (x, y) = connect(&f, dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    let after = apm::report();
    assert_eq!(after.checked - before.checked, 2, "one check per QP at RTS");
    assert_eq!(after.armed, before.armed, "an alternate path was armed");
    // The pair still moves data after the check.
    transfer(&x, &y, 4096, 9);
    let (p, q) = connect(&f, dev_index(&f, &rig.b.0.dev), dev_index(&f, &rig.b.1.dev));
    assert_eq!(
        apm::report().checked - after.checked,
        2,
        "rail B: one check per QP"
    );
    transfer(&p, &q, 4096, 10);
    assert_eq!(apm::report().armed, 0);
}

// ---------------------------------------------------------------- data path

/// `len` bytes from `x` to `y` as a chain: an unsignaled WRITE of the data, then a signaled
/// zero-byte WRITE_WITH_IMM; checks the bytes when the receive completes.
pub(crate) fn transfer(x: &Side, y: &Side, len: usize, seed: u8) {
    let mut src = pattern(len.max(1), seed);
    let mut dst = vec![0u8; len.max(1)];
    let smr = x.reg(&mut src, Access::LOCAL_WRITE);
    let dmr = y.reg(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    y.qp.post_recv(0xD0 + u64::from(seed)).unwrap();
    let mut data = write(
        7,
        SendOp::Write,
        &src[..len],
        &*smr,
        dst.as_ptr() as u64,
        dmr.keys().rkey,
    );
    data.signaled = false;
    let imm = 0x8000_0000 | len as u32;
    let done = write(8, SendOp::WriteWithImm(imm), &[], &*smr, 0, dmr.keys().rkey);
    let t = Instant::now();
    x.qp.post_send(&[data, done]).unwrap();
    let r = y.wait(1, SHORT);
    let s = x.wait(1, SHORT);
    println!("{len} bytes in {:?}", t.elapsed());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, WcStatus::Success, "{r:?}");
    assert_eq!(r[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(r[0].wr_id, 0xD0 + u64::from(seed));
    assert_eq!(r[0].imm, Some(imm), "immediate back in host order");
    assert_eq!(r[0].byte_len, 0);
    assert_eq!(r[0].qp_num, y.qp.qp_num());
    assert!(dst[..len] == src[..len], "{len} bytes differ");
    assert_eq!(s.len(), 1, "only the signaled WR completes: {s:?}");
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode, s[0].qp_num),
        (8, WcStatus::Success, WcOpcode::RdmaWrite, x.qp.qp_num())
    );
}

#[test]
fn writes_are_placed_on_both_rails() {
    let rig = rig_or_skip!("writes_are_placed_on_both_rails");
    let f = open(&data_cfg());
    for (near, far) in [&rig.a, &rig.b] {
        let (x, y) = connect(&f, dev_index(&f, &near.dev), dev_index(&f, &far.dev));
        for (i, len) in [0usize, 4096, 16 << 20].into_iter().enumerate() {
            transfer(&x, &y, len, i as u8);
        }
        // And the other direction.
        transfer(&y, &x, 4096, 9);
        assert!(x.drain_for(Duration::from_millis(100)).is_empty());
        assert!(y.drain_for(Duration::from_millis(100)).is_empty());
    }
}

#[test]
fn write_with_imm_completes_in_order_with_its_immediate() {
    let rig = rig_or_skip!("write_with_imm_completes_in_order_with_its_immediate");
    let f = open(&data_cfg());
    let (x, y) = connect(&f, dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    const N: usize = 32;
    const SLOT: usize = 1024;
    let mut src = pattern(N * SLOT, 3);
    let mut dst = vec![0u8; N * SLOT];
    let smr = x.reg(&mut src, Access::LOCAL_WRITE);
    let dmr = y.reg(&mut dst, Access::REMOTE_WRITE);
    for i in 0..N {
        y.qp.post_recv(1000 + i as u64).unwrap();
    }
    let wrs: Vec<SendWr> = (0..N)
        .map(|i| {
            let mut w = write(
                i as u64,
                SendOp::WriteWithImm(0xA500_0000 | i as u32),
                &src[i * SLOT..(i + 1) * SLOT],
                &*smr,
                dst.as_ptr() as u64 + (i * SLOT) as u64,
                dmr.keys().rkey,
            );
            w.signaled = i % 8 == 7;
            w
        })
        .collect();
    x.qp.post_send(&wrs).unwrap();
    let r = y.wait(N, SHORT);
    for (i, c) in r.iter().enumerate() {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(
            c.wr_id,
            1000 + i as u64,
            "receives complete in posting order"
        );
        assert_eq!(c.imm, Some(0xA500_0000 | i as u32));
        assert_eq!(c.byte_len as usize, SLOT);
        assert!(dst[i * SLOT..(i + 1) * SLOT] == src[i * SLOT..(i + 1) * SLOT]);
    }
    let s = x.wait(N / 8, SHORT);
    let ids: Vec<u64> = s.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [7, 15, 23, 31]);
    assert!(s.iter().all(|c| c.status.is_ok()));
    assert!(x.drain_for(Duration::from_millis(200)).is_empty());
    assert!(y.drain_for(Duration::from_millis(200)).is_empty());
}

#[test]
fn read_pulls_remote_bytes() {
    let rig = rig_or_skip!("read_pulls_remote_bytes");
    let f = open(&data_cfg());
    let (x, y) = connect(&f, dev_index(&f, &rig.b.0.dev), dev_index(&f, &rig.b.1.dev));
    let mut remote = pattern(256 << 10, 77);
    let mut local = vec![0u8; 256 << 10];
    let rmr = y.reg(&mut remote, Access::REMOTE_READ);
    let lmr = x.reg(&mut local, Access::LOCAL_WRITE);
    // Four reads in flight, one chain.
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| {
            let q = 64 << 10;
            let w = write(
                40 + i as u64,
                SendOp::Read,
                &local[i * q..(i + 1) * q],
                &*lmr,
                remote.as_ptr() as u64 + (i * q) as u64,
                rmr.keys().rkey,
            );
            SendWr {
                signaled: i == 3,
                ..w
            }
        })
        .collect();
    x.qp.post_send(&wrs).unwrap();
    let s = x.wait(1, SHORT);
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode),
        (43, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(s[0].byte_len, 64 << 10);
    assert!(local == remote, "read bytes differ");
    assert!(x.drain_for(Duration::from_millis(100)).is_empty());
    assert!(
        y.drain_for(Duration::from_millis(100)).is_empty(),
        "reads are invisible"
    );
}

#[test]
fn remote_access_errors_leave_memory_untouched() {
    let rig = rig_or_skip!("remote_access_errors_leave_memory_untouched");
    let f = open(&data_cfg());
    let (a, b) = (dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    let mut dst = vec![0x5Au8; 8192];
    let mut src = pattern(4096, 1);
    for case in ["bad rkey", "out of bounds", "no remote write"] {
        let (x, y) = connect(&f, a, b);
        let access = if case == "no remote write" {
            Access::REMOTE_READ
        } else {
            Access::REMOTE_WRITE
        };
        let dmr = y.reg(&mut dst[..4096], access);
        let smr = x.reg(&mut src, Access::LOCAL_WRITE);
        let (addr, rkey) = match case {
            "bad rkey" => (dst.as_ptr() as u64, dmr.keys().rkey ^ 0x80),
            "out of bounds" => (dst.as_ptr() as u64 + 2048, dmr.keys().rkey),
            _ => (dst.as_ptr() as u64, dmr.keys().rkey),
        };
        x.qp.post_send(&[write(5, SendOp::Write, &src, &*smr, addr, rkey)])
            .unwrap();
        let s = x.wait(1, SHORT);
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (5, WcStatus::RemAccessErr),
            "{case}"
        );
        assert!(dst.iter().all(|&v| v == 0x5A), "{case}: memory was written");
        assert_eq!(x.qp.state(), QpState::Err, "{case}: requester QP in ERR");
        drop(dmr);
    }
}

#[test]
fn to_err_flushes_every_outstanding_request() {
    let rig = rig_or_skip!("to_err_flushes_every_outstanding_request");
    // The peer stays in INIT and drops everything: sends stay outstanding (first
    // retransmission after 4.3 s), so all of them are pending when the QP goes to ERR.
    let f = open(&cfg(20, 6));
    let x = Side::new(&f, dev_index(&f, &rig.a.0.dev));
    let y = Side::new(&f, dev_index(&f, &rig.a.1.dev));
    y.qp.to_init().unwrap();
    x.qp.to_init().unwrap();
    x.qp.to_rtr(&y.qp.local_endpoint()).unwrap();
    x.qp.to_rts().unwrap();
    let mut dst = vec![0u8; 4096];
    let mut src = pattern(4096, 2);
    let dmr = y.reg(&mut dst, Access::REMOTE_WRITE);
    let smr = x.reg(&mut src, Access::LOCAL_WRITE);
    for i in 0..4 {
        x.qp.post_recv(100 + i).unwrap();
    }
    let wrs: Vec<SendWr> = (0..5)
        .map(|i| SendWr {
            signaled: i % 2 == 0,
            ..write(
                i,
                SendOp::Write,
                &src[..1024],
                &*smr,
                dst.as_ptr() as u64,
                dmr.keys().rkey,
            )
        })
        .collect();
    x.qp.post_send(&wrs).unwrap();
    assert!(
        x.drain_for(Duration::from_millis(300)).is_empty(),
        "nothing completes yet"
    );
    x.qp.to_err().unwrap();
    assert_eq!(x.qp.state(), QpState::Err);
    let mut got = x.wait(9, SHORT);
    // Posting to a QP in ERR is accepted and flushed at once (as in the sock fabric).
    x.qp.post_recv(200).unwrap();
    x.qp.post_send(&[write(9, SendOp::Write, &src[..8], &*smr, 0, 0)])
        .unwrap();
    got.extend(x.wait(2, SHORT));
    got.extend(x.drain_for(Duration::from_millis(300)));
    assert!(
        got.iter().all(|c| c.status == WcStatus::WrFlushErr),
        "{got:?}"
    );
    let mut ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(
        ids,
        [0, 1, 2, 3, 4, 9, 100, 101, 102, 103, 200],
        "every send (signaled or not) and every receive, once"
    );
    assert!(dst.iter().all(|&v| v == 0));
}

// ---------------------------------------------------------------- lifetime

#[test]
fn threads_stop_when_the_objects_are_dropped() {
    let rig = rig_or_skip!("threads_stop_when_the_objects_are_dropped");
    let base = verbs::live_threads();
    {
        let f = open(&data_cfg());
        assert_eq!(verbs::live_threads(), base, "discovery starts no thread");
        let (x, y) = connect(&f, dev_index(&f, &rig.b.0.dev), dev_index(&f, &rig.b.1.dev));
        // Per open device one event thread, per CQ one channel thread.
        assert_eq!(verbs::live_threads(), base + 4);
        transfer(&x, &y, 4096, 6);
        let extra_cq = x.pd.create_cq(16, Arc::new(Doorbell::new())).unwrap();
        assert_eq!(verbs::live_threads(), base + 5);
        drop(extra_cq);
        assert_eq!(verbs::live_threads(), base + 4);
        drop((x, y));
        assert_eq!(verbs::live_threads(), base);
    }
    assert_eq!(verbs::live_threads(), base);
}

// ---------------------------------------------------------------- the layers above

/// The plugin's own operations (api → transport → engine) on the verbs fabric, unchanged:
/// connect rail A's two ends through the OOB handshake and move verified bytes.
#[test]
fn plugin_operations_run_unchanged_on_verbs() {
    use ha_core::api::ops::{self, RecvBuf};
    use ha_core::fabric::{counters, verbs::apm};
    let rig = rig_or_skip!("plugin_operations_run_unchanged_on_verbs");
    std::env::set_var("HA_NCCL_FABRIC", "verbs");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    ops::init().expect("init");
    let n = ops::devices().unwrap();
    let find = |name: &str| {
        (0..n)
            .find(|&i| ops::properties(i).unwrap().name == format!("{name}:1"))
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let (a, b) = (find(&rig.a.0.dev), find(&rig.a.1.dev));
    let (qps0, apm0) = (counters::snapshot().qps, apm::report());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut handle = [0u8; 128];
    let listen = ops::listen(b, &mut handle).expect("listen");
    let (mut send, mut recv) = (0, 0);
    while send == 0 || recv == 0 {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if send == 0 {
            send = ops::connect(a, &mut handle).expect("connect");
        }
        if recv == 0 {
            recv = ops::accept(listen).expect("accept");
        }
    }
    // Every queue pair the plugin created for this connection (primary and standby, both
    // sides) was checked for an armed alternate path at RTS, and none had one.
    let created = counters::snapshot().qps - qps0;
    assert!(created >= 2, "{created} queue pairs");
    assert_eq!(apm::report().checked - apm0.checked, created as u64);
    assert_eq!(apm::report().armed, apm0.armed);
    for (i, len) in [0usize, 8, 4096, 1 << 20].into_iter().enumerate() {
        let src = pattern(len.max(1), 40 + i as u8);
        let mut dst = vec![0u8; len.max(1)];
        let smr = ops::reg_mr(send, src.as_ptr() as usize, src.len(), 1).unwrap();
        let rmr = ops::reg_mr(recv, dst.as_mut_ptr() as usize, dst.len(), 1).unwrap();
        let buf = RecvBuf {
            addr: dst.as_mut_ptr() as usize,
            size: dst.len() as i64,
            tag: 7,
            mr: rmr,
        };
        let (mut sreq, mut rreq) = (0, 0);
        let (mut sdone, mut rdone) = (None, None);
        while sdone.is_none() || rdone.is_none() {
            assert!(
                Instant::now() < deadline,
                "transfer of {len} bytes did not finish"
            );
            if rreq == 0 {
                rreq = ops::irecv(recv, &[buf]).expect("irecv");
            }
            if sreq == 0 {
                sreq = ops::isend(send, src.as_ptr() as usize, len as i64, 7, smr).unwrap();
            }
            if sreq != 0 && sdone.is_none() {
                sdone = ops::test(sreq).expect("test send");
            }
            if rreq != 0 && rdone.is_none() {
                rdone = ops::test(rreq).expect("test recv");
            }
        }
        assert_eq!(rdone.unwrap(), [len as u64], "received size");
        assert!(dst[..len] == src[..len], "{len} bytes differ");
        ops::dereg_mr(send, smr).unwrap();
        ops::dereg_mr(recv, rmr).unwrap();
    }
    ops::close_send(send).unwrap();
    ops::close_recv(recv).unwrap();
    ops::close_listen(listen).unwrap();
}
