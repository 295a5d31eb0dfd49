//! Automatic Path Migration (APM) stays off: the plugin never loads an alternate path into a
//! queue pair, and checks at RTS that the device agrees (no alternate path armed), because two
//! failover mechanisms on one queue pair would fight — hardware migrating the QP to an
//! alternate port while the failover engine fences the same QP and replays on its standby.
//!
//! A QP created without an alternate path reports `IBV_MIG_MIGRATED` (nothing left to migrate
//! to); `REARM` also means no alternate path is usable yet. Only `ARMED` lets the hardware
//! move the QP by itself: such a QP is refused with an error naming the device and QP. Every
//! check is counted ([`report`]) so tests can assert that each QP the plugin brought to RTS
//! was checked.

use super::super::{FabricError, Result};
use super::ffi;
use ibverbs_sys as sys;
use std::sync::atomic::{AtomicU64, Ordering};

static CHECKED: AtomicU64 = AtomicU64::new(0);
static ARMED: AtomicU64 = AtomicU64::new(0);

/// What the process's APM checks found so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApmReport {
    /// Queue pairs whose migration state was read at RTS.
    pub checked: u64,
    /// Of those, how many had an alternate path armed (and were refused).
    pub armed: u64,
}

/// The counts of every check so far in this process.
pub fn report() -> ApmReport {
    ApmReport {
        checked: CHECKED.load(Ordering::Relaxed),
        armed: ARMED.load(Ordering::Relaxed),
    }
}

/// The migration state as the device reports it, by name.
pub fn state_name(s: sys::ibv_mig_state) -> &'static str {
    match s {
        sys::IBV_MIG_MIGRATED => "MIGRATED",
        sys::IBV_MIG_REARM => "REARM",
        sys::IBV_MIG_ARMED => "ARMED",
        _ => "unknown",
    }
}

/// Read `qp`'s path-migration state and refuse a QP the hardware could migrate by itself.
///
/// `what` names the device and QP for the error.
pub(super) fn check(qp: *mut sys::ibv_qp, what: &str) -> Result<sys::ibv_mig_state> {
    let mut attr = sys::ibv_qp_attr::default();
    let mut init = sys::ibv_qp_init_attr::default();
    // SAFETY: `qp` is a live queue pair owned by the caller; both out-parameters are live
    // locals that ibv_query_qp fills.
    let rc = unsafe {
        sys::ibv_query_qp(
            qp,
            &mut attr,
            sys::ibv_qp_attr_mask::IBV_QP_PATH_MIG_STATE.0 as i32,
            &mut init,
        )
    };
    ffi::check_rc(rc, || format!("{what}: ibv_query_qp(PATH_MIG_STATE)"))?;
    CHECKED.fetch_add(1, Ordering::Relaxed);
    if attr.path_mig_state == sys::IBV_MIG_ARMED {
        ARMED.fetch_add(1, Ordering::Relaxed);
        return Err(FabricError::System(format!(
            "{what}: the device armed an alternate path (Automatic Path Migration, alternate \
             port {}): hardware migration and the plugin's failover would both move this queue \
             pair; the plugin loads no alternate path, so something else did — refusing the QP",
            attr.alt_port_num
        )));
    }
    Ok(attr.path_mig_state)
}
