//! The state of one protection domain of the verbs fabric, shared by everything made on it:
//! the `ibv_pd`, its device and port, the resolved configuration and the port's events. Its
//! completion queues, queue pairs and registrations hold it; it keeps the device open.

use super::super::counters::{Held, Resource};
use super::super::Result;
use super::config::Resolved;
use super::events::PortEvents;
use super::ffi;
use super::hca::Hca;
use ibverbs_sys as sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

impl PdInner {
    /// Allocate the PD of port `port` of `hca` (fabric device `dev`).
    pub fn open(
        hca: Arc<Hca>,
        dev: usize,
        name: String,
        port: u8,
        cfg: Resolved,
        events: Arc<PortEvents>,
    ) -> Result<PdInner> {
        // SAFETY: live context owned by `hca`.
        let pd = unsafe { sys::ibv_alloc_pd(hca.raw()) };
        if pd.is_null() {
            return Err(ffi::last_error(format!("{name}: ibv_alloc_pd")));
        }
        Ok(PdInner {
            pd,
            id: NEXT_PD_ID.fetch_add(1, Ordering::Relaxed),
            dev,
            name,
            port,
            cfg,
            events,
            _held: Held::new(Resource::Pd),
            hca,
        })
    }
}
