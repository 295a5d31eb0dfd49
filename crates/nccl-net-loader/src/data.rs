//! The data path of [`Plugin`]: `isend`, `irecv`, `iflush`, `test` and the `close*` calls,
//! marshalled as NCCL's proxy thread does (argument arrays on the stack, sizes converted to
//! what the loaded version takes, the optional-completion hint preset on `*request`).

use crate::call::rc;
use crate::entries::{CloseFn, Size};
use crate::props::ArgArray;
use crate::types::TEST_SIZES_SCRATCH;
use crate::{Comm, Mr, NcclError, Plugin, Request};
use nccl_net_abi::common::{
    NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_NET_OPTIONAL_RECV_COMPLETION,
};
use std::os::raw::{c_int, c_void};
use std::ptr;

impl Plugin {
    /// `isend` with an `int` size, as v8 takes it: `Ok(None)` means "try later". For v9+ a
    /// negative size cannot be expressed and is refused here (`ncclInvalidArgument`).
    pub fn isend(
        &self,
        comm: &Comm,
        buf: *mut u8,
        size: i32,
        tag: i32,
        mr: &Mr,
    ) -> Result<Option<Request>, NcclError> {
        self.isend_with(comm, buf, Size::Int(size), tag, mr)
    }

    /// `isend` with a `size_t` size (v9+; for v8, sizes above `INT_MAX` are refused here with
    /// `ncclInvalidArgument`, as NCCL's v8 adapter refuses them with an error).
    pub fn isend_sized(
        &self,
        comm: &Comm,
        buf: *mut u8,
        size: usize,
        tag: i32,
        mr: &Mr,
    ) -> Result<Option<Request>, NcclError> {
        self.isend_with(comm, buf, Size::Sized(size), tag, mr)
    }

    fn isend_with(
        &self,
        comm: &Comm,
        buf: *mut u8,
        size: Size,
        tag: i32,
        mr: &Mr,
    ) -> Result<Option<Request>, NcclError> {
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: `comm` is a live send comm, `mr` a live registration, `req` writable. The
        // plugin reads `size` bytes at `buf` until the request completes; the caller keeps
        // that memory valid meanwhile.
        let r = unsafe {
            self.ver
                .isend(comm.0, buf.cast(), size, tag, mr.0, &mut req)
        };
        self.done(r)?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `irecv` of `bufs.len()` buffers (a multi-receive when > 1) with `int` sizes:
    /// `Ok(None)` = "try later". The four slices must have the same length (else
    /// `ncclInvalidArgument`, nothing called). For v9+ negative sizes are refused here.
    pub fn irecv(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[i32],
        tags: &[i32],
        mrs: &[&Mr],
    ) -> Result<Option<Request>, NcclError> {
        let sizes: Vec<Size> = sizes.iter().map(|&s| Size::Int(s)).collect();
        self.irecv_with(comm, bufs, &sizes, tags, mrs, false)
    }

    /// `irecv` with `size_t` sizes (v9+; for v8 sizes above `INT_MAX` are refused here). With
    /// `optional_completion`, `*request` is preset to `NCCL_NET_OPTIONAL_RECV_COMPLETION` as
    /// NCCL does for LL/LL128 receives (v9+; NCCL's v8 adapter clears it, and so does this).
    pub fn irecv_sized(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[usize],
        tags: &[i32],
        mrs: &[&Mr],
        optional_completion: bool,
    ) -> Result<Option<Request>, NcclError> {
        let sizes: Vec<Size> = sizes.iter().map(|&s| Size::Sized(s)).collect();
        self.irecv_with(comm, bufs, &sizes, tags, mrs, optional_completion)
    }

    fn irecv_with(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[Size],
        tags: &[i32],
        mrs: &[&Mr],
        optional_completion: bool,
    ) -> Result<Option<Request>, NcclError> {
        let n = bufs.len();
        if sizes.len() != n || tags.len() != n || mrs.len() != n {
            return Err(NcclError(NCCL_INVALID_ARGUMENT));
        }
        let n_c = c_int::try_from(n).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
        let mut data = ArgArray::new(ptr::null_mut(), bufs.iter().map(|b| b.cast::<c_void>()));
        let mut tg = ArgArray::new(0, tags.iter().copied());
        let mut mh = ArgArray::new(ptr::null_mut(), mrs.iter().map(|m| m.0));
        let mut req: *mut c_void = if optional_completion {
            NCCL_NET_OPTIONAL_RECV_COMPLETION as *mut c_void
        } else {
            ptr::null_mut()
        };
        // SAFETY: the arrays hold `n` valid elements each and outlive the call (plugins copy
        // them: NCCL passes stack arrays); `comm` is a live recv comm; `req` is writable. The
        // plugin writes into the buffers until the request completes; the caller keeps that
        // memory valid meanwhile.
        let r = unsafe {
            self.ver.irecv(
                comm.0,
                n_c,
                data.as_mut_ptr(),
                sizes,
                tg.as_mut_ptr(),
                mh.as_mut_ptr(),
                &mut req,
            )
        };
        self.done(r)?;
        if req as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION {
            tracing::error!(
                "plugin {}: irecv left the optional-completion hint as its request",
                self.name()
            );
            return Err(NcclError(NCCL_INTERNAL_ERROR));
        }
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `iflush` of received buffers: `Ok(None)` means nothing to flush (or "try later").
    pub fn iflush(
        &self,
        comm: &Comm,
        bufs: &[*mut u8],
        sizes: &[i32],
        mrs: &[&Mr],
    ) -> Result<Option<Request>, NcclError> {
        let f = self.entry(self.common().iflush, "iflush")?;
        let n = bufs.len();
        if sizes.len() != n || mrs.len() != n {
            return Err(NcclError(NCCL_INVALID_ARGUMENT));
        }
        let n_c = c_int::try_from(n).map_err(|_| NcclError(NCCL_INVALID_ARGUMENT))?;
        let mut data = ArgArray::new(ptr::null_mut(), bufs.iter().map(|b| b.cast::<c_void>()));
        let mut sz = ArgArray::new(0, sizes.iter().copied());
        let mut mh = ArgArray::new(ptr::null_mut(), mrs.iter().map(|m| m.0));
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: as in `irecv`: `n` valid elements per array, live comm, writable `req`.
        self.done(rc(unsafe {
            f(
                comm.0,
                n_c,
                data.as_mut_ptr(),
                sz.as_mut_ptr(),
                mh.as_mut_ptr(),
                &mut req,
            )
        }))?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `test`: `Ok(true)` when done. On completion the sizes the plugin reported are copied
    /// into `sizes_out` (entries it did not write read -1). An empty `sizes_out` passes NULL,
    /// as NCCL does for flush requests. After `Ok(true)` the request is gone: NCCL never tests
    /// it again, and neither may the caller. (`test` reports `int` sizes in every version.)
    pub fn test(&self, req: &Request, sizes_out: &mut [i32]) -> Result<bool, NcclError> {
        let f = self.entry(self.common().test, "test")?;
        let mut done: c_int = 0;
        let mut scratch = [-1 as c_int; TEST_SIZES_SCRATCH];
        let len = sizes_out.len();
        let sizes_ptr: *mut c_int = if len == 0 {
            ptr::null_mut()
        } else if len <= TEST_SIZES_SCRATCH {
            scratch.as_mut_ptr()
        } else {
            sizes_out.fill(-1);
            sizes_out.as_mut_ptr()
        };
        // SAFETY: `req` is an in-flight request of this plugin; `done` is writable; `sizes_ptr`
        // is NULL or points to at least max(len, 64) writable ints, more than any plugin writes
        // (one per receive of the request, at most NCCL_PROXY_MAX_SUBS).
        self.done(rc(unsafe { f(req.0, &mut done, sizes_ptr) }))?;
        if done != 0 && (1..=TEST_SIZES_SCRATCH).contains(&len) {
            sizes_out.copy_from_slice(&scratch[..len]);
        }
        Ok(done != 0)
    }

    fn close_with(
        &self,
        f: Option<CloseFn>,
        what: &'static str,
        comm: Comm,
    ) -> Result<(), NcclError> {
        let f = self.entry(f, what)?;
        // SAFETY: `comm` is a live comm of the right kind, consumed here so it cannot be closed
        // twice.
        self.done(rc(unsafe { f(comm.0) }))
    }

    /// `closeSend`.
    pub fn close_send(&self, comm: Comm) -> Result<(), NcclError> {
        self.close_with(self.common().close_send, "closeSend", comm)
    }

    /// `closeRecv`.
    pub fn close_recv(&self, comm: Comm) -> Result<(), NcclError> {
        self.close_with(self.common().close_recv, "closeRecv", comm)
    }

    /// `closeListen`.
    pub fn close_listen(&self, comm: Comm) -> Result<(), NcclError> {
        self.close_with(self.common().close_listen, "closeListen", comm)
    }
}
