//! The entry points whose C signature is the same in every ext-net version (v8 … v12):
//! written once, placed in every version's table. Each checks the pointers NCCL hands in and
//! calls `ha_core::api::ops` under `guard` (panic-safe, errors logged and mapped).

use super::adapt::*;
use ha_core::api::ops::{self, guard};
use nccl_net_abi::common::*;
use nccl_net_abi::v8::NcclNetDeviceHandleV8;
use std::os::raw::{c_int, c_void};

pub(super) unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    code(guard("devices", || put(ndev, ops::devices()?, "ndev")))
}

pub(super) unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    dev_comm: *mut *mut NcclNetDeviceHandleV8,
) -> NcclResult {
    code(guard("accept", || {
        non_null(recv_comm, "recvComm")?;
        if !dev_comm.is_null() {
            put(dev_comm, std::ptr::null_mut(), "recvDevComm")?;
        }
        let t = ops::accept(token(listen_comm))?;
        put(recv_comm, as_ptr(t), "recvComm")
    }))
}

pub(super) unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    code(guard("regMr", || {
        non_null(mhandle, "mhandle")?;
        let t = ops::reg_mr(token(comm), data as usize, size, ptr_type)?;
        put(mhandle, as_ptr(t), "mhandle")
    }))
}

pub(super) unsafe extern "C" fn reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    code(guard("regMrDmaBuf", || {
        non_null(mhandle, "mhandle")?;
        // Host memory ignores the fd; GPU memory with an fd is registered through the
        // dma-buf on every device of the connection before returning (NCCL closes the fd
        // right after); fd -1 means by address, as regMr.
        let t = ops::reg_mr_dmabuf(token(comm), data as usize, size, ptr_type, offset, fd)?;
        put(mhandle, as_ptr(t), "mhandle")
    }))
}

pub(super) unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    code(guard("deregMr", || {
        ops::dereg_mr(token(comm), token(mhandle))
    }))
}

pub(super) unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("iflush", || {
        non_null(request, "request")?;
        // Count and comm are checked before the arrays are read.
        let k = ops::iflush_count(token(recv_comm), n)?;
        let data = array(data, k, "data")?;
        let sizes = array(sizes, k, "sizes")?;
        let mhandles = array(mhandles, k, "mhandles")?;
        let bufs: Vec<ops::FlushBuf> = (0..k)
            .map(|i| ops::FlushBuf {
                addr: data[i] as usize,
                size: sizes[i],
                mr: token(mhandles[i]),
            })
            .collect();
        // NULL: nothing to flush (NCCL treats it as done).
        let t = ops::iflush(token(recv_comm), n, &bufs)?.unwrap_or(0);
        put(request, as_ptr(t), "request")
    }))
}

pub(super) unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> NcclResult {
    code(guard("test", || {
        non_null(done, "done")?;
        match ops::test(token(request))? {
            None => put(done, 0, "done"),
            Some(got) => {
                put_sizes(sizes, &got);
                put(done, 1, "done")
            }
        }
    }))
}

pub(super) unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
    code(guard("closeSend", || ops::close_send(token(comm))))
}

pub(super) unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
    code(guard("closeRecv", || ops::close_recv(token(comm))))
}

pub(super) unsafe extern "C" fn close_listen(comm: *mut c_void) -> NcclResult {
    code(guard("closeListen", || ops::close_listen(token(comm))))
}
