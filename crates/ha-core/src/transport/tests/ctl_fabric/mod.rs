//! A fabric wrapper whose faults the test controls, around a real `sock` fabric: port health
//! per device (the port-event path never fires on `sock`, where ports are always healthy),
//! completions of chosen queue pairs held back (a stall, a fence that does not flush) and
//! released, completions injected, posts made to fail, a device message-size limit, and a
//! record of what each completion queue is asked to carry and of posts aimed at a peer queue
//! pair that is not connected yet.
//!
//! Links can be cut at either end ([`Ctl::cut`]): the end's port goes down (as its events
//! say) and the link of that device is dead while either end is cut — work posted on it
//! completes with `RETRY_EXC_ERR` (then flushes), connecting a queue pair on it fails. When
//! each side of a connection has its own `Ctl` ([`Ctl::pair_with`]), the two ends see their
//! own ports: the link comes back only when both are restored (skew). A link can also go
//! dark ([`Ctl::dark`]): ports up, queue pairs connect, nothing gets through (a dead switch
//! port between two healthy NICs).

use crate::fabric::WcStatus;
use crate::fabric::{
    Completion, CompletionQueue, DeviceInfo, Doorbell, Fabric, FabricError, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, Result,
};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

mod qp;
use qp::CtlQp;

/// What one wrapped queue pair is.
#[derive(Clone, Debug, Default)]
struct QpInfo {
    cq: usize,
    peer: Option<u32>,
    connected: bool,
}

/// What a completion queue was created with and is asked to carry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CqLoad {
    pub depth: u32,
    pub qps: u32,
    /// Completions its queue pairs can owe at once (send and receive queue sizes).
    pub owed: u64,
}

/// The test's handle on the faults.
#[derive(Default)]
pub struct Ctl {
    port_down: Mutex<HashSet<usize>>,
    hold: Mutex<HashSet<u32>>,
    /// Posts still to fail per queue pair.
    fail_post: Mutex<HashMap<u32, u32>>,
    max_msg: Mutex<Option<usize>>,
    qps: Mutex<HashMap<u32, QpInfo>>,
    cqs: Mutex<Vec<(Weak<CtlCq>, CqLoad)>>,
    /// Posts on a queue pair whose peer had not reached RTR yet.
    pub posts_to_unconnected: AtomicU64,
    /// Clear-to-sends posted, signaled and unsignaled.
    pub cts_signaled: AtomicU64,
    pub cts_unsignaled: AtomicU64,
    /// Clear-to-sends posted, by WRITE length in bytes.
    pub cts_lens: Mutex<HashMap<usize, u64>>,
    /// Polls of this fabric's completion queues by the thread [`Ctl::count_polls_here`] named.
    pub cq_polls: AtomicU64,
    polls_by: Mutex<Option<std::thread::ThreadId>>,
    /// Payload WRITE_WITH_IMMs (a message in one operation) posted, and how many of them were
    /// marked inline.
    pub fast_writes: AtomicU64,
    pub fast_inline: AtomicU64,
    /// Eager sends posted (payload into the receiver's ring, then its header), and how many
    /// of their payload writes were marked inline.
    pub eager_writes: AtomicU64,
    pub eager_inline: AtomicU64,
    /// Queue pairs say nothing of their link (`link_alive` is `None`, as on verbs).
    hide_link: AtomicBool,
    /// Devices whose link is cut at this end.
    cut: Mutex<HashSet<usize>>,
    /// Devices whose link is dark (seen from this end).
    dark: Mutex<HashSet<usize>>,
    /// The other end's control, when it has its own.
    far: Mutex<Option<Weak<Ctl>>>,
    /// Queue pairs that saw their dead link (every later post fails too, until fenced).
    broken: Mutex<HashSet<u32>>,
    /// Devices whose link acknowledges nothing since then (`link_silence`), as seen from
    /// this end; the queue pairs still carry what they are given.
    silent: Mutex<HashMap<usize, Instant>>,
}

impl Ctl {
    /// From now on queue pairs cannot tell whether their link answers (as on verbs), so a
    /// stall is judged by the soft timeout alone.
    pub fn hide_link_state(&self) {
        self.hide_link.store(true, Ordering::Relaxed);
    }

    /// From now on (`true`) device `dev`'s queue pairs report a link that acknowledges nothing
    /// (`link_silence` growing from now), or (`false`) one that answers again.
    pub fn silence(&self, dev: usize, on: bool) {
        if on {
            self.silent.lock().insert(dev, Instant::now());
        } else {
            self.silent.lock().remove(&dev);
        }
    }

    /// Device `dev`'s port goes down (or up again).
    pub fn set_port(&self, dev: usize, up: bool) {
        let mut d = self.port_down.lock();
        if up {
            d.remove(&dev);
        } else {
            d.insert(dev);
        }
    }

    /// The two ends of a connection, each with its own control: a link is dead while either
    /// end is cut.
    pub fn pair_with(self: &Arc<Ctl>, far: &Arc<Ctl>) {
        *self.far.lock() = Some(Arc::downgrade(far));
        *far.far.lock() = Some(Arc::downgrade(self));
    }

    /// Cut (or restore) this end of device `dev`'s link: its port goes down (up) too.
    pub fn cut(&self, dev: usize, cut: bool) {
        if cut {
            self.cut.lock().insert(dev);
        } else {
            self.cut.lock().remove(&dev);
        }
        self.set_port(dev, !cut);
    }

    /// Device `dev`'s link goes dark (or lights up again): nothing gets through, ports up.
    pub fn dark(&self, dev: usize, dark: bool) {
        if dark {
            self.dark.lock().insert(dev);
        } else {
            self.dark.lock().remove(&dev);
        }
    }

    /// Whether device `dev`'s link is cut at either end.
    fn cut_at_an_end(&self, dev: usize) -> bool {
        self.cut.lock().contains(&dev) || self.far().is_some_and(|f| f.cut.lock().contains(&dev))
    }

    /// Whether device `dev`'s link carries nothing (cut at either end, or dark).
    pub fn link_dead(&self, dev: usize) -> bool {
        self.cut_at_an_end(dev)
            || self.dark.lock().contains(&dev)
            || self.far().is_some_and(|f| f.dark.lock().contains(&dev))
    }

    fn far(&self) -> Option<Arc<Ctl>> {
        self.far.lock().as_ref().and_then(Weak::upgrade)
    }

    /// Hold back every completion of queue pair `qpn` from now on.
    pub fn hold(&self, qpn: u32) {
        self.hold.lock().insert(qpn);
    }

    /// Stop holding `qpn`'s completions and hand back the held ones, in order.
    pub fn release(&self, qpn: u32) {
        self.release_as(qpn, |c| c);
    }

    /// Stop holding `qpn`'s completions and hand the held ones back through `f`, in order.
    fn release_as(&self, qpn: u32, mut f: impl FnMut(Completion) -> Completion) {
        self.hold.lock().remove(&qpn);
        for (cq, _) in self.cqs.lock().iter() {
            if let Some(cq) = cq.upgrade() {
                let go = cq.take_held(qpn);
                cq.injected.lock().extend(go.into_iter().map(&mut f));
            }
        }
    }

    /// Completions of `qpn` held back so far.
    pub fn held(&self, qpn: u32) -> usize {
        self.cqs
            .lock()
            .iter()
            .filter_map(|(cq, _)| cq.upgrade())
            .map(|cq| cq.held.lock().iter().filter(|c| c.qp_num == qpn).count())
            .sum()
    }

    /// Stop holding `qpn`'s completions and hand the held ones back as failures: the first
    /// `status`, the rest flushed (what the device would say had its retries run out).
    pub fn release_failed(&self, qpn: u32, status: WcStatus) {
        let mut first = true;
        self.release_as(qpn, |mut c| {
            c.status = if std::mem::take(&mut first) {
                status
            } else {
                WcStatus::WrFlushErr
            };
            c
        });
    }

    /// Hand `c` to its queue pair's completion queue as if the device had written it.
    pub fn inject(&self, c: Completion) {
        let cq = self.qps.lock().get(&c.qp_num).map(|q| q.cq);
        let cq = cq.and_then(|k| self.cqs.lock().get(k).and_then(|(w, _)| w.upgrade()));
        cq.expect("injected completion of an unknown queue pair")
            .injected
            .lock()
            .push_back(c);
    }

    /// The next `n` posts on `qpn` fail.
    pub fn fail_posts(&self, qpn: u32, n: u32) {
        self.fail_post.lock().insert(qpn, n);
    }

    /// Every device refuses (at post) work requests longer than `bytes`, as a verbs device
    /// above its `max_msg_sz` does.
    pub fn set_max_msg(&self, bytes: usize) {
        *self.max_msg.lock() = Some(bytes);
    }

    /// The peer queue pair `qpn` was connected to (RTR), if any.
    pub fn peer_of(&self, qpn: u32) -> Option<u32> {
        self.qps.lock().get(&qpn).and_then(|q| q.peer)
    }

    /// What each completion queue carries.
    /// Count the completion-queue polls the calling thread makes from now on (not the
    /// progress thread's) in [`Ctl::cq_polls`].
    pub fn count_polls_here(&self) {
        *self.polls_by.lock() = Some(std::thread::current().id());
    }

    pub fn cq_loads(&self) -> Vec<CqLoad> {
        self.cqs.lock().iter().map(|(_, l)| l.clone()).collect()
    }
}

/// The wrapped fabric.
pub struct CtlFabric {
    inner: Arc<dyn Fabric>,
    devices: Vec<DeviceInfo>,
    pub ctl: Arc<Ctl>,
}

impl CtlFabric {
    pub fn new(inner: Arc<dyn Fabric>, ctl: Arc<Ctl>) -> CtlFabric {
        CtlFabric {
            devices: inner.devices().to_vec(),
            inner,
            ctl,
        }
    }

    /// Report `bytes` as every device's largest message.
    pub fn with_max_msg(mut self, bytes: u64) -> CtlFabric {
        for d in &mut self.devices {
            d.max_msg_bytes = bytes;
        }
        self.ctl.set_max_msg(bytes as usize);
        self
    }
}

impl Fabric for CtlFabric {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }
    fn port_healthy(&self, dev: usize) -> bool {
        !self.ctl.port_down.lock().contains(&dev)
    }
    fn rail_affine(&self) -> bool {
        self.inner.rail_affine()
    }
    fn open_pd(&self, dev: usize) -> Result<Arc<dyn ProtectionDomain>> {
        Ok(Arc::new(CtlPd {
            inner: self.inner.open_pd(dev)?,
            ctl: self.ctl.clone(),
            cqs: Mutex::new(Vec::new()),
        }))
    }
}

/// A wrapper queue (by address), its index in `Ctl::cqs`, and the queue it wraps.
type CqEntry = (usize, usize, Arc<dyn CompletionQueue>);

struct CtlPd {
    inner: Arc<dyn ProtectionDomain>,
    ctl: Arc<Ctl>,
    cqs: Mutex<Vec<CqEntry>>,
}

impl ProtectionDomain for CtlPd {
    fn id(&self) -> u64 {
        self.inner.id()
    }
    fn copy_into(
        &self,
        lkey: u32,
        addr: usize,
        src: &ha_proto::data::layout::SharedWords,
        from: usize,
        len: usize,
    ) -> Result<()> {
        self.inner.copy_into(lkey, addr, src, from, len)
    }
    fn device(&self) -> usize {
        self.inner.device()
    }
    fn reg_mr(
        &self,
        addr: usize,
        len: usize,
        access: crate::fabric::Access,
    ) -> Result<Box<dyn MemoryRegion>> {
        self.inner.reg_mr(addr, len, access)
    }
    fn create_cq(&self, depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>> {
        let inner = self.inner.create_cq(depth, doorbell)?;
        let cq = Arc::new(CtlCq {
            inner: inner.clone(),
            ctl: self.ctl.clone(),
            held: Mutex::new(VecDeque::new()),
            injected: Mutex::new(VecDeque::new()),
        });
        let key = {
            let mut all = self.ctl.cqs.lock();
            all.push((
                Arc::downgrade(&cq),
                CqLoad {
                    depth,
                    ..CqLoad::default()
                },
            ));
            all.len() - 1
        };
        self.cqs
            .lock()
            .push((Arc::as_ptr(&cq) as *const () as usize, key, inner));
        Ok(cq)
    }
    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>> {
        let addr = Arc::as_ptr(cq) as *const () as usize;
        let (key, inner_cq) = self
            .cqs
            .lock()
            .iter()
            .find(|(a, _, _)| *a == addr)
            .map(|(_, k, c)| (*k, c.clone()))
            .ok_or_else(|| FabricError::InvalidArgument("foreign completion queue".into()))?;
        let inner = self.inner.create_qp(&inner_cq, caps)?;
        let qpn = inner.qp_num();
        self.ctl.qps.lock().insert(
            qpn,
            QpInfo {
                cq: key,
                ..QpInfo::default()
            },
        );
        let load = &mut self.ctl.cqs.lock()[key].1;
        load.qps += 1;
        load.owed += u64::from(caps.max_send_wr) + u64::from(caps.max_recv_wr);
        Ok(Box::new(CtlQp {
            inner,
            ctl: self.ctl.clone(),
            qpn,
            dev: self.inner.device(),
        }))
    }
}

struct CtlCq {
    inner: Arc<dyn CompletionQueue>,
    ctl: Arc<Ctl>,
    held: Mutex<VecDeque<Completion>>,
    injected: Mutex<VecDeque<Completion>>,
}

impl CtlCq {
    /// The held completions of `qpn`, in order, taken out of the held ones.
    fn take_held(&self, qpn: u32) -> VecDeque<Completion> {
        let mut held = self.held.lock();
        let (go, keep): (VecDeque<_>, VecDeque<_>) = held.drain(..).partition(|c| c.qp_num == qpn);
        *held = keep;
        go
    }
}

impl CompletionQueue for CtlCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        if *self.ctl.polls_by.lock() == Some(std::thread::current().id()) {
            self.ctl.cq_polls.fetch_add(1, Ordering::Relaxed);
        }
        let start = out.len();
        {
            let mut inj = self.injected.lock();
            while out.len() - start < max {
                match inj.pop_front() {
                    Some(c) => out.push(c),
                    None => break,
                }
            }
        }
        let mut got = Vec::new();
        self.inner.poll(&mut got, max - (out.len() - start))?;
        let hold = self.ctl.hold.lock();
        for c in got {
            if hold.contains(&c.qp_num) {
                self.held.lock().push_back(c);
            } else {
                out.push(c);
            }
        }
        Ok(out.len() - start)
    }
}
