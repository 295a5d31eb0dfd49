//! Tests of the `sock` fabric over 127.0.0.1: two protection domains of one process act as
//! two hosts. Raw `TcpListener`/`TcpStream`s play broken or silent peers. This file holds
//! the shared helpers; the tests are in the submodules.

mod bench;
mod data;
mod errors;
mod gate;
mod lanes;
mod lifecycle;
mod liveness;
mod rogue;
mod strangers;

use super::hello::Hello;
use super::wire::{Header, Op};
use super::*;
use crate::fabric::{
    Access, Completion, CompletionQueue, Doorbell, MemoryRegion, QpCaps, QpState, QueuePair,
    SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

pub(crate) use super::test_lock::TEST_LOCK;

pub(super) const LONG: Duration = Duration::from_secs(30);
pub(super) const CAPS: QpCaps = QpCaps {
    max_send_wr: 256,
    max_recv_wr: 256,
    traffic_class: None,
};

pub(super) fn lo() -> SockRail {
    SockRail {
        name: "lo".into(),
        ip: "127.0.0.1".parse().unwrap(),
    }
}

pub(super) fn fabric(retry: Duration, seg: usize) -> SockFabric {
    SockFabric::new(SockConfig {
        rails: vec![lo()],
        retry_timeout: retry,
        segment_bytes: seg,
        inline_bytes: 64 << 10,
        inline_gate: None,
        spin: Duration::from_micros(100),
        lanes: 4,
        delack_max: Some(std::time::Duration::from_millis(5)),
        limits: Default::default(),
    })
    .unwrap()
}

/// One "host": a PD, a CQ with its doorbell and a queue pair.
pub(super) struct Side {
    pub(super) pd: Arc<dyn ProtectionDomain>,
    pub(super) bell: Arc<Doorbell>,
    pub(super) cq: Arc<dyn CompletionQueue>,
    pub(super) qp: Box<dyn QueuePair>,
}

pub(super) fn side(f: &SockFabric, caps: QpCaps) -> Side {
    let pd = f.open_pd(0).unwrap();
    let bell = Arc::new(Doorbell::new());
    let cq = pd.create_cq(1024, bell.clone()).unwrap();
    let qp = pd.create_qp(&cq, caps).unwrap();
    Side { pd, bell, cq, qp }
}

impl Side {
    /// Wait for exactly `n` completions (fails on timeout), then check none is left.
    pub(super) fn wait(&self, n: usize) -> Vec<Completion> {
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
    pub(super) fn none_until(&self, deadline: Instant) {
        let mut out = Vec::new();
        while Instant::now() < deadline {
            self.cq.poll(&mut out, 16).unwrap();
            assert!(out.is_empty(), "unexpected completions {out:?}");
            self.bell.wait(Duration::from_millis(20));
        }
    }

    pub(super) fn ep(&self) -> SockEndpoint {
        SockEndpoint::decode(&self.qp.local_endpoint()).unwrap()
    }

    pub(super) fn reg(&self, b: &Buf, access: Access) -> Box<dyn MemoryRegion> {
        self.pd.reg_mr(b.addr(), b.len(), access).unwrap()
    }
}

/// Bring both queue pairs to RTS aimed at each other.
pub(super) fn connect(a: &Side, b: &Side) {
    a.qp.to_init().unwrap();
    b.qp.to_init().unwrap();
    a.qp.to_rtr(&b.qp.local_endpoint()).unwrap();
    b.qp.to_rtr(&a.qp.local_endpoint()).unwrap();
    a.qp.to_rts().unwrap();
    b.qp.to_rts().unwrap();
}

pub(super) fn pair(retry: Duration, seg: usize) -> (SockFabric, Side, Side) {
    let f = fabric(retry, seg);
    let a = side(&f, CAPS);
    let b = side(&f, CAPS);
    connect(&a, &b);
    (f, a, b)
}

/// 8-byte aligned test memory.
pub(super) struct Buf(pub(super) Vec<u64>);

impl Buf {
    pub(super) fn new(bytes: usize, fill: u8) -> Buf {
        let mut b = Buf(vec![0u64; bytes.div_ceil(8).max(1)]);
        b.bytes_mut().fill(fill);
        b
    }
    pub(super) fn addr(&self) -> usize {
        self.0.as_ptr() as usize
    }
    pub(super) fn len(&self) -> usize {
        self.0.len() * 8
    }
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: a Vec<u64>'s storage viewed as bytes; the test reads it only when no
        // fabric copy into it can be running (after the completion that covers it).
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.len()) }
    }
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, mutable and exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, self.len()) }
    }
    /// Fill with a pattern that differs per position and per `seed`.
    pub(super) fn pattern(&mut self, seed: u64) {
        for (i, w) in self.0.iter_mut().enumerate() {
            *w = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
        }
    }
}

/// A send WR: `local` = (buffer, offset, length, lkey).
pub(super) fn wr(
    wr_id: u64,
    op: SendOp,
    local: (&Buf, usize, usize, u32),
    raddr: usize,
    rkey: u32,
) -> SendWr {
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
        inline: false,
    }
}

pub(super) fn statuses(cs: &[Completion]) -> Vec<(u64, WcStatus)> {
    cs.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// A peer that completes the TCP handshake (kernel backlog) and never says anything.
pub(super) fn silent_peer() -> (TcpListener, Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = SockEndpoint {
        ip: "127.0.0.1".parse().unwrap(),
        port: l.local_addr().unwrap().port(),
        qpn: 1,
        nonce: 2,
    };
    (l, ep.encode())
}

pub(super) fn lone_rts(f: &SockFabric, caps: QpCaps, remote: &[u8]) -> Side {
    let s = side(f, caps);
    s.qp.to_init().unwrap();
    s.qp.to_rtr(remote).unwrap();
    s.qp.to_rts().unwrap();
    s
}

/// Connect to `pd`'s listener as a raw peer and send a hello for `ep`.
pub(super) fn raw_stream_to(ep: &SockEndpoint, nonce: u64) -> TcpStream {
    let mut s = TcpStream::connect((ep.ip, ep.port)).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(
        &Hello {
            target_qpn: ep.qpn,
            source_qpn: 4242,
            target_nonce: nonce,
            lane: 0,
        }
        .encode(),
    )
    .unwrap();
    s
}

pub(super) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}
