//! The connection budget: how many connections (NCCL send or receive comms) one device can
//! carry, reported to NCCL as `maxComms`. A connection holds two queue pairs (primary and
//! standby path) and, on the completion queue its paths share with every other connection of
//! the device, room for everything its paths can have posted at once: when a port dies every
//! posted work request completes (flushed in error, even the unsignaled ones), so the queue
//! must hold all of them or it overruns and takes the whole device down. The per-path figures
//! come from the transport's own constants ([`QP_CAPS`], [`RECV_POOL`]) and the protocol's
//! window ([`FIFO_DEPTH`] grouped receives of up to [`MAX_RECVS`] buffers, the control
//! mailbox); the device's limits from the fabric ([`DeviceLimits`]); the completion queue's
//! size from the engine ([`engine::cq_capacity`]). [`cq_depth_for`] is the sizing rule for an
//! engine that sizes its completion queue from the paths on it.

use super::link::Role;
use super::path::{QP_CAPS, RECV_POOL};
use crate::engine;
use crate::fabric::DeviceLimits;
use ha_proto::data::layout::{FIFO_DEPTH, MAILBOX_SLOTS, MAX_RECVS};

/// Queue pairs per connection: the primary and the standby path (a device carries its own
/// connections' primaries and its partner device's standbys).
pub const QPS_PER_COMM: u32 = 2;

/// Work requests one path of a `role` connection can have on its send queue at once, capped
/// by the queue pair's size: a send comm writes, for each of the [`FIFO_DEPTH`] grouped
/// receives the peer may have open (up to [`MAX_RECVS`] buffers each, what `maxRecvs`
/// advertises), one payload write per buffer and the completion record; a receive comm
/// writes one clear-to-send per open receive; both send up to [`MAILBOX_SLOTS`] control
/// messages and one probe.
pub const fn sends_per_path(role: Role) -> u32 {
    let window = match role {
        Role::Send => FIFO_DEPTH * (MAX_RECVS + 1),
        Role::Recv => FIFO_DEPTH,
    } + MAILBOX_SLOTS
        + 1;
    let cap = QP_CAPS.max_send_wr as usize;
    (if window < cap { window } else { cap }) as u32
}

/// Completion-queue entries one path of a `role` connection can produce at once: its posted
/// receives and its send window.
pub const fn cq_entries_per_path(role: Role) -> u32 {
    RECV_POOL as u32 + sends_per_path(role)
}

/// Completion-queue entries budgeted per connection: both paths, priced as a send comm (a
/// device carries both kinds; NCCL does not say which a connection will be).
pub const CQ_ENTRIES_PER_COMM: u32 = QPS_PER_COMM * cq_entries_per_path(Role::Send);

/// The share of each limit held back (1/8): a re-armed path opens its new queue pair, with
/// its receives, before the failed one goes; other processes (the node's other ranks) use
/// the same device's queue pairs.
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
    /// Connections the shared completion queue allows (`None`: unbounded).
    pub by_cq: Option<u32>,
    /// The device's limits.
    pub limits: DeviceLimits,
    /// Entries of the completion queue the engine gives the device.
    pub cq_capacity: Option<u32>,
}

/// `n` less the spare share.
fn usable(n: u32) -> u32 {
    n - n / SPARE_DIVISOR
}

impl Budget {
    pub fn for_device(limits: DeviceLimits) -> Budget {
        let cq_capacity = engine::cq_capacity(limits.max_cqe);
        let by_qps = limits.max_qp.map(|q| usable(q) / QPS_PER_COMM);
        let by_cq = cq_capacity.map(|c| usable(c) / CQ_ENTRIES_PER_COMM);
        let max_comms = [by_qps, by_cq]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(UNLIMITED_COMMS)
            .clamp(1, UNLIMITED_COMMS);
        Budget {
            max_comms,
            by_qps,
            by_cq,
            limits,
            cq_capacity,
        }
    }

    /// One line for the log: the result, what one connection costs, and each bound.
    pub fn describe(&self) -> String {
        let qps = match (self.limits.max_qp, self.by_qps) {
            (Some(q), Some(n)) => format!("max_qp {q} less 1/8 spare / {QPS_PER_COMM} = {n}"),
            _ => "no limit".into(),
        };
        let cq = match (self.cq_capacity, self.by_cq) {
            (Some(c), Some(n)) => format!(
                "shared completion queue of {c} (max_cqe {}) less 1/8 spare / {CQ_ENTRIES_PER_COMM} = {n}",
                self.limits.max_cqe.unwrap_or(c)
            ),
            _ => "unbounded".into(),
        };
        format!(
            "maxComms {}: per connection {QPS_PER_COMM} queue pairs and {CQ_ENTRIES_PER_COMM} completion entries (a path: {RECV_POOL} receives + {} sends = {FIFO_DEPTH} grouped receives x ({MAX_RECVS} writes + record) + {MAILBOX_SLOTS} control + probe); queue pairs: {qps}; completions: {cq}",
            self.max_comms,
            sends_per_path(Role::Send),
        )
    }
}

/// The sizing rule for a completion queue shared by `send_paths` paths of send comms and
/// `recv_paths` of receive comms: room for everything they can have posted at once, plus the
/// spare share, capped at the device's `max_cqe`.
pub fn cq_depth_for(send_paths: u32, recv_paths: u32, max_cqe: Option<u32>) -> u32 {
    let need = u64::from(send_paths) * u64::from(cq_entries_per_path(Role::Send))
        + u64::from(recv_paths) * u64::from(cq_entries_per_path(Role::Recv));
    let with_spare = need + need / u64::from(SPARE_DIVISOR - 1);
    let cap = u64::from(max_cqe.unwrap_or(u32::MAX));
    with_spare.clamp(1, cap) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_qp: Option<u32>, max_cqe: Option<u32>) -> DeviceLimits {
        DeviceLimits { max_qp, max_cqe }
    }

    #[test]
    fn per_path_figures_follow_the_window() {
        // 32 grouped receives x (8 writes + record) + 8 control + 1 probe; 32 CTS + 8 + 1.
        assert_eq!(sends_per_path(Role::Send), 297);
        assert_eq!(sends_per_path(Role::Recv), 41);
        assert!(sends_per_path(Role::Send) <= QP_CAPS.max_send_wr);
        assert_eq!(cq_entries_per_path(Role::Send), 64 + 297);
        assert_eq!(cq_entries_per_path(Role::Recv), 64 + 41);
        assert_eq!(CQ_ENTRIES_PER_COMM, 722);
    }

    #[test]
    fn the_smaller_bound_wins() {
        // Queue pairs: 40 - 5 = 35 usable, 17 connections; no completion limit.
        let b = Budget::for_device(limits(Some(40), None));
        assert_eq!((b.max_comms, b.by_qps, b.by_cq), (17, Some(17), None));
        // A 4096-entry shared queue: 3584 usable / 722 = 4, below the 65536 queue pairs allow.
        let b = Budget::for_device(limits(Some(131072), Some(4194303)));
        assert_eq!(b.cq_capacity, Some(4096));
        assert_eq!((b.max_comms, b.by_qps, b.by_cq), (4, Some(57344), Some(4)));
        // A device whose queues are smaller than the engine's: clamped, as verbs does.
        let b = Budget::for_device(limits(None, Some(2048)));
        assert_eq!(
            (b.cq_capacity, b.by_cq, b.max_comms),
            (Some(2048), Some(2), 2)
        );
        // Nothing limits sock without emulated limits.
        let b = Budget::for_device(DeviceLimits::default());
        assert_eq!(
            (b.max_comms, b.by_qps, b.by_cq),
            (UNLIMITED_COMMS, None, None)
        );
        // Never 0, even on a device too small for one connection.
        assert_eq!(Budget::for_device(limits(Some(1), Some(16))).max_comms, 1);
    }

    #[test]
    fn the_log_line_shows_the_arithmetic() {
        let d = Budget::for_device(limits(Some(40), Some(8192))).describe();
        assert!(
            d.starts_with("maxComms 4: per connection 2 queue pairs and 722 completion entries"),
            "{d}"
        );
        assert!(d.contains("64 receives + 297 sends = 32 grouped receives x (8 writes + record) + 8 control + probe"), "{d}");
        assert!(
            d.contains("queue pairs: max_qp 40 less 1/8 spare / 2 = 17"),
            "{d}"
        );
        assert!(d.contains("completions: shared completion queue of 4096 (max_cqe 8192) less 1/8 spare / 722 = 4"), "{d}");
        let d = Budget::for_device(DeviceLimits::default()).describe();
        assert!(
            d.contains("queue pairs: no limit; completions: unbounded"),
            "{d}"
        );
    }

    #[test]
    fn cq_depth_rule_covers_the_paths_with_spare() {
        assert_eq!(cq_depth_for(0, 0, None), 1);
        // 4 send paths (1444) + 4 receive paths (420) = 1864, + 1/7 = 2130.
        let d = cq_depth_for(4, 4, None);
        assert_eq!(d, 1864 + 1864 / 7);
        // After taking the spare out again, what remains still covers the paths.
        assert!(usable(d) >= 1864);
        assert_eq!(cq_depth_for(1000, 1000, Some(65536)), 65536);
    }
}
