//! Protection domains of the verbs fabric: the [`ProtectionDomain`] handle the engine holds,
//! which registers memory and makes completion queues and queue pairs on its
//! [`PdInner`](super::domain::PdInner).

use super::super::{
    Access, CompletionQueue, Doorbell, FabricError, MemoryRegion, ProtectionDomain, QpCaps,
    QueuePair, Result,
};
use super::config::Resolved;
use super::cq::VerbsCq;
use super::domain::PdInner;
use super::events::PortEvents;
use super::gdr::dmabuf::DmabufApi;
use super::hca::Hca;
use super::mr::VerbsMr;
use super::qp::VerbsQp;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// A protection domain on one fabric device.
pub struct VerbsPd {
    inner: Arc<PdInner>,
    /// Completion queues made here, to map `Arc<dyn CompletionQueue>` back.
    cqs: Mutex<Vec<(usize, Weak<VerbsCq>)>>,
}

impl VerbsPd {
    pub fn open(
        hca: Arc<Hca>,
        dev: usize,
        name: String,
        port: u8,
        cfg: Resolved,
        events: Arc<PortEvents>,
    ) -> Result<VerbsPd> {
        Ok(VerbsPd {
            inner: Arc::new(PdInner::open(hca, dev, name, port, cfg, events)?),
            cqs: Mutex::new(Vec::new()),
        })
    }

    /// The concrete queue behind a handle this PD made.
    fn resolve_cq(&self, cq: &Arc<dyn CompletionQueue>) -> Result<Arc<VerbsCq>> {
        let addr = Arc::as_ptr(cq) as *const () as usize;
        let mut cqs = self.cqs.lock();
        cqs.retain(|(_, w)| w.strong_count() > 0);
        cqs.iter()
            .find(|(a, _)| *a == addr)
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| {
                FabricError::InvalidArgument(format!(
                    "{}: completion queue not created by this protection domain",
                    self.inner.name
                ))
            })
    }
}

impl ProtectionDomain for VerbsPd {
    fn id(&self) -> u64 {
        self.inner.id
    }

    fn device(&self) -> usize {
        self.inner.dev
    }

    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Box<dyn MemoryRegion>> {
        Ok(Box::new(VerbsMr::register(&self.inner, addr, len, access)?))
    }

    fn reg_dmabuf_mr(
        &self,
        iova: usize,
        len: usize,
        offset: u64,
        fd: std::os::fd::RawFd,
        access: Access,
    ) -> Result<Box<dyn MemoryRegion>> {
        Ok(Box::new(VerbsMr::register_dmabuf(
            &self.inner,
            DmabufApi::system(),
            iova,
            len,
            offset,
            fd,
            access,
        )?))
    }

    fn create_cq(&self, depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>> {
        let cq = Arc::new(VerbsCq::create(self.inner.clone(), depth, doorbell)?);
        self.cqs
            .lock()
            .push((Arc::as_ptr(&cq) as usize, Arc::downgrade(&cq)));
        Ok(cq)
    }

    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>> {
        let cq = self.resolve_cq(cq)?;
        Ok(Box::new(VerbsQp::create(self.inner.clone(), cq, caps)?))
    }
}
