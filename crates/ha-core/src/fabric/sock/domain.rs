//! The state of one `sock` protection domain that its listener, its registrations and its
//! queue pairs share: the rail address and listening port, the key table, and the queue pairs
//! an inbound stream may be handed to (seen through [`InboundTarget`], so this module does
//! not depend on the queue pairs).

use super::hello::Hello;
use super::mr::MrTable;
use super::Tunables;
use crate::fabric::counters::Counted;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// A queue pair as the listener sees it: something an inbound stream can be handed to.
pub trait InboundTarget: Send + Sync {
    /// The stream's hello names this queue pair: take the stream (`false`: refused, and the
    /// stream is closed).
    fn attach_inbound(self: Arc<Self>, s: Counted<TcpStream>, hello: &Hello) -> bool;
}

/// Ids of protection domains (process-unique).
static NEXT_PD_ID: AtomicU64 = AtomicU64::new(1);

/// What the listener and the queue pairs' threads share.
pub struct PdShared {
    pub id: u64,
    pub dev: usize,
    pub ip: IpAddr,
    pub port: u16,
    pub tun: Tunables,
    /// The key table (registrations hold it too, to leave it when dropped).
    pub mrs: Arc<MrTable>,
    /// Queue pairs that may receive an inbound stream, by queue pair number.
    qps: Mutex<HashMap<u32, Weak<dyn InboundTarget>>>,
}

impl PdShared {
    pub fn new(dev: usize, ip: IpAddr, port: u16, tun: Tunables) -> PdShared {
        PdShared {
            id: NEXT_PD_ID.fetch_add(1, Ordering::Relaxed),
            dev,
            ip,
            port,
            tun,
            mrs: Arc::new(MrTable::default()),
            qps: Mutex::new(HashMap::new()),
        }
    }
    pub fn register_qp(&self, qpn: u32, qp: Weak<dyn InboundTarget>) {
        self.qps.lock().insert(qpn, qp);
    }
    pub fn unregister_qp(&self, qpn: u32) {
        self.qps.lock().remove(&qpn);
    }
    pub fn qp(&self, qpn: u32) -> Option<Arc<dyn InboundTarget>> {
        self.qps.lock().get(&qpn).and_then(Weak::upgrade)
    }
}
