//! The rig of the verbs tests: which rxe devices the guest offers (the environment the
//! Soft-RoCE scripts set), skipping when there are none, link repair, and the connected pair
//! of queue pairs ("sides") most tests use.
#![allow(dead_code)]

use ha_core::fabric::verbs::{self, VerbsConfig, VerbsFabric};
use ha_core::fabric::{
    Access, Completion, CompletionQueue, Doorbell, Fabric, MemoryRegion, ProtectionDomain, QpCaps,
    QpState, QueuePair, SendOp, SendWr, Sge,
};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- rig and skipping

/// One rail end: `SOFTROCE_A0="rxe0a 1 10.10.0.1 p0a"`.
#[derive(Clone, Debug)]
pub struct End {
    pub dev: String,
    pub gid: u32,
    pub ip: std::net::Ipv4Addr,
}

pub struct Rig {
    pub a: (End, End),
    pub b: (End, End),
    pub link: String,
    pub _serial: MutexGuard<'static, ()>,
}

static SERIAL: Mutex<()> = Mutex::new(());

pub fn end(var: &str) -> Option<End> {
    let v = std::env::var(var).ok()?;
    let f: Vec<&str> = v.split_whitespace().collect();
    Some(End {
        dev: f.first()?.to_string(),
        gid: f.get(1)?.parse().ok()?,
        ip: f.get(2)?.parse().ok()?,
    })
}

/// The rig, or `None` after printing why the test is skipped.
pub fn rig(test: &str) -> Option<Rig> {
    let has_devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.count() > 0)
        .unwrap_or(false);
    if !has_devices {
        println!("{test}: skipped: no RDMA device (run scripts/softroce/test-verbs.sh)");
        return None;
    }
    let ends = (
        end("SOFTROCE_A0"),
        end("SOFTROCE_A1"),
        end("SOFTROCE_B0"),
        end("SOFTROCE_B1"),
        std::env::var("SOFTROCE_LINK").ok(),
    );
    let (Some(a0), Some(a1), Some(b0), Some(b1), Some(link)) = ends else {
        println!("{test}: skipped: RDMA devices but no Soft-RoCE rig (SOFTROCE_* unset)");
        return None;
    };
    Some(Rig {
        a: (a0, a1),
        b: (b0, b1),
        link,
        _serial: SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
    })
}

macro_rules! rig_or_skip {
    ($name:expr) => {
        match rig($name) {
            Some(r) => r,
            None => return,
        }
    };
}

impl Rig {
    /// Run the link-control script; panics if it fails.
    pub fn link(&self, args: &[&str]) {
        let t = Instant::now();
        let st = Command::new(&self.link)
            .args(args)
            .status()
            .expect("run link.sh");
        assert!(st.success(), "link.sh {args:?}: {st}");
        println!("link.sh {args:?} took {:?}", t.elapsed());
    }

    /// Repairs `rail` when dropped.
    pub fn repair_on_drop(&self, rail: &'static str) -> Repair<'_> {
        Repair { rig: self, rail }
    }
}

pub struct Repair<'a> {
    pub rig: &'a Rig,
    pub rail: &'static str,
}

impl Drop for Repair<'_> {
    fn drop(&mut self) {
        let st = Command::new(&self.rig.link)
            .args([self.rail, "up"])
            .status();
        if !matches!(st, Ok(s) if s.success()) {
            eprintln!("could not repair rail {}: {st:?}", self.rail);
        }
    }
}

// ---------------------------------------------------------------- fabric helpers

pub fn cfg(timeout: u8, retry: u8) -> VerbsConfig {
    VerbsConfig {
        qp_timeout: timeout,
        qp_retry_cnt: retry,
        ib_hca: Some(String::new()),
        gid_index: Some(-1),
        traffic_class: Some(-1),
        service_level: Some(-1),
        gdr: verbs::gdr::GdrMode::Auto,
    }
}

/// Generous for a loaded 2-core TCG guest, finite so a real failure cannot hang: 16 × 1.07 s.
pub fn data_cfg() -> VerbsConfig {
    cfg(18, 6)
}

pub fn open(c: &VerbsConfig) -> Arc<VerbsFabric> {
    verbs::open_verbs(c).expect("open the verbs fabric")
}

pub fn dev_index(f: &VerbsFabric, name: &str) -> usize {
    let want = format!("{name}:1");
    f.devices()
        .iter()
        .position(|d| d.name == want)
        .unwrap_or_else(|| panic!("no device {want} in {:?}", names(f)))
}

pub fn names(f: &VerbsFabric) -> Vec<String> {
    f.devices().iter().map(|d| d.name.clone()).collect()
}

pub const CAPS: QpCaps = QpCaps {
    max_send_wr: 256,
    max_recv_wr: 256,
    traffic_class: None,
};

/// One side of a connection: its PD, CQ (with doorbell) and QP.
pub struct Side {
    pub qp: Box<dyn QueuePair>,
    pub cq: Arc<dyn CompletionQueue>,
    pub bell: Arc<Doorbell>,
    pub pd: Arc<dyn ProtectionDomain>,
}

impl Side {
    pub fn new(f: &VerbsFabric, dev: usize) -> Side {
        let pd = f.open_pd(dev).expect("open_pd");
        let bell = Arc::new(Doorbell::new());
        let cq = pd.create_cq(1024, bell.clone()).expect("create_cq");
        let qp = pd.create_qp(&cq, CAPS).expect("create_qp");
        assert_eq!(qp.state(), QpState::Reset);
        Side { qp, cq, bell, pd }
    }

    pub fn reg(&self, buf: &mut [u8], access: Access) -> Box<dyn MemoryRegion> {
        self.pd
            .reg_mr(buf.as_mut_ptr() as usize, buf.len(), access)
            .expect("reg_mr")
    }

    /// Wait (on the CQ's doorbell) until `n` completions arrived; panics after `timeout`.
    pub fn wait(&self, n: usize, timeout: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            self.cq.poll(&mut got, 64).expect("poll");
            if got.len() >= n {
                return got;
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "waited {timeout:?} for {n} completions, got {}: {got:?}",
                got.len()
            );
            self.bell
                .wait((deadline - now).min(Duration::from_millis(200)));
        }
    }

    /// Collect whatever arrives within `window` (to prove that nothing more does).
    pub fn drain_for(&self, window: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + window;
        let mut got = Vec::new();
        loop {
            self.cq.poll(&mut got, 64).expect("poll");
            let now = Instant::now();
            if now >= deadline {
                return got;
            }
            self.bell.wait(deadline - now);
        }
    }
}

/// Two connected sides on devices `a` and `b`, both RTS.
pub fn connect(f: &VerbsFabric, a: usize, b: usize) -> (Side, Side) {
    let (x, y) = (Side::new(f, a), Side::new(f, b));
    x.qp.to_init().unwrap();
    y.qp.to_init().unwrap();
    let (ex, ey) = (x.qp.local_endpoint(), y.qp.local_endpoint());
    assert!(ex.len() <= 64);
    x.qp.to_rtr(&ey).unwrap();
    y.qp.to_rtr(&ex).unwrap();
    x.qp.to_rts().unwrap();
    y.qp.to_rts().unwrap();
    assert_eq!((x.qp.state(), y.qp.state()), (QpState::Rts, QpState::Rts));
    (x, y)
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

pub fn write(
    wr_id: u64,
    op: SendOp,
    src: &[u8],
    mr: &dyn MemoryRegion,
    dst: u64,
    rkey: u32,
) -> SendWr {
    SendWr {
        wr_id,
        op,
        local: Sge {
            addr: src.as_ptr() as usize,
            len: src.len(),
            lkey: mr.keys().lkey,
        },
        remote_addr: dst,
        rkey,
        signaled: true,
        inline: false,
    }
}

pub const SHORT: Duration = Duration::from_secs(60);
