//! One connected path of a connection: a queue pair on a leased device and the route of its
//! completions into the connection's inbox. Dropping a path fences its queue pair first, so
//! nothing is placed in memory once the connection's buffers start being freed.

use crate::engine::{Lease, Route};
use crate::fabric::{
    Access, MemoryRegion, QpCaps, QueuePair, Result as FabricResult,
};
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
