//! Tests of the `sock` fabric over 127.0.0.1: two protection domains of one process act as
//! two hosts. Raw `TcpListener`/`TcpStream`s play broken or silent peers.

use super::wire::{Header, Hello, Op};
use super::*;
use crate::fabric::{
    Access, Completion, CompletionQueue, Doorbell, MemoryRegion, QpCaps, QpState, QueuePair,
    SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use parking_lot::RwLock;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

/// Sock tests share `live_threads()`: the leak test takes this exclusively.
pub(crate) static TEST_LOCK: RwLock<()> = RwLock::new(());

const LONG: Duration = Duration::from_secs(30);
const CAPS: QpCaps = QpCaps {
    max_send_wr: 256,
    max_recv_wr: 256,
};

fn lo() -> SockRail {
    SockRail {
        name: "lo".into(),
        ip: "127.0.0.1".parse().unwrap(),
    }
}

fn fabric(retry: Duration, seg: usize) -> SockFabric {
    SockFabric::new(SockConfig {
        rails: vec![lo()],
        retry_timeout: retry,
        segment_bytes: seg,
    })
    .unwrap()
}

/// One "host": a PD, a CQ with its doorbell and a queue pair.
struct Side {
    pd: Arc<dyn ProtectionDomain>,
    bell: Arc<Doorbell>,
    cq: Arc<dyn CompletionQueue>,
    qp: Box<dyn QueuePair>,
}

fn side(f: &SockFabric, caps: QpCaps) -> Side {
    let pd = f.open_pd(0).unwrap();
    let bell = Arc::new(Doorbell::new());
    let cq = pd.create_cq(1024, bell.clone()).unwrap();
    let qp = pd.create_qp(&cq, caps).unwrap();
    Side { pd, bell, cq, qp }
}

impl Side {
    /// Wait for exactly `n` completions (fails on timeout), then check none is left.
    fn wait(&self, n: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        let deadline = Instant::now() + LONG;
        while out.len() < n {
            let want = n - out.len();
            let got = self.cq.poll(&mut out, want).unwrap();
            if got == 0 {
                assert!(
                    Instant::now() < deadline,
                    "timed out with {} of {n} completions: {out:?}",
                    out.len()
                );
                self.bell.wait(Duration::from_millis(100));
            }
        }
        let mut extra = Vec::new();
        self.cq.poll(&mut extra, 16).unwrap();
        assert!(
            extra.is_empty(),
            "unexpected completions {extra:?} after {out:?}"
        );
        out
    }

    /// Nothing completes until `deadline`.
    fn none_until(&self, deadline: Instant) {
        let mut out = Vec::new();
        while Instant::now() < deadline {
            self.cq.poll(&mut out, 16).unwrap();
            assert!(out.is_empty(), "unexpected completions {out:?}");
            self.bell.wait(Duration::from_millis(20));
        }
    }

    fn ep(&self) -> SockEndpoint {
        SockEndpoint::decode(&self.qp.local_endpoint()).unwrap()
    }

    fn reg(&self, b: &Buf, access: Access) -> Box<dyn MemoryRegion> {
        self.pd.reg_mr(b.addr(), b.len(), access).unwrap()
    }
}

/// Bring both queue pairs to RTS aimed at each other.
fn connect(a: &Side, b: &Side) {
    a.qp.to_init().unwrap();
    b.qp.to_init().unwrap();
    a.qp.to_rtr(&b.qp.local_endpoint()).unwrap();
    b.qp.to_rtr(&a.qp.local_endpoint()).unwrap();
    a.qp.to_rts().unwrap();
    b.qp.to_rts().unwrap();
}

fn pair(retry: Duration, seg: usize) -> (SockFabric, Side, Side) {
    let f = fabric(retry, seg);
    let a = side(&f, CAPS);
    let b = side(&f, CAPS);
    connect(&a, &b);
    (f, a, b)
}

/// 8-byte aligned test memory.
struct Buf(Vec<u64>);

impl Buf {
    fn new(bytes: usize, fill: u8) -> Buf {
        let mut b = Buf(vec![0u64; bytes.div_ceil(8).max(1)]);
        b.bytes_mut().fill(fill);
        b
    }
    fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
    fn len(&self) -> usize {
        self.0.len() * 8
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: a Vec<u64>'s storage viewed as bytes; the test reads it only when no
        // fabric copy into it can be running (after the completion that covers it).
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.len()) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, mutable and exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, self.len()) }
    }
    /// Fill with a pattern that differs per position and per `seed`.
    fn pattern(&mut self, seed: u64) {
        for (i, w) in self.0.iter_mut().enumerate() {
            *w = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        }
    }
}

/// A send WR: `local` = (buffer, offset, length, lkey).
fn wr(wr_id: u64, op: SendOp, local: (&Buf, usize, usize, u32), raddr: usize, rkey: u32) -> SendWr {
    SendWr {
        wr_id,
        op,
        local: Sge {
            addr: local.0.addr() + local.1,
            len: local.2,
            lkey: local.3,
        },
        remote_addr: raddr as u64,
        rkey,
        signaled: true,
    }
}

fn statuses(cs: &[Completion]) -> Vec<(u64, WcStatus)> {
    cs.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn devices_config_and_endpoint() {
    let f = fabric(Duration::from_secs(1), 1 << 20);
    assert_eq!(f.kind(), "sock");
    let d = &f.devices()[0];
    assert_eq!(d.name, "sock:lo");
    assert_eq!(d.guid, 1);
    assert_eq!(d.port, 1);
    assert_eq!(d.link_layer, LinkLayer::Ethernet);
    assert_eq!(d.max_comms, 65536);
    assert_eq!(d.ptr_support, 1);
    assert!(d.speed_mbps > 0);
    assert_eq!(d.pci_path, None); // lo has no device node
    assert!(matches!(f.open_pd(1), Err(FabricError::InvalidArgument(_))));
    let bad = |rails: Vec<SockRail>, seg: usize| {
        SockFabric::new(SockConfig {
            rails,
            retry_timeout: Duration::from_secs(1),
            segment_bytes: seg,
        })
    };
    assert!(matches!(
        bad(vec![], 1 << 20),
        Err(FabricError::NoDevice(_))
    ));
    assert!(matches!(
        bad(vec![lo()], 0),
        Err(FabricError::InvalidArgument(_))
    ));
    assert!(matches!(
        bad(vec![lo()], wire::MAX_SEGMENT_BYTES + 1),
        Err(FabricError::InvalidArgument(_))
    ));

    for ip in ["10.1.2.3", "fe80::1234:5678"] {
        let ep = SockEndpoint {
            ip: ip.parse().unwrap(),
            port: 4791,
            qpn: 77,
            nonce: 0xfeed_f00d_dead_beef,
        };
        let b = ep.encode();
        assert!(b.len() <= 64);
        assert_eq!(SockEndpoint::decode(&b).unwrap(), ep);
        for cut in 0..b.len() {
            assert!(matches!(
                SockEndpoint::decode(&b[..cut]),
                Err(FabricError::BadPeerAddress(_))
            ));
        }
        let mut v = b.clone();
        v[0] = 9;
        assert!(SockEndpoint::decode(&v).is_err());
        let mut v = b.clone();
        v.push(0);
        assert!(SockEndpoint::decode(&v).is_err());
    }
}

#[test]
fn registration_keys() {
    let _l = TEST_LOCK.read();
    let f = fabric(Duration::from_secs(1), 1 << 20);
    let pd = f.open_pd(0).unwrap();
    let b = Buf::new(64, 0);
    assert!(matches!(
        pd.reg_mr(b.addr(), 0, Access::ALL),
        Err(FabricError::InvalidArgument(_))
    ));
    let m1 = pd.reg_mr(b.addr(), 64, Access::ALL).unwrap();
    let m2 = pd.reg_mr(b.addr() + 8, 8, Access::REMOTE_READ).unwrap();
    let (k1, k2) = (m1.keys(), m2.keys());
    assert_ne!(k1.lkey, 0);
    assert_eq!(k1.lkey, k1.rkey);
    assert_ne!(k1.lkey, k2.lkey);
    assert_eq!((m2.addr(), m2.len()), (b.addr() + 8, 8));
    drop(m1);
    let m3 = pd.reg_mr(b.addr(), 64, Access::ALL).unwrap();
    assert_ne!(m3.keys().lkey, k1.lkey, "key reused at once");
}

#[test]
fn write_bytes_verified_0_1_4k_64m() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const BIG: usize = 64 << 20;
    let mut src = Buf::new(BIG, 0);
    let dst = Buf::new(BIG + 64, 0xEE);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    for (i, &n) in [0usize, 1, 4096, BIG].iter().enumerate() {
        src.pattern(i as u64 + 1);
        // Land at an odd offset so the last word is unaligned for 1 and 4096+8.
        let off = if n == 4096 { 8 } else { 3 };
        let w = wr(
            i as u64,
            SendOp::Write,
            (&src, 0, n, ms.keys().lkey),
            dst.addr() + off,
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
        let c = a.wait(1);
        assert_eq!(
            c[0],
            Completion {
                wr_id: i as u64,
                qp_num: a.qp.qp_num(),
                status: WcStatus::Success,
                opcode: WcOpcode::RdmaWrite,
                byte_len: n as u32,
                imm: None,
            }
        );
        assert!(
            dst.bytes()[off..off + n] == src.bytes()[..n],
            "size {n}: bytes differ"
        );
        assert!(
            dst.bytes()[off + n..].iter().all(|&x| x == 0xEE),
            "size {n}: wrote past the end"
        );
    }
    assert!(dst.bytes()[..3].iter().all(|&x| x == 0xEE));
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn multi_segment_writes_and_reads() {
    let _l = TEST_LOCK.read();
    // 4 KiB segments: a 1 MiB+13 write is 257 segments; the aligned tail word of the second
    // write straddles two segments.
    let (_f, a, b) = pair(LONG, 4096);
    let mut src = Buf::new(2 << 20, 0);
    src.pattern(42);
    let dst = Buf::new(2 << 20, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let md = b.reg(&dst, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let cases = [(0usize, 0usize, (1 << 20) + 13), (5, 4, 3 * 4096 + 4)];
    for (i, &(soff, doff, n)) in cases.iter().enumerate() {
        let w = wr(
            i as u64,
            SendOp::Write,
            (&src, soff, n, ms.keys().lkey),
            dst.addr() + (1 << 20) * i + doff,
            md.keys().rkey,
        );
        a.qp.post_send(&[w]).unwrap();
        assert!(a.wait(1)[0].status.is_ok());
        let d = (1 << 20) * i + doff;
        assert!(
            dst.bytes()[d..d + n] == src.bytes()[soff..soff + n],
            "case {i}"
        );
    }
    // Read it back from B into another place in A's buffer.
    let back = Buf::new((1 << 20) + 64, 0);
    let mb = a.reg(&back, Access::LOCAL_WRITE);
    let r = wr(
        9,
        SendOp::Read,
        (&back, 1, (1 << 20) + 13, mb.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[r]).unwrap();
    let c = a.wait(1);
    assert_eq!(
        (c[0].status, c[0].opcode, c[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, (1 << 20) + 13)
    );
    assert!(back.bytes()[1..1 + (1 << 20) + 13] == dst.bytes()[..(1 << 20) + 13]);
    assert_eq!((back.bytes()[0], back.bytes()[(1 << 20) + 14]), (0, 0));
}

#[test]
fn read_bytes_verified() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 64 << 10);
    let mut remote = Buf::new(3 << 20, 0);
    remote.pattern(7);
    let local = Buf::new(3 << 20, 0xEE);
    let mr = b.reg(&remote, Access::REMOTE_READ);
    let ml = a.reg(&local, Access::LOCAL_WRITE);
    let mut off = 0;
    for (i, &n) in [0usize, 5, (2 << 20) + 3].iter().enumerate() {
        let r = wr(
            i as u64,
            SendOp::Read,
            (&local, off, n, ml.keys().lkey),
            remote.addr() + 11,
            mr.keys().rkey,
        );
        a.qp.post_send(&[r]).unwrap();
        let c = a.wait(1);
        assert_eq!(
            (c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len),
            (i as u64, WcStatus::Success, WcOpcode::RdmaRead, n as u32)
        );
        assert!(local.bytes()[off..off + n] == remote.bytes()[11..11 + n]);
        assert_eq!(local.bytes()[off + n], 0xEE);
        off += n + 1;
    }
}

#[test]
fn write_with_imm_after_earlier_writes() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 256 << 10);
    let mut src = Buf::new(4 << 20, 0);
    src.pattern(3);
    let dst = Buf::new(4 << 20, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    b.qp.post_recv(100).unwrap();
    b.qp.post_recv(101).unwrap();
    let mut wrs: Vec<SendWr> = (0..3)
        .map(|i| {
            let mut w = wr(
                i,
                SendOp::Write,
                (&src, (i as usize) << 20, 1 << 20, ms.keys().lkey),
                dst.addr() + ((i as usize) << 20),
                md.keys().rkey,
            );
            w.signaled = false;
            w
        })
        .collect();
    wrs.push(wr(
        3,
        SendOp::WriteWithImm(0xabcd_0123),
        (&src, 3 << 20, 4096, ms.keys().lkey),
        dst.addr() + (3 << 20),
        md.keys().rkey,
    ));
    // Zero-length WRITE_WITH_IMM: no key needed.
    wrs.push(wr(4, SendOp::WriteWithImm(7), (&src, 0, 0, 0), 0, 0));
    a.qp.post_send(&wrs).unwrap();
    let rc = b.wait(2);
    assert_eq!(
        rc[0],
        Completion {
            wr_id: 100,
            qp_num: b.qp.qp_num(),
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm: Some(0xabcd_0123),
        }
    );
    assert_eq!((rc[1].wr_id, rc[1].imm, rc[1].byte_len), (101, Some(7), 0));
    // Everything before the immediate is in place once its receive completed.
    assert!(dst.bytes()[..(3 << 20) + 4096] == src.bytes()[..(3 << 20) + 4096]);
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(3, WcStatus::Success), (4, WcStatus::Success)]
    );
}

#[test]
fn many_wrs_complete_in_posting_order() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let mut src = Buf::new(64 << 10, 0);
    src.pattern(9);
    let rbuf = Buf::new(64 << 10, 0);
    let dst = Buf::new(64 << 10, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let mr = a.reg(&rbuf, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let mut wrs = Vec::new();
    let mut imms = 0;
    for i in 0..200u64 {
        let off = (i as usize * 256) % (60 << 10);
        let op = match i % 5 {
            0 => SendOp::Read,
            1 => {
                imms += 1;
                SendOp::WriteWithImm(i as u32)
            }
            _ => SendOp::Write,
        };
        let (lbuf, lkey) = if op == SendOp::Read {
            (&rbuf, mr.keys().lkey)
        } else {
            (&src, ms.keys().lkey)
        };
        let mut w = wr(
            i,
            op,
            (lbuf, off, 100, lkey),
            dst.addr() + off,
            md.keys().rkey,
        );
        w.signaled = i % 3 != 0;
        wrs.push(w);
    }
    for i in 0..imms {
        b.qp.post_recv(1000 + i).unwrap();
    }
    // Post in a few calls.
    for chunk in wrs.chunks(37) {
        a.qp.post_send(chunk).unwrap();
    }
    let want: Vec<(u64, WcStatus)> = wrs
        .iter()
        .filter(|w| w.signaled)
        .map(|w| (w.wr_id, WcStatus::Success))
        .collect();
    assert_eq!(statuses(&a.wait(want.len())), want);
    let rc = b.wait(imms as usize);
    let got: Vec<(u64, Option<u32>)> = rc.iter().map(|c| (c.wr_id, c.imm)).collect();
    let want: Vec<(u64, Option<u32>)> = (0..imms)
        .map(|i| (1000 + i, Some((i * 5 + 1) as u32)))
        .collect();
    assert_eq!(got, want);
}

/// A WR at the responder's `rkey`/range/access that must be refused.
fn remote_violation(
    make: impl Fn(&Buf, u32, &Buf, u32) -> (usize, u32),
    access: Access,
    op: SendOp,
) {
    let (_f, a, b) = pair(LONG, 1 << 20);
    let mut src = Buf::new(8192, 0);
    src.pattern(1);
    let dst = Buf::new(8192, 0xEE);
    let ok_dst = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, access);
    let mok = b.reg(&ok_dst, Access::REMOTE_WRITE);
    b.qp.post_recv(50).unwrap();
    b.qp.post_recv(51).unwrap();
    let (raddr, rkey) = make(&dst, md.keys().rkey, &ok_dst, mok.keys().rkey);
    let src_before = src.bytes().to_vec();
    let w0 = wr(
        0,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        ok_dst.addr(),
        mok.keys().rkey,
    );
    let w1 = wr(1, op, (&src, 0, 4096, ms.keys().lkey), raddr, rkey);
    let w2 = wr(
        2,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        ok_dst.addr(),
        mok.keys().rkey,
    );
    a.qp.post_send(&[w0, w1, w2]).unwrap();
    assert_eq!(
        statuses(&a.wait(3)),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    // The responder went to ERR too: its receives flush.
    assert_eq!(
        statuses(&b.wait(2)),
        vec![(50, WcStatus::WrFlushErr), (51, WcStatus::WrFlushErr)]
    );
    assert_eq!(b.qp.state(), QpState::Err);
    assert!(dst.bytes().iter().all(|&x| x == 0xEE), "canary touched");
    assert!(ok_dst.bytes() == &src.bytes()[..64]);
    // A refused READ placed nothing locally either.
    assert!(src.bytes() == src_before.as_slice());
}

#[test]
fn remote_wrong_rkey() {
    let _l = TEST_LOCK.read();
    remote_violation(
        |d, k, _, _| (d.addr(), k ^ 0x8000_0000),
        Access::REMOTE_WRITE,
        SendOp::Write,
    );
}

#[test]
fn remote_out_of_range() {
    let _l = TEST_LOCK.read();
    // 4096 bytes starting 4095 before the end: one byte past the region.
    remote_violation(
        |d, k, _, _| (d.addr() + d.len() - 4095, k),
        Access::REMOTE_WRITE,
        SendOp::Write,
    );
}

#[test]
fn remote_no_write_access() {
    let _l = TEST_LOCK.read();
    remote_violation(
        |d, k, _, _| (d.addr(), k),
        Access::REMOTE_READ,
        SendOp::Write,
    );
}

#[test]
fn remote_no_read_access() {
    let _l = TEST_LOCK.read();
    remote_violation(
        |d, k, _, _| (d.addr(), k),
        Access::REMOTE_WRITE,
        SendOp::Read,
    );
}

#[test]
fn remote_key_of_other_pd_or_deregistered() {
    let _l = TEST_LOCK.read();
    // The key is valid in the requester's PD only: the responder refuses it.
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(4096, 1);
    let dst = Buf::new(4096, 0xEE);
    let ms = a.reg(&src, Access::ALL);
    let in_a = a.reg(&dst, Access::ALL);
    let w = wr(
        0,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        dst.addr(),
        in_a.keys().rkey,
    );
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::RemAccessErr)]);
    assert!(dst.bytes().iter().all(|&x| x == 0xEE));
    drop(b);

    let (_f, a, b) = pair(LONG, 1 << 20);
    let ms = a.reg(&src, Access::ALL);
    let md = b.reg(&dst, Access::ALL);
    let rkey = md.keys().rkey;
    drop(md);
    let w = wr(
        0,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey),
        dst.addr(),
        rkey,
    );
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::RemAccessErr)]);
    assert!(dst.bytes().iter().all(|&x| x == 0xEE));
}

#[test]
fn bad_lkey_is_local_protection_error() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(4096, 1);
    let dst = Buf::new(4096, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let good = |id| {
        wr(
            id,
            SendOp::Write,
            (&src, 0, 64, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )
    };
    let bad = wr(
        1,
        SendOp::Write,
        (&src, 0, 64, ms.keys().lkey + 1000),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[good(0), bad, good(2)]).unwrap();
    assert_eq!(
        statuses(&a.wait(3)),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::LocProtErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    // Posting in ERR flushes at once.
    a.qp.post_send(&[good(3)]).unwrap();
    a.qp.post_recv(4).unwrap();
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(3, WcStatus::WrFlushErr), (4, WcStatus::WrFlushErr)]
    );

    // Out of the registration, and READ into memory without LOCAL_WRITE.
    let (_f, a, b) = pair(LONG, 1 << 20);
    let ms = a.reg(&src, Access::REMOTE_READ);
    let md = b.reg(&dst, Access::ALL);
    let past = wr(
        0,
        SendOp::Write,
        (&src, 1, 4096, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[past]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::LocProtErr)]);
    let (_f, a, b) = pair(LONG, 1 << 20);
    let ms = a.reg(&src, Access::REMOTE_READ);
    let md = b.reg(&dst, Access::ALL);
    let rd = wr(
        0,
        SendOp::Read,
        (&src, 0, 16, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    );
    a.qp.post_send(&[rd]).unwrap();
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::LocProtErr)]);
    assert_eq!(b.qp.state(), QpState::Rts);
}

/// A peer that completes the TCP handshake (kernel backlog) and never says anything.
fn silent_peer() -> (TcpListener, Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = SockEndpoint {
        ip: "127.0.0.1".parse().unwrap(),
        port: l.local_addr().unwrap().port(),
        qpn: 1,
        nonce: 2,
    };
    (l, ep.encode())
}

fn lone_rts(f: &SockFabric, caps: QpCaps, remote: &[u8]) -> Side {
    let s = side(f, caps);
    s.qp.to_init().unwrap();
    s.qp.to_rtr(remote).unwrap();
    s.qp.to_rts().unwrap();
    s
}

#[test]
fn to_err_flushes_sends_and_recvs_in_order() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(4096, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_recv(100).unwrap();
    a.qp.post_recv(101).unwrap();
    a.qp.post_recv(102).unwrap();
    let wrs: Vec<SendWr> = (0..7)
        .map(|i| {
            let mut w = wr(i, SendOp::Write, (&src, 0, 4096, ms.keys().lkey), 0x1000, 5);
            w.signaled = i % 2 == 0;
            w
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    a.none_until(Instant::now() + Duration::from_millis(100));
    a.qp.to_err().unwrap();
    assert_eq!(a.qp.state(), QpState::Err);
    let c = a.wait(10);
    let mut want: Vec<(u64, WcStatus)> = (0..7).map(|i| (i, WcStatus::WrFlushErr)).collect();
    want.extend((100..103).map(|i| (i, WcStatus::WrFlushErr)));
    assert_eq!(statuses(&c), want);
    assert!(c[..7].iter().all(|c| c.opcode == WcOpcode::RdmaWrite));
    assert!(c[7..]
        .iter()
        .all(|c| c.opcode == WcOpcode::RecvRdmaWithImm && c.imm.is_none()));
    // to_err again is harmless and completes nothing.
    a.qp.to_err().unwrap();
    a.none_until(Instant::now() + Duration::from_millis(50));
}

#[test]
fn posting_in_wrong_state_and_queue_limits() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 1,
    };
    let a = side(&f, caps);
    let src = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let w = |id| wr(id, SendOp::Write, (&src, 0, 8, ms.keys().lkey), 0x1000, 5);
    let bad_state = |r: Result<()>, st: QpState| match r {
        Err(FabricError::BadState { state, .. }) => assert_eq!(state, st),
        other => panic!("expected BadState({st:?}), got {other:?}"),
    };
    assert_eq!(a.qp.state(), QpState::Reset);
    bad_state(a.qp.post_send(&[w(0)]), QpState::Reset);
    bad_state(a.qp.post_recv(0), QpState::Reset);
    let (_peer, ep) = silent_peer();
    bad_state(a.qp.to_rtr(&ep), QpState::Reset);
    bad_state(a.qp.to_rts(), QpState::Reset);
    a.qp.to_init().unwrap();
    bad_state(a.qp.to_init(), QpState::Init);
    bad_state(a.qp.post_send(&[w(0)]), QpState::Init);
    a.qp.post_recv(1).unwrap();
    assert!(matches!(a.qp.post_recv(2), Err(FabricError::QueueFull(_))));
    assert!(matches!(
        a.qp.to_rtr(b"garbage"),
        Err(FabricError::BadPeerAddress(_))
    ));
    assert!(matches!(
        a.qp.to_rtr(&[]),
        Err(FabricError::BadPeerAddress(_))
    ));
    a.qp.to_rtr(&ep).unwrap();
    bad_state(a.qp.post_send(&[w(0)]), QpState::Rtr);
    a.qp.to_rts().unwrap();
    assert!(matches!(
        a.qp.post_send(&[w(0), w(1), w(2)]),
        Err(FabricError::QueueFull(_))
    ));
    a.qp.post_send(&[w(0), w(1)]).unwrap();
    assert!(matches!(
        a.qp.post_send(&[w(2)]),
        Err(FabricError::QueueFull(_))
    ));
    a.qp.to_err().unwrap();
    assert_eq!(
        statuses(&a.wait(3)),
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr)
        ]
    );
    bad_state(a.qp.to_rts(), QpState::Err);
}

#[test]
fn retry_exceeded_against_silent_peer() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(400);
    let f = fabric(retry, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(4096, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let t0 = Instant::now();
    a.qp.post_send(&[
        wr(0, SendOp::Write, (&src, 0, 4096, ms.keys().lkey), 0x1000, 5),
        wr(1, SendOp::Read, (&src, 0, 0, 0), 0x1000, 5),
    ])
    .unwrap();
    let c = a.wait(2);
    let dt = t0.elapsed();
    assert_eq!(
        statuses(&c),
        vec![(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr)]
    );
    assert!(dt >= retry, "fired early: {dt:?}");
    assert!(dt <= retry + Duration::from_secs(3), "fired late: {dt:?}");
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn retry_exceeded_when_nothing_listens() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(300);
    let f = fabric(retry, 1 << 20);
    let ep = {
        let (l, ep) = silent_peer();
        drop(l); // the port now refuses connections
        ep
    };
    let t0 = Instant::now();
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(64, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_send(&[wr(
        7,
        SendOp::Write,
        (&src, 0, 8, ms.keys().lkey),
        0x1000,
        5,
    )])
    .unwrap();
    let c = a.wait(1);
    let dt = t0.elapsed();
    assert_eq!(statuses(&c), vec![(7, WcStatus::RetryExcErr)]);
    assert!(
        dt >= retry && dt <= retry + Duration::from_secs(3),
        "{dt:?}"
    );
}

#[test]
fn peer_qp_dropped_fails_next_wr_at_once() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(64, 1);
    let dst = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let w = |id| {
        wr(
            id,
            SendOp::Write,
            (&src, 0, 64, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )
    };
    a.qp.post_send(&[w(0)]).unwrap();
    assert!(a.wait(1)[0].status.is_ok());
    let Side { qp: bqp, .. } = b;
    drop(bqp);
    let t0 = Instant::now();
    a.qp.post_send(&[w(1), w(2)]).unwrap();
    // Well before the 30 s retry timer: the broken stream fails the WR right away.
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn rnr_waits_for_a_receive_with_keepalives() {
    let _l = TEST_LOCK.read();
    let retry = Duration::from_millis(500);
    let (_f, a, b) = pair(retry, 1 << 20);
    let src = Buf::new(64, 1);
    let dst = Buf::new(64, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    a.qp.post_send(&[wr(
        0,
        SendOp::WriteWithImm(5),
        (&src, 0, 64, ms.keys().lkey),
        dst.addr(),
        md.keys().rkey,
    )])
    .unwrap();
    // Four retry periods without a receive: the requester must not give up.
    a.none_until(Instant::now() + retry * 4);
    assert_eq!(a.qp.state(), QpState::Rts);
    b.qp.post_recv(9).unwrap();
    let rc = b.wait(1);
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].imm),
        (9, WcStatus::Success, Some(5))
    );
    assert_eq!(statuses(&a.wait(1)), vec![(0, WcStatus::Success)]);
    assert!(dst.bytes() == src.bytes());
}

/// Connect to `pd`'s listener as a raw peer and send a hello for `ep`.
fn raw_stream_to(ep: &SockEndpoint, nonce: u64) -> TcpStream {
    let mut s = TcpStream::connect((ep.ip, ep.port)).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(
        &Hello {
            target_qpn: ep.qpn,
            source_qpn: 4242,
            target_nonce: nonce,
        }
        .encode(),
    )
    .unwrap();
    s
}

#[test]
fn garbage_on_inbound_stream_fails_only_that_qp() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (_peer, ep) = silent_peer();
    let a = lone_rts(&f, CAPS, &ep);
    // A second queue pair on the same PD must not be affected.
    let a2 = a.pd.create_qp(&a.cq, CAPS).unwrap();
    a2.to_init().unwrap();
    a2.post_recv(77).unwrap();
    a.qp.post_recv(1).unwrap();
    a.qp.post_recv(2).unwrap();
    let mut s = raw_stream_to(&a.ep(), a.ep().nonce);
    s.write_all(&[0xff; 36]).unwrap();
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a2.state(), QpState::Init);
    // The bad stream is closed.
    let mut b = [0u8; 1];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
}

#[test]
fn garbage_on_reply_stream_fails_the_requester() {
    let _l = TEST_LOCK.read();
    let f = fabric(LONG, 1 << 20);
    let (l, ep) = silent_peer();
    let peer = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut hello = [0u8; wire::HELLO_LEN];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(Hello::decode(&hello).unwrap().target_qpn, 1);
        let mut h = Header::new(Op::Ack);
        h.len = 5; // ACKs carry no payload
        s.write_all(&h.to_bytes()).unwrap();
        // Wait for the requester to hang up.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let a = lone_rts(&f, CAPS, &ep);
    let src = Buf::new(64, 1);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    a.qp.post_send(&[
        wr(0, SendOp::Write, (&src, 0, 64, ms.keys().lkey), 0x1000, 5),
        wr(1, SendOp::Write, (&src, 0, 64, ms.keys().lkey), 0x1000, 5),
    ])
    .unwrap();
    assert_eq!(
        statuses(&a.wait(2)),
        vec![(0, WcStatus::RemOpErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    peer.join().unwrap();
}

#[test]
fn hello_with_wrong_nonce_is_refused() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    let src = Buf::new(64, 3);
    let dst = Buf::new(64, 0);
    let both_ways = || {
        for (from, to) in [(&a, &b), (&b, &a)] {
            let ms = from.reg(&src, Access::LOCAL_WRITE);
            let md = to.reg(&dst, Access::REMOTE_WRITE);
            from.qp
                .post_send(&[wr(
                    0,
                    SendOp::Write,
                    (&src, 0, 64, ms.keys().lkey),
                    dst.addr(),
                    md.keys().rkey,
                )])
                .unwrap();
            assert_eq!(statuses(&from.wait(1)), vec![(0, WcStatus::Success)]);
        }
    };
    both_ways();
    let ep = a.ep();
    let mut s = raw_stream_to(&ep, ep.nonce ^ 1);
    let mut x = [0u8; 1];
    assert!(
        matches!(s.read(&mut x), Ok(0) | Err(_)),
        "stream not closed"
    );
    // A second stream with the right nonce is refused too: one inbound stream per QP.
    let mut s = raw_stream_to(&ep, ep.nonce);
    assert!(
        matches!(s.read(&mut x), Ok(0) | Err(_)),
        "duplicate stream not closed"
    );
    both_ways();
}

#[test]
fn fence_nothing_placed_after_to_err() {
    let _l = TEST_LOCK.read();
    let (_f, a, b) = pair(LONG, 1 << 20);
    const N: usize = 8 << 20;
    let mut src = Buf::new(N, 0);
    src.pattern(5);
    let mut dst = Buf::new(N, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let wrs: Vec<SendWr> = (0..64)
        .map(|i| {
            wr(
                i,
                SendOp::Write,
                (&src, 0, N, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            )
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    // Wait until placement is under way (the first word changed).
    let first = dst.addr() as *const u64;
    let deadline = Instant::now() + LONG;
    // SAFETY: aligned, inside `dst`; volatile because the fabric writes it concurrently.
    while unsafe { first.read_volatile() } == 0 {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    b.qp.to_err().unwrap();
    // From here on nothing may land in `dst`.
    dst.bytes_mut().fill(0x5A);
    // The requester sees its stream die: every WR completes (some maybe Success, at least
    // the last ones in error). Then give a stray placement every chance to show up.
    let c = a.wait(64);
    assert!(c.iter().any(|c| !c.status.is_ok()));
    assert!(c.windows(2).all(|w| w[0].wr_id + 1 == w[1].wr_id));
    drop(a);
    drop(md);
    assert!(
        dst.bytes().iter().all(|&x| x == 0x5A),
        "bytes placed after to_err returned"
    );
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn threads_and_fds_return_to_baseline() {
    let _l = TEST_LOCK.write();
    let threads0 = live_threads();
    let fds0 = open_fds();
    {
        let (f, a, b) = pair(LONG, 1 << 20);
        let src = Buf::new(1 << 20, 1);
        let dst = Buf::new(1 << 20, 0);
        let ms = a.reg(&src, Access::ALL);
        let md = b.reg(&dst, Access::ALL);
        a.qp.post_send(&[
            wr(
                0,
                SendOp::Write,
                (&src, 0, 1 << 20, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            ),
            wr(
                1,
                SendOp::Read,
                (&src, 0, 4096, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            ),
        ])
        .unwrap();
        assert_eq!(a.wait(2).len(), 2);
        // b's responder now waits for a receive (RNR) when everything is dropped.
        a.qp.post_send(&[wr(
            2,
            SendOp::WriteWithImm(1),
            (&src, 0, 8, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )])
        .unwrap();
        // A queue pair talking to a silent peer, and one never started.
        let (_peer, ep) = silent_peer();
        let c = lone_rts(&f, CAPS, &ep);
        c.qp.post_send(&[wr(
            0,
            SendOp::Write,
            (&src, 0, 8, c.reg(&src, Access::ALL).keys().lkey),
            0x1000,
            5,
        )])
        .unwrap();
        let d = side(&f, CAPS);
        // Listeners of a, b, c, d; senders of a, b, c; a's ack reader; b's responder.
        assert!(
            live_threads() >= threads0 + 9,
            "{} vs {threads0}",
            live_threads()
        );
        // Drop QPs before PDs, PDs before QPs, CQs last: any order must clean up.
        drop(a.pd);
        drop(ms);
        drop((a.qp, b, c, d));
    }
    let deadline = Instant::now() + LONG;
    while live_threads() != threads0 || open_fds() != fds0 {
        assert!(
            Instant::now() < deadline,
            "threads {} vs {threads0}, fds {} vs {fds0}",
            live_threads(),
            open_fds()
        );
        std::thread::yield_now();
    }
}

/// Throughput: `cargo test --release --lib fabric::sock::tests::bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_write_64m_loopback() {
    let _l = TEST_LOCK.write();
    let seg = std::env::var("SOCK_BENCH_SEG").map_or(1 << 20, |v| v.parse().unwrap());
    let (_f, a, b) = pair(LONG, seg);
    const N: usize = 64 << 20;
    let mut src = Buf::new(N, 0);
    src.pattern(1);
    let dst = Buf::new(N, 0);
    let ms = a.reg(&src, Access::LOCAL_WRITE);
    let md = b.reg(&dst, Access::REMOTE_WRITE);
    let w = |i| {
        wr(
            i,
            SendOp::Write,
            (&src, 0, N, ms.keys().lkey),
            dst.addr(),
            md.keys().rkey,
        )
    };
    for (iters, window) in [(8u64, 1u64), (32, 4)] {
        let t0 = Instant::now();
        let mut posted = 0;
        let mut done = 0;
        while done < iters {
            while posted < iters && posted - done < window {
                a.qp.post_send(&[w(posted)]).unwrap();
                posted += 1;
            }
            let mut c = Vec::new();
            while a.cq.poll(&mut c, 16).unwrap() == 0 {
                a.bell.wait(Duration::from_millis(10));
            }
            assert!(c.iter().all(|c| c.status.is_ok()));
            done += c.len() as u64;
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "sock WRITE 64 MiB x{iters}, window {window}: {:.2} GB/s",
            (iters as f64 * N as f64) / dt / 1e9
        );
    }
    // Small messages: 4 KiB WRITEs, 128 in flight.
    let iters = 20000u64;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0, 0);
    let mut out = Vec::new();
    while done < iters {
        while posted < iters && posted - done < 128 {
            a.qp.post_send(&[wr(
                posted,
                SendOp::Write,
                (&src, 0, 4096, ms.keys().lkey),
                dst.addr(),
                md.keys().rkey,
            )])
            .unwrap();
            posted += 1;
        }
        out.clear();
        let n = a.cq.poll(&mut out, 128).unwrap();
        if n == 0 {
            a.bell.wait(Duration::from_millis(10));
        }
        done += n as u64;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "sock WRITE 4 KiB x{iters}, 128 in flight: {:.0} kWR/s, {:.2} GB/s",
        iters as f64 / dt / 1e3,
        iters as f64 * 4096.0 / dt / 1e9
    );
}
