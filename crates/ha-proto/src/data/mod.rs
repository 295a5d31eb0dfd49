//! Data protocol (sans-IO), in the style of NCCL's IB transport: the receiver RDMA-writes
//! clear-to-send (CTS) entries into the sender's FIFO; the sender matches tags, RDMA-writes
//! the payloads, then a WRITE_WITH_IMM carrying a completion record (sizes) whose immediate is
//! the per-connection sequence number. The machines here decide *what* to post and *when* a
//! request is done; drivers in `transport::conn` post it on a fabric.

#[cfg(test)]
mod eager_tests;
#[cfg(test)]
mod failover_tests;
pub mod layout;
#[cfg(test)]
mod planned_tests;
pub mod recv;
pub mod send;
#[cfg(test)]
mod tests;

use crate::rc::WcStatus;

/// A request handle local to one side of one connection: slot index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReqId {
    pub index: u16,
    pub gen: u16,
}

/// Broad class of a protocol error (maps to an `ncclResult_t` above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// A malformed argument (bad handle, size, pointer).
    Argument,
    /// The caller broke the contract (NCCL or the application).
    Usage,
    /// The peer or the link failed.
    Remote,
    /// A local resource failed.
    System,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("send of {send} bytes is larger than the posted receive buffer of {recv} bytes")]
    Truncated { send: u64, recv: u64 },
    #[error("the peer's send was larger than this receive buffer")]
    PeerTruncated,
    #[error("send tag {0} matches no free buffer of the posted receive")]
    TagMismatch(i32),
    #[error("peer posted a malformed clear-to-send (entry count {0})")]
    BadCts(u64),
    #[error("completion record {what}: the peer's record is corrupted")]
    CorruptRecord { what: &'static str },
    #[error("{what} failed with completion status {status:?}")]
    Failed {
        status: WcStatus,
        what: &'static str,
    },
    #[error("unknown or already completed request")]
    BadRequest,
}

impl ProtoError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ProtoError::Truncated { .. } | ProtoError::TagMismatch(_) | ProtoError::BadRequest => {
                ErrorClass::Usage
            }
            ProtoError::PeerTruncated
            | ProtoError::BadCts(_)
            | ProtoError::CorruptRecord { .. } => ErrorClass::Remote,
            ProtoError::Failed { status, .. } => match status {
                WcStatus::LocLenErr | WcStatus::LocQpOpErr | WcStatus::LocProtErr => {
                    ErrorClass::System
                }
                _ => ErrorClass::Remote,
            },
        }
    }
}

/// Fixed-size pool of request slots with generations, so stale or forged ids are caught.
pub(crate) struct Slab<T> {
    slots: Vec<(u16, Option<T>)>,
    free: Vec<u16>,
}

impl<T> Slab<T> {
    pub fn new(n: usize) -> Self {
        Slab {
            slots: (0..n).map(|_| (0, None)).collect(),
            free: (0..n as u16).rev().collect(),
        }
    }
    pub fn insert(&mut self, v: T) -> Option<ReqId> {
        let index = self.free.pop()?;
        let s = &mut self.slots[index as usize];
        s.0 = s.0.wrapping_add(1);
        s.1 = Some(v);
        Some(ReqId { index, gen: s.0 })
    }
    pub fn get(&self, id: ReqId) -> Option<&T> {
        match self.slots.get(id.index as usize) {
            Some((g, Some(v))) if *g == id.gen => Some(v),
            _ => None,
        }
    }
    pub fn get_mut(&mut self, id: ReqId) -> Option<&mut T> {
        match self.slots.get_mut(id.index as usize) {
            Some((g, Some(v))) if *g == id.gen => Some(v),
            _ => None,
        }
    }
    pub fn remove(&mut self, id: ReqId) -> Option<T> {
        match self.slots.get_mut(id.index as usize) {
            Some((g, v @ Some(_))) if *g == id.gen => {
                self.free.push(id.index);
                v.take()
            }
            _ => None,
        }
    }
    pub fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}
