//! The connection budget: how many connections (NCCL send or receive comms) one device can
//! carry, reported to NCCL as `maxComms`. A connection holds two queue pairs (primary and
//! standby path), and each queue pair reserves, on one of the device's completion queues,
//! room for everything it can have posted at once ([`CQES_PER_QP`]): when a port dies every
//! posted work request completes (flushed in error, even the unsignaled ones), so a queue must
//! hold all of them or it overruns and takes the device down. The engine opens another
//! completion queue of [`engine::cq_capacity`] entries whenever none has room left, so the
//! queue pairs are the bound (`max_qp`, with a spare share), provided one queue holds at
//! least one queue pair's completions (`max_cqe`). NCCL 2.28 does not act on `maxComms`; the
//! same arithmetic is what keeps queue-pair creation from failing, and the INFO line at
//! `getProperties` shows it.

use super::path::{CQES_PER_QP, MAX_SEND_WR, RECV_POOL};
use crate::engine;
use crate::fabric::DeviceLimits;

/// Queue pairs per connection: the primary and the standby path (a device carries its own
/// connections' primaries and its partner device's standbys).
pub const QPS_PER_COMM: u32 = 2;

/// Completion-queue entries reserved per connection (both paths).
pub const CQ_ENTRIES_PER_COMM: u32 = QPS_PER_COMM * CQES_PER_QP;

/// The share of each limit held back (1/8): a re-armed path opens its new queue pair, with
/// its receives, before the failed one goes; a receive comm that flushes GPU buffers has a
/// loopback queue pair per device; other processes (the node's other ranks) use the same
/// device's queue pairs.
pub const SPARE_DIVISOR: u32 = 8;

/// `maxComms` when nothing limits the device (what NCCL's socket transport reports).
pub const UNLIMITED_COMMS: u32 = 65536;

/// One device's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// What `maxComms` reports: the smaller bound (at least 1).
    pub max_comms: u32,
    /// Connections the queue pairs allow (`None`: no limit).
    pub by_qps: Option<u32>,
    /// Entries of each completion queue the engine opens on the device.
    pub cq_size: u32,
    /// Queue pairs one completion queue holds (0: the device cannot carry a connection).
    pub qps_per_cq: u32,
    /// The device's limits.
    pub limits: DeviceLimits,
}

/// `n` less the spare share.
fn usable(n: u32) -> u32 {
    n - n / SPARE_DIVISOR
}

impl Budget {
    pub fn for_device(limits: DeviceLimits) -> Budget {
        let cq_size = engine::cq_capacity(limits.max_cqe);
        let qps_per_cq = cq_size / CQES_PER_QP;
        let by_qps = limits.max_qp.map(|q| usable(q) / QPS_PER_COMM);
        let max_comms = if qps_per_cq == 0 {
            1 // no connection fits; reported as 1 (NCCL's minimum), opening one fails clearly
        } else {
            by_qps.unwrap_or(UNLIMITED_COMMS).clamp(1, UNLIMITED_COMMS)
        };
        Budget {
            max_comms,
            by_qps,
            cq_size,
            qps_per_cq,
            limits,
        }
    }

    /// One line for the log: the result, what one connection costs, and each bound.
    pub fn describe(&self) -> String {
        let qps = match (self.limits.max_qp, self.by_qps) {
            (Some(q), Some(n)) => format!("max_qp {q} less 1/8 spare / {QPS_PER_COMM} = {n}"),
            _ => "no limit".into(),
        };
        let cq = if self.qps_per_cq == 0 {
            format!(
                "a completion queue of {} entries (max_cqe) cannot hold one queue pair's {CQES_PER_QP}: no connection fits",
                self.cq_size
            )
        } else {
            format!(
                "queues of {} entries, {} queue pairs each, opened as needed",
                self.cq_size, self.qps_per_cq
            )
        };
        format!(
            "maxComms {}: per connection {QPS_PER_COMM} queue pairs, each reserving {CQES_PER_QP} completion entries ({RECV_POOL} receives + {MAX_SEND_WR} sends); queue pairs: {qps}; completions: {cq}",
            self.max_comms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_qp: Option<u32>, max_cqe: Option<u32>) -> DeviceLimits {
        DeviceLimits { max_qp, max_cqe }
    }

    #[test]
    fn per_connection_figures_follow_the_paths() {
        assert_eq!(CQES_PER_QP, RECV_POOL as u32 + MAX_SEND_WR);
        assert_eq!(CQ_ENTRIES_PER_COMM, 2 * CQES_PER_QP);
    }

    #[test]
    fn queue_pairs_bound_and_a_queue_must_hold_one_queue_pair() {
        // Queue pairs: 40 - 5 = 35 usable, 17 connections.
        let b = Budget::for_device(limits(Some(40), None));
        assert_eq!((b.max_comms, b.by_qps), (17, Some(17)));
        assert_eq!(b.cq_size, engine::CQ_DEPTH);
        // A device with large queues: the queue pairs bound, capped at 65536.
        let b = Budget::for_device(limits(Some(131072), Some(4194303)));
        assert_eq!((b.max_comms, b.by_qps), (57344, Some(57344)));
        assert_eq!(b.qps_per_cq, engine::CQ_DEPTH / CQES_PER_QP);
        // Smaller queues than the engine's: clamped, fewer queue pairs per queue, same bound.
        let b = Budget::for_device(limits(None, Some(2048)));
        assert_eq!(
            (b.cq_size, b.qps_per_cq, b.max_comms),
            (2048, 2048 / CQES_PER_QP, UNLIMITED_COMMS)
        );
        // Nothing limits sock without emulated limits.
        let b = Budget::for_device(DeviceLimits::default());
        assert_eq!((b.max_comms, b.by_qps), (UNLIMITED_COMMS, None));
        // Never 0, even on a device too small for one connection.
        assert_eq!(Budget::for_device(limits(Some(1), None)).max_comms, 1);
        let tiny = Budget::for_device(limits(Some(1000), Some(16)));
        assert_eq!((tiny.qps_per_cq, tiny.max_comms), (0, 1));
    }

    #[test]
    fn the_log_line_shows_the_arithmetic() {
        let d = Budget::for_device(limits(Some(40), Some(8192))).describe();
        assert!(
            d.starts_with(&format!(
                "maxComms 17: per connection 2 queue pairs, each reserving {CQES_PER_QP} completion entries"
            )),
            "{d}"
        );
        assert!(
            d.contains("queue pairs: max_qp 40 less 1/8 spare / 2 = 17"),
            "{d}"
        );
        assert!(
            d.contains(&format!(
                "completions: queues of 8192 entries, {} queue pairs each, opened as needed",
                8192 / CQES_PER_QP
            )),
            "{d}"
        );
        let d = Budget::for_device(limits(None, Some(16))).describe();
        assert!(d.contains("cannot hold one queue pair"), "{d}");
        let d = Budget::for_device(DeviceLimits::default()).describe();
        assert!(d.contains("queue pairs: no limit"), "{d}");
    }
}
