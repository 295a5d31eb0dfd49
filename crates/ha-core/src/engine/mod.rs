//! Engine: the background progress thread, per-connection completion inboxes, and the
//! per-device resources (PD, shared CQ, MR cache) that connections lease. Threads and device
//! resources exist only while some connection (or registration) holds a lease.

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

/// Completion-queue depth per device.
const CQ_DEPTH: u32 = 4096;

/// Entries of the completion queue the engine shares among all queue pairs of a device whose
/// completion queues hold at most `max_cqe` (`None`: unbounded): today one queue of
/// [`CQ_DEPTH`], which the fabric clamps to the device's limit. The connection budget
/// (`transport::budget`) divides this by what one connection may put on it; a resizing
/// engine returns what it can grow to (`max_cqe`).
pub fn cq_capacity(max_cqe: Option<u32>) -> Option<u32> {
    max_cqe.map(|m| CQ_DEPTH.clamp(1, m.max(1)))
}

/// Resources of one device shared by every connection on it.
pub struct DeviceRes {
    pub dev: usize,
    pub pd: Arc<dyn ProtectionDomain>,
    pub cq: Arc<dyn CompletionQueue>,
    pub mrs: MrCache,
    cq_id: u64,
    router: Arc<Router>,
}

impl Drop for DeviceRes {
    fn drop(&mut self) {
        self.router.remove_cq(self.cq_id);
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

impl Drop for Route {
    fn drop(&mut self) {
        self.router.remove_route(self.cq_id, self.qpn);
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
                let cq = pd.create_cq(CQ_DEPTH, self.router.doorbell.clone())?;
                let cq_id = self.router.add_cq(cq.clone());
                let align = if self.fabric.kind() == "verbs" {
                    4096
                } else {
                    1
                };
                let r = Arc::new(DeviceRes {
                    dev,
                    mrs: MrCache::new(pd.clone(), align),
                    pd,
                    cq,
                    cq_id,
                    router: self.router.clone(),
                });
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
    /// Route completions of queue pair `qpn` (on this lease's device) to a new inbox.
    pub fn route(&self, qpn: u32) -> Route {
        let router = self.engine.router.clone();
        let inbox = Arc::new(Inbox::polled_by(&router));
        router.add_route(self.dev.cq_id, qpn, inbox.clone());
        Route {
            router,
            cq_id: self.dev.cq_id,
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
