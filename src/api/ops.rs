//! The plugin's operations in safe Rust, one per ext-net entry point. Arguments arrive as
//! plain values (addresses as `usize`, handles as `u64` tokens); every one is validated here.

use super::error::{ApiError, ApiResult, Code};
use super::handles::{kind_of, request_token, split_request, Kind};
use super::state::{self, MrEntry};
use crate::fabric::DeviceInfo;
use crate::transport::conn::connect::PendingConnect;
use crate::transport::conn::ha::HaCfg;
use crate::transport::conn::listen::ListenComm;
use crate::transport::conn::mr::MrHandle;
use crate::transport::conn::recv::RecvArg;
use crate::transport::data::layout::MAX_RECVS;
use crate::transport::data::ReqId;
use crate::transport::handle::{self, ConnectHandle, HANDLE_SIZE};

/// `ncclNetProperties` fields beyond the device's own.
pub const MAX_RECVS_ADVERTISED: i32 = MAX_RECVS as i32;

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

pub fn properties(dev: i32) -> ApiResult<DeviceInfo> {
    let d = device(dev)?;
    Ok(state::get()?.engine.fabric().devices()[d].clone())
}

fn ha_cfg() -> ApiResult<&'static HaCfg> {
    Ok(&state::get()?.ha)
}

pub fn listen(dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> ApiResult<u64> {
    let d = device(dev)?;
    let p = state::get()?;
    let l = ListenComm::new(&p.engine, d, p.oob_ip, ha_cfg()?, &p.cfg.stats_file, handle)?;
    p.listens.insert(l)
}

/// Non-blocking: `Ok(0)` until the connection is ready.
pub fn connect(dev: i32, h: &mut [u8; HANDLE_SIZE]) -> ApiResult<u64> {
    let d = device(dev)?;
    let p = state::get()?;
    let ch =
        ConnectHandle::decode(h).map_err(|e| ApiError::arg(format!("bad connect handle: {e}")))?;
    let mut token = handle::scratch(h);
    if token == 0 {
        let pc = PendingConnect::start(&p.engine, d, &ch, ha_cfg()?, &p.cfg.stats_file)?;
        token = p.connects.insert(pc)?;
        handle::set_scratch(h, token);
    }
    let pc = p.connects.get(token, "connect state in the handle")?;
    let step = pc.lock().step();
    drop(pc);
    match step {
        Ok(false) => Ok(0),
        Ok(true) => {
            handle::set_scratch(h, 0);
            let pc = p.connects.remove(token, "connect state")?;
            let pc = std::sync::Arc::try_unwrap(pc)
                .map_err(|_| ApiError::internal("connect state still shared"))?
                .into_inner();
            p.sends.insert(pc.finish())
        }
        Err(e) => {
            handle::set_scratch(h, 0);
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
        Some(rc) => p.recvs.insert(rc),
        None => Ok(0),
    }
}

/// The devices of a comm's paths, the active one first.
fn devices_of(comm: u64) -> ApiResult<Vec<std::sync::Arc<crate::engine::DeviceRes>>> {
    let p = state::get()?;
    match kind_of(comm) {
        Some(Kind::Send) => Ok(p.sends.get(comm, "comm")?.lock().devices()),
        Some(Kind::Recv) => Ok(p.recvs.get(comm, "comm")?.lock().devices()),
        _ if comm == 0 => Err(ApiError::arg("comm is NULL")),
        _ => Err(ApiError::arg(format!(
            "comm {comm:#x} is not a send or receive comm of this plugin"
        ))),
    }
}

pub fn reg_mr(comm: u64, addr: usize, size: usize, ptr_type: i32) -> ApiResult<u64> {
    let devs = devices_of(comm)?;
    let dev = devs[0].clone();
    let support = state::get()?.engine.fabric().devices()[dev.dev].ptr_support;
    if ptr_type <= 0 || ptr_type & !support != 0 {
        return Err(ApiError::arg(format!(
            "memory type {ptr_type} is not supported by this device (ptrSupport {support})"
        )));
    }
    if size == 0 {
        return Err(ApiError::arg("regMr of 0 bytes"));
    }
    if addr == 0 || addr.checked_add(size).is_none() {
        return Err(ApiError::arg(format!(
            "regMr of bad range {addr:#x}+{size}"
        )));
    }
    let handle = MrHandle::register(&dev, addr, size)?;
    if state::get()?.cfg.mr_eager {
        // HA_NCCL_MR_POLICY=eager: on the standby device too, now.
        for d in &devs[1..] {
            handle.keys_for(d)?;
        }
    }
    state::get()?.mrs.insert(MrEntry {
        handle: std::sync::Arc::new(handle),
    })
}

pub fn dereg_mr(comm: u64, mr: u64) -> ApiResult<()> {
    if comm == 0 {
        return Err(ApiError::arg("comm is NULL"));
    }
    if !matches!(kind_of(comm), Some(Kind::Send | Kind::Recv)) {
        return Err(ApiError::arg(format!(
            "comm {comm:#x} is not a send or receive comm of this plugin"
        )));
    }
    state::get()?.mrs.remove(mr, "mhandle").map(drop)
}

fn check_size(size: i64, what: &str) -> ApiResult<usize> {
    usize::try_from(size).map_err(|_| ApiError::arg(format!("{what} size {size} is negative")))
}

/// `Ok(0)`: the receiver has not posted yet, try later.
pub fn isend(comm: u64, addr: usize, size: i64, tag: i32, mr: u64) -> ApiResult<u64> {
    let size = check_size(size, "send")?;
    let p = state::get()?;
    let c = p.sends.get(comm, "sendComm")?;
    let m = p.mrs.get(mr, "mhandle")?.lock().handle.clone();
    let got = c.lock().isend(addr, size, tag, &m)?;
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
    let mut mrs = Vec::with_capacity(bufs.len());
    for b in bufs {
        check_size(b.size, "receive")?;
        mrs.push(p.mrs.get(b.mr, "mhandle")?.lock().handle.clone());
    }
    let args: Vec<RecvArg> = bufs
        .iter()
        .zip(&mrs)
        .map(|(b, m)| RecvArg {
            addr: b.addr,
            size: b.size as usize,
            tag: b.tag,
            mr: m,
        })
        .collect();
    let got = c.lock().irecv(&args)?;
    Ok(got.map_or(0, |id| request_token(Kind::RecvReq, comm, id)))
}

/// Host memory needs no flush: the request is complete at once.
pub fn iflush(comm: u64, n: i32) -> ApiResult<u64> {
    if n < 0 || n as usize > MAX_RECVS {
        return Err(ApiError::arg(format!("iflush of {n} buffers")));
    }
    let p = state::get()?;
    p.recvs.get(comm, "recvComm")?;
    Ok(request_token(
        Kind::FlushReq,
        comm,
        ReqId { index: 0, gen: 0 },
    ))
}

/// `Ok(Some(sizes))` when done (one size per buffer), `Ok(None)` while pending.
pub fn test(req: u64) -> ApiResult<Option<Vec<u64>>> {
    let (kind, index, gen, id) = split_request(req)?;
    let p = state::get()?;
    match kind {
        Kind::SendReq => {
            let c = p.sends.get_for_request(index, gen)?;
            let r = c.lock().test(id)?;
            Ok(r.map(|s| vec![s]))
        }
        Kind::RecvReq => {
            let c = p.recvs.get_for_request(index, gen)?;
            let r = c.lock().test(id)?;
            Ok(r)
        }
        _ => Ok(Some(Vec::new())),
    }
}

pub fn close_send(comm: u64) -> ApiResult<()> {
    state::get()?.sends.remove(comm, "sendComm").map(drop)
}

pub fn close_recv(comm: u64) -> ApiResult<()> {
    state::get()?.recvs.remove(comm, "recvComm").map(drop)
}

pub fn close_listen(comm: u64) -> ApiResult<()> {
    state::get()?.listens.remove(comm, "listenComm").map(drop)
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
