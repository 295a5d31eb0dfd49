//! Per-PD memory-registration cache: refcounted ranges, so NCCL registering the same buffer
//! (or a sub-range of one already registered) from several connections costs one fabric
//! registration. Ranges are widened to `align` (the page size on verbs, 1 on `sock`), except
//! dma-buf registrations, which cover exactly the range NCCL names (widening could reach past
//! the end of the dma-buf). A request is served by any live registration covering its range,
//! whatever kind made it: with unified addressing one range is one piece of memory, as in
//! NCCL's per-device cache.

use crate::fabric::{Access, MemoryRegion, MrKeys, ProtectionDomain, Result};
use parking_lot::Mutex;
use std::sync::Arc;

struct Entry {
    start: usize,
    end: usize,
    refs: usize,
    mr: Box<dyn MemoryRegion>,
}

pub struct MrCache {
    pd: Arc<dyn ProtectionDomain>,
    align: usize,
    entries: Mutex<Vec<Entry>>,
}

/// One reference to a cached registration; give it back with [`MrCache::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrRef {
    pub keys: MrKeys,
    start: usize,
    end: usize,
}

impl MrCache {
    pub fn new(pd: Arc<dyn ProtectionDomain>, align: usize) -> Self {
        MrCache {
            pd,
            align: align.max(1),
            entries: Mutex::new(Vec::new()),
        }
    }

    /// A registration covering `[addr, addr+len)`, reusing a cached one when it covers it.
    pub fn acquire(&self, addr: usize, len: usize) -> Result<MrRef> {
        let start = addr - addr % self.align;
        let end = (addr + len.max(1)).div_ceil(self.align) * self.align;
        let mut entries = self.entries.lock();
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.start <= start && end <= e.end)
        {
            e.refs += 1;
            return Ok(MrRef {
                keys: e.mr.keys(),
                start: e.start,
                end: e.end,
            });
        }
        let mr = self.pd.reg_mr(start, end - start, Access::ALL)?;
        let keys = mr.keys();
        entries.push(Entry {
            start,
            end,
            refs: 1,
            mr,
        });
        Ok(MrRef { keys, start, end })
    }

    /// A registration covering `[addr, addr+len)` of the dma-buf `fd` (`addr` sits `offset`
    /// bytes into it), reusing a cached one when it covers the range. `fd` is only used during
    /// the call.
    pub fn acquire_dmabuf(
        &self,
        addr: usize,
        len: usize,
        offset: u64,
        fd: std::os::fd::RawFd,
    ) -> Result<MrRef> {
        let (start, end) = (addr, addr + len.max(1));
        let mut entries = self.entries.lock();
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.start <= start && end <= e.end)
        {
            e.refs += 1;
            return Ok(MrRef {
                keys: e.mr.keys(),
                start: e.start,
                end: e.end,
            });
        }
        let mr = self
            .pd
            .reg_dmabuf_mr(start, end - start, offset, fd, Access::ALL)?;
        let keys = mr.keys();
        entries.push(Entry {
            start,
            end,
            refs: 1,
            mr,
        });
        Ok(MrRef { keys, start, end })
    }

    /// Drop one reference; the last one deregisters.
    pub fn release(&self, r: MrRef) {
        let mut entries = self.entries.lock();
        if let Some(i) = entries
            .iter()
            .position(|e| e.start == r.start && e.end == r.end && e.mr.keys() == r.keys)
        {
            entries[i].refs -= 1;
            if entries[i].refs == 0 {
                entries.swap_remove(i);
            }
        }
    }

    /// Live fabric registrations (for stats and leak tests).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
