//! RC queue pairs of the verbs fabric: creation (with the port's GID resolved afresh),
//! the RESET→INIT→RTR→RTS→ERR transitions with NCCL's attributes, and posting.
//!
//! Posting follows verbs: a chain goes down in one `ibv_post_send`; WRITE_WITH_IMM carries its
//! immediate in network order; zero-length transfers carry no SGE; receives have no SGE (they
//! are consumed by the peer's WRITE_WITH_IMM). If the send queue overflows mid-chain the
//! work requests before the failing one stay posted (verbs semantics) and `QueueFull` is
//! returned. `to_err` moves the QP to ERR: every outstanding send and receive (signaled or
//! not) completes with `WR_FLUSH_ERR`, and the responder stops placing data. Work posted
//! after `to_err` is not handed to the device: the fabric completes it with `WR_FLUSH_ERR`
//! itself (as the `sock` fabric does; rxe would leave such receives pending forever).

use super::super::counters::{Held, Resource};
use super::super::{
    Completion, FabricError, LinkLayer, QpCaps, QpState, QueuePair, Result, SendOp, SendWr,
    WcOpcode, WcStatus,
};
use super::cq::VerbsCq;
use super::domain::PdInner;
use super::endpoint::Endpoint;
use super::ffi;
use super::gid::select_gid;
use ibverbs_sys as sys;
use parking_lot::Mutex;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// RDMA READs in flight per QP, at most (each side also respects the device's limit).
const MAX_RD_ATOMIC: i32 = 16;
/// RNR NAK timer NCCL uses (12 = 0.64 ms).
const MIN_RNR_TIMER: u8 = 12;
/// Infinite RNR retries: a receive is always posted before the peer's WRITE_WITH_IMM
/// can arrive, so an RNR is a transient race, never a failure.
const RNR_RETRY: u8 = 7;
/// Work requests of one post built on the stack (more go to the heap).
const POST_ON_STACK: usize = 4;

fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Err => 4,
    }
}

fn state_of(c: u8) -> QpState {
    match c {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        _ => QpState::Err,
    }
}

/// A random 24-bit initial PSN, so packets of an old QP with a reused number are rejected.
fn random_psn() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() & 0xFF_FFFF) as u32
}

static INLINE_SENDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Send work requests posted inline so far, process-wide.
pub fn inline_sends() -> u64 {
    INLINE_SENDS.load(Ordering::Relaxed)
}

/// An RC queue pair.
pub struct VerbsQp {
    qp: *mut sys::ibv_qp,
    qpn: u32,
    state: AtomicU8,
    /// Serialises transitions; holds the peer's endpoint once RTR.
    ctl: Mutex<Option<Endpoint>>,
    local: Endpoint,
    sgid_index: u8,
    /// RDMA READs this side may issue (before the peer's limit is known).
    init_rd_atomic: u8,
    _held: Held,
    /// GRH traffic class set at RTR: the connection's (`QpCaps`), else `NCCL_IB_TC`.
    traffic_class: u8,
    /// Most payload bytes a send may carry inline (what the device granted; 0: none).
    max_inline: u32,
    // Drop order: the QP is destroyed (in Drop) before its CQ and PD go.
    cq: Arc<VerbsCq>,
    pd: Arc<PdInner>,
}

// SAFETY: posting and modifying a QP are thread-safe verbs calls; the QP is destroyed once,
// in Drop, while its CQ and PD are still alive (held here).
unsafe impl Send for VerbsQp {}
// SAFETY: as above.
unsafe impl Sync for VerbsQp {}

impl VerbsQp {
    pub fn create(pd: Arc<PdInner>, cq: Arc<VerbsCq>, caps: QpCaps) -> Result<VerbsQp> {
        let hca = &pd.hca;
        let pa = hca.ctx.query_port(pd.port)?;
        let link_layer = if u32::from(pa.link_layer) == sys::IBV_LINK_LAYER_ETHERNET {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        };
        // Never cached: a port flap may have moved the address to another index.
        let table = hca
            .ctx
            .gid_table(pd.port, hca.attr.phys_port_cnt, pa.gid_tbl_len)?;
        let gid = select_gid(&table, link_layer, pd.cfg.gid_index)
            .map_err(|e| FabricError::System(format!("{}: {e}", pd.name)))?;
        let max_wr = hca.attr.max_qp_wr.max(1) as u32;
        let cap = |max_inline_data| sys::ibv_qp_cap {
            max_send_wr: caps.max_send_wr.clamp(1, max_wr),
            max_recv_wr: caps.max_recv_wr.clamp(1, max_wr),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data,
        };
        let mut init = sys::ibv_qp_init_attr {
            send_cq: cq.cq,
            recv_cq: cq.cq,
            cap: cap(0),
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // A device that refuses this much inline data is asked for less (inline.rs); each ask
        // starts from the same capabilities, whatever a refused call left in `init`.
        let created = super::inline::create_with_inline(|want| {
            init.cap = cap(want);
            // SAFETY: live PD and CQ; `init` is a live in/out parameter.
            let qp = unsafe { sys::ibv_create_qp(pd.pd, &mut init) };
            (!qp.is_null()).then_some(qp)
        });
        let Some(qp) = created else {
            return Err(ffi::last_error(format!("{}: ibv_create_qp", pd.name)));
        };
        // SAFETY: `qp` was just returned non-null.
        let qpn = unsafe { (*qp).qp_num };
        let rd = |v: i32| v.clamp(1, MAX_RD_ATOMIC) as u8;
        let local = Endpoint {
            link_layer,
            mtu: pa.active_mtu,
            qpn,
            psn: random_psn(),
            lid: pa.lid,
            rd_atomic: rd(hca.attr.max_qp_rd_atom),
            gid: gid.gid,
        };
        hca.routes.add_qp(qpn, pd.events.clone());
        tracing::debug!(
            "NET/HA verbs: {}: QP {qpn:#x} created, GID index {} ({:?}), inline up to {} bytes",
            pd.name,
            gid.index,
            gid.gid_type,
            init.cap.max_inline_data
        );
        Ok(VerbsQp {
            qp,
            qpn,
            state: AtomicU8::new(state_code(QpState::Reset)),
            ctl: Mutex::new(None),
            local,
            sgid_index: gid.index as u8,
            init_rd_atomic: rd(hca.attr.max_qp_init_rd_atom),
            _held: Held::new(Resource::Qp),
            traffic_class: caps.traffic_class.unwrap_or(pd.cfg.traffic_class),
            // The provider writes back what it granted.
            max_inline: init.cap.max_inline_data,
            cq,
            pd,
        })
    }

    /// Whether `w` goes inline: host memory the CPU may read now (the plugin's staging, or a
    /// caller's `NCCL_PTR_HOST` buffer: `SendWr::inline`), within the granted limit.
    fn inlines(&self, w: &SendWr) -> bool {
        w.inline && w.local.len > 0 && w.local.len as u64 <= u64::from(self.max_inline)
    }

    fn tracked(&self) -> QpState {
        state_of(self.state.load(Ordering::Acquire))
    }

    fn set(&self, s: QpState) {
        self.state.store(state_code(s), Ordering::Release);
    }

    fn bad_state(&self, op: &'static str) -> FabricError {
        FabricError::BadState {
            state: self.state(),
            op,
        }
    }

    fn modify(
        &self,
        attr: &mut sys::ibv_qp_attr,
        mask: sys::ibv_qp_attr_mask,
        what: &str,
    ) -> Result<()> {
        // SAFETY: live QP; `attr` is a live, fully initialised attribute block.
        let rc = unsafe { sys::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        ffi::check_rc(rc, || {
            format!(
                "{}: QP {:#x}: ibv_modify_qp({what})",
                self.pd.name, self.qpn
            )
        })
    }

    fn flush(&self, wr_ids: impl Iterator<Item = u64>) {
        self.cq.push_soft(wr_ids.map(|wr_id| Completion {
            wr_id,
            qp_num: self.qpn,
            status: WcStatus::WrFlushErr,
            opcode: WcOpcode::Unknown,
            byte_len: 0,
            imm: None,
        }));
    }

    fn sge(addr: usize, len: usize, lkey: u32) -> Result<sys::ibv_sge> {
        let length = u32::try_from(len).map_err(|_| {
            FabricError::InvalidArgument(format!("transfer of {len} bytes exceeds 4 GiB"))
        })?;
        Ok(sys::ibv_sge {
            addr: addr as u64,
            length,
            lkey,
        })
    }
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn silence_floor(&self) -> std::time::Duration {
        // Twice the local ACK timeout; 0 means "wait forever" in the verbs spec (no floor can
        // be derived: the soft timeout alone then).
        let t = u32::from(self.pd.cfg.qp_timeout);
        if t == 0 {
            return std::time::Duration::MAX;
        }
        std::time::Duration::from_nanos(4096u64 << t.min(31)) * 2
    }

    /// The tracked state; once connected, also asks the device, so a QP that an error
    /// completion moved to ERR reports `Err`.
    fn state(&self) -> QpState {
        let s = self.tracked();
        if matches!(s, QpState::Rtr | QpState::Rts) {
            let mut attr = sys::ibv_qp_attr::default();
            let mut init = sys::ibv_qp_init_attr::default();
            // SAFETY: live QP; both out-parameters are live locals.
            let rc = unsafe {
                sys::ibv_query_qp(
                    self.qp,
                    &mut attr,
                    sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                    &mut init,
                )
            };
            if rc == 0
                && matches!(
                    attr.qp_state,
                    sys::ibv_qp_state::IBV_QPS_ERR | sys::ibv_qp_state::IBV_QPS_SQE
                )
            {
                self.set(QpState::Err);
                return QpState::Err;
            }
        }
        s
    }

    fn local_endpoint(&self) -> Vec<u8> {
        self.local.encode()
    }

    fn to_init(&self) -> Result<()> {
        let _ctl = self.ctl.lock();
        if self.tracked() != QpState::Reset {
            return Err(self.bad_state("to_init"));
        }
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.pd.port,
            qp_access_flags: (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
                .0,
            ..Default::default()
        };
        use sys::ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        self.set(QpState::Init);
        Ok(())
    }

    fn to_rtr(&self, remote: &[u8]) -> Result<()> {
        let peer = Endpoint::decode(remote)?;
        if peer.link_layer != self.local.link_layer {
            return Err(FabricError::BadPeerAddress(format!(
                "{}: peer link layer {:?}, ours {:?}",
                self.pd.name, peer.link_layer, self.local.link_layer
            )));
        }
        let mut ctl = self.ctl.lock();
        if self.tracked() != QpState::Init {
            return Err(self.bad_state("to_rtr"));
        }
        let cfg = &self.pd.cfg;
        let global = peer.link_layer == LinkLayer::Ethernet || peer.gid[..8] != self.local.gid[..8];
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.local.mtu.min(peer.mtu),
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: self.local.rd_atomic,
            min_rnr_timer: MIN_RNR_TIMER,
            ..Default::default()
        };
        a.ah_attr.is_global = u8::from(global);
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.sl = cfg.service_level;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = self.pd.port;
        if global {
            a.ah_attr.grh.dgid.raw = peer.gid;
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.sgid_index = self.sgid_index;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = self.traffic_class;
        }
        use sys::ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        *ctl = Some(peer);
        self.set(QpState::Rtr);
        Ok(())
    }

    fn to_rts(&self) -> Result<()> {
        let ctl = self.ctl.lock();
        let peer = match (*ctl, self.tracked()) {
            (Some(p), QpState::Rtr) => p,
            _ => return Err(self.bad_state("to_rts")),
        };
        let cfg = &self.pd.cfg;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTS,
            timeout: cfg.qp_timeout,
            retry_cnt: cfg.qp_retry_cnt,
            rnr_retry: RNR_RETRY,
            sq_psn: self.local.psn,
            max_rd_atomic: self.init_rd_atomic.min(peer.rd_atomic),
            ..Default::default()
        };
        use sys::ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )?;
        // No alternate path was loaded: make sure the device agrees (see `apm`).
        super::apm::check(self.qp, &format!("{}: QP {:#x}", self.pd.name, self.qpn))?;
        self.set(QpState::Rts);
        Ok(())
    }

    fn to_err(&self) -> Result<()> {
        let _ctl = self.ctl.lock();
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, sys::ibv_qp_attr_mask::IBV_QP_STATE, "ERR")?;
        self.set(QpState::Err);
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        match self.tracked() {
            QpState::Rts => {}
            QpState::Err => {
                self.flush(wrs.iter().map(|w| w.wr_id));
                return Ok(());
            }
            _ => return Err(self.bad_state("post_send")),
        }
        if wrs.is_empty() {
            return Ok(());
        }
        if crate::fabric::stages::enabled() {
            let w = &wrs[0];
            let op = match w.op {
                SendOp::Write => 0u64,
                SendOp::WriteWithImm(_) => 1,
                SendOp::Read => 2,
            };
            crate::fabric::stages::mark("verbs_post", op << 32 | w.local.len as u64);
        }
        // A post of a few WRs (the transport's are 1 to 3) builds its chain on the stack.
        let n = wrs.len();
        let mut sge_stack = [sys::ibv_sge::default(); POST_ON_STACK];
        let mut wr_stack: [sys::ibv_send_wr; POST_ON_STACK] = Default::default();
        let (mut sge_heap, mut wr_heap) = (Vec::new(), Vec::new());
        let (sges, chain): (&mut [sys::ibv_sge], &mut [sys::ibv_send_wr]) = if n <= POST_ON_STACK {
            (&mut sge_stack[..n], &mut wr_stack[..n])
        } else {
            sge_heap.resize(n, sys::ibv_sge::default());
            wr_heap.resize_with(n, Default::default);
            (&mut sge_heap[..], &mut wr_heap[..])
        };
        for (sge, w) in sges.iter_mut().zip(wrs) {
            *sge = Self::sge(w.local.addr, w.local.len, w.local.lkey)?;
        }
        for ((w, sge), slot) in wrs.iter().zip(sges.iter_mut()).zip(chain.iter_mut()) {
            let mut s = sys::ibv_send_wr {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: if w.local.len > 0 {
                    sge
                } else {
                    std::ptr::null_mut()
                },
                num_sge: i32::from(w.local.len > 0),
                send_flags: (if w.signaled {
                    sys::ibv_send_flags::IBV_SEND_SIGNALED.0
                } else {
                    0
                }) | (if self.inlines(w) {
                    INLINE_SENDS.fetch_add(1, Ordering::Relaxed);
                    sys::ibv_send_flags::IBV_SEND_INLINE.0
                } else {
                    0
                }),
                ..Default::default()
            };
            s.opcode = match w.op {
                SendOp::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                SendOp::WriteWithImm(imm) => {
                    s.__bindgen_anon_1.imm_data = imm.to_be();
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                }
                SendOp::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
            };
            s.wr.rdma.remote_addr = w.remote_addr;
            s.wr.rdma.rkey = w.rkey;
            *slot = s;
        }
        // Link once every entry is in place (the storage does not move from here on).
        let base = chain.as_mut_ptr();
        for i in 1..chain.len() {
            // SAFETY: `i` and `i - 1` are in bounds of `chain`.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; `chain` and `sges` (on the stack or in the heap vectors, which do
        // not move) outlive the call; the chain ends in null.
        let rc = unsafe { ffi::post_send(self.qp, base, &mut bad) };
        // The post's own cost (on rxe it includes the kernel's send processing).
        crate::fabric::stages::mark("verbs_posted", rc as u64);
        match rc {
            0 => Ok(()),
            libc::ENOMEM => Err(FabricError::QueueFull(
                "verbs: send queue (work requests before the failing one were posted)",
            )),
            libc::EINVAL => Err(FabricError::InvalidArgument(format!(
                "{}: QP {:#x}: ibv_post_send rejected work request {} of {}",
                self.pd.name,
                self.qpn,
                // SAFETY: on failure `bad` points into `chain` (or is null).
                if bad.is_null() {
                    0
                } else {
                    unsafe { bad.offset_from(base) }
                },
                chain.len()
            ))),
            e => Err(FabricError::io(
                format!("{}: QP {:#x}: ibv_post_send", self.pd.name, self.qpn),
                std::io::Error::from_raw_os_error(e),
            )),
        }
    }

    fn post_recv(&self, wr_id: u64) -> Result<()> {
        match self.tracked() {
            QpState::Reset => return Err(self.bad_state("post_recv")),
            QpState::Err => {
                self.flush(std::iter::once(wr_id));
                return Ok(());
            }
            _ => {}
        }
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; `wr` outlives the call and has no SGE list to read.
        let rc = unsafe { ffi::post_recv(self.qp, &mut wr, &mut bad) };
        match rc {
            0 => Ok(()),
            libc::ENOMEM => Err(FabricError::QueueFull("verbs: receive queue")),
            e => Err(FabricError::io(
                format!("{}: QP {:#x}: ibv_post_recv", self.pd.name, self.qpn),
                std::io::Error::from_raw_os_error(e),
            )),
        }
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        self.pd.hca.routes.remove_qp(self.qpn);
        // SAFETY: destroys the QP made in `create`, exactly once; its CQ and PD are alive
        // (held by `self`). Completions of it still queued in the CQ stay harmless.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp) };
        if rc != 0 {
            tracing::warn!(
                "NET/HA verbs: {}: ibv_destroy_qp({:#x}) failed: {rc}",
                self.pd.name,
                self.qpn
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_roundtrip() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Err,
        ] {
            assert_eq!(state_of(state_code(s)), s);
        }
    }

    #[test]
    fn psns_are_24_bit_and_vary() {
        let a: Vec<u32> = (0..8).map(|_| random_psn()).collect();
        assert!(a.iter().all(|&p| p <= 0xFF_FFFF));
        assert!(a.windows(2).any(|w| w[0] != w[1]));
    }
}
