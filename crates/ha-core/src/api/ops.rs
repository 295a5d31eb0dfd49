//! The plugin's operations in safe Rust, one per ext-net entry point. Arguments arrive as
//! plain values (addresses as `usize`, handles as `u64` tokens); every one is validated here.

use super::error::{ApiError, ApiResult, Code};
use super::gdr;
use super::handles::{kind_of, request_token, split_request, Kind};
pub use super::mem::{dereg_mr, iflush, iflush_count, reg_mr, reg_mr_dmabuf, FlushBuf};
use super::state::{self, NetAttr, NetContext, Plugin};
use crate::fabric::stages;
use crate::fabric::DeviceInfo;
use crate::transport::budget::Budget;
use crate::transport::connect::PendingConnect;
use crate::transport::ha::HaCfg;
use crate::transport::listen::ListenComm;
use crate::transport::mr::MrHandle;
use crate::transport::recv::RecvArg;
use ha_proto::data::layout::MAX_RECVS;
use ha_proto::handle::{self, ConnectHandle, HANDLE_SIZE};
use std::sync::Arc;

/// The most buffers one `irecv` takes (what an ABI adapter accepts before the connection
/// decides; [`max_recvs`] is what a device advertises).
pub const MAX_RECVS_ADVERTISED: i32 = MAX_RECVS as i32;

/// Largest message one `isend` may carry: the fabrics move a message as one write whose
/// length is a 32-bit field (verbs `ibv_sge.length`, `sock` frames), so 4 GiB − 1. Real RDMA
/// devices may allow less (`max_msg_sz`, often 1 GiB); [`MAX_P2P_BYTES`] keeps NCCL below.
pub const MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// `maxP2pBytes` advertised from v9 on: 1 GiB, the value NCCL's own adapter gives every v8
/// plugin (`MAX_NET_SIZE`), so NCCL chunks point-to-point transfers the same way whichever
/// ABI it loaded, and a single write never exceeds the 1 GiB `max_msg_sz` of common NICs.
pub const MAX_P2P_BYTES: usize = 1 << 30;

/// `maxCollBytes` advertised from v9 on: NCCL's `MAX_COLLNET_SIZE` (512 MiB), what its IB and
/// socket transports report. The plugin has no collective offload; NCCL ignores it for p2p.
pub const MAX_COLL_BYTES: usize = 512 << 20;

/// `forceFlush` advertised from v9 on: 0. NCCL then flushes GPU receives where the platform
/// needs it (GPUs before Hopper, C2C systems; `NCCL_NET_FORCE_FLUSH=1` forces it) and calls
/// `iflush`, which this plugin serves with a loopback RDMA READ. NCCL's IB transport sets it
/// only for mlx5 Data Direct devices, whose DMA comes from a separate PCIe function; this
/// plugin does not use Data Direct, so no device needs it.
pub const FORCE_FLUSH: i32 = 0;

/// Where a listen or connect belongs: the ext-net v11 context that owns it (0: none, v8–v10)
/// and the traffic class asked for its queue pairs (`None`: the fabric's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub ctx: u64,
    pub traffic_class: Option<u8>,
}

/// NCCL's `trafficClass` (`-1` = `NCCL_NET_TRAFFIC_CLASS_UNDEF`) as a traffic class: values
/// outside 0..=255 are logged and ignored rather than failing the communicator.
pub fn traffic_class(raw: i32) -> Option<u8> {
    match raw {
        -1 => None,
        0..=255 => Some(raw as u8),
        _ => {
            tracing::warn!(
                "NET/HA : traffic class {raw} is outside 0..=255 (or -1); using the default"
            );
            None
        }
    }
}

/// The traffic class a connection runs with. On `verbs`, `NCCL_IB_TC` (when set, not -1)
/// wins over the communicator's, as in NCCL's IB transport; `sock` has no such variable.
fn effective_traffic_class(p: &Plugin, asked: Option<u8>) -> Option<u8> {
    let ib_tc_set = std::env::var("NCCL_IB_TC")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .is_some_and(|v| v != -1);
    if p.engine.fabric().kind() == "verbs" && ib_tc_set {
        None
    } else {
        asked
    }
}

fn conn_cfg(p: &Plugin, scope: Scope) -> HaCfg {
    HaCfg {
        traffic_class: effective_traffic_class(p, scope.traffic_class),
        ..p.ha.clone()
    }
}

fn own(p: &Plugin, token: u64, ctx: u64) {
    if ctx != 0 {
        p.owners.lock().insert(token, ctx);
    }
}

fn disown(p: &Plugin, token: u64) -> Option<u64> {
    p.owners.lock().remove(&token)
}

/// A v11 context for communicator `comm_id` (initialises the plugin on first use).
pub fn context_init(comm_id: u64, traffic_class: Option<u8>) -> ApiResult<u64> {
    let p = state::init()?;
    p.contexts.insert(NetContext {
        comm_id,
        traffic_class,
        attr: None,
    })
}

/// The scope of a listen/connect made through context `ctx`.
pub fn context_scope(ctx: u64) -> ApiResult<Scope> {
    let c = state::get()?.contexts.get(ctx, "net context")?;
    let tc = c.lock().traffic_class;
    Ok(Scope {
        ctx,
        traffic_class: tc,
    })
}

/// `setNetAttr`: the hints are kept on the context (the plugin runs the same either way).
pub fn set_net_attr(ctx: u64, attr: NetAttr) -> ApiResult<()> {
    let c = state::get()?.contexts.get(ctx, "net context")?;
    let mut c = c.lock();
    if c.attr != Some(attr) {
        tracing::debug!("NET/HA : comm {:#x}: net attributes {attr:?}", c.comm_id);
    }
    c.attr = Some(attr);
    Ok(())
}

/// `finalize(ctx)`: ends context `ctx`. The engine (progress thread, devices, protection
/// domains, completion queues) is process-wide and shared by every context, so it stays.
/// What the context still owns — listen comms, send/receive comms and pending connects made
/// through it, and receive comms accepted on its listen comms — is closed, which joins the
/// fabric threads of their queue pairs (`sock` I/O threads); NCCL normally closed them all
/// already. Objects of other contexts, and of v8–v10 entry points, are not touched. Returns
/// how many objects it had to close.
pub fn context_finalize(ctx: u64) -> ApiResult<usize> {
    let p = state::get()?;
    let c = p.contexts.remove(ctx, "net context")?;
    let comm_id = c.lock().comm_id;
    let owned: Vec<u64> = {
        let mut o = p.owners.lock();
        let v: Vec<u64> = o
            .iter()
            .filter(|(_, &c)| c == ctx)
            .map(|(&t, _)| t)
            .collect();
        for t in &v {
            o.remove(t);
        }
        v
    };
    let mut closed = 0;
    for t in owned {
        let gone = match kind_of(t) {
            Some(Kind::Listen) => p.listens.remove(t, "listenComm").is_ok(),
            Some(Kind::Send) => p.sends.remove(t, "sendComm").is_ok(),
            Some(Kind::Recv) => p.recvs.remove(t, "recvComm").is_ok(),
            Some(Kind::Connect) => p.connects.remove(t, "connect state").is_ok(),
            _ => false,
        };
        closed += usize::from(gone);
    }
    if closed > 0 {
        tracing::warn!(
            "NET/HA : finalize of comm {comm_id:#x}: closed {closed} object(s) NCCL left open"
        );
    }
    Ok(closed)
}

pub fn init() -> ApiResult<()> {
    state::init().map(|_| ())
}

pub fn devices() -> ApiResult<i32> {
    Ok(state::get()?.engine.fabric().devices().len() as i32)
}

fn device(dev: i32) -> ApiResult<usize> {
    let n = devices()?;
    if dev < 0 || dev >= n {
        return Err(ApiError::arg(format!(
            "device {dev} does not exist (this plugin has {n})"
        )));
    }
    Ok(dev as usize)
}

/// Device `dev` as NCCL sees it. GPU memory types are advertised only where the standby a
/// connection on `dev` gets can register them too (`gdr::advertised`).
/// `maxP2pBytes` of device `dev` (v9+): [`MAX_P2P_BYTES`], or less when a device of the
/// fabric takes smaller messages (`max_msg_sz`; Soft-RoCE ports report 8 MiB). Every device
/// counts, since a connection's standby may be on any of them: NCCL then splits point-to-point
/// transfers below what every path of a connection can carry, instead of meeting the clear
/// error `isend` gives a larger message.
pub fn max_p2p_bytes(dev: i32) -> ApiResult<usize> {
    device(dev)?;
    let p = state::get()?;
    let smallest = p
        .engine
        .fabric()
        .devices()
        .iter()
        .map(|d| d.max_msg_bytes)
        .min()
        .unwrap_or(u64::MAX);
    Ok(MAX_P2P_BYTES.min(usize::try_from(smallest).unwrap_or(usize::MAX)))
}

pub fn properties(dev: i32) -> ApiResult<DeviceInfo> {
    let d = device(dev)?;
    let p = state::get()?;
    let devs = p.engine.fabric().devices();
    let mut info = devs[d].clone();
    let shown = gdr::advertised(devs, d, &p.ha);
    if shown != info.ptr_support {
        tracing::debug!(
            "NET/HA : {}: ptrSupport {} advertised as {shown}: its standby cannot register the other GPU memory types",
            info.name,
            info.ptr_support
        );
    }
    info.ptr_support = shown;
    Ok(info)
}

/// Devices whose budget was logged (one INFO line per device, at the first `getProperties`).
static BUDGET_LOGGED: parking_lot::Mutex<Vec<bool>> = parking_lot::Mutex::new(Vec::new());

/// Device `dev`'s connection budget (`maxComms`); logs it once per device.
pub fn comm_budget(dev: i32) -> ApiResult<Budget> {
    let info = properties(dev)?;
    let budget = Budget::for_device(info.limits);
    let d = dev as usize;
    let mut logged = BUDGET_LOGGED.lock();
    if logged.len() <= d {
        logged.resize(d + 1, false);
    }
    if !std::mem::replace(&mut logged[d], true) {
        tracing::info!(
            init = true,
            "NET/HA : device {dev} ({}): {}",
            info.name,
            budget.describe()
        );
    }
    Ok(budget)
}

/// `maxRecvs` of device `dev`: one buffer per receive while this process's receive
/// connections offer eager rings (`HA_NCCL_SOCK_EAGER` on `sock`, as NCCL's Socket transport
/// takes one), else [`MAX_RECVS_ADVERTISED`].
pub fn max_recvs(dev: i32) -> ApiResult<i32> {
    device(dev)?;
    let p = state::get()?;
    Ok(if p.ha.eager_ring(p.engine.fabric().kind()) {
        1
    } else {
        MAX_RECVS_ADVERTISED
    })
}

/// `maxComms` of device `dev` for NCCL's properties.
pub fn max_comms(dev: i32) -> ApiResult<i32> {
    Ok(i32::try_from(comm_budget(dev)?.max_comms).unwrap_or(i32::MAX))
}

pub fn listen(dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> ApiResult<u64> {
    listen_in(Scope::default(), dev, handle)
}

/// `listen` on behalf of `scope` (v11: the context; the traffic class is for accepted
/// connections whose connector offers none).
pub fn listen_in(scope: Scope, dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> ApiResult<u64> {
    let d = device(dev)?;
    let p = state::get()?;
    let cfg = conn_cfg(p, scope);
    let l = ListenComm::new(&p.engine, d, p.oob_ip, &cfg, &p.cfg.stats_file, handle)?;
    let t = p.listens.insert(l)?;
    own(p, t, scope.ctx);
    Ok(t)
}

/// Non-blocking: `Ok(0)` until the connection is ready.
pub fn connect(dev: i32, h: &mut [u8; HANDLE_SIZE]) -> ApiResult<u64> {
    connect_in(Scope::default(), dev, h)
}

/// `connect` on behalf of `scope` (v10: the comm config's traffic class; v11: the context).
/// The scope of the first call of a connection counts; later calls only advance it.
pub fn connect_in(scope: Scope, dev: i32, h: &mut [u8; HANDLE_SIZE]) -> ApiResult<u64> {
    let d = device(dev)?;
    let p = state::get()?;
    let ch =
        ConnectHandle::decode(h).map_err(|e| ApiError::arg(format!("bad connect handle: {e}")))?;
    let mut token = handle::scratch(h);
    if token == 0 {
        let cfg = conn_cfg(p, scope);
        let pc = PendingConnect::start(&p.engine, d, &ch, &cfg, &p.cfg.stats_file)?;
        token = p.connects.insert(pc)?;
        own(p, token, scope.ctx);
        handle::set_scratch(h, token);
    }
    let pc = p.connects.get(token, "connect state in the handle")?;
    let step = pc.lock().step();
    drop(pc);
    match step {
        Ok(false) => Ok(0),
        Ok(true) => {
            handle::set_scratch(h, 0);
            let owner = disown(p, token);
            let pc = p.connects.remove(token, "connect state")?;
            let pc = std::sync::Arc::try_unwrap(pc)
                .map_err(|_| ApiError::internal("connect state still shared"))?
                .into_inner();
            let t = p.sends.insert(pc.finish())?;
            own(p, t, owner.unwrap_or(0));
            Ok(t)
        }
        Err(e) => {
            handle::set_scratch(h, 0);
            disown(p, token);
            let _ = p.connects.remove(token, "connect state");
            Err(e.into())
        }
    }
}

/// Non-blocking: `Ok(0)` until a peer completed its handshake.
pub fn accept(listen: u64) -> ApiResult<u64> {
    let p = state::get()?;
    let l = p.listens.get(listen, "listenComm")?;
    let got = l.lock().accept()?;
    match got {
        Some(rc) => {
            let t = p.recvs.insert(rc)?;
            let owner = p.owners.lock().get(&listen).copied();
            own(p, t, owner.unwrap_or(0));
            Ok(t)
        }
        None => Ok(0),
    }
}

fn check_size(size: i64, what: &str) -> ApiResult<usize> {
    usize::try_from(size).map_err(|_| ApiError::arg(format!("{what} size {size} is negative")))
}

/// `Ok(0)`: the receiver has not posted yet, try later.
pub fn isend(comm: u64, addr: usize, size: i64, tag: i32, mr: u64) -> ApiResult<u64> {
    isend_bytes(comm, addr, check_size(size, "send")?, tag, mr)
}

/// `isend` with an unsigned size (v9+ `size_t`), up to [`MAX_MESSAGE_BYTES`].
pub fn isend_bytes(comm: u64, addr: usize, size: usize, tag: i32, mr: u64) -> ApiResult<u64> {
    if size > MAX_MESSAGE_BYTES {
        return Err(ApiError::arg(format!(
            "send of {size} bytes is over the {MAX_MESSAGE_BYTES}-byte message limit"
        )));
    }
    stages::mark("isend", size as u64);
    let p = state::get()?;
    let c = p.sends.get(comm, "sendComm")?;
    let m = p.mrs.get(mr, "mhandle")?.lock().handle.clone();
    let got = c.lock().isend(addr, size, tag, &m)?;
    if got.is_none() {
        stages::mark("isend_none", size as u64);
    }
    Ok(got.map_or(0, |id| request_token(Kind::SendReq, comm, id)))
}

/// One receive buffer as NCCL passes it.
#[derive(Clone, Copy, Debug)]
pub struct RecvBuf {
    pub addr: usize,
    pub size: i64,
    pub tag: i32,
    pub mr: u64,
}

/// `Ok(0)`: too many receives outstanding, try later.
pub fn irecv(comm: u64, bufs: &[RecvBuf]) -> ApiResult<u64> {
    irecv_hinted(comm, bufs, false)
}

/// `irecv` with NCCL's hint (v9+) that it does not need the completion
/// (`NCCL_NET_OPTIONAL_RECV_COMPLETION`: LL/LL128, where NCCL polls flags in the data).
///
/// The hint is counted and otherwise changes nothing: the request still completes only once
/// the sender's completion record has arrived. Completing earlier would end the receive's
/// exactly-once tracking while its data may still be in flight on a path that then fails:
/// the replay after a failover relies on the receiver knowing which receives it delivered
/// (`Switch` carries the delivered sequence), and an early completion would let NCCL reuse
/// the buffer (or the request slot) before a replay lands in it. Nothing else in a receive
/// is optional (the posted clear-to-send is what the sender writes through), so there is
/// no work that is safe to skip.
pub fn irecv_hinted(comm: u64, bufs: &[RecvBuf], optional_completion: bool) -> ApiResult<u64> {
    if optional_completion {
        let n = state::get()?
            .optional_recvs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == 0 {
            tracing::info!(
                "NET/HA : NCCL marks LL/LL128 receives completion-optional; they complete as usual (exactly-once across failover needs the completion record)"
            );
        }
    }
    stages::mark("irecv", bufs.first().map_or(0, |b| b.size.max(0) as u64));
    if bufs.is_empty() || bufs.len() > MAX_RECVS {
        return Err(ApiError::arg(format!(
            "irecv of {} buffers (1..={MAX_RECVS} supported)",
            bufs.len()
        )));
    }
    let p = state::get()?;
    let c = p.recvs.get(comm, "recvComm")?;
    // Clone the handles out (no lock held): the buffers of one multi-receive often share
    // one registration.
    let handle = |b: &RecvBuf| -> ApiResult<Arc<MrHandle>> {
        check_size(b.size, "receive")?;
        Ok(p.mrs.get(b.mr, "mhandle")?.lock().handle.clone())
    };
    let arg = |b: &RecvBuf, mr| RecvArg {
        addr: b.addr,
        size: b.size as usize,
        tag: b.tag,
        mr,
    };
    let got = if let [b] = bufs {
        // One buffer, what NCCL posts almost always: nothing allocated.
        let mr = handle(b)?;
        c.lock().irecv(&[arg(b, &mr)])?
    } else {
        let mrs = bufs.iter().map(handle).collect::<ApiResult<Vec<_>>>()?;
        let args: Vec<RecvArg> = bufs.iter().zip(&mrs).map(|(b, m)| arg(b, m)).collect();
        c.lock().irecv(&args)?
    };
    Ok(got.map_or(0, |id| request_token(Kind::RecvReq, comm, id)))
}

/// `Ok(Some(sizes))` when done (one size per buffer), `Ok(None)` while pending.
pub fn test(req: u64) -> ApiResult<Option<Vec<u64>>> {
    let (kind, index, gen, id) = split_request(req)?;
    let p = state::get()?;
    match kind {
        Kind::SendReq => {
            let c = p.sends.get_for_request(index, gen)?;
            let r = c.lock().test(id)?;
            if r.is_some() {
                stages::mark("send_done", 0);
            }
            Ok(r.map(|s| vec![s]))
        }
        Kind::RecvReq => {
            let c = p.recvs.get_for_request(index, gen)?;
            let r = c.lock().test(id)?;
            if r.is_some() {
                stages::mark("recv_done", 0);
            }
            Ok(r)
        }
        Kind::FlushReq if id.gen == 0 => Ok(Some(Vec::new())),
        Kind::FlushReq => {
            let c = p.recvs.get_for_request(index, gen)?;
            let done = c.lock().test_flush(id)?;
            Ok(done.then(Vec::new))
        }
        _ => Ok(Some(Vec::new())),
    }
}

pub fn close_send(comm: u64) -> ApiResult<()> {
    stages::dump();
    let p = state::get()?;
    p.sends.remove(comm, "sendComm")?;
    disown(p, comm);
    Ok(())
}

pub fn close_recv(comm: u64) -> ApiResult<()> {
    stages::dump();
    let p = state::get()?;
    p.recvs.remove(comm, "recvComm")?;
    disown(p, comm);
    Ok(())
}

pub fn close_listen(comm: u64) -> ApiResult<()> {
    let p = state::get()?;
    p.listens.remove(comm, "listenComm")?;
    disown(p, comm);
    Ok(())
}

/// Receives posted with `NCCL_NET_OPTIONAL_RECV_COMPLETION` so far.
pub fn optional_recvs() -> ApiResult<u64> {
    Ok(state::get()?
        .optional_recvs
        .load(std::sync::atomic::Ordering::Relaxed))
}

/// Run an entry point: panics become `InternalError`, errors are logged once with the
/// entry point's name.
pub fn guard<F: FnOnce() -> ApiResult<()>>(name: &'static str, f: F) -> Code {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => Code::Success,
        Ok(Err(e)) => {
            tracing::warn!("NET/HA {name}: {}", e.msg);
            e.code
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::warn!("NET/HA {name}: internal error: {msg}");
            Code::InternalError
        }
    }
}
