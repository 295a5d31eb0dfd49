//! One connected path of a connection: a queue pair on a leased device and the route of its
//! completions into the connection's inbox. Dropping a path fences its queue pair first, so
//! nothing is placed in memory once the connection's buffers start being freed.

use crate::engine::{Lease, Route};
use crate::fabric::{Access, MemoryRegion, QpCaps, QueuePair, Result as FabricResult};
use crate::transport::data::layout::SharedWords;

/// Work-request budget per queue pair: 32 receives × 8 buffers of payload writes plus the
/// records and clear-to-sends, with headroom.
pub const QP_CAPS: QpCaps = QpCaps {
    max_send_wr: 1024,
    max_recv_wr: 256,
};

pub struct Path {
    // Field order is drop order: the queue pair goes (fenced) before its route and lease.
    pub qp: Box<dyn QueuePair>,
    pub route: Route,
    pub lease: Lease,
}

impl Path {
    /// A queue pair in INIT on `lease`'s device, routed to a fresh inbox.
    pub fn open(lease: Lease) -> FabricResult<Path> {
        let qp = lease.dev.pd.create_qp(&lease.dev.cq, QP_CAPS)?;
        let route = lease.route(qp.qp_num());
        qp.to_init()?;
        Ok(Path { qp, route, lease })
    }

    /// Register words owned by the connection on this path's device.
    pub fn register(&self, w: &SharedWords, access: Access) -> FabricResult<Box<dyn MemoryRegion>> {
        self.lease.dev.pd.reg_mr(w.addr(), w.len_bytes(), access)
    }
}

impl Drop for Path {
    fn drop(&mut self) {
        // Fence: after this no byte is placed through this queue pair.
        let _ = self.qp.to_err();
    }
}

/// Keep-alive probing: a connection that has waited `interval` on its peer posts one
/// zero-length RDMA WRITE to a region the peer registered. A live peer acknowledges it; a
/// dead one makes it complete in error (retry exceeded), which fails the waiting request
/// instead of leaving NCCL polling forever.
pub struct Keepalive {
    interval: std::time::Duration,
    waiting_since: Option<std::time::Instant>,
    outstanding: bool,
    sent: u64,
}

impl Keepalive {
    pub fn new(interval: std::time::Duration) -> Self {
        Keepalive {
            interval,
            waiting_since: None,
            outstanding: false,
            sent: 0,
        }
    }

    /// Something moved: the peer is alive.
    pub fn progress(&mut self) {
        self.waiting_since = None;
    }

    /// The connection is waiting on its peer; probe `target` when due.
    pub fn waiting(
        &mut self,
        qp: &dyn QueuePair,
        target: crate::transport::handshake::RemoteBuf,
    ) -> FabricResult<()> {
        let now = std::time::Instant::now();
        let since = *self.waiting_since.get_or_insert(now);
        if self.outstanding || now.duration_since(since) < self.interval {
            return Ok(());
        }
        self.sent += 1;
        self.outstanding = true;
        self.waiting_since = Some(now);
        qp.post_send(&[crate::fabric::SendWr {
            wr_id: crate::transport::data::layout::wr_id(
                crate::transport::data::layout::WrKind::Probe,
                self.sent,
                0,
            ),
            op: crate::fabric::SendOp::Write,
            local: crate::fabric::Sge {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            remote_addr: target.addr,
            rkey: target.rkey,
            signaled: true,
        }])
    }

    /// Note a completion (a probe's answer clears the outstanding flag).
    pub fn on_completion(&mut self, c: &crate::fabric::Completion) {
        if crate::transport::data::layout::decode_wr_id(c.wr_id).0
            == Some(crate::transport::data::layout::WrKind::Probe)
        {
            self.outstanding = false;
        }
    }

    /// Probes posted so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }
}
