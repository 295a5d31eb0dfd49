//! The exported `ncclNetPlugin_v10` table (name "HA"). New adapters for what v10 changed:
//! `init` also takes NCCL's profiler callback (stored; the plugin defines no events),
//! `connect` takes the communicator's config, whose traffic class goes down to the
//! connection's queue pairs (and, through the handshake, the acceptor's), and `isend`/`irecv`
//! take profiler handles (ignored). The rest is v9's (properties) and v8's.

use super::adapt::*;
use super::{reload, shared};
use super::{v8, v9};
use ha_core::api::ops::{self, guard, Scope};
use nccl_net_abi::common::*;
use nccl_net_abi::v10::{NcclNetCommConfigV10, NcclNetDeviceHandleV10, NcclNetV10};
use std::os::raw::{c_int, c_void};

/// NCCL 2.26+ loads this symbol when it finds no newer one. Exported unless the build hides
/// v10 (`HA_ABI_MAX` below 10, see build.rs).
#[cfg_attr(ha_abi_v10, no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v10: NcclNetV10 = NcclNetV10 {
    name: c"HA".as_ptr(),
    init: Some(init),
    devices: Some(shared::devices),
    get_properties: Some(v9::get_properties),
    listen: Some(v8::listen),
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
    make_v_device: None,
};

unsafe extern "C" fn init(logger: NcclDebugLogger, profiler: NcclProfilerCallback) -> NcclResult {
    code(guard("init", || {
        install_logger(logger);
        store_profiler(profiler);
        ops::init()?;
        reload::on_init(logger, 10);
        Ok(())
    }))
}

/// The traffic class of a v10/v11 comm config (NULL: none).
pub(super) fn config_traffic_class(config: *const NcclNetCommConfigV10) -> Option<u8> {
    if config.is_null() {
        return None;
    }
    get(config, "config")
        .ok()
        .and_then(|c| ops::traffic_class(c.traffic_class))
}

unsafe extern "C" fn connect(
    dev: c_int,
    config: *mut NcclNetCommConfigV10,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut NcclNetDeviceHandleV10,
) -> NcclResult {
    code(guard("connect", || {
        non_null(send_comm, "sendComm")?;
        if !dev_comm.is_null() {
            put(dev_comm, std::ptr::null_mut(), "sendDevComm")?;
        }
        let scope = Scope {
            ctx: 0,
            traffic_class: config_traffic_class(config),
        };
        let t = ops::connect_in(scope, dev, handle_buf(handle)?)?;
        put(send_comm, as_ptr(t), "sendComm")
    }))
}

pub(super) unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("isend", || {
        v9::isend_sized(send_comm, data, size, tag, mhandle, request)
    }))
}

#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("irecv", || {
        v9::irecv_sized(recv_comm, n, data, sizes, tags, mhandles, request)
    }))
}
