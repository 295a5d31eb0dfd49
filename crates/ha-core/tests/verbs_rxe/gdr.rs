//! GPUDirect on real kernel verbs without GPUs: what detection says about rxe devices (no
//! CUDA driver in the guest; rxe has no dma-buf registration), a dma-buf registration refused
//! cleanly by the kernel/provider, and the flush path (loopback queue pair, 1-byte RDMA READ)
//! run for real through the connection layer, with host memory standing in for GPU memory.

use super::rig::*;
use ha_core::engine::Engine;
use ha_core::fabric::verbs::context::DeviceList;
use ha_core::fabric::verbs::gdr::cuda::CudaStatus;
use ha_core::fabric::verbs::gdr::dmabuf::{probe_device, Probe};
use ha_core::fabric::{Access, Fabric, FabricError, PTR_HOST};
use ha_core::transport::connect::PendingConnect;
use ha_core::transport::ha::HaCfg;
use ha_core::transport::listen::ListenComm;
use ha_core::transport::mr::{MemKind, MrHandle};
use ha_core::transport::recv::{RecvArg, RecvComm};
use ha_core::transport::send::SendComm;
use ha_proto::data::ReqId;
use ha_proto::handle::{ConnectHandle, HANDLE_SIZE};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn detection_offers_host_memory_with_the_reason() {
    let _rig = rig_or_skip!("detection_offers_host_memory_with_the_reason");
    let f = open(&data_cfg());
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        println!("skipped: this guest has an NVIDIA driver");
        return;
    }
    assert!(matches!(f.host_gdr().cuda, CudaStatus::NotFound(_)));
    for i in 0..f.devices().len() {
        let g = f.gdr(i).unwrap();
        assert_eq!(g.ptr_support, PTR_HOST);
        assert_eq!(f.devices()[i].ptr_support, PTR_HOST);
        assert!(
            g.line()
                .starts_with("GPU Direct RDMA disabled: no CUDA driver (dlopen libcuda.so.1: "),
            "{}",
            g.line()
        );
    }
    // The probe itself, run on every device although detection skipped it (no CUDA):
    // rxe's provider has no dma-buf registration.
    let list = DeviceList::get().unwrap();
    for i in 0..list.len() {
        let p = probe_device(&list, i).unwrap();
        assert_eq!(p, Probe::Unsupported(libc::EOPNOTSUPP), "{}", list.name(i));
    }
}

#[test]
fn dmabuf_registration_is_refused_cleanly() {
    let rig = rig_or_skip!("dmabuf_registration_is_refused_cleanly");
    let f = open(&data_cfg());
    let pd = f.open_pd(dev_index(&f, &rig.a.0.dev)).unwrap();
    let name = std::ffi::CString::new("rxe-dmabuf").unwrap();
    // SAFETY: memfd_create with a valid name; owned below.
    let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(name.as_ptr(), 0)) };
    let buf = vec![0u8; 8192];
    match pd.reg_dmabuf_mr(buf.as_ptr() as usize, 4096, 0, fd.as_raw_fd(), Access::ALL) {
        Err(FabricError::Io { context, source }) => {
            assert!(
                context.contains("ibv_reg_dmabuf_mr(offset 0, 4096 bytes"),
                "{context}"
            );
            assert_eq!(source.raw_os_error(), Some(libc::EOPNOTSUPP), "{source}");
        }
        Err(e) => panic!("expected an I/O error, got {e}"),
        Ok(_) => panic!("rxe registered a dma-buf"),
    }
    // The PD is fine afterwards.
    let mr = pd.reg_mr(buf.as_ptr() as usize, 4096, Access::ALL).unwrap();
    assert_ne!(mr.keys().rkey, 0);
}

fn ha_cfg() -> HaCfg {
    HaCfg {
        max_poll: 16,
        keepalive: Duration::from_secs(1),
        enable_backup: false,
        standby_map: String::new(),
        rto: Duration::from_secs(20),
        silence: Duration::ZERO,
        heartbeat: Duration::from_secs(1),
        failback: false,
        rearm_hold: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(60),
        traffic_class: None,
        home: Default::default(),
        eager_bytes: 0,
    }
}

fn connect_transport(f: Arc<dyn Fabric>, a: usize, b: usize) -> (Arc<Engine>, SendComm, RecvComm) {
    let engine = Engine::new(f, Duration::from_micros(50));
    let cfg = ha_cfg();
    let mut handle = [0u8; HANDLE_SIZE];
    let mut l = ListenComm::new(
        &engine,
        b,
        "127.0.0.1".parse().unwrap(),
        &cfg,
        "",
        &mut handle,
    )
    .unwrap();
    let ch = ConnectHandle::decode(&handle).unwrap();
    let mut pc = PendingConnect::start(&engine, a, &ch, &cfg, "").unwrap();
    let deadline = Instant::now() + SHORT;
    let (mut sent, mut recv) = (false, None);
    while !sent || recv.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if !sent {
            sent = pc.step().unwrap();
        }
        if recv.is_none() {
            recv = l.accept().unwrap();
        }
    }
    (engine, pc.finish(), recv.unwrap())
}

/// Move `src` into `dst` (each with its registration) through the connection layer: post the
/// receive (again while its slots are taken), send, and test both until done, within `SHORT`.
fn transfer(
    send: &mut SendComm,
    recv: &mut RecvComm,
    (src, smr): (&[u8], &Arc<MrHandle>),
    (dst, dmr): (&[u8], &Arc<MrHandle>),
    tag: i32,
) {
    let deadline = Instant::now() + SHORT;
    let rid = loop {
        let arg = RecvArg {
            addr: dst.as_ptr() as usize,
            size: dst.len(),
            tag,
            mr: dmr,
        };
        if let Some(id) = recv.irecv(&[arg]).unwrap() {
            break id;
        }
        assert!(Instant::now() < deadline);
    };
    let (mut sid, mut sdone, mut rdone) = (None, false, false);
    while !(sdone && rdone) {
        assert!(Instant::now() < deadline, "transfer did not finish");
        if sid.is_none() {
            sid = send
                .isend(src.as_ptr() as usize, src.len(), tag, smr)
                .unwrap();
        }
        if let (Some(id), false) = (sid, sdone) {
            sdone = send.test(id).unwrap().is_some();
        }
        if !rdone {
            rdone = recv.test(rid).unwrap().is_some();
        }
    }
}

#[test]
fn gpu_flush_reads_through_a_loopback_queue_pair() {
    let rig = rig_or_skip!("gpu_flush_reads_through_a_loopback_queue_pair");
    let f = open(&data_cfg());
    let (a, b) = (dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    let (_engine, mut send, mut recv) = connect_transport(f, a, b);
    const LEN: usize = 1 << 16;
    let src = pattern(LEN, 77);
    let dst = vec![0u8; LEN];
    let smr = Arc::new(MrHandle::register(&send.devices()[0], src.as_ptr() as usize, LEN).unwrap());
    // Host memory registered as GPU memory by address: the flush path cannot tell.
    let dmr = Arc::new(
        MrHandle::register_kind(
            &recv.devices()[0],
            dst.as_ptr() as usize,
            LEN,
            MemKind::Cuda,
        )
        .unwrap(),
    );
    transfer(&mut send, &mut recv, (&src, &smr), (&dst, &dmr), 3);
    let deadline = Instant::now() + SHORT;
    assert!(dst == src);
    for k in 0..3u64 {
        let id = recv
            .iflush(dst.as_ptr() as usize + k as usize * 4096, &dmr)
            .unwrap();
        loop {
            if recv.test_flush(id).unwrap() {
                break;
            }
            let _ = send.test(ReqId { index: 0, gen: 0 });
            assert!(Instant::now() < deadline, "flush {k} did not complete");
        }
    }
    assert_eq!(recv.flushes().posted_on, vec![(b, 3)]);
    assert!(recv.flushes().qp(0).is_some());
    assert_eq!(recv.flushes().outstanding(), 0);
    assert!(dst == src, "a flush reads, never writes");
}

/// One message through the connection layer: `len` bytes from `src` (registered as `kind`)
/// into a fresh host buffer, every byte checked; returns how many work requests went inline
/// meanwhile (the receiver's clear-to-send is one: the plugin's own staging).
fn inline_sends_for_one_message(
    send: &mut SendComm,
    recv: &mut RecvComm,
    len: usize,
    kind: MemKind,
) -> u64 {
    let src = pattern(len, len as u8);
    let dst = vec![0u8; len];
    let smr = Arc::new(
        MrHandle::register_kind(&send.devices()[0], src.as_ptr() as usize, len, kind).unwrap(),
    );
    let dmr = Arc::new(MrHandle::register(&recv.devices()[0], dst.as_ptr() as usize, len).unwrap());
    let before = ha_core::fabric::verbs::inline_sends();
    transfer(send, recv, (&src, &smr), (&dst, &dmr), 5);
    assert!(
        dst == src,
        "{len} bytes from {kind:?} memory arrived changed"
    );
    ha_core::fabric::verbs::inline_sends() - before
}

/// A small payload from host memory travels inside its work request (`IBV_SEND_INLINE`: the
/// NIC does not fetch it with a DMA read); one from GPU memory never does (the CPU cannot read
/// it), nor one over the queue pair's inline limit (512 bytes asked).
#[test]
fn small_host_payloads_go_inline_gpu_ones_never() {
    let rig = rig_or_skip!("small_host_payloads_go_inline_gpu_ones_never");
    let f = open(&data_cfg());
    let (a, b) = (dev_index(&f, &rig.a.0.dev), dev_index(&f, &rig.a.1.dev));
    let (_engine, mut send, mut recv) = connect_transport(f, a, b);
    // Each message: the receiver's clear-to-send (inline), then the payload.
    assert_eq!(
        inline_sends_for_one_message(&mut send, &mut recv, 64, MemKind::Host),
        2
    );
    assert_eq!(
        inline_sends_for_one_message(&mut send, &mut recv, 64, MemKind::Cuda),
        1
    );
    assert_eq!(
        inline_sends_for_one_message(&mut send, &mut recv, 4096, MemKind::Host),
        1
    );
    assert_eq!(
        inline_sends_for_one_message(&mut send, &mut recv, 500, MemKind::Host),
        2
    );
}
