//! The exported `ncclNetPlugin_v9` table (name "HA"). New adapters for what v9 changed —
//! the properties (`forceFlush`, one physical device per virtual NIC, `maxP2pBytes`,
//! `maxCollBytes`), `size_t` sizes in `isend`/`irecv`, and NCCL's
//! `NCCL_NET_OPTIONAL_RECV_COMPLETION` hint in `irecv` — and v8's entry points for the rest.
//! `makeVDevice` is NULL: the plugin does its own multi-NIC (primary + standby per
//! connection), so NCCL keeps using the physical devices.

use super::adapt::*;
use super::shared;
use super::v8;
use ha_core::api::ops::{self, guard};
use ha_core::api::ApiResult;
use nccl_net_abi::common::*;
use nccl_net_abi::v9::{NcclNetPropertiesV9, NcclNetV9, NcclNetVDevicePropsV9};
use std::os::raw::{c_int, c_void};

/// NCCL 2.24+ loads this symbol when it finds no newer one. Exported unless the build hides
/// v9 (`HA_ABI_MAX=8`, see build.rs).
#[cfg_attr(ha_abi_v9, no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclNetPlugin_v9: NcclNetV9 = NcclNetV9 {
    name: c"HA".as_ptr(),
    init: Some(v8::init),
    devices: Some(shared::devices),
    get_properties: Some(get_properties),
    listen: Some(v8::listen),
    connect: Some(v8::connect),
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

/// The v9 (and v10) properties of device `dev`.
pub(super) fn properties(dev: c_int) -> ApiResult<NcclNetPropertiesV9> {
    let d = ops::properties(dev)?;
    let (name, pci) = leak_names(dev as usize, &d);
    let mut devs = [0; NCCL_NET_MAX_DEVS_PER_NIC];
    devs[0] = dev;
    Ok(NcclNetPropertiesV9 {
        name,
        pci_path: pci,
        guid: d.guid,
        ptr_support: d.ptr_support,
        reg_is_global: 0,
        force_flush: ops::FORCE_FLUSH,
        speed: d.speed_mbps,
        port: d.port,
        latency: 0.0,
        max_comms: ops::max_comms(dev)?,
        max_recvs: ops::max_recvs(dev)?,
        net_device_type: NCCL_NET_DEVICE_HOST,
        net_device_version: 0,
        v_props: NcclNetVDevicePropsV9 { ndevs: 1, devs },
        max_p2p_bytes: ops::max_p2p_bytes(dev)?,
        max_coll_bytes: ops::MAX_COLL_BYTES,
    })
}

pub(super) unsafe extern "C" fn get_properties(
    dev: c_int,
    props: *mut NcclNetPropertiesV9,
) -> NcclResult {
    code(guard("getProperties", || {
        non_null(props, "props")?;
        put(props, properties(dev)?, "props")
    }))
}

/// `isend` with a `size_t` size (shared with v10/v11, which add a profiler handle).
pub(super) fn isend_sized(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ApiResult<()> {
    non_null(request, "request")?;
    let t = ops::isend_bytes(token(send_comm), data as usize, size, tag, token(mhandle))?;
    put(request, as_ptr(t), "request")
}

/// `irecv` with `size_t` sizes and the optional-completion hint (shared with v10/v11).
pub(super) fn irecv_sized(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ApiResult<()> {
    let optional = optional_completion(request)?;
    let posted = (|| {
        let n = recv_count(n)?;
        let sizes = array(sizes, n, "sizes")?;
        let bufs = recv_bufs(n, data, tags, mhandles, |i| size_t(sizes[i], "receive"))?;
        ops::irecv_hinted(token(recv_comm), &bufs, optional)
    })();
    // NCCL preset `*request` to the hint: always overwrite it, with NULL on failure, so the
    // hint value is never taken for a posted request.
    put(request, as_ptr(*posted.as_ref().unwrap_or(&0)), "request")?;
    posted.map(drop)
}

unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("isend", || {
        isend_sized(send_comm, data, size, tag, mhandle, request)
    }))
}

unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    code(guard("irecv", || {
        irecv_sized(recv_comm, n, data, sizes, tags, mhandles, request)
    }))
}
