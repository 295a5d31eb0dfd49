//! GPUDirect RDMA in the connection layer, without GPU or RDMA hardware: connections built by
//! the real transport (listen, connect, two paths, failover) on a fake fabric (`fake.rs`: the
//! `sock` fabric on two loopback rails, advertising CUDA and dma-buf memory, logging every
//! registration and work request, failing a device on demand). Host memory stands in for GPU
//! memory and a memfd for the dma-buf.
//!
//! Covered: dma-buf registrations made on both paths inside the call (fd open during it, not
//! kept after; released on dereg), rollback when the standby refuses, no later registration
//! of a dma-buf; peer-memory GPU registrations following the lazy policy; flushes posted as a
//! 1-byte READ on the active path's loopback queue pair with that device's key, after a
//! failover on the new path, re-posted on the new path when the device dies or stalls under
//! an outstanding flush, failing cleanly when no path is left, and the outstanding limit.

mod fake;

use fake::{fake_dmabuf, fake_dmabuf_named, fds_on, Call, FakeGpuFabric, Mode};
use ha_core::engine::Engine;
use ha_core::fabric::SendOp;
use ha_core::transport::connect::PendingConnect;
use ha_core::transport::flush::MAX_FLUSHES;
use ha_core::transport::ha::HaCfg;
use ha_core::transport::listen::ListenComm;
use ha_core::transport::mr::{MemKind, MrHandle};
use ha_core::transport::recv::{RecvArg, RecvComm};
use ha_core::transport::send::SendComm;
use ha_proto::data::ReqId;
use ha_proto::handle::{ConnectHandle, HANDLE_SIZE};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Long enough for a loaded 2-core machine; every wait ends as soon as its condition holds.
const DEADLINE: Duration = Duration::from_secs(60);
const MSG: usize = 64 * 1024;

fn cfg(backup: bool) -> HaCfg {
    HaCfg {
        max_poll: 16,
        keepalive: Duration::from_millis(200),
        enable_backup: backup,
        standby_map: String::new(),
        // Long enough that a loaded host does not fail a healthy path over (the tests check
        // which device each flush went to), short enough to keep the stall tests quick.
        rto: Duration::from_millis(1500),
        silence: Duration::ZERO,
        heartbeat: Duration::from_millis(200),
        // No re-arm: the tests look at which device each flush went to.
        failback: false,
        rearm_hold: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(30),
        traffic_class: None,
        home: Default::default(),
        eager_bytes: 0,
    }
}

struct Conn {
    fab: Arc<FakeGpuFabric>,
    send: SendComm,
    recv: RecvComm,
    _engine: Arc<Engine>,
}

fn connect(backup: bool) -> Conn {
    let fab = FakeGpuFabric::new();
    let engine = Engine::new(fab.clone(), Duration::from_micros(50));
    let cfg = cfg(backup);
    let mut handle = [0u8; HANDLE_SIZE];
    let mut l = ListenComm::new(
        &engine,
        0,
        "127.0.0.1".parse().unwrap(),
        &cfg,
        "",
        &mut handle,
    )
    .unwrap();
    let ch = ConnectHandle::decode(&handle).unwrap();
    let mut pc = PendingConnect::start(&engine, 0, &ch, &cfg, "").unwrap();
    let (mut sent, mut recv) = (false, None);
    let t0 = Instant::now();
    while !sent || recv.is_none() {
        assert!(t0.elapsed() < DEADLINE, "connection not established");
        if !sent {
            sent = pc.step().unwrap();
        }
        if recv.is_none() {
            recv = l.accept().unwrap();
        }
        std::thread::yield_now();
    }
    Conn {
        send: pc.finish(),
        recv: recv.unwrap(),
        fab,
        _engine: engine,
    }
}

/// A page-aligned buffer ("GPU memory") of `len` bytes.
struct Buf(Vec<u64>);

impl Buf {
    fn new(len: usize) -> Buf {
        Buf(vec![0; len / 8])
    }
    fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
    fn fill(&mut self, seed: u64) {
        for (i, w) in self.0.iter_mut().enumerate() {
            *w = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64;
        }
    }
}

/// Send `src` into `dst` (one message), driving both sides until both requests completed.
fn transfer(c: &mut Conn, src: &Buf, smr: &Arc<MrHandle>, dst: &Buf, dmr: &Arc<MrHandle>) {
    let t0 = Instant::now();
    let rid = loop {
        let arg = RecvArg {
            addr: dst.addr(),
            size: MSG,
            tag: 7,
            mr: dmr,
        };
        if let Some(id) = c.recv.irecv(&[arg]).unwrap() {
            break id;
        }
        let _ = c.send.test(ReqId { index: 0, gen: 0 });
        assert!(t0.elapsed() < DEADLINE, "irecv kept answering try-later");
    };
    let mut sid = None;
    let (mut s_done, mut r_done) = (false, false);
    while !(s_done && r_done) {
        assert!(t0.elapsed() < DEADLINE, "transfer did not complete");
        if sid.is_none() {
            sid = c.send.isend(src.addr(), MSG, 7, smr).unwrap();
        }
        if let (Some(id), false) = (sid, s_done) {
            s_done = c.send.test(id).unwrap().is_some();
        }
        if !r_done {
            if let Some(sizes) = c.recv.test(rid).unwrap() {
                assert_eq!(sizes, vec![MSG as u64]);
                r_done = true;
            }
        }
        std::thread::yield_now();
    }
    assert!(src.0 == dst.0, "received bytes differ from the sent ones");
}

/// Drive flush `id` (and both sides) until done; the error if it failed.
fn flush_done(c: &mut Conn, id: ReqId) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        match c.recv.test_flush(id) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        }
        // Let the sender take part in a failover.
        let _ = c.send.test(ReqId { index: 0, gen: 0 });
        assert!(t0.elapsed() < DEADLINE, "flush did not finish");
        std::thread::yield_now();
    }
}

fn reads(c: &Conn) -> Vec<(usize, u32, u64, u32)> {
    c.fab
        .shared
        .calls()
        .into_iter()
        .filter_map(|x| match x {
            Call::Post {
                dev,
                qpn,
                op: SendOp::Read,
                remote_addr,
                rkey,
            } => Some((dev, qpn, remote_addr, rkey)),
            _ => None,
        })
        .collect()
}

fn dmabuf_rkey(c: &Conn, dev: usize, iova: usize) -> u32 {
    c.fab
        .shared
        .calls()
        .into_iter()
        .find_map(|x| match x {
            Call::RegDmabuf {
                dev: d,
                iova: a,
                rkey,
                ..
            } if d == dev && a == iova => Some(rkey),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no dma-buf registration of {iova:#x} on device {dev}"))
}

/// A connection with one message received into a dma-buf registered destination.
fn received(backup: bool) -> (Conn, Buf, Arc<MrHandle>, Buf, Arc<MrHandle>) {
    let mut c = connect(backup);
    let mut src = Buf::new(MSG);
    src.fill(1);
    let dst = Buf::new(MSG);
    let smr = Arc::new(MrHandle::register(&c.send.devices()[0], src.addr(), MSG).unwrap());
    let fd = fake_dmabuf(MSG);
    let dmr = Arc::new(
        MrHandle::register_dmabuf(&c.recv.devices(), dst.addr(), MSG, 0, fd.as_raw_fd()).unwrap(),
    );
    drop(fd); // as NCCL does right after regMrDmaBuf
    transfer(&mut c, &src, &smr, &dst, &dmr);
    (c, src, smr, dst, dmr)
}

#[test]
fn dmabuf_is_registered_on_both_paths_inside_the_call_and_never_kept() {
    let mut c = connect(true);
    assert_eq!(c.recv.devices().len(), 2, "primary and standby");
    let mut src = Buf::new(MSG);
    src.fill(3);
    let dst = Buf::new(MSG);
    let smr = Arc::new(MrHandle::register(&c.send.devices()[0], src.addr(), MSG).unwrap());
    const NAME: &str = "dmabuf-both-paths";
    let fd = fake_dmabuf_named(NAME, MSG);
    let raw = fd.as_raw_fd();
    assert_eq!(fds_on(NAME), 1);
    let dmr = MrHandle::register_dmabuf(&c.recv.devices(), dst.addr(), MSG, 4096, raw).unwrap();
    assert_eq!(dmr.kind, MemKind::DmaBuf);
    assert_eq!(dmr.devices(), vec![0, 1]);
    let regs: Vec<Call> = c
        .fab
        .shared
        .calls()
        .into_iter()
        .filter(|x| matches!(x, Call::RegDmabuf { .. }))
        .collect();
    assert_eq!(regs.len(), 2, "{regs:?}");
    for (i, r) in regs.iter().enumerate() {
        let Call::RegDmabuf {
            dev,
            iova,
            len,
            offset,
            fd,
            target,
            ..
        } = r
        else {
            unreachable!()
        };
        assert_eq!(
            (*dev, *iova, *len, *offset, *fd),
            (i, dst.addr(), MSG, 4096, raw)
        );
        assert!(
            target
                .as_deref()
                .is_some_and(|t| t.starts_with(&format!("/memfd:{NAME}"))),
            "fd open during the call: {target:?}"
        );
    }
    // The caller's memfd plus the fake kernel's one reference per registration: the plugin
    // itself holds no descriptor on it.
    assert_eq!(fds_on(NAME), 1 + 2);
    drop(fd); // NCCL closes it
    assert_eq!(fds_on(NAME), 2);
    let dmr = Arc::new(dmr);
    transfer(&mut c, &src, &smr, &dst, &dmr);
    // Fail the primary: the next message lands through the standby's registration, made
    // back in regMrDmaBuf (no registration is attempted now).
    let before = c.fab.shared.calls().len();
    c.fab.shared.set_mode(0, Mode::Down);
    let mut src2 = Buf::new(MSG);
    src2.fill(4);
    let smr2 = Arc::new(MrHandle::register(&c.send.devices()[0], src2.addr(), MSG).unwrap());
    transfer(&mut c, &src2, &smr2, &dst, &dmr);
    assert!(dst.0 == src2.0);
    let after: Vec<Call> = c.fab.shared.calls()[before..].to_vec();
    assert!(
        !after.iter().any(|x| matches!(x, Call::RegDmabuf { iova: addr, .. } | Call::RegMr { addr, .. } if *addr == dst.addr())),
        "no registration of the dma-buf buffer after regMrDmaBuf: {after:?}"
    );
    let rkey1 = dmabuf_rkey(&c, 1, dst.addr());
    assert!(
        after.iter().any(|x| matches!(x, Call::Post { dev: 1, op: SendOp::Write | SendOp::WriteWithImm(_), remote_addr, rkey, .. } if *remote_addr == dst.addr() as u64 && *rkey == rkey1)),
        "the sender wrote through device 1 with the standby registration's key"
    );
    // deregMr drops NCCL's handle; the connection still holds the buffer's registration
    // for its receive slot (for a re-key on failover) until it closes. Then both go, and
    // with them the dma-buf references.
    drop(dmr);
    drop(c.send);
    drop(c.recv);
    let deregs = c
        .fab
        .shared
        .calls()
        .into_iter()
        .filter(|x| matches!(x, Call::Dereg { addr, .. } if *addr == dst.addr()))
        .count();
    assert_eq!(deregs, 2);
    assert_eq!(fds_on(NAME), 0);
}

#[test]
fn dmabuf_registration_rolls_back_when_the_standby_refuses() {
    let c = connect(true);
    let dst = Buf::new(MSG);
    const NAME: &str = "dmabuf-rollback";
    let fd = fake_dmabuf_named(NAME, MSG);
    c.fab
        .shared
        .refuse_dmabuf_on
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let err = MrHandle::register_dmabuf(&c.recv.devices(), dst.addr(), MSG, 0, fd.as_raw_fd())
        .err()
        .expect("the standby refused");
    let msg = err.to_string();
    assert!(msg.contains("on device 1"), "{msg}");
    assert!(msg.contains("fake: dma-buf refused on device 1"), "{msg}");
    let calls = c.fab.shared.calls();
    let mine: Vec<&Call> = calls
        .iter()
        .filter(|x| match x {
            Call::RegDmabuf { iova, .. } => *iova == dst.addr(),
            Call::Dereg { addr, .. } => *addr == dst.addr(),
            _ => false,
        })
        .collect();
    assert!(
        matches!(
            mine[..],
            [Call::RegDmabuf { dev: 0, .. }, Call::Dereg { dev: 0, .. }]
        ),
        "{mine:?}"
    );
    assert_eq!(
        fds_on(NAME),
        1,
        "the reference taken on device 0 is released"
    );
    drop(fd);
    assert_eq!(fds_on(NAME), 0);
}

#[test]
fn dmabuf_keys_exist_only_where_registered() {
    let c = connect(true);
    let dst = Buf::new(MSG);
    let fd = fake_dmabuf(MSG);
    let devs = c.recv.devices();
    let h = MrHandle::register_dmabuf(&devs[..1], dst.addr(), MSG, 0, fd.as_raw_fd()).unwrap();
    drop(fd);
    assert!(h.keys_for(&devs[0]).is_ok());
    let e = h.keys_for(&devs[1]).unwrap_err().to_string();
    assert!(e.contains("exists on device(s) 0 only"), "{e}");
    assert!(e.contains("its fd is gone"), "{e}");
    assert_eq!(h.registrations(), 1);
    // A dma-buf kind cannot be made without its fd.
    assert!(MrHandle::register_kind(&devs[0], dst.addr(), MSG, MemKind::DmaBuf).is_err());
}

#[test]
fn peermem_gpu_memory_follows_the_lazy_policy() {
    let mut c = connect(true);
    let mut src = Buf::new(MSG);
    src.fill(5);
    let dst = Buf::new(MSG);
    let smr = Arc::new(MrHandle::register(&c.send.devices()[0], src.addr(), MSG).unwrap());
    let dmr = Arc::new(
        MrHandle::register_kind(&c.recv.devices()[0], dst.addr(), MSG, MemKind::Cuda).unwrap(),
    );
    assert!(dmr.kind.is_gpu());
    transfer(&mut c, &src, &smr, &dst, &dmr);
    assert_eq!(dmr.devices(), vec![0], "standby untouched until needed");
    c.fab.shared.set_mode(0, Mode::Down);
    let mut src2 = Buf::new(MSG);
    src2.fill(6);
    let smr2 = Arc::new(MrHandle::register(&c.send.devices()[0], src2.addr(), MSG).unwrap());
    transfer(&mut c, &src2, &smr2, &dst, &dmr);
    assert_eq!(
        dmr.devices(),
        vec![0, 1],
        "registered on the standby at first use"
    );
    assert!(c
        .fab
        .shared
        .calls()
        .iter()
        .any(|x| matches!(x, Call::RegMr { dev: 1, addr, .. } if *addr == dst.addr() - dst.addr() % 4096 || *addr == dst.addr())));
}

#[test]
fn flush_is_a_one_byte_read_on_the_active_paths_loopback_queue_pair() {
    let (mut c, _src, _smr, dst, dmr) = received(true);
    let id = c.recv.iflush(dst.addr(), &dmr).unwrap();
    assert_ne!(id.gen, 0, "GPU flush ids are never the host token's");
    flush_done(&mut c, id).unwrap();
    let r = reads(&c);
    let qp = c.recv.flushes().qp(0).expect("made on path 0").qp_num();
    assert_eq!(
        r,
        vec![(0, qp, dst.addr() as u64, dmabuf_rkey(&c, 0, dst.addr()))]
    );
    assert!(c.recv.flushes().qp(1).is_none(), "none on the standby");
    assert_eq!(c.recv.flushes().outstanding(), 0);
    // The flush request is gone once reported.
    assert!(c.recv.test_flush(id).is_err());
    // A second flush reuses the queue pair.
    let id2 = c.recv.iflush(dst.addr() + 8, &dmr).unwrap();
    flush_done(&mut c, id2).unwrap();
    assert_eq!(reads(&c).len(), 2);
    assert_eq!(reads(&c)[1].1, qp);
    assert_eq!(reads(&c)[1].2, dst.addr() as u64 + 8);
    assert_eq!(c.recv.flushes().posted_on, vec![(0, 2)]);
}

#[test]
fn a_failover_between_receive_and_flush_flushes_on_the_new_path() {
    let (mut c, _src, _smr, dst, dmr) = received(true);
    c.fab.shared.set_mode(0, Mode::Down);
    let mut src2 = Buf::new(MSG);
    src2.fill(9);
    let dst2 = Buf::new(MSG);
    let smr2 = Arc::new(MrHandle::register(&c.send.devices()[0], src2.addr(), MSG).unwrap());
    let fd = fake_dmabuf(MSG);
    let dmr2 = Arc::new(
        MrHandle::register_dmabuf(&c.recv.devices(), dst2.addr(), MSG, 0, fd.as_raw_fd()).unwrap(),
    );
    transfer(&mut c, &src2, &smr2, &dst2, &dmr2);
    // Registered after the failover: on the active device first, and on the failed one too
    // (a re-armed path comes back there and needs it).
    let dst3 = Buf::new(MSG);
    let dmr3 =
        MrHandle::register_dmabuf(&c.recv.devices(), dst3.addr(), MSG, 0, fd.as_raw_fd()).unwrap();
    assert_eq!(dmr3.devices(), vec![1, 0]);
    // Flush the first buffer (received before the failover) and the second.
    for (buf, mr) in [(&dst, &dmr), (&dst2, &dmr2)] {
        let id = c.recv.iflush(buf.addr(), mr).unwrap();
        flush_done(&mut c, id).unwrap();
    }
    let r = reads(&c);
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r.iter().all(|x| x.0 == 1), "both on device 1: {r:?}");
    assert_eq!(r[0].3, dmabuf_rkey(&c, 1, dst.addr()));
    assert_eq!(r[1].3, dmabuf_rkey(&c, 1, dst2.addr()));
    assert_eq!(c.recv.flushes().posted_on, vec![(1, 2)]);
}

/// Post a flush while device 0 swallows everything, fail the device per `how`, and drive a
/// second message through the failover: the flush is posted again on device 1 and completes.
fn flush_survives(how: Mode) {
    let (mut c, _src, _smr, dst, dmr) = received(true);
    c.fab.shared.set_mode(0, Mode::Stalled);
    let id = c.recv.iflush(dst.addr(), &dmr).unwrap();
    assert_eq!(reads(&c).len(), 1);
    assert_eq!(reads(&c)[0].0, 0);
    assert!(
        !c.recv.test_flush(id).unwrap(),
        "held by the stalled device"
    );
    if how == Mode::Down {
        c.fab.shared.set_mode(0, Mode::Down);
    }
    // A message keeps both sides going through the failover.
    let mut src2 = Buf::new(MSG);
    src2.fill(11);
    let dst2 = Buf::new(MSG);
    let smr2 = Arc::new(MrHandle::register(&c.send.devices()[0], src2.addr(), MSG).unwrap());
    let fd = fake_dmabuf(MSG);
    let dmr2 = Arc::new(
        MrHandle::register_dmabuf(&c.recv.devices(), dst2.addr(), MSG, 0, fd.as_raw_fd()).unwrap(),
    );
    transfer(&mut c, &src2, &smr2, &dst2, &dmr2);
    flush_done(&mut c, id).unwrap();
    let r = reads(&c);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!((r[0].0, r[1].0), (0, 1));
    assert_eq!(r[1].2, dst.addr() as u64);
    assert_eq!(r[1].3, dmabuf_rkey(&c, 1, dst.addr()));
    assert_eq!(c.recv.flushes().posted_on, vec![(0, 1), (1, 1)]);
    assert!(
        c.recv.flushes().qp(0).is_none(),
        "the failed one was dropped"
    );
}

#[test]
fn a_flush_in_flight_when_its_device_dies_is_posted_again_on_the_new_path() {
    flush_survives(Mode::Down);
}

#[test]
fn a_stalled_flush_times_out_and_is_posted_again_on_the_new_path() {
    flush_survives(Mode::Stalled);
}

#[test]
fn a_flush_fails_cleanly_when_no_path_is_left() {
    let (mut c, _src, _smr, dst, dmr) = received(false);
    assert_eq!(c.recv.devices().len(), 1);
    c.fab.shared.set_mode(0, Mode::Stalled);
    let id = c.recv.iflush(dst.addr(), &dmr).unwrap();
    c.fab.shared.set_mode(0, Mode::Down);
    let e = flush_done(&mut c, id).expect_err("no path left");
    assert!(e.starts_with("fabric: GPU flush: "), "{e}");
    assert!(e.ends_with("before the flush could be posted"), "{e}");
    // A new flush on the dead connection is refused at once.
    assert!(c.recv.iflush(dst.addr(), &dmr).is_err());
}

#[test]
fn outstanding_flushes_are_bounded() {
    let (mut c, _src, _smr, dst, dmr) = received(true);
    c.fab.shared.set_mode(0, Mode::Stalled);
    let ids: Vec<ReqId> = (0..MAX_FLUSHES)
        .map(|_| c.recv.iflush(dst.addr(), &dmr).unwrap())
        .collect();
    assert_eq!(c.recv.flushes().outstanding(), MAX_FLUSHES);
    let e = c.recv.iflush(dst.addr(), &dmr).unwrap_err().to_string();
    assert!(e.contains("flushes are outstanding"), "{e}");
    assert_eq!(ids.len(), MAX_FLUSHES);
}

#[test]
fn a_flush_fails_when_the_new_path_has_no_key_for_the_buffer() {
    let (mut c, _src, _smr, _dst, _dmr) = received(true);
    // A dma-buf registered on the primary only (not what regMrDmaBuf does; the guard).
    let only0 = Buf::new(MSG);
    let fd = fake_dmabuf(MSG);
    let devs = c.recv.devices();
    let h = Arc::new(
        MrHandle::register_dmabuf(&devs[..1], only0.addr(), MSG, 0, fd.as_raw_fd()).unwrap(),
    );
    c.fab.shared.set_mode(0, Mode::Down);
    let mut src2 = Buf::new(MSG);
    src2.fill(12);
    let dst2 = Buf::new(MSG);
    let smr2 = Arc::new(MrHandle::register(&c.send.devices()[0], src2.addr(), MSG).unwrap());
    let dmr2 =
        Arc::new(MrHandle::register_kind(&devs[1], dst2.addr(), MSG, MemKind::Cuda).unwrap());
    transfer(&mut c, &src2, &smr2, &dst2, &dmr2);
    let id = c.recv.iflush(only0.addr(), &h).unwrap();
    let e = flush_done(&mut c, id).expect_err("no key on device 1");
    assert!(e.contains("the buffer has no key on device 1"), "{e}");
    assert!(reads(&c).is_empty(), "nothing posted");
}

#[test]
fn a_flush_gives_up_after_three_attempts_to_make_its_queue_pair() {
    let (mut c, _src, _smr, dst, dmr) = received(true);
    c.fab
        .shared
        .refuse_qps_on
        .store(0, std::sync::atomic::Ordering::SeqCst);
    let id = c.recv.iflush(dst.addr(), &dmr).unwrap();
    let e = flush_done(&mut c, id).expect_err("no queue pair");
    assert!(e.contains("gave up after 3 attempts"), "{e}");
    assert!(e.contains("flush queue pair on device 0: "), "{e}");
    assert!(e.contains("fake: no queue pair on device 0"), "{e}");
    assert!(reads(&c).is_empty());
    assert_eq!(c.recv.flushes().outstanding(), 0);
}

#[test]
fn a_flush_whose_post_fails_is_retried_then_fails() {
    let (mut c, _src, _smr, dst, dmr) = received(true);
    c.fab
        .shared
        .refuse_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let id = c.recv.iflush(dst.addr(), &dmr).unwrap();
    let e = flush_done(&mut c, id).expect_err("posting refused");
    assert!(e.contains("gave up after 3 attempts"), "{e}");
    assert!(e.contains("posting on device 0: "), "{e}");
    // Three posts were tried, each on a fresh loopback queue pair.
    let r = reads(&c);
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(r[0].1 != r[1].1 && r[1].1 != r[2].1, "{r:?}");
    // Posting works again: a new flush goes through.
    c.fab
        .shared
        .refuse_reads
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let id = c.recv.iflush(dst.addr(), &dmr).unwrap();
    flush_done(&mut c, id).unwrap();
}
