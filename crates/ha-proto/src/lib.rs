//! The protocol core of nccl-net-ha, sans-IO in the style of quinn-proto: pure state machines
//! that decide what to post and when a request is done, driven by the connection layer
//! (`ha-core`'s `transport`) and by unit and property tests with no thread, socket or device.
//!
//! - [`handle`]: the 128-byte connect handle NCCL carries from `listen` to `connect`;
//! - [`handshake`]: the out-of-band hello/accept exchange that sets up both paths;
//! - [`data`]: the data protocol (clear-to-send FIFO, completion records, sequence numbers)
//!   and the failover machines that replay exactly what the peer did not complete;
//! - [`recovery`]: when to try a failed path again (re-arm backoff) and when to return to the
//!   preferred one (hold with hysteresis);
//! - [`wire`]: the little-endian reader/writer both use;
//! - [`rc`]: the RC completion vocabulary (status, opcode) the machines read.

pub mod data;
pub mod handle;
pub mod handshake;
pub mod rc;
pub mod recovery;
pub mod rto;
pub mod status;
pub mod wire;
