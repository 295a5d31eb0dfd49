//! The exported `ncclNetPlugin_v8` table and its thin adapters: each entry point checks the
//! C pointers NCCL hands in, converts them to plain values, and calls `api::ops` under
//! `api::ops::guard` (panic-safe, errors logged and mapped to `ncclResult_t`). The entry
//! points whose C signature did not change in later versions are shared with v9–v11's tables.

use super::adapt::*;
use super::common::*;
use super::v8_types::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use crate::api::ops::{self, guard};
use std::os::raw::{c_int, c_void};

/// NCCL 2.20+ loads this symbol when it finds no newer one (always exported); `name` is what
/// `NCCL_NET=HA` matches.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v8: NcclNetV8 = NcclNetV8 {
    name: c"HA".as_ptr(),
    init: Some(init),
    devices: Some(devices),
    get_properties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr: Some(dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
};

pub(super) unsafe extern "C" fn init(logger: NcclDebugLogger) -> NcclResult {
    code(guard("init", || {
        install_logger(logger);
        ops::init()
    }))
}

pub(super) unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    code(guard("devices", || put(ndev, ops::devices()?, "ndev")))
}

unsafe extern "C" fn get_properties(dev: c_int, props: *mut NcclNetPropertiesV8) -> NcclResult {
    code(guard("getProperties", || {
        let d = ops::properties(dev)?;
        let (name, pci) = leak_names(dev as usize, &d);
        put(
            props,
            NcclNetPropertiesV8 {
                name,
                pci_path: pci,
                guid: d.guid,
                ptr_support: d.ptr_support,
                reg_is_global: 0,
                speed: d.speed_mbps,
                port: d.port,
                latency: 0.0,
                max_comms: d.max_comms,
                max_recvs: ops::MAX_RECVS_ADVERTISED,
                net_device_type: NCCL_NET_DEVICE_HOST,
                net_device_version: 0,
            },
            "props",
        )
    }))
}

pub(super) unsafe extern "C" fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    code(guard("listen", || {
        non_null(listen_comm, "listenComm")?;
        let t = ops::listen(dev, handle_buf(handle)?)?;
        put(listen_comm, as_ptr(t), "listenComm")
    }))
}

pub(super) unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut NcclNetDeviceHandleV8,
) -> NcclResult {
    code(guard("connect", || {
        non_null(send_comm, "sendComm")?;
        if !dev_comm.is_null() {
            put(dev_comm, std::ptr::null_mut(), "sendDevComm")?;
        }
        let t = ops::connect(dev, handle_buf(handle)?)?;
        put(send_comm, as_ptr(t), "sendComm")
    }))
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
    _offset: u64,
    _fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    code(guard("regMrDmaBuf", || {
        non_null(mhandle, "mhandle")?;
        // The memory type decides: host memory needs no dma-buf; others are refused by
        // the device's ptrSupport check.
        let t = ops::reg_mr(token(comm), data as usize, size, ptr_type)?;
        put(mhandle, as_ptr(t), "mhandle")
    }))
}

pub(super) unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    code(guard("deregMr", || {
        ops::dereg_mr(token(comm), token(mhandle))
    }))
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("isend", || {
        non_null(request, "request")?;
        let t = ops::isend(
            token(send_comm),
            data as usize,
            size as i64,
            tag,
            token(mhandle),
        )?;
        put(request, as_ptr(t), "request")
    }))
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("irecv", || {
        non_null(request, "request")?;
        let n = recv_count(n)?;
        let sizes = array(sizes, n, "sizes")?;
        let bufs = recv_bufs(n, data, tags, mhandles, |i| Ok(i64::from(sizes[i])))?;
        let t = ops::irecv(token(recv_comm), &bufs)?;
        put(request, as_ptr(t), "request")
    }))
}

pub(super) unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("iflush", || {
        non_null(request, "request")?;
        let t = ops::iflush(token(recv_comm), n)?;
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
