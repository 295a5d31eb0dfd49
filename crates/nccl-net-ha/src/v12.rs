//! The exported `ncclNetPlugin_v12` table (name "HA"), which NCCL 2.30 and later load. The
//! table has v11's members and signatures: only the properties changed (8 devices per virtual
//! NIC, then `railId` and `planeId`), so `getProperties` is new and every other entry is
//! v11's (`makeVDevice` stays NULL: the plugin does its own multi-NIC, so NCCL keeps using the
//! physical devices and never hands us an 8-device merge). `railId` and `planeId` are
//! `NCCL_NET_ID_UNDEF`: the plugin does not know the fabric's rails or planes, and a wrong
//! defined value would change how NCCL pairs NICs in rings and trees.
// A build with `HA_ABI_MAX` below 12 keeps the table but does not export it.
#![cfg_attr(not(ha_abi_v12), allow(dead_code))]

use super::adapt::*;
use super::shared;
use super::{v10, v11, v9};
use ha_core::api::ops::guard;
use nccl_net_abi::common::*;
use nccl_net_abi::v12::{
    NcclNetCommConfigV12, NcclNetPropertiesV12, NcclNetV12, NcclNetVDevicePropsV12,
    NCCL_NET_ID_UNDEF, NCCL_NET_MAX_DEVS_PER_NIC_V12,
};
use std::os::raw::{c_int, c_void};

/// NCCL 2.30+ loads this symbol first. Exported unless the build hides v12 (`HA_ABI_MAX`
/// below 12, see build.rs).
#[cfg_attr(ha_abi_v12, no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v12: NcclNetV12 = NcclNetV12 {
    name: c"HA".as_ptr(),
    init: Some(init),
    devices: Some(shared::devices),
    get_properties: Some(get_properties),
    listen: Some(v11::listen),
    connect: Some(v11::connect),
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
    finalize: Some(v11::finalize),
    set_net_attr: Some(v11::set_net_attr),
};

unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NcclNetCommConfigV12,
    logger: NcclDebugLogger,
    profiler: NcclProfilerCallback,
) -> NcclResult {
    code(guard("init", || {
        v11::context_init(12, ctx, comm_id, config, logger, profiler)
    }))
}

/// All 128 bytes of the v12 properties are written: NCCL passes uninitialised memory.
unsafe extern "C" fn get_properties(dev: c_int, props: *mut NcclNetPropertiesV12) -> NcclResult {
    code(guard("getProperties", || {
        non_null(props, "props")?;
        let p = v9::properties(dev)?;
        let mut devs = [0; NCCL_NET_MAX_DEVS_PER_NIC_V12];
        let n = (p.v_props.ndevs.max(0) as usize).min(p.v_props.devs.len());
        devs[..n].copy_from_slice(&p.v_props.devs[..n]);
        put(
            props,
            NcclNetPropertiesV12 {
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
                v_props: NcclNetVDevicePropsV12 {
                    ndevs: p.v_props.ndevs,
                    devs,
                },
                max_p2p_bytes: p.max_p2p_bytes,
                max_coll_bytes: p.max_coll_bytes,
                max_multi_request_size: 1,
                rail_id: NCCL_NET_ID_UNDEF,
                plane_id: NCCL_NET_ID_UNDEF,
            },
            "props",
        )
    }))
}
