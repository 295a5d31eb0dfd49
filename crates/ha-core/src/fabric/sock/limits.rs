//! Device limits the `sock` fabric can emulate (`HA_NCCL_SOCK_MAX_QP`,
//! `HA_NCCL_SOCK_MAX_CQE`), so the connection budget can be tested without RDMA hardware:
//! a rail holds at most `max_qp` queue pairs (creating one more fails, as `ibv_create_qp`
//! does), and a completion queue holds at most `max_cqe` entries (see `cq.rs`: a full queue
//! overruns). Without limits nothing is counted against anything.

use crate::fabric::{FabricError, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The queue-pair slots of one rail.
#[derive(Debug)]
pub(crate) struct QpSlots {
    /// The rail's name, for errors.
    name: String,
    max: Option<u32>,
    used: AtomicU32,
}

/// One queue pair's slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct QpSlot(Arc<QpSlots>);

impl QpSlots {
    pub fn new(name: String, max: Option<u32>) -> Arc<QpSlots> {
        Arc::new(QpSlots {
            name,
            max,
            used: AtomicU32::new(0),
        })
    }

    /// A slot for a new queue pair, or the error `ibv_create_qp` gives when the device has
    /// no queue pair left.
    pub fn take(self: &Arc<Self>) -> Result<QpSlot> {
        let took = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                self.max.is_none_or(|m| n < m).then_some(n + 1)
            });
        match took {
            Ok(_) => Ok(QpSlot(self.clone())),
            Err(n) => Err(FabricError::System(format!(
                "sock:{}: cannot create a queue pair: the device holds {n} of its max_qp {} \
                 (HA_NCCL_SOCK_MAX_QP)",
                self.name,
                self.max.unwrap_or(0)
            ))),
        }
    }

    /// Queue pairs holding a slot now.
    #[cfg(test)]
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::SeqCst)
    }
}

impl Drop for QpSlot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_run_out_at_max_and_come_back() {
        let s = QpSlots::new("lo".into(), Some(2));
        let a = s.take().unwrap();
        let _b = s.take().unwrap();
        let e = s.take().unwrap_err().to_string();
        assert!(e.contains("sock:lo: cannot create a queue pair"), "{e}");
        assert!(e.contains("holds 2 of its max_qp 2"), "{e}");
        assert_eq!(s.used(), 2);
        drop(a);
        assert_eq!(s.used(), 1);
        let _c = s.take().unwrap();
        let free = QpSlots::new("lo".into(), None);
        let many: Vec<QpSlot> = (0..100).map(|_| free.take().unwrap()).collect();
        assert_eq!(free.used(), 100);
        drop(many);
        assert_eq!(free.used(), 0);
    }
}
