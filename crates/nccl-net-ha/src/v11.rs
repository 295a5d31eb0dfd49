//! The exported `ncclNetPlugin_v11` table (name "HA"). New adapters for what v11 changed:
//! `init` runs once per NCCL communicator and returns a context (`api::ops::context_init`)
//! holding the communicator's id and traffic class; `listen`/`connect` take that context, so
//! the connections they open belong to it; `finalize(ctx)` ends it; `setNetAttr(ctx, attr)`
//! stores NCCL's hints on it; the properties add `maxMultiRequestSize` (1: no multi-request).
//! The rest is v10's (`isend`/`irecv`) and v8's.
//!
//! `finalize(ctx)` — see `api::ops::context_finalize`: the engine (progress thread, devices,
//! protection domains, completion queues) is process-wide and shared by all contexts, so it
//! stays; whatever the context still owns (listen/send/receive comms and pending connects
//! made through it, receive comms accepted on its listen comms) is closed, which joins their
//! queue pairs' fabric threads; other contexts' objects are untouched. `finalize(NULL)`
//! succeeds and does nothing: NCCL calls it with the context still NULL after a failed
//! `init`.

use super::adapt::*;
use super::{reload, shared};
use super::{v10, v9};
use ha_core::api::ops::{self, guard};
use ha_core::api::state::NetAttr;
use ha_core::api::ApiResult;
use nccl_net_abi::common::*;
use nccl_net_abi::v11::{
    NcclNetAttrV11, NcclNetCommConfigV11, NcclNetDeviceHandleV11, NcclNetPropertiesV11, NcclNetV11,
};
use std::os::raw::{c_int, c_void};

/// NCCL 2.28+ loads this symbol first. Exported unless the build hides v11 (`HA_ABI_MAX`
/// below 11, see build.rs).
#[cfg_attr(ha_abi_v11, no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v11: NcclNetV11 = NcclNetV11 {
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
    isend: Some(v10::isend),
    irecv: Some(v10::irecv),
    iflush: Some(shared::iflush),
    test: Some(shared::test),
    close_send: Some(shared::close_send),
    close_recv: Some(shared::close_recv),
    close_listen: Some(shared::close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
    finalize: Some(finalize),
    set_net_attr: Some(set_net_attr),
};

unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NcclNetCommConfigV11,
    logger: NcclDebugLogger,
    profiler: NcclProfilerCallback,
) -> NcclResult {
    code(guard("init", || {
        context_init(11, ctx, comm_id, config, logger, profiler)
    }))
}

/// The per-communicator `init` of v11 and v12 (`abi`: the version NCCL called).
pub(super) fn context_init(
    abi: u32,
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NcclNetCommConfigV11,
    logger: NcclDebugLogger,
    profiler: NcclProfilerCallback,
) -> ApiResult<()> {
    non_null(ctx, "ctx")?;
    install_logger(logger);
    store_profiler(profiler);
    let t = ops::context_init(comm_id, v10::config_traffic_class(config))?;
    put(ctx, as_ptr(t), "ctx")?;
    reload::on_init(logger, abi);
    Ok(())
}

unsafe extern "C" fn get_properties(dev: c_int, props: *mut NcclNetPropertiesV11) -> NcclResult {
    code(guard("getProperties", || {
        non_null(props, "props")?;
        let p = v9::properties(dev)?;
        put(
            props,
            NcclNetPropertiesV11 {
                name: p.name,
                pci_path: p.pci_path,
                guid: p.guid,
                ptr_support: p.ptr_support,
                reg_is_global: p.reg_is_global,
                force_flush: p.force_flush,
                speed: p.speed,
                port: p.port,
                latency: p.latency,
                max_comms: p.max_comms,
                max_recvs: p.max_recvs,
                net_device_type: p.net_device_type,
                net_device_version: p.net_device_version,
                v_props: p.v_props,
                max_p2p_bytes: p.max_p2p_bytes,
                max_coll_bytes: p.max_coll_bytes,
                max_multi_request_size: 1,
            },
            "props",
        )
    }))
}

pub(super) unsafe extern "C" fn listen(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    code(guard("listen", || {
        non_null(listen_comm, "listenComm")?;
        let scope = ops::context_scope(token(ctx))?;
        let t = ops::listen_in(scope, dev, handle_buf(handle)?)?;
        put(listen_comm, as_ptr(t), "listenComm")
    }))
}

pub(super) unsafe extern "C" fn connect(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut NcclNetDeviceHandleV11,
) -> NcclResult {
    code(guard("connect", || {
        non_null(send_comm, "sendComm")?;
        if !dev_comm.is_null() {
            put(dev_comm, std::ptr::null_mut(), "sendDevComm")?;
        }
        let scope = ops::context_scope(token(ctx))?;
        let t = ops::connect_in(scope, dev, handle_buf(handle)?)?;
        put(send_comm, as_ptr(t), "sendComm")
    }))
}

pub(super) unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    code(guard("finalize", || {
        if ctx.is_null() {
            return Ok(());
        }
        ops::context_finalize(token(ctx)).map(drop)
    }))
}

pub(super) unsafe extern "C" fn set_net_attr(
    ctx: *mut c_void,
    attr: *mut NcclNetAttrV11,
) -> NcclResult {
    code(guard("setNetAttr", || {
        let a = get(attr, "netAttr")?;
        let side = |c: &nccl_net_abi::v11::NcclNetCommAttrV11| {
            [
                c.max_concurrent_peers,
                c.min_concurrent_peers,
                c.max_flows_per_peer,
                c.min_flows_per_peer,
            ]
        };
        ops::set_net_attr(
            token(ctx),
            NetAttr {
                send: side(&a.send_comm_attr),
                recv: side(&a.recv_comm_attr),
                op: a.op,
                algo: a.algo,
                proto: a.proto,
            },
        )
    }))
}
