//! Completion queues of the verbs fabric. Each CQ has a completion channel and a small thread
//! that waits on it: on a completion event it acknowledges it and rings the engine's doorbell.
//!
//! The CQ is armed (`ibv_req_notify_cq`) only when its consumer is about to sleep: the
//! doorbell calls [`CqArm::arm`] from `Doorbell::wait`, and the first completion after that
//! disarms it and rings. A consumer that keeps polling (the progress thread spinning, a
//! `test()` loop) therefore causes no completion events at all: on Soft-RoCE each event woke
//! the notifier thread and then the progress thread, and the posting thread, in whose system
//! call rxe placed the completion, was preempted on its way out (measured: `ibv_post_send`
//! 2–4x slower, the 8-byte ping-pong 2x slower). A completion that arrives between the
//! consumer's last poll and the arming is covered by the consumer polling once more after it
//! armed (verbs only signals completions added after the request).
//!
//! Besides the device's completions a CQ carries flush completions the fabric makes itself
//! for work posted to a QP already in ERR (rxe in Linux 6.1 never flushes a receive posted
//! after the QP entered ERR; doing it here gives every provider the same behaviour).

use super::super::counters::{Held, Resource};
use super::super::doorbell::Arm;
use super::super::{
    Completion, CompletionQueue, Doorbell, FabricError, Result, WcOpcode, WcStatus,
};
use super::domain::PdInner;
use super::ffi::{self, Wait, WakeFd};
use super::threads;
use ibverbs_sys as sys;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// Completions fetched per `ibv_poll_cq` call.
const BATCH: usize = 32;

/// A completion queue with its notification thread.
pub struct VerbsCq {
    pub cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    /// Whether a completion event is requested; shared with the notifier and the doorbell.
    arm: Arc<CqArm>,
    wake: Arc<WakeFd>,
    thread: Option<JoinHandle<()>>,
    /// Completions made by the fabric (flushes of work posted in ERR).
    soft: Mutex<VecDeque<Completion>>,
    bell: Arc<Doorbell>,
    _held: Held,
    // Last: the PD (and through it the device) outlives the CQ.
    pub pd: Arc<PdInner>,
}

// SAFETY: `ibv_poll_cq` / `ibv_req_notify_cq` are thread-safe in libibverbs providers; the
// CQ and channel are destroyed once, in Drop, after the notifier thread has been joined.
unsafe impl Send for VerbsCq {}
// SAFETY: as above.
unsafe impl Sync for VerbsCq {}

struct Raw {
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
}

// SAFETY: handed to the notifier thread, which the CQ's Drop joins before destroying them.
unsafe impl Send for Raw {}

/// Arm state of one CQ. `live` is cleared (under the lock) before the CQ is destroyed, so the
/// doorbell, which may still hold this after the CQ went, never touches a dead CQ.
pub struct CqArm {
    cq: *mut sys::ibv_cq,
    state: Mutex<ArmState>,
    name: String,
}

struct ArmState {
    armed: bool,
    live: bool,
}

// SAFETY: `cq` is only used under `state`'s lock while `live`, i.e. before the CQ's Drop
// destroys it; `ibv_req_notify_cq` is a thread-safe verbs call.
unsafe impl Send for CqArm {}
// SAFETY: as above.
unsafe impl Sync for CqArm {}

impl CqArm {
    /// A completion event arrived: the request it answered is used up.
    fn fired(&self) {
        self.state.lock().armed = false;
    }

    fn kill(&self) {
        self.state.lock().live = false;
    }
}

impl Arm for CqArm {
    fn arm(&self) -> bool {
        let mut st = self.state.lock();
        if st.armed || !st.live {
            return false;
        }
        // SAFETY: `live` under the lock: the CQ is not destroyed yet.
        let rc = unsafe { ffi::req_notify_cq(self.cq) };
        if rc != 0 {
            tracing::warn!(
                "NET/HA verbs: {}: ibv_req_notify_cq failed: {rc}",
                self.name
            );
            // Not armed: the consumer's bounded sleeps keep polling.
            return false;
        }
        st.armed = true;
        true
    }
}

impl VerbsCq {
    pub fn create(pd: Arc<PdInner>, depth: u32, doorbell: Arc<Doorbell>) -> Result<VerbsCq> {
        let ctx = pd.hca.raw();
        let max = pd.hca.attr.max_cqe.max(1) as u32;
        let depth = depth.clamp(1, max) as i32;
        let wake = Arc::new(WakeFd::new().map_err(|e| FabricError::io("eventfd", e))?);
        // SAFETY: live context.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(ffi::last_error(format!(
                "{}: ibv_create_comp_channel",
                pd.name
            )));
        }
        // SAFETY: live context and channel; no CQ context pointer is used.
        let cq = unsafe { sys::ibv_create_cq(ctx, depth, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = ffi::last_error(format!("{}: ibv_create_cq({depth})", pd.name));
            // SAFETY: destroys the channel made above, which has no CQ.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        let arm = Arc::new(CqArm {
            cq,
            state: Mutex::new(ArmState {
                armed: false,
                live: true,
            }),
            name: pd.name.clone(),
        });
        let mut me = VerbsCq {
            cq,
            channel,
            arm,
            wake,
            thread: None,
            soft: Mutex::new(VecDeque::new()),
            bell: doorbell.clone(),
            _held: Held::new(Resource::Cq),
            pd,
        };
        // From here on, Drop cleans up whatever fails.
        // SAFETY: `channel` is live; reading its fd has no other effect.
        let fd = unsafe { (*channel).fd };
        ffi::set_nonblocking(fd)
            .map_err(|e| FabricError::io(format!("{}: completion channel", me.pd.name), e))?;
        let raw = Raw { cq, channel };
        let wake = me.wake.clone();
        let name = me.pd.name.clone();
        let arm = me.arm.clone();
        let bell = doorbell.clone();
        me.thread = Some(threads::spawn(
            format!("ha-verbs-cq{}", me.pd.dev),
            move || notify_loop(raw, fd, &wake, &arm, &bell, &name),
        )?);
        // Armed by the consumer's first `Doorbell::wait` from now on.
        let weak: Weak<dyn Arm> = Arc::downgrade(&me.arm) as Weak<dyn Arm>;
        doorbell.add_arm(weak);
        me.pd.hca.routes.add_cq(cq as usize, me.pd.events.clone());
        Ok(me)
    }
}

fn notify_loop(raw: Raw, fd: i32, wake: &WakeFd, arm: &CqArm, bell: &Doorbell, name: &str) {
    loop {
        match ffi::wait_readable(fd, wake) {
            Ok(Wait::Stop) => return,
            Ok(Wait::Ready) => {}
            Err(e) => {
                tracing::warn!("NET/HA verbs: {name}: completion channel: {e}");
                return;
            }
        }
        let mut events = 0;
        loop {
            let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: live channel (joined before destruction); out-parameters are live
            // locals. Non-blocking fd: fails with EAGAIN once drained.
            if unsafe { sys::ibv_get_cq_event(raw.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            crate::fabric::stages::mark("cq_event", events as u64);
            // SAFETY: acknowledges exactly the events obtained above, on the live CQ.
            unsafe { sys::ibv_ack_cq_events(raw.cq, events) };
            // Disarmed before the ring: the woken consumer re-arms before it sleeps again.
            arm.fired();
            bell.ring();
        }
    }
}

/// Map one verbs completion. After an error only `wr_id`, `qp_num` and `status` are valid.
pub fn completion(wc: &sys::ibv_wc) -> Completion {
    let status = match wc.error() {
        None => WcStatus::Success,
        Some((s, _vendor)) => WcStatus::from_code(s),
    };
    let opcode = if status.is_ok() {
        match wc.opcode() {
            sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            sys::ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            _ => WcOpcode::Unknown,
        }
    } else {
        WcOpcode::Unknown
    };
    Completion {
        wr_id: wc.wr_id(),
        qp_num: wc.qp_num,
        status,
        opcode,
        byte_len: if status.is_ok() { wc.len() as u32 } else { 0 },
        // Network order on the wire and in the CQE; host order above the fabric.
        imm: wc.imm_data().map(u32::from_be),
    }
}

impl VerbsCq {
    /// Queue completions the fabric made and wake the consumer.
    pub fn push_soft(&self, cs: impl IntoIterator<Item = Completion>) {
        self.soft.lock().extend(cs);
        self.bell.ring();
    }
}

impl CompletionQueue for VerbsCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut wcs = [sys::ibv_wc::default(); BATCH];
        let mut total = 0;
        while total < max {
            let want = (max - total).min(BATCH);
            // SAFETY: live CQ; `wcs` has `want` ≤ BATCH writable entries.
            let n = unsafe { ffi::poll_cq(self.cq, want as i32, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(FabricError::io(
                    format!("{}: ibv_poll_cq", self.pd.name),
                    std::io::Error::from_raw_os_error(-n),
                ));
            }
            let n = n as usize;
            out.extend(wcs[..n].iter().map(completion));
            total += n;
            if n < want {
                break;
            }
        }
        if total < max {
            let mut soft = self.soft.lock();
            while total < max {
                match soft.pop_front() {
                    Some(c) => {
                        out.push(c);
                        total += 1;
                    }
                    None => break,
                }
            }
        }
        if total > 0 && crate::fabric::stages::enabled() {
            // Which kind came first (1: a receive, i.e. an immediate arrived; 0: a send).
            let first = &out[out.len() - total];
            let recv = u64::from(matches!(first.opcode, WcOpcode::RecvRdmaWithImm));
            crate::fabric::stages::mark("cq_poll", recv << 32 | total as u64);
        }
        Ok(total)
    }
}

impl Drop for VerbsCq {
    fn drop(&mut self) {
        self.arm.kill();
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.pd.hca.routes.remove_cq(self.cq as usize);
        // SAFETY: the notifier thread is gone and every event it took was acknowledged;
        // QPs using this CQ hold an `Arc` to it, so none is left. Destroyed exactly once.
        unsafe {
            let rc = sys::ibv_destroy_cq(self.cq);
            if rc != 0 {
                tracing::warn!(
                    "NET/HA verbs: {}: ibv_destroy_cq failed: {rc}",
                    self.pd.name
                );
            }
            sys::ibv_destroy_comp_channel(self.channel);
        }
    }
}
