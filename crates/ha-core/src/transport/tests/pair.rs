//! A connection in one process: a send and a receive comm over two `sock` rails on loopback
//! (127.0.0.1, 127.0.0.2), both on device 0, wrapped in [`CtlFabric`] so the test controls
//! port health and completions — one fabric for both sides, or ([`Pair::split`]) one per
//! side, so that each end of a link is cut and restored on its own; and [`Flow`], a stream of
//! verified messages over it.

use super::ctl_fabric::{Ctl, CtlFabric};
use crate::engine::Engine;
use crate::fabric::sock::{SockConfig, SockFabric, SockRail};
use crate::fabric::Fabric;
use crate::transport::connect::PendingConnect;
use crate::transport::ha::HaCfg;
use crate::transport::listen::ListenComm;
use crate::transport::mr::{MemKind, MrHandle};
use crate::transport::recv::{RecvArg, RecvComm};
use crate::transport::send::SendComm;
use ha_proto::data::ReqId;
use ha_proto::handle::{ConnectHandle, HANDLE_SIZE};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Knobs for tests: short timers, so faults show quickly.
pub fn cfg() -> HaCfg {
    HaCfg {
        max_poll: 16,
        keepalive: Duration::from_millis(200),
        enable_backup: true,
        standby_map: String::new(),
        rto: Duration::from_millis(300),
        silence: Duration::from_millis(25),
        heartbeat: Duration::from_millis(100),
        failback: true,
        rearm_hold: Duration::from_millis(200),
        handshake_timeout: Duration::from_secs(20),
        traffic_class: None,
        home: Default::default(),
        eager_bytes: 4096,
    }
}

/// The `sock` fabric of the pair: two loopback rails.
pub fn sock() -> Arc<dyn Fabric> {
    let rail = |ip: &str| SockRail {
        name: ip.into(),
        ip: ip.parse().unwrap(),
    };
    Arc::new(
        SockFabric::new(SockConfig {
            rails: vec![rail("127.0.0.1"), rail("127.0.0.2")],
            retry_timeout: Duration::from_millis(300),
            segment_bytes: 1 << 20,
            inline_bytes: 8 << 10,
            inline_gate: Some(crate::fabric::sock::InlineGate::process()),
            spin: Duration::from_micros(100),
            lanes: 4,
            delack_max: Some(std::time::Duration::from_millis(5)),
            limits: Default::default(),
        })
        .unwrap(),
    )
}

pub struct Pair {
    /// The control of the sender's fabric (and of the receiver's, unless split).
    pub ctl: Arc<Ctl>,
    /// The control of the receiver's fabric.
    pub ctl_r: Arc<Ctl>,
    pub send: SendComm,
    pub recv: RecvComm,
    /// Kept alive as long as the comms (NCCL's plugin state holds them).
    _engines: Vec<Arc<Engine>>,
}

impl Pair {
    pub fn new(cfg: HaCfg) -> Pair {
        Pair::over(CtlFabric::new(sock(), Arc::new(Ctl::default())), cfg)
    }

    /// A pair whose connections write their statistics to `stats_file`.
    pub fn with_stats(cfg: HaCfg, stats_file: &str) -> Pair {
        let fabric = CtlFabric::new(sock(), Arc::new(Ctl::default()));
        Pair::one_fabric(fabric, cfg, stats_file)
    }

    /// A pair over `fabric` (say, one limiting the message size).
    pub fn over(fabric: CtlFabric, cfg: HaCfg) -> Pair {
        Pair::one_fabric(fabric, cfg, "")
    }

    fn one_fabric(fabric: CtlFabric, cfg: HaCfg, stats_file: &str) -> Pair {
        let ctl = fabric.ctl.clone();
        let engine = Engine::new(Arc::new(fabric), Duration::from_micros(50));
        Pair::build(
            vec![engine],
            [ctl.clone(), ctl],
            [cfg.clone(), cfg],
            stats_file,
        )
    }

    /// Each side on its own fabric with its own control: each end of a link is cut and
    /// restored on its own ([`Ctl::cut`]); `stats_file` for both sides.
    pub fn split(cfg: HaCfg, stats_file: &str) -> Pair {
        Pair::split_with([cfg.clone(), cfg], stats_file)
    }

    /// [`Pair::split`] with knobs per side (the sender's, the receiver's): say, a drain list
    /// of one node only.
    pub fn split_with(cfgs: [HaCfg; 2], stats_file: &str) -> Pair {
        let (s, r) = (Arc::new(Ctl::default()), Arc::new(Ctl::default()));
        s.pair_with(&r);
        let engine = |ctl: &Arc<Ctl>| {
            let f = CtlFabric::new(sock(), ctl.clone());
            Engine::new(Arc::new(f), Duration::from_micros(50))
        };
        Pair::build(vec![engine(&s), engine(&r)], [s, r], cfgs, stats_file)
    }

    /// The connection over `engines` (the sender's first, the receiver's last) and their
    /// controls.
    fn build(
        engines: Vec<Arc<Engine>>,
        [ctl, ctl_r]: [Arc<Ctl>; 2],
        [cfg, cfg_r]: [HaCfg; 2],
        stats_file: &str,
    ) -> Pair {
        let (es, er) = (&engines[0], &engines[engines.len() - 1]);
        let mut handle = [0u8; HANDLE_SIZE];
        let ip = "127.0.0.1".parse().unwrap();
        let mut listen = ListenComm::new(er, 0, ip, &cfg_r, stats_file, &mut handle).unwrap();
        let h = ConnectHandle::decode(&handle).unwrap();
        let mut pending = PendingConnect::start(es, 0, &h, &cfg, stats_file).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut sent_ready, mut recv) = (false, None);
        while !sent_ready || recv.is_none() {
            assert!(Instant::now() < deadline, "connection setup timed out");
            if !sent_ready {
                sent_ready = pending.step().unwrap();
            }
            if recv.is_none() {
                recv = listen.accept().unwrap();
            }
        }
        let send = pending.finish();
        let recv = recv.unwrap();
        let paths = if cfg.enable_backup { 2 } else { 1 };
        assert_eq!(send.link.paths.len(), paths, "rails in use");
        Pair {
            ctl,
            ctl_r,
            send,
            recv,
            _engines: engines,
        }
    }

    /// Queue pair number of path `i` of the send (`true`) or receive side.
    pub fn qpn(&self, send: bool, i: usize) -> u32 {
        let link = if send {
            &self.send.link
        } else {
            &self.recv.link
        };
        link.path(i).qp.qp_num()
    }
}

/// Message `seq`'s bytes: `len` bytes of a pattern keyed by `seq`.
pub fn pattern(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq.wrapping_mul(131) as usize + i * 7 + (i >> 8)) as u8)
        .collect()
}

/// A stream of verified messages over a pair: `window` buffers each side, sizes from 1 byte
/// to `max` bytes.
pub struct Flow {
    min: usize,
    max: usize,
    send_bufs: Vec<Vec<u8>>,
    recv_bufs: Vec<Vec<u8>>,
    send_mrs: Vec<Arc<MrHandle>>,
    recv_mrs: Vec<Arc<MrHandle>>,
    next_send: u64,
    next_recv: u64,
    /// Messages delivered and verified.
    pub verified: u64,
    sends: VecDeque<(u64, ReqId)>,
    recvs: VecDeque<(u64, ReqId)>,
}

impl Drop for Flow {
    /// The tests drop a flow before its pair (declared after it): requests still in flight
    /// there may still place bytes into these buffers (their registrations live on in the
    /// comms), so a flow with requests in flight leaks its buffers rather than free memory the
    /// fabric may write (as NCCL never frees a buffer under a pending request). Freeing them
    /// corrupted the heap of the test binary now and then under load (SIGSEGV in free).
    fn drop(&mut self) {
        if !self.sends.is_empty() || !self.recvs.is_empty() {
            std::mem::forget(std::mem::take(&mut self.send_bufs));
            std::mem::forget(std::mem::take(&mut self.recv_bufs));
        }
    }
}

impl Flow {
    pub fn new(p: &Pair, window: usize, max: usize) -> Flow {
        Flow::with_send_kind(p, window, max, MemKind::Host)
    }

    /// A flow whose send buffers are registered as memory of `kind` (the bytes are host
    /// memory all the same: the sock fabric reads them as such).
    pub fn with_send_kind(p: &Pair, window: usize, max: usize, kind: MemKind) -> Flow {
        let send_bufs: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; max]).collect();
        let recv_bufs: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; max]).collect();
        let reg = |dev, b: &Vec<u8>| {
            Arc::new(MrHandle::register(dev, b.as_ptr() as usize, b.len()).unwrap())
        };
        let reg_send = |dev, b: &Vec<u8>| {
            Arc::new(MrHandle::register_kind(dev, b.as_ptr() as usize, b.len(), kind).unwrap())
        };
        Flow {
            min: 1,
            max,
            send_mrs: send_bufs
                .iter()
                .map(|b| reg_send(p.send.device_res(), b))
                .collect(),
            recv_mrs: recv_bufs
                .iter()
                .map(|b| reg(p.recv.device_res(), b))
                .collect(),
            send_bufs,
            recv_bufs,
            next_send: 0,
            next_recv: 0,
            verified: 0,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
        }
    }

    /// A flow whose messages are `min..=max` bytes (host memory).
    pub fn sized(p: &Pair, window: usize, min: usize, max: usize) -> Flow {
        let mut f = Flow::new(p, window, max);
        f.min = min.clamp(1, max);
        f
    }

    fn size(&self, seq: u64) -> usize {
        self.min + (seq.wrapping_mul(7919) as usize) % (self.max - self.min + 1)
    }

    /// One round: post what the windows allow, test what is outstanding. An error of either
    /// side is returned as text.
    pub fn step(&mut self, p: &mut Pair) -> Result<(), String> {
        let window = self.send_bufs.len() as u64;
        while self.next_recv < self.verified + window {
            let k = (self.next_recv % window) as usize;
            let arg = RecvArg {
                addr: self.recv_bufs[k].as_ptr() as usize,
                size: self.max,
                tag: 7,
                mr: &self.recv_mrs[k],
            };
            match p.recv.irecv(&[arg]).map_err(|e| format!("irecv: {e}"))? {
                Some(id) => {
                    self.recvs.push_back((self.next_recv, id));
                    self.next_recv += 1;
                }
                None => break,
            }
        }
        while self.sends.len() < window as usize && self.next_send < self.next_recv {
            let seq = self.next_send;
            let k = (seq % window) as usize;
            let n = self.size(seq);
            if self.sends.iter().all(|(s, _)| *s != seq) {
                let msg = pattern(seq, n);
                self.send_bufs[k][..n].copy_from_slice(&msg);
            }
            let addr = self.send_bufs[k].as_ptr() as usize;
            match p
                .send
                .isend(addr, n, 7, &self.send_mrs[k])
                .map_err(|e| format!("isend: {e}"))?
            {
                Some(id) => {
                    self.sends.push_back((seq, id));
                    self.next_send += 1;
                }
                None => break,
            }
        }
        while let Some(&(seq, id)) = self.sends.front() {
            match p.send.test(id).map_err(|e| format!("send test: {e}"))? {
                Some(n) if n as usize == self.size(seq) => {
                    self.sends.pop_front();
                }
                Some(n) => return Err(format!("send {seq} completed with {n} bytes")),
                None => break,
            }
        }
        while let Some(&(seq, id)) = self.recvs.front() {
            match p.recv.test(id).map_err(|e| format!("recv test: {e}"))? {
                Some(sizes) => {
                    let n = self.size(seq);
                    if sizes != [n as u64] {
                        return Err(format!("recv {seq}: sizes {sizes:?}, sent {n}"));
                    }
                    let k = (seq % window) as usize;
                    if self.recv_bufs[k][..n] != pattern(seq, n)[..] {
                        return Err(format!("recv {seq}: bytes differ"));
                    }
                    self.recvs.pop_front();
                    self.verified += 1;
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Run until `more` further messages are verified, or fail at `within`.
    pub fn run(&mut self, p: &mut Pair, more: u64, within: Duration) -> Result<(), String> {
        let target = self.verified + more;
        let deadline = Instant::now() + within;
        while self.verified < target {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of {more} messages within {within:?}",
                    more - (target - self.verified)
                ));
            }
            self.step(p)?;
        }
        Ok(())
    }
}
