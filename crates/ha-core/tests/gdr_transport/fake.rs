//! A fake GPUDirect fabric: the `sock` fabric on two loopback rails (devices 0 and 1) behind
//! wrappers that (a) advertise `NCCL_PTR_CUDA | NCCL_PTR_DMABUF`, (b) accept dma-buf
//! registrations — checking the fd is open during the call and holding their own duplicate
//! of it while registered, as the kernel's MR holds a reference on the dma-buf — and register
//! the host memory standing in for GPU memory underneath, (c) log every registration,
//! deregistration and posted work request with its device, and (d) fail a device on demand:
//! `Stalled` swallows everything posted (a black-holed link), `Down` moves its queue pairs to
//! ERR and flushes what they held (a dead port).

use ha_core::fabric::sock::{SockConfig, SockFabric, SockRail};
use ha_core::fabric::{
    Access, Completion, CompletionQueue, DeviceInfo, Doorbell, Fabric, FabricError, MemoryRegion,
    MrKeys, ProtectionDomain, QpCaps, QpState, QueuePair, Result, SendOp, SendWr, WcOpcode,
    WcStatus, PTR_CUDA, PTR_DMABUF, PTR_HOST,
};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What the fake saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    RegMr {
        dev: usize,
        addr: usize,
        len: usize,
    },
    RegDmabuf {
        dev: usize,
        iova: usize,
        len: usize,
        offset: u64,
        fd: RawFd,
        /// `/proc/self/fd` target of `fd` during the call (`None`: it was not open).
        target: Option<String>,
        rkey: u32,
    },
    Dereg {
        dev: usize,
        addr: usize,
        len: usize,
    },
    Post {
        dev: usize,
        qpn: u32,
        op: SendOp,
        remote_addr: u64,
        rkey: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Up = 0,
    Stalled = 1,
    Down = 2,
}

pub struct Shared {
    modes: [AtomicU8; 2],
    pub log: Mutex<Vec<Call>>,
    qps: Mutex<Vec<Weak<QpCore>>>,
    /// Refuse dma-buf registrations on this device (rollback tests); 255 = none.
    pub refuse_dmabuf_on: AtomicU8,
    /// Refuse new queue pairs on this device; 255 = none.
    pub refuse_qps_on: AtomicU8,
    /// Refuse posting RDMA READs.
    pub refuse_reads: AtomicBool,
}

impl Shared {
    pub fn mode(&self, dev: usize) -> Mode {
        match self.modes[dev].load(Ordering::SeqCst) {
            0 => Mode::Up,
            1 => Mode::Stalled,
            _ => Mode::Down,
        }
    }

    /// Change device `dev`'s mode; `Down` fails every queue pair on it now.
    pub fn set_mode(&self, dev: usize, m: Mode) {
        self.modes[dev].store(m as u8, Ordering::SeqCst);
        if m == Mode::Down {
            let qps: Vec<Arc<QpCore>> = self.qps.lock().iter().filter_map(Weak::upgrade).collect();
            for q in qps.into_iter().filter(|q| q.dev == dev) {
                q.fail();
            }
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().clone()
    }

    fn record(&self, c: Call) {
        self.log.lock().push(c);
    }
}

pub struct FakeGpuFabric {
    inner: SockFabric,
    devices: Vec<DeviceInfo>,
    pub shared: Arc<Shared>,
}

impl FakeGpuFabric {
    pub fn new() -> Arc<FakeGpuFabric> {
        let rail = |n: &str, ip: &str| SockRail {
            name: n.into(),
            ip: ip.parse().unwrap(),
        };
        let inner = SockFabric::new(SockConfig {
            rails: vec![rail("lo", "127.0.0.1"), rail("lo2", "127.0.0.2")],
            retry_timeout: Duration::from_secs(5),
            segment_bytes: 1 << 20,
            inline_bytes: 4 << 10,
            inline_gate: None,
            spin: Duration::ZERO,
            lanes: 4,
            delack_max: Some(std::time::Duration::from_millis(5)),
            limits: Default::default(),
        })
        .unwrap();
        let devices = inner
            .devices()
            .iter()
            .map(|d| DeviceInfo {
                name: format!("fakegpu:{}", d.name),
                ptr_support: PTR_HOST | PTR_CUDA | PTR_DMABUF,
                ..d.clone()
            })
            .collect();
        Arc::new(FakeGpuFabric {
            inner,
            devices,
            shared: Arc::new(Shared {
                modes: [AtomicU8::new(0), AtomicU8::new(0)],
                log: Mutex::new(Vec::new()),
                qps: Mutex::new(Vec::new()),
                refuse_dmabuf_on: AtomicU8::new(255),
                refuse_qps_on: AtomicU8::new(255),
                refuse_reads: AtomicBool::new(false),
            }),
        })
    }
}

impl Fabric for FakeGpuFabric {
    fn kind(&self) -> &'static str {
        "fakegpu"
    }
    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }
    fn port_healthy(&self, dev: usize) -> bool {
        self.shared.mode(dev) != Mode::Down
    }
    fn rail_affine(&self) -> bool {
        self.inner.rail_affine()
    }
    fn open_pd(&self, dev: usize) -> Result<Arc<dyn ProtectionDomain>> {
        Ok(Arc::new(FakePd {
            inner: self.inner.open_pd(dev)?,
            dev,
            shared: self.shared.clone(),
            cqs: Mutex::new(Vec::new()),
        }))
    }
}

struct FakePd {
    inner: Arc<dyn ProtectionDomain>,
    dev: usize,
    shared: Arc<Shared>,
    cqs: Mutex<Vec<(usize, Weak<FakeCq>)>>,
}

struct FakeMr {
    inner: Box<dyn MemoryRegion>,
    dev: usize,
    shared: Arc<Shared>,
    /// The fake kernel's reference on the dma-buf (a duplicate of the caller's fd).
    _dmabuf_ref: Option<OwnedFd>,
}

impl MemoryRegion for FakeMr {
    fn keys(&self) -> MrKeys {
        self.inner.keys()
    }
    fn addr(&self) -> usize {
        self.inner.addr()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        self.shared.record(Call::Dereg {
            dev: self.dev,
            addr: self.inner.addr(),
            len: self.inner.len(),
        });
    }
}

/// `/proc/self/fd` target of `fd`, `None` if it is not open.
pub fn fd_target(fd: RawFd) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

impl ProtectionDomain for FakePd {
    fn id(&self) -> u64 {
        self.inner.id()
    }
    fn device(&self) -> usize {
        self.dev
    }
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Box<dyn MemoryRegion>> {
        let inner = self.inner.reg_mr(addr, len, access)?;
        self.shared.record(Call::RegMr {
            dev: self.dev,
            addr,
            len,
        });
        Ok(Box::new(FakeMr {
            inner,
            dev: self.dev,
            shared: self.shared.clone(),
            _dmabuf_ref: None,
        }))
    }
    fn reg_dmabuf_mr(
        &self,
        iova: usize,
        len: usize,
        offset: u64,
        fd: RawFd,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>> {
        let target = fd_target(fd);
        if self.shared.refuse_dmabuf_on.load(Ordering::SeqCst) as usize == self.dev {
            return Err(FabricError::System(format!(
                "fake: dma-buf refused on device {}",
                self.dev
            )));
        }
        if target.is_none() {
            return Err(FabricError::io(
                "fake ibv_reg_dmabuf_mr",
                std::io::Error::from_raw_os_error(libc::EBADF),
            ));
        }
        // SAFETY: `fd` is open (checked above); the duplicate is a new descriptor we own.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        assert!(dup >= 0, "dup of an open fd");
        // SAFETY: just created, owned by nothing else.
        let dmabuf_ref = unsafe { OwnedFd::from_raw_fd(dup) };
        let inner = self.inner.reg_mr(iova, len, access)?;
        self.shared.record(Call::RegDmabuf {
            dev: self.dev,
            iova,
            len,
            offset,
            fd,
            target,
            rkey: inner.keys().rkey,
        });
        Ok(Box::new(FakeMr {
            inner,
            dev: self.dev,
            shared: self.shared.clone(),
            _dmabuf_ref: Some(dmabuf_ref),
        }))
    }
    fn create_cq(&self, depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>> {
        let cq = Arc::new(FakeCq {
            inner: self.inner.create_cq(depth, doorbell.clone())?,
            soft: Mutex::new(VecDeque::new()),
            bell: doorbell,
        });
        self.cqs
            .lock()
            .push((Arc::as_ptr(&cq) as *const () as usize, Arc::downgrade(&cq)));
        Ok(cq)
    }
    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>> {
        if self.shared.refuse_qps_on.load(Ordering::SeqCst) as usize == self.dev {
            return Err(FabricError::System(format!(
                "fake: no queue pair on device {}",
                self.dev
            )));
        }
        let addr = Arc::as_ptr(cq) as *const () as usize;
        let cq = self
            .cqs
            .lock()
            .iter()
            .find(|(a, _)| *a == addr)
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| FabricError::InvalidArgument("fake: foreign CQ".into()))?;
        let inner = self.inner.create_qp(&cq.inner, caps)?;
        let core = Arc::new(QpCore {
            qpn: inner.qp_num(),
            inner,
            dev: self.dev,
            cq,
            held: Mutex::new(Vec::new()),
            shared: self.shared.clone(),
        });
        self.shared.qps.lock().push(Arc::downgrade(&core));
        Ok(Box::new(FakeQp(core)))
    }
}

pub struct FakeCq {
    inner: Arc<dyn CompletionQueue>,
    soft: Mutex<VecDeque<Completion>>,
    bell: Arc<Doorbell>,
}

impl CompletionQueue for FakeCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut n = self.inner.poll(out, max)?;
        let mut soft = self.soft.lock();
        while n < max {
            match soft.pop_front() {
                Some(c) => {
                    out.push(c);
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
}

pub struct QpCore {
    inner: Box<dyn QueuePair>,
    qpn: u32,
    dev: usize,
    cq: Arc<FakeCq>,
    /// Work requests a stalled device swallowed (signaled ones complete as flushed later).
    held: Mutex<Vec<SendWr>>,
    shared: Arc<Shared>,
}

impl QpCore {
    /// ERR: the queue pair's own outstanding work is flushed by the fabric; what the fake
    /// held is flushed here.
    fn fail(&self) {
        let _ = self.inner.to_err();
        let held: Vec<SendWr> = std::mem::take(&mut *self.held.lock());
        self.cq.soft.lock().extend(held.iter().map(|w| Completion {
            wr_id: w.wr_id,
            qp_num: self.qpn,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Unknown,
            byte_len: 0,
            imm: None,
        }));
        self.cq.bell.ring();
    }
}

struct FakeQp(Arc<QpCore>);

impl QueuePair for FakeQp {
    fn qp_num(&self) -> u32 {
        self.0.qpn
    }
    fn state(&self) -> QpState {
        self.0.inner.state()
    }
    fn local_endpoint(&self) -> Vec<u8> {
        self.0.inner.local_endpoint()
    }
    fn to_init(&self) -> Result<()> {
        self.0.inner.to_init()
    }
    fn to_rtr(&self, remote: &[u8]) -> Result<()> {
        self.0.inner.to_rtr(remote)
    }
    fn to_rts(&self) -> Result<()> {
        self.0.inner.to_rts()
    }
    fn to_err(&self) -> Result<()> {
        self.0.fail();
        Ok(())
    }
    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        let q = &self.0;
        {
            let mut log = q.shared.log.lock();
            for w in wrs {
                log.push(Call::Post {
                    dev: q.dev,
                    qpn: q.qpn,
                    op: w.op,
                    remote_addr: w.remote_addr,
                    rkey: w.rkey,
                });
            }
        }
        if q.shared.refuse_reads.load(Ordering::SeqCst) && wrs.iter().any(|w| w.op == SendOp::Read)
        {
            return Err(FabricError::QueueFull("fake: reads refused"));
        }
        match q.shared.mode(q.dev) {
            Mode::Up => q.inner.post_send(wrs),
            Mode::Stalled => {
                q.held.lock().extend_from_slice(wrs);
                Ok(())
            }
            Mode::Down => {
                // In ERR the fabric completes them as flushed.
                let _ = q.inner.to_err();
                q.inner.post_send(wrs)
            }
        }
    }
    fn post_recv(&self, wr_id: u64) -> Result<()> {
        self.0.inner.post_recv(wr_id)
    }
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        let _ = self.0.inner.to_err();
    }
}

/// Descriptors of this process open on the memfd named `name` (tests run in parallel in one
/// process: each uses its own name).
pub fn fds_on(name: &str) -> usize {
    let want = format!("/memfd:{name} ");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with(&want))
        .count()
}

/// A memfd named `name` standing in for a dma-buf exported from GPU memory.
pub fn fake_dmabuf_named(name: &str, len: usize) -> OwnedFd {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: memfd_create with a valid name; the descriptor is owned by the OwnedFd.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nothing else.
    let f = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on the descriptor we own.
    assert_eq!(unsafe { libc::ftruncate(f.as_raw_fd(), len as i64) }, 0);
    f
}

/// A memfd standing in for a dma-buf.
pub fn fake_dmabuf(len: usize) -> OwnedFd {
    fake_dmabuf_named("fake-dmabuf", len)
}
