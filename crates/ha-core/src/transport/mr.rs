//! A registration as NCCL sees it (`mhandle`): one user range, registered on the primary
//! device at `regMr` and lazily on any other device a connection needs it on (the standby),
//! through each device's MR cache.

use super::error::Result;
use crate::engine::mr_cache::MrRef;
use crate::engine::DeviceRes;
use crate::fabric::MrKeys;
use parking_lot::Mutex;
use std::sync::Arc;

pub struct MrHandle {
    pub addr: usize,
    pub len: usize,
    regs: Mutex<Vec<(Arc<DeviceRes>, MrRef)>>,
}

impl MrHandle {
    /// Register `[addr, addr+len)` on `dev` now.
    pub fn register(dev: &Arc<DeviceRes>, addr: usize, len: usize) -> Result<MrHandle> {
        let r = dev.mrs.acquire(addr, len)?;
        Ok(MrHandle {
            addr,
            len,
            regs: Mutex::new(vec![(dev.clone(), r)]),
        })
    }

    /// Keys valid on `dev`, registering there on first use.
    pub fn keys_for(&self, dev: &Arc<DeviceRes>) -> Result<MrKeys> {
        let mut regs = self.regs.lock();
        if let Some((_, r)) = regs.iter().find(|(d, _)| Arc::ptr_eq(d, dev)) {
            return Ok(r.keys);
        }
        let r = dev.mrs.acquire(self.addr, self.len)?;
        regs.push((dev.clone(), r));
        Ok(r.keys)
    }

    /// Whether `[addr, addr+len)` lies inside this registration.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.addr + self.len)
    }

    /// Devices this range is registered on.
    pub fn registrations(&self) -> usize {
        self.regs.lock().len()
    }
}

impl Drop for MrHandle {
    fn drop(&mut self) {
        for (dev, r) in self.regs.get_mut().drain(..) {
            dev.mrs.release(r);
        }
    }
}
