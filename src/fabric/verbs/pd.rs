//! Protection domains and memory registrations of the verbs fabric. A PD belongs to one
//! fabric device (an HCA port); it keeps the device open, and its CQs, QPs and MRs keep it.

use super::super::counters::{Held, Resource};
use super::super::{
    Access, CompletionQueue, Doorbell, FabricError, MemoryRegion, MrKeys, ProtectionDomain, QpCaps,
    QueuePair, Result,
};
use super::config::Resolved;
use super::cq::VerbsCq;
use super::events::PortEvents;
use super::ffi;
use super::hca::Hca;
use super::qp::VerbsQp;
use ibverbs_sys as sys;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

static NEXT_PD_ID: AtomicU64 = AtomicU64::new(1);

/// The shared part of a PD.
pub struct PdInner {
    pub pd: *mut sys::ibv_pd,
    pub id: u64,
    /// Fabric device index.
    pub dev: usize,
    /// Device name (`rxe0a:1`) for messages.
    pub name: String,
    pub port: u8,
    pub cfg: Resolved,
    pub events: Arc<PortEvents>,
    /// Completion queues made here, to map `Arc<dyn CompletionQueue>` back.
    cqs: Mutex<Vec<(usize, Weak<VerbsCq>)>>,
    _held: Held,
    // Last: the device outlives the PD.
    pub hca: Arc<Hca>,
}

// SAFETY: `ibv_pd` is only used through thread-safe verbs calls and freed once, in Drop.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: deallocates the PD made in `VerbsPd::open`, exactly once; its MRs, CQs and
        // QPs hold an `Arc` to this value, so none is left.
        let rc = unsafe { sys::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!("NET/HA verbs: {}: ibv_dealloc_pd failed: {rc}", self.name);
        }
    }
}

/// A protection domain on one fabric device.
pub struct VerbsPd(pub Arc<PdInner>);

impl VerbsPd {
    pub fn open(
        hca: Arc<Hca>,
        dev: usize,
        name: String,
        port: u8,
        cfg: Resolved,
        events: Arc<PortEvents>,
    ) -> Result<VerbsPd> {
        // SAFETY: live context owned by `hca`.
        let pd = unsafe { sys::ibv_alloc_pd(hca.raw()) };
        if pd.is_null() {
            return Err(ffi::last_error(format!("{name}: ibv_alloc_pd")));
        }
        Ok(VerbsPd(Arc::new(PdInner {
            pd,
            id: NEXT_PD_ID.fetch_add(1, Ordering::Relaxed),
            dev,
            name,
            port,
            cfg,
            events,
            cqs: Mutex::new(Vec::new()),
            _held: Held::new(Resource::Pd),
            hca,
        })))
    }

    /// The concrete queue behind a handle this PD made.
    fn resolve_cq(&self, cq: &Arc<dyn CompletionQueue>) -> Result<Arc<VerbsCq>> {
        let addr = Arc::as_ptr(cq) as *const () as usize;
        let mut cqs = self.0.cqs.lock();
        cqs.retain(|(_, w)| w.strong_count() > 0);
        cqs.iter()
            .find(|(a, _)| *a == addr)
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| {
                FabricError::InvalidArgument(format!(
                    "{}: completion queue not created by this protection domain",
                    self.0.name
                ))
            })
    }
}

impl ProtectionDomain for VerbsPd {
    fn id(&self) -> u64 {
        self.0.id
    }

    fn device(&self) -> usize {
        self.0.dev
    }

    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Box<dyn MemoryRegion>> {
        Ok(Box::new(VerbsMr::register(&self.0, addr, len, access)?))
    }

    fn create_cq(&self, depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>> {
        let cq = Arc::new(VerbsCq::create(self.0.clone(), depth, doorbell)?);
        self.0
            .cqs
            .lock()
            .push((Arc::as_ptr(&cq) as usize, Arc::downgrade(&cq)));
        Ok(cq)
    }

    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>> {
        let cq = self.resolve_cq(cq)?;
        Ok(Box::new(VerbsQp::create(self.0.clone(), cq, caps)?))
    }
}

/// `Access` → `ibv_access_flags` (remote write needs local write in verbs).
pub fn access_flags(access: Access) -> u32 {
    let mut f = 0;
    if access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f
}

/// A registration of foreign memory; deregistered on drop.
pub struct VerbsMr {
    mr: *mut sys::ibv_mr,
    addr: usize,
    len: usize,
    keys: MrKeys,
    _held: Held,
    _pd: Arc<PdInner>,
}

// SAFETY: the `ibv_mr` is immutable after registration and freed once, in Drop.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl VerbsMr {
    fn register(pd: &Arc<PdInner>, addr: usize, len: usize, access: Access) -> Result<VerbsMr> {
        if len == 0 {
            // Nothing can be accessed through it; zero-length transfers carry no SGE and
            // are not key-checked, so no verbs registration is made.
            return Ok(VerbsMr {
                mr: std::ptr::null_mut(),
                addr,
                len,
                keys: MrKeys { lkey: 0, rkey: 0 },
                _held: Held::new(Resource::Mr),
                _pd: pd.clone(),
            });
        }
        // SAFETY: live PD; the caller of `reg_mr` promises the range stays valid while the
        // registration lives. The kernel pins the pages; nothing is dereferenced here.
        let mr = unsafe {
            sys::ibv_reg_mr(
                pd.pd,
                addr as *mut libc::c_void,
                len,
                access_flags(access) as i32,
            )
        };
        if mr.is_null() {
            return Err(ffi::last_error(format!(
                "{}: ibv_reg_mr({addr:#x}, {len})",
                pd.name
            )));
        }
        // SAFETY: `mr` was just returned non-null by ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(VerbsMr {
            mr,
            addr,
            len,
            keys: MrKeys { lkey, rkey },
            _held: Held::new(Resource::Mr),
            _pd: pd.clone(),
        })
    }
}

impl MemoryRegion for VerbsMr {
    fn keys(&self) -> MrKeys {
        self.keys
    }
    fn addr(&self) -> usize {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        if self.mr.is_null() {
            return;
        }
        // SAFETY: deregisters the MR made in `register`, exactly once.
        let rc = unsafe { sys::ibv_dereg_mr(self.mr) };
        if rc != 0 {
            tracing::warn!("NET/HA verbs: ibv_dereg_mr failed: {rc}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_mapping() {
        assert_eq!(access_flags(Access::LOCAL_WRITE), 1);
        assert_eq!(access_flags(Access::REMOTE_WRITE), 1 | 2);
        assert_eq!(access_flags(Access::REMOTE_READ), 4);
        assert_eq!(access_flags(Access::ALL), 1 | 2 | 4);
    }
}
