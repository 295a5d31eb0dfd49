//! Protection domains of the `sock` fabric: the [`ProtectionDomain`] handle the engine holds.
//! It registers memory in the domain's key table and makes completion queues and queue
//! pairs; the listener ([`PdCore`]) lives as long as the handle or any of its queue pairs.

use super::cq::SockCq;
use super::limits::QpSlots;
use super::listener::PdCore;
use super::mr::SockMr;
use super::qp::SockQp;
use super::Tunables;
use crate::fabric::counters::{Held, Resource};
use crate::fabric::{
    Access, CompletionQueue, Doorbell, FabricError, MemoryRegion, ProtectionDomain, QpCaps,
    QueuePair, Result,
};
use ha_proto::data::layout::SharedWords;
use std::net::IpAddr;
use std::sync::Arc;

/// The handle `open_pd` returns.
pub struct SockPd {
    core: Arc<PdCore>,
    /// The rail's queue-pair slots.
    slots: Arc<QpSlots>,
    /// Entries a completion queue holds at most (`None`: unbounded).
    max_cqe: Option<u32>,
}

impl SockPd {
    pub fn open(dev: usize, ip: IpAddr, tun: Tunables, slots: Arc<QpSlots>) -> Result<SockPd> {
        Ok(SockPd {
            core: Arc::new(PdCore::open(dev, ip, tun)?),
            slots,
            max_cqe: tun.max_cqe,
        })
    }
}

impl ProtectionDomain for SockPd {
    fn id(&self) -> u64 {
        self.core.shared.id
    }
    fn device(&self) -> usize {
        self.core.shared.dev
    }
    /// Host memory always: checked against the key table, the registration pinned (a
    /// deregistration waits) while the bytes are copied.
    fn copy_into(
        &self,
        lkey: u32,
        addr: usize,
        src: &SharedWords,
        from: usize,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let refuse = |what: &str| {
            Err(FabricError::InvalidArgument(format!(
                "sock: copy of {len} bytes to {addr:#x} (key {lkey:#x}): {what}"
            )))
        };
        if from
            .checked_add(len)
            .is_none_or(|end| end > src.len_bytes())
        {
            return refuse("the source lies outside its words");
        }
        let Some(e) = self.core.shared.mrs.get(lkey) else {
            return refuse("no such registration");
        };
        if !e.contains(addr as u64, len as u64) || !e.access.contains(Access::LOCAL_WRITE) {
            return refuse("outside the registration, or not writable");
        }
        let Some(_pin) = e.pin() else {
            return refuse("the registration is being removed");
        };
        // SAFETY: the destination lies inside a registration of this domain (checked above),
        // host memory its owner keeps valid until the registration is dropped, which waits
        // for the pin held here; the source lies inside `src` (checked above), memory the
        // caller owns, whose bytes were placed before the completion that led here was polled.
        // The two never overlap: `src` is the plugin's own allocation, never registered by
        // NCCL.
        unsafe {
            std::ptr::copy_nonoverlapping((src.addr() + from) as *const u8, addr as *mut u8, len);
        }
        Ok(())
    }
    fn reg_mr(&self, addr: usize, len: usize, access: Access) -> Result<Box<dyn MemoryRegion>> {
        if len == 0 {
            return Err(FabricError::InvalidArgument(
                "sock: zero-length registration".into(),
            ));
        }
        if addr == 0 || addr.checked_add(len).is_none() {
            return Err(FabricError::InvalidArgument(format!(
                "sock: bad registration {addr:#x}+{len}"
            )));
        }
        let entry = self.core.shared.mrs.insert(addr, len, access);
        Ok(Box::new(SockMr {
            entry,
            table: self.core.shared.mrs.clone(),
            _held: Held::new(Resource::Mr),
        }))
    }
    /// Unbounded unless a `max_cqe` is emulated; then `depth` clamped to it, as verbs does.
    fn create_cq(&self, depth: u32, doorbell: Arc<Doorbell>) -> Result<Arc<dyn CompletionQueue>> {
        let capacity = self.max_cqe.map(|m| depth.clamp(1, m) as usize);
        Ok(SockCq::create(doorbell, capacity))
    }
    fn create_qp(&self, cq: &Arc<dyn CompletionQueue>, caps: QpCaps) -> Result<Box<dyn QueuePair>> {
        if caps.max_send_wr == 0 || caps.max_recv_wr == 0 {
            return Err(FabricError::InvalidArgument(
                "sock: queue pair needs max_send_wr and max_recv_wr > 0".into(),
            ));
        }
        let cq = SockCq::resolve(cq)?;
        let slot = self.slots.take()?;
        let mut qp = SockQp::new(self.core.clone(), cq, caps);
        qp.hold_slot(slot);
        Ok(Box::new(qp))
    }
}
