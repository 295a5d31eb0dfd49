//! Which completion statuses are link failures and which are bugs.
//!
//! A failover only helps when the fault belongs to the path: the same request replayed on the
//! standby succeeds. A protection, access, length or invalid-request error says the request
//! itself was wrong (a key, an address, a size): replayed on the standby it fails the same
//! way, after a needless switch that hides the cause. So those end the connection at once,
//! naming the status and the request; everything that says "this path stopped working" fails
//! over. RCCL's port failover draws the line in the same place (flush and retry-exceeded fail
//! over; remote access and general errors are fatal).
//!
//! | `ibv_wc_status` | code | class | why |
//! |---|---:|---|---|
//! | `LOC_LEN_ERR` | 1 | bug | a request longer than what it was posted for |
//! | `LOC_QP_OP_ERR` | 2 | link | the queue pair broke under the request |
//! | `LOC_EEC_OP_ERR` | 3 | bug | EE contexts are never used |
//! | `LOC_PROT_ERR` | 4 | bug | a local key that does not cover the buffer |
//! | `WR_FLUSH_ERR` | 5 | link | flushed: the queue pair went to error |
//! | `MW_BIND_ERR` | 6 | bug | memory windows are never used |
//! | `BAD_RESP_ERR` | 7 | link | an unexpected transport response (corruption on the wire) |
//! | `LOC_ACCESS_ERR` | 8 | bug | a local access violation |
//! | `REM_INV_REQ_ERR` | 9 | bug | the responder found the request invalid |
//! | `REM_ACCESS_ERR` | 10 | bug | a remote key or address that the peer's region does not cover |
//! | `REM_OP_ERR` | 11 | link | the responder could not complete it (its queue pair failed; on `sock`, garbage on the stream) |
//! | `RETRY_EXC_ERR` | 12 | link | no acknowledgement within the retry window: the link is dead |
//! | `RNR_RETRY_EXC_ERR` | 13 | link | the peer never posted a receive (a dead peer side) |
//! | `LOC_RDD_VIOL_ERR` | 14 | bug | RD domains are never used |
//! | `REM_INV_RD_REQ_ERR` | 15 | bug | an RDMA READ the responder refused |
//! | `REM_ABORT_ERR` | 16 | link | the responder aborted the operation |
//! | `INV_EECN_ERR`, `INV_EEC_STATE_ERR` | 17, 18 | bug | EE contexts are never used |
//! | `FATAL_ERR` | 19 | link | the device failed: the other NIC still works |
//! | `RESP_TIMEOUT_ERR` | 20 | link | no response in time |
//! | `GENERAL_ERR` | 21 | bug | a device-specific error (RCCL: fatal) |
//! | `TM_ERR`, `TM_RNDV_INCOMPLETE` | 22, 23 | bug | tag matching is never used |
//! | anything newer | > 23 | link | unknown: failing over is what the plugin did before it knew |
//!
//! Asynchronous events are handled where they arrive (the verbs fabric's event thread):
//! `PORT_ERR` makes the port unhealthy until `PORT_ACTIVE` and the active path on it fails
//! over at the next tick (link); `CQ_ERR` and `DEVICE_FATAL` make the device unhealthy (link:
//! the other NIC still works); `QP_FATAL`, `QP_REQ_ERR` and `QP_ACCESS_ERR` move the queue
//! pair to error, whose requests then complete flushed or with their own status, classified
//! here.

use crate::rc::WcStatus;

/// What an error completion says about the path it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusClass {
    /// The path stopped working: fail over and replay what the peer did not complete.
    Link,
    /// The request itself was wrong: replaying it elsewhere repeats the fault. End the
    /// connection, naming the status.
    Bug,
}

impl WcStatus {
    /// The class of an error status (see the module's table). `Success` is `Link` by
    /// convention: callers ask only for errors.
    pub fn class(self) -> StatusClass {
        match self.code() {
            1 | 3 | 4 | 6 | 8 | 9 | 10 | 14 | 15 | 17 | 18 | 21 | 22 | 23 => StatusClass::Bug,
            _ => StatusClass::Link,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verbs_status_has_the_class_of_the_table() {
        let link = [0u32, 2, 5, 7, 11, 12, 13, 16, 19, 20, 24, 99];
        let bug = [1u32, 3, 4, 6, 8, 9, 10, 14, 15, 17, 18, 21, 22, 23];
        for c in link {
            assert_eq!(
                WcStatus::from_code(c).class(),
                StatusClass::Link,
                "code {c}"
            );
        }
        for c in bug {
            assert_eq!(WcStatus::from_code(c).class(), StatusClass::Bug, "code {c}");
        }
        // The named variants agree with their codes.
        assert_eq!(WcStatus::RemAccessErr.class(), StatusClass::Bug);
        assert_eq!(WcStatus::LocProtErr.class(), StatusClass::Bug);
        assert_eq!(WcStatus::RetryExcErr.class(), StatusClass::Link);
        assert_eq!(WcStatus::WrFlushErr.class(), StatusClass::Link);
    }
}
