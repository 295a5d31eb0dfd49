//! The memory entry points: `regMr`, `regMrDmaBuf`, `deregMr` (host memory, GPU memory by
//! address, GPU memory through a dma-buf) and `iflush` (GPU receives made visible to the GPU).
//! Re-exported by `ops`.

use super::error::{ApiError, ApiResult};
use super::gdr;
use super::handles::{kind_of, request_token, Kind};
use super::state::{self, MrEntry};
use crate::transport::mr::MrHandle;
use ha_proto::data::layout::MAX_RECVS;
use ha_proto::data::ReqId;

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

/// `regMr`: host memory, or GPU memory by address (`NCCL_PTR_CUDA`, nvidia-peermem).
pub fn reg_mr(comm: u64, addr: usize, size: usize, ptr_type: i32) -> ApiResult<u64> {
    reg_mr_in(comm, addr, size, ptr_type, None)
}

/// `regMrDmaBuf`: as `regMr`, and GPU memory through dma-buf `fd` (`addr` sits `offset` bytes
/// into it; fd -1 = by address). The fd is used during this call only (NCCL closes it right
/// after): the registration is made on every device of the connection now.
pub fn reg_mr_dmabuf(
    comm: u64,
    addr: usize,
    size: usize,
    ptr_type: i32,
    offset: u64,
    fd: i32,
) -> ApiResult<u64> {
    reg_mr_in(comm, addr, size, ptr_type, Some((offset, fd)))
}

fn reg_mr_in(
    comm: u64,
    addr: usize,
    size: usize,
    ptr_type: i32,
    dmabuf: Option<(u64, i32)>,
) -> ApiResult<u64> {
    let devs = devices_of(comm)?;
    let p = state::get()?;
    let infos = p.engine.fabric().devices();
    // What every device of this connection can register (the primary's, less the standby's).
    let support = devs.iter().fold(infos[devs[0].dev].ptr_support, |a, d| {
        a & infos[d.dev].ptr_support
    });
    let plan = gdr::plan(ptr_type, dmabuf, support).map_err(ApiError::arg)?;
    if size == 0 {
        return Err(ApiError::arg("regMr of 0 bytes"));
    }
    if addr == 0 || addr.checked_add(size).is_none() {
        return Err(ApiError::arg(format!(
            "regMr of bad range {addr:#x}+{size}"
        )));
    }
    let handle = match plan {
        gdr::Plan::DmaBuf { offset, fd } => {
            let what = crate::fabric::verbs::gdr::dmabuf::check_fd(fd)
                .map_err(|e| ApiError::arg(format!("dma-buf fd {fd} is not open: {e}")))?;
            tracing::debug!(
                "NET/HA : regMrDmaBuf {addr:#x}+{size} fd {fd} ({what}) offset {offset} on {} device(s)",
                devs.len()
            );
            MrHandle::register_dmabuf(&devs, addr, size, offset, fd)?
        }
        _ => {
            let handle = MrHandle::register_kind(&devs[0], addr, size, plan.kind())?;
            if p.cfg.mr_eager {
                // HA_NCCL_MR_POLICY=eager: on the standby device too, now.
                for d in &devs[1..] {
                    handle.keys_for(d)?;
                }
            }
            handle
        }
    };
    p.mrs.insert(MrEntry {
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

/// One received buffer of an `iflush`.
#[derive(Clone, Copy, Debug)]
pub struct FlushBuf {
    pub addr: usize,
    pub size: i32,
    pub mr: u64,
}

/// The buffer count of an `iflush` on `comm`, checked (before the C arrays are read).
pub fn iflush_count(comm: u64, n: i32) -> ApiResult<usize> {
    if n < 0 || n as usize > MAX_RECVS {
        return Err(ApiError::arg(format!("iflush of {n} buffers")));
    }
    state::get()?.recvs.get(comm, "recvComm")?;
    Ok(n as usize)
}

/// `iflush`: `Ok(None)` = nothing to flush (NCCL reads a NULL request as done). Host memory
/// needs no flush: its request is complete at once. GPU memory gets a 1-byte RDMA READ on
/// the active path (`transport::flush`), unless `NCCL_GDR_FLUSH_DISABLE` is set.
pub fn iflush(comm: u64, n: i32, bufs: &[FlushBuf]) -> ApiResult<Option<u64>> {
    iflush_count(comm, n)?;
    if bufs.len() != n as usize {
        return Err(ApiError::arg(format!(
            "iflush of {n} buffers given {} entries",
            bufs.len()
        )));
    }
    let p = state::get()?;
    let c = p.recvs.get(comm, "recvComm")?;
    let sizes: Vec<i32> = bufs.iter().map(|b| b.size).collect();
    let Some(last) = gdr::flush_target(&sizes) else {
        return Ok(None);
    };
    let b = bufs[last];
    let mr = p.mrs.get(b.mr, "mhandle")?.lock().handle.clone();
    if !mr.kind.is_gpu() {
        return Ok(Some(request_token(
            Kind::FlushReq,
            comm,
            ReqId { index: 0, gen: 0 },
        )));
    }
    if !mr.contains(b.addr, 1) {
        return Err(ApiError::arg(format!(
            "flushed buffer {:#x} lies outside its registration {:#x}+{}",
            b.addr, mr.addr, mr.len
        )));
    }
    if gdr::flush_disabled() {
        return Ok(None);
    }
    let id = c.lock().iflush(b.addr, &mr)?;
    Ok(Some(request_token(Kind::FlushReq, comm, id)))
}
