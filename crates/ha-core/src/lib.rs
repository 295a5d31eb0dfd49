//! The core of nccl-net-ha: everything the plugin does, behind a safe Rust API that the
//! `nccl-net-ha` crate's C tables adapt onto.
//!
//! Layers (arrows point one way): [`api`] (validation of what NCCL passes, panic safety,
//! error mapping) → [`transport`] (the connection layer: handshake and data drivers that apply
//! `ha_proto`'s sans-IO machines to queue pairs, the multi-path link and its failover) →
//! [`engine`] (progress thread, completion routing, MR cache) → [`fabric`] (`verbs`, `sock`:
//! the only code touching hardware or sockets). [`config`] holds every `HA_NCCL_*` knob.

pub mod api;
pub mod config;
pub mod engine;
pub mod fabric;
pub mod transport;
