//! Memory registrations of the verbs fabric: foreign memory (host, or GPU memory by virtual
//! address through the peer-memory client, or a dma-buf) registered on a protection domain,
//! deregistered on drop.

use super::super::counters::{Held, Resource};
use super::super::{Access, FabricError, MemoryRegion, MrKeys, Result};
use super::domain::PdInner;
use super::ffi;
use super::gdr::dmabuf::{DeregFn, DmabufApi, Probe};
use ibverbs_sys as sys;
use std::os::fd::RawFd;
use std::sync::Arc;

/// `Access` → `ibv_access_flags` (remote write needs local write in verbs).
pub(crate) fn access_flags(access: Access) -> u32 {
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
    /// How it is released (`ibv_dereg_mr`; the table's for dma-buf registrations).
    dereg: DeregFn,
    _held: Held,
    _pd: Arc<PdInner>,
}

// SAFETY: the `ibv_mr` is immutable after registration and freed once, in Drop.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl VerbsMr {
    pub fn register(pd: &Arc<PdInner>, addr: usize, len: usize, access: Access) -> Result<VerbsMr> {
        if len == 0 {
            // Nothing can be accessed through it; zero-length transfers carry no SGE and
            // are not key-checked, so no verbs registration is made.
            return Ok(Self::wrap(
                pd,
                std::ptr::null_mut(),
                addr,
                len,
                sys::ibv_dereg_mr,
            ));
        }
        // SAFETY: live PD; the caller of `reg_mr` promises the range stays valid while the
        // registration lives. The kernel pins the pages (for a GPU address, through the peer-
        // memory client); nothing is dereferenced here.
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
        Ok(Self::wrap(pd, mr, addr, len, sys::ibv_dereg_mr))
    }

    /// `ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)` through `api`. The MR's own
    /// `addr` field holds the offset, not an address (rdma-core), so the registration keeps
    /// `iova` as its address. `fd` is only used during the call.
    pub fn register_dmabuf(
        pd: &Arc<PdInner>,
        api: &DmabufApi,
        iova: usize,
        len: usize,
        offset: u64,
        fd: RawFd,
        access: Access,
    ) -> Result<VerbsMr> {
        let Some(reg) = api.reg else {
            return Err(FabricError::InvalidArgument(format!(
                "{}: dma-buf registration: {}",
                pd.name,
                Probe::NoSymbol.describe()
            )));
        };
        if len == 0 {
            return Err(FabricError::InvalidArgument(format!(
                "{}: dma-buf registration of 0 bytes",
                pd.name
            )));
        }
        // SAFETY: live PD; the kernel looks `fd` up (taking its own reference on the dma-buf)
        // and maps the exporter's pages; no user memory is dereferenced.
        let mr = unsafe {
            reg(
                pd.pd,
                offset,
                len,
                iova as u64,
                fd,
                access_flags(access) as i32,
            )
        };
        if mr.is_null() {
            return Err(ffi::last_error(format!(
                "{}: ibv_reg_dmabuf_mr(offset {offset}, {len} bytes, iova {iova:#x}, fd {fd})",
                pd.name
            )));
        }
        Ok(Self::wrap(pd, mr, iova, len, api.dereg))
    }

    fn wrap(
        pd: &Arc<PdInner>,
        mr: *mut sys::ibv_mr,
        addr: usize,
        len: usize,
        dereg: DeregFn,
    ) -> VerbsMr {
        let (lkey, rkey) = if mr.is_null() {
            (0, 0)
        } else {
            // SAFETY: `mr` was just returned non-null by a registration call.
            unsafe { ((*mr).lkey, (*mr).rkey) }
        };
        VerbsMr {
            mr,
            addr,
            len,
            keys: MrKeys { lkey, rkey },
            dereg,
            _held: Held::new(Resource::Mr),
            _pd: pd.clone(),
        }
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
        // SAFETY: deregisters the MR made in `register*`, exactly once.
        let rc = unsafe { (self.dereg)(self.mr) };
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
