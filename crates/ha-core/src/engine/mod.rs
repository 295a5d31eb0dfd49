//! Engine: the background progress thread, per-connection completion inboxes, and the
//! per-device resources (PD, shared CQs, MR cache) that connections lease. Threads and device
//! resources exist only while some connection (or registration) holds a lease.
//!
//! A device's completion queues are sized from what is posted on them: each queue pair
//! reserves the completions it can owe at once (`transport::path::CQES_PER_QP`: a flush
//! completes every posted work request), and a device opens another queue when none of its
//! queues has room left, so a mass flush never overflows one.

pub mod inbox;
pub mod mr_cache;
pub mod progress;
pub mod router;

use crate::fabric::{CompletionQueue, Fabric, FabricError, ProtectionDomain};
use inbox::Inbox;
use mr_cache::MrCache;
use parking_lot::Mutex;
use progress::ProgressThread;
use router::Router;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Depth of each completion queue (entries); a device gets as many as its queue pairs need.
pub const CQ_DEPTH: u32 = 8192;

/// One completion queue of a device and the completions reserved on it.
struct CqSlot {
    cq: Arc<dyn CompletionQueue>,
    id: u64,
    reserved: u32,
}

/// Entries of each completion queue the engine opens on a device whose queues hold at most
/// `max_cqe` entries (`None`: no limit known): [`CQ_DEPTH`], or the device's limit when that is
/// smaller. Queue pairs reserve what they can owe on one of them ([`DeviceRes::reserve_cq`]);
/// the connection budget (`transport::budget`) reads how many fit in one queue from this.
pub fn cq_capacity(max_cqe: Option<u32>) -> u32 {
    match max_cqe {
        Some(m) => CQ_DEPTH.min(m.max(1)),
        None => CQ_DEPTH,
    }
}

/// Resources of one device shared by every connection on it.
pub struct DeviceRes {
    pub dev: usize,
    pub pd: Arc<dyn ProtectionDomain>,
    pub mrs: MrCache,
    /// Entries of each completion queue of this device ([`cq_capacity`]).
    cq_size: u32,
    cqs: Mutex<Vec<CqSlot>>,
    router: Arc<Router>,
}

impl Drop for DeviceRes {
    fn drop(&mut self) {
        for s in self.cqs.get_mut().iter() {
            self.router.remove_cq(s.id);
        }
    }
}

/// Room for some completions on one of a device's completion queues, held by a queue pair
/// for its lifetime (released on drop).
pub struct CqShare {
    pub cq: Arc<dyn CompletionQueue>,
    pub id: u64,
    cqes: u32,
    dev: Arc<DeviceRes>,
}

impl Drop for CqShare {
    fn drop(&mut self) {
        if let Some(s) = self.dev.cqs.lock().iter_mut().find(|s| s.id == self.id) {
            s.reserved -= self.cqes;
        }
    }
}

impl DeviceRes {
    fn new_cq(&self) -> Result<CqSlot, FabricError> {
        let cq = self
            .pd
            .create_cq(self.cq_size, self.router.doorbell.clone())?;
        let id = self.router.add_cq(cq.clone());
        Ok(CqSlot {
            cq,
            id,
            reserved: 0,
        })
    }

    /// Reserve room for `cqes` completions (what one queue pair can owe at once) on a
    /// completion queue of this device with room left, opening a new queue if none has.
    pub fn reserve_cq(self: &Arc<Self>, cqes: u32) -> Result<CqShare, FabricError> {
        let size = self.cq_size;
        if cqes > size {
            return Err(FabricError::InvalidArgument(format!(
                "a queue pair owing {cqes} completions does not fit this device's completion queues of {size} entries (max_cqe)"
            )));
        }
        let mut cqs = self.cqs.lock();
        let i = match cqs.iter().position(|s| s.reserved + cqes <= size) {
            Some(i) => i,
            None => {
                cqs.push(self.new_cq()?);
                cqs.len() - 1
            }
        };
        cqs[i].reserved += cqes;
        Ok(CqShare {
            cq: cqs[i].cq.clone(),
            id: cqs[i].id,
            cqes,
            dev: self.clone(),
        })
    }

    /// Completion queues this device has open.
    pub fn cq_count(&self) -> usize {
        self.cqs.lock().len()
    }
}

struct State {
    devices: Vec<Weak<DeviceRes>>,
    progress: Option<ProgressThread>,
    leases: usize,
}

pub struct Engine {
    fabric: Arc<dyn Fabric>,
    router: Arc<Router>,
    spin: Duration,
    state: Mutex<State>,
}

/// A connection's hold on the engine: keeps the progress thread and its device alive.
pub struct Lease {
    engine: Arc<Engine>,
    pub dev: Arc<DeviceRes>,
}

/// Routes one queue pair's completions into an inbox while it lives.
pub struct Route {
    router: Arc<Router>,
    cq_id: u64,
    qpn: u32,
    pub inbox: Arc<Inbox>,
}

impl Route {
    /// Which router feeds this route's inbox (routes of one engine share it).
    pub fn router_id(&self) -> usize {
        Arc::as_ptr(&self.router) as usize
    }

    /// Have the router poll its completion queues once (as an empty [`Inbox::pop`] does,
    /// without the weak reference's upgrade); false when nothing moved, or another thread was
    /// polling (it delivers). A consumer of several inboxes fed by one router pops them all
    /// with [`Inbox::pop_queued`] and polls once.
    pub fn poll_queues(&self) -> bool {
        inbox::Poller::try_poll_once(&*self.router, inbox::POLL_BATCH) > 0
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        self.router.remove_route(self.cq_id, self.qpn, &self.inbox);
    }
}

impl Engine {
    pub fn new(fabric: Arc<dyn Fabric>, spin: Duration) -> Arc<Engine> {
        let n = fabric.devices().len();
        Arc::new(Engine {
            fabric,
            router: Arc::new(Router::default()),
            spin,
            state: Mutex::new(State {
                devices: (0..n).map(|_| Weak::new()).collect(),
                progress: None,
                leases: 0,
            }),
        })
    }

    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// Take a lease on device `dev`, opening it and starting the progress thread if needed.
    pub fn lease(self: &Arc<Self>, dev: usize) -> Result<Lease, FabricError> {
        let mut st = self.state.lock();
        let slot = st
            .devices
            .get(dev)
            .ok_or_else(|| FabricError::InvalidArgument(format!("no device {dev}")))?;
        let res = match slot.upgrade() {
            Some(r) => r,
            None => {
                let pd = self.fabric.open_pd(dev)?;
                let align = if self.fabric.kind() == "verbs" {
                    4096
                } else {
                    1
                };
                let max_cqe = self
                    .fabric
                    .devices()
                    .get(dev)
                    .and_then(|d| d.limits.max_cqe);
                let r = Arc::new(DeviceRes {
                    dev,
                    mrs: MrCache::new(pd.clone(), align),
                    pd,
                    cq_size: cq_capacity(max_cqe),
                    cqs: Mutex::new(Vec::new()),
                    router: self.router.clone(),
                });
                // The first queue at once (most devices never need a second).
                let first = r.new_cq()?;
                r.cqs.lock().push(first);
                st.devices[dev] = Arc::downgrade(&r);
                r
            }
        };
        if st.progress.is_none() {
            st.progress = Some(
                ProgressThread::start(self.router.clone(), self.spin)
                    .map_err(|e| FabricError::io("starting the progress thread", e))?,
            );
        }
        st.leases += 1;
        Ok(Lease {
            engine: self.clone(),
            dev: res,
        })
    }

    pub fn unrouted(&self) -> u64 {
        self.router
            .unrouted
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Lease {
    /// Route completions of queue pair `qpn` (whose completions go to queue `cq_id` of this
    /// lease's device) to a new inbox.
    pub fn route(&self, cq_id: u64, qpn: u32) -> Route {
        let router = self.engine.router.clone();
        let inbox = Arc::new(Inbox::polled_by(&router));
        router.add_route(cq_id, qpn, inbox.clone());
        Route {
            router,
            cq_id,
            qpn,
            inbox,
        }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Another lease on the same device.
    pub fn clone_lease(&self) -> Lease {
        self.engine.state.lock().leases += 1;
        Lease {
            engine: self.engine.clone(),
            dev: self.dev.clone(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let stopped = {
            let mut st = self.engine.state.lock();
            st.leases -= 1;
            if st.leases == 0 {
                st.progress.take()
            } else {
                None
            }
        };
        // Joined outside the lock.
        drop(stopped);
    }
}
