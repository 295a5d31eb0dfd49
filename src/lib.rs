//! nccl-net-ha: an NCCL ext-net plugin whose connections survive the loss of a NIC port,
//! cable or switch port.
//!
//! Layers (arrows point one way):
//! `abi` (C ABI tables per version) → `api` (validation, panic safety, error mapping) →
//! `transport` (handshake and data protocol as sans-IO state machines, plus the drivers that
//! apply them) → `engine` (progress thread, completion queues, MR cache) → `fabric`
//! (`verbs`, `sock`: the only code touching hardware or sockets). `config` holds every
//! `HA_NCCL_*` knob.

pub mod abi;
pub mod api;
pub mod config;
pub mod engine;
pub mod fabric;
#[doc(hidden)]
pub mod fuzzing;
pub mod harness;
pub mod transport;
