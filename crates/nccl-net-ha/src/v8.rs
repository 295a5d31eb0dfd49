//! The exported `ncclNetPlugin_v8` table and its thin adapters: each entry point checks the
//! C pointers NCCL hands in, converts them to plain values, and calls `api::ops` under
//! `api::ops::guard` (panic-safe, errors logged and mapped to `ncclResult_t`). The entry
//! points whose C signature did not change in later versions are shared with v9–v11's tables.

use super::adapt::*;
use super::{reload, shared};
use ha_core::api::ops::{self, guard};
use nccl_net_abi::common::*;
use nccl_net_abi::v8::{NcclNetDeviceHandleV8, NcclNetPropertiesV8, NcclNetV8};
use std::os::raw::{c_int, c_void};

/// NCCL 2.20+ loads this symbol when it finds no newer one (always exported); `name` is what
/// `NCCL_NET=HA` matches.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v8: NcclNetV8 = NcclNetV8 {
    name: c"HA".as_ptr(),
    init: Some(init),
    devices: Some(shared::devices),
    get_properties: Some(get_properties),
    listen: Some(listen),
    connect: Some(connect),
    accept: Some(shared::accept),
    reg_mr: Some(shared::reg_mr),
    reg_mr_dma_buf: Some(shared::reg_mr_dma_buf),
    dereg_mr: Some(shared::dereg_mr),
    isend: Some(isend),
    irecv: Some(irecv),
    iflush: Some(shared::iflush),
    test: Some(shared::test),
    close_send: Some(shared::close_send),
    close_recv: Some(shared::close_recv),
    close_listen: Some(shared::close_listen),
    get_device_mr: None,
    irecv_consumed: None,
};

pub(super) unsafe extern "C" fn init(logger: NcclDebugLogger) -> NcclResult {
    code(guard("init", || {
        install_logger(logger);
        ops::init()?;
        reload::on_init(logger, 8);
        Ok(())
    }))
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
                max_comms: ops::max_comms(dev)?,
                max_recvs: ops::max_recvs(dev)?,
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
