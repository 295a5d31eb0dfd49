//! Owned handles on libibverbs' device list and device contexts, with the queries the fabric
//! needs (device and port attributes, the port's GID table).

use super::super::{FabricError, Result};
use super::ffi;
use super::gid::{GidEntry, GidType};
use ibverbs_sys as sys;
use std::ffi::CStr;

/// `ibv_get_device_list`, freed on drop.
pub struct DeviceList {
    list: *mut *mut sys::ibv_device,
    n: usize,
}

// SAFETY: the list and the `ibv_device` structures it points to are immutable after
// `ibv_get_device_list` returns and stay valid until `ibv_free_device_list` (our Drop).
unsafe impl Send for DeviceList {}
// SAFETY: see Send: only read access is ever made.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    /// The RDMA devices of this host (an empty list when the kernel has none).
    pub fn get() -> Result<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a live out-parameter.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            // ENOSYS: no uverbs support in the kernel at all — same as no device.
            if e.raw_os_error() == Some(libc::ENOSYS) {
                return Ok(DeviceList {
                    list: std::ptr::null_mut(),
                    n: 0,
                });
            }
            return Err(FabricError::io("ibv_get_device_list", e));
        }
        Ok(DeviceList {
            list,
            n: n.max(0) as usize,
        })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn device(&self, i: usize) -> *mut sys::ibv_device {
        assert!(i < self.n);
        // SAFETY: `i < n`, the list holds `n` valid pointers.
        unsafe { *self.list.add(i) }
    }

    pub fn name(&self, i: usize) -> String {
        // SAFETY: a valid device has a NUL-terminated name that lives as long as the list.
        unsafe { CStr::from_ptr(sys::ibv_get_device_name(self.device(i))) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn guid(&self, i: usize) -> u64 {
        // SAFETY: valid device pointer (see `device`).
        u64::from_be(unsafe { sys::ibv_get_device_guid(self.device(i)) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: frees the list obtained in `get`, exactly once. Contexts opened from
            // it stay valid (libibverbs reference-counts the devices).
            unsafe { sys::ibv_free_device_list(self.list) };
        }
    }
}

/// Device limits the fabric uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct DevAttr {
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_cqe: i32,
    pub max_qp_rd_atom: i32,
    pub max_qp_init_rd_atom: i32,
    pub phys_port_cnt: u8,
}

/// An open device context (`ibv_open_device`), closed on drop.
pub struct Context {
    ctx: *mut sys::ibv_context,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe; the pointer is only freed in Drop.
unsafe impl Send for Context {}
// SAFETY: as above; every verbs call on a context may be made from any thread.
unsafe impl Sync for Context {}

impl Context {
    pub fn open(list: &DeviceList, i: usize) -> Result<Context> {
        let name = list.name(i);
        // SAFETY: valid device pointer from a live list.
        let ctx = unsafe { sys::ibv_open_device(list.device(i)) };
        if ctx.is_null() {
            return Err(ffi::last_error(format!("ibv_open_device({name})")));
        }
        Ok(Context { ctx, name })
    }

    pub fn raw(&self) -> *mut sys::ibv_context {
        self.ctx
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The async-event file descriptor of this context.
    pub fn async_fd(&self) -> i32 {
        // SAFETY: the context is live for `self`'s lifetime.
        unsafe { (*self.ctx).async_fd }
    }

    pub fn query_device(&self) -> Result<DevAttr> {
        let mut a = sys::ibv_device_attr::default();
        // SAFETY: live context, `a` is a live out-parameter of the right type.
        let rc = unsafe { sys::ibv_query_device(self.ctx, &mut a) };
        ffi::check_rc(rc, || format!("ibv_query_device({})", self.name))?;
        Ok(DevAttr {
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_cqe: a.max_cqe,
            max_qp_rd_atom: a.max_qp_rd_atom,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    /// `ibv_query_port`. The exported symbol fills the legacy prefix of `ibv_port_attr`
    /// (everything up to `flags`), which holds every field used here.
    pub fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr> {
        let mut a = sys::ibv_port_attr::default();
        // SAFETY: live context; `a` is larger than the legacy struct the call fills.
        let rc = unsafe {
            sys::ibv_query_port(
                self.ctx,
                port,
                (&mut a as *mut sys::ibv_port_attr).cast::<sys::_compat_ibv_port_attr>(),
            )
        };
        ffi::check_rc(rc, || format!("ibv_query_port({}:{port})", self.name))?;
        Ok(a)
    }

    /// The valid entries of `port`'s GID table, read now (one `ioctl`).
    pub fn gid_table(&self, port: u8, ports: u8, tbl_len: i32) -> Result<Vec<GidEntry>> {
        let max = (tbl_len.max(1) as usize) * (ports.max(1) as usize);
        let mut raw = vec![sys::ibv_gid_entry::default(); max];
        // SAFETY: live context; `raw` has `max` writable entries of the size we pass.
        let n = unsafe {
            sys::_ibv_query_gid_table(
                self.ctx,
                raw.as_mut_ptr(),
                max,
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(FabricError::io(
                format!("ibv_query_gid_table({})", self.name),
                std::io::Error::from_raw_os_error((-n) as i32),
            ));
        }
        Ok(raw[..(n as usize).min(max)]
            .iter()
            .filter(|e| e.port_num == u32::from(port))
            .map(|e| GidEntry {
                index: e.gid_index,
                // SAFETY: `raw` is plain bytes in every variant of the union.
                gid: unsafe { e.gid.raw },
                gid_type: GidType::from_raw(e.gid_type),
            })
            .collect())
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: closes the context opened in `open`, exactly once; every object made
        // from it holds an `Arc` to its owner and is gone by now.
        let rc = unsafe { sys::ibv_close_device(self.ctx) };
        if rc != 0 {
            tracing::warn!("NET/HA verbs: ibv_close_device({}) failed: {rc}", self.name);
        }
    }
}
