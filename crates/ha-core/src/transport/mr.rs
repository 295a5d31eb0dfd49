//! A registration as NCCL sees it (`mhandle`): one user range, of host memory, of GPU memory
//! by virtual address (`NCCL_PTR_CUDA` through nvidia-peermem) or of a dma-buf, registered on
//! the devices a connection uses through each device's MR cache.
//!
//! When: host and peer-memory GPU registrations are made on the primary device at `regMr`,
//! and on another device (the standby) at first use there or at once, by
//! `HA_NCCL_MR_POLICY`. A dma-buf registration is made on every device of the connection
//! inside `regMrDmaBuf`, whatever the policy: NCCL closes the fd as soon as the call returns,
//! so a later registration would need a duplicate of the fd kept open for the registration's
//! whole life — one descriptor per registered buffer, held against the process's limit and
//! easy to leak — while registering now costs only a second memory registration on the
//! standby NIC (NCCL's IB transport does the same for the devices of a merged NIC). The
//! handle never keeps the fd: each registration holds its own reference on the dma-buf.

use super::error::{Error, Result};
use crate::engine::mr_cache::MrRef;
use crate::engine::DeviceRes;
use crate::fabric::MrKeys;
use parking_lot::Mutex;
use std::os::fd::RawFd;
use std::sync::Arc;

/// What kind of memory a registration covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    Host,
    /// GPU memory registered by virtual address (peer-memory client).
    Cuda,
    /// GPU memory registered through a dma-buf fd (on every device at once).
    DmaBuf,
}

impl MemKind {
    /// GPU memory: received data may need a flush before the GPU reads it.
    pub fn is_gpu(self) -> bool {
        !matches!(self, MemKind::Host)
    }
}

pub struct MrHandle {
    pub addr: usize,
    pub len: usize,
    pub kind: MemKind,
    regs: Mutex<Vec<(Arc<DeviceRes>, MrRef)>>,
}

impl MrHandle {
    /// Register host memory `[addr, addr+len)` on `dev` now.
    pub fn register(dev: &Arc<DeviceRes>, addr: usize, len: usize) -> Result<MrHandle> {
        Self::register_kind(dev, addr, len, MemKind::Host)
    }

    /// Register `[addr, addr+len)` (host, or GPU memory by address) on `dev` now.
    pub fn register_kind(
        dev: &Arc<DeviceRes>,
        addr: usize,
        len: usize,
        kind: MemKind,
    ) -> Result<MrHandle> {
        if kind == MemKind::DmaBuf {
            return Err(Error::Usage(
                "a dma-buf registration needs its fd (register_dmabuf)".into(),
            ));
        }
        let r = dev.mrs.acquire(addr, len)?;
        Ok(MrHandle {
            addr,
            len,
            kind,
            regs: Mutex::new(vec![(dev.clone(), r)]),
        })
    }

    /// Register `[addr, addr+len)`, which starts `offset` bytes into the dma-buf `fd`, on
    /// every device in `devs` now (primary first). If one fails, those already made are
    /// released and the error names the device. `fd` is not kept.
    pub fn register_dmabuf(
        devs: &[Arc<DeviceRes>],
        addr: usize,
        len: usize,
        offset: u64,
        fd: RawFd,
    ) -> Result<MrHandle> {
        let h = MrHandle {
            addr,
            len,
            kind: MemKind::DmaBuf,
            regs: Mutex::new(Vec::with_capacity(devs.len())),
        };
        for d in devs {
            // On error `h` is dropped: its Drop releases the registrations made so far.
            let r = d.mrs.acquire_dmabuf(addr, len, offset, fd).map_err(|e| {
                Error::Usage(format!(
                    "dma-buf registration of {addr:#x}+{len} (fd {fd}, offset {offset}) on device {}: {e}",
                    d.dev
                ))
            })?;
            h.regs.lock().push((d.clone(), r));
        }
        Ok(h)
    }

    /// Keys valid on `dev`, registering there on first use (host and peer-memory GPU
    /// memory). A dma-buf registration exists only on the devices it was made on.
    pub fn keys_for(&self, dev: &Arc<DeviceRes>) -> Result<MrKeys> {
        let mut regs = self.regs.lock();
        if let Some((_, r)) = regs.iter().find(|(d, _)| Arc::ptr_eq(d, dev)) {
            return Ok(r.keys);
        }
        if self.kind == MemKind::DmaBuf {
            let on: Vec<String> = regs.iter().map(|(d, _)| d.dev.to_string()).collect();
            return Err(Error::Usage(format!(
                "dma-buf registration {:#x}+{} exists on device(s) {} only; it cannot be made on device {} later (its fd is gone)",
                self.addr,
                self.len,
                on.join(", "),
                dev.dev
            )));
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

    /// Fabric device indices this range is registered on, in registration order.
    pub fn devices(&self) -> Vec<usize> {
        self.regs.lock().iter().map(|(d, _)| d.dev).collect()
    }
}

impl Drop for MrHandle {
    fn drop(&mut self) {
        for (dev, r) in self.regs.get_mut().drain(..) {
            dev.mrs.release(r);
        }
    }
}
