//! Transport: handshake and data protocol as sans-IO state machines (`handshake`, `data`),
//! and the drivers that apply them to fabric queue pairs (`conn`).

pub mod conn;
pub mod data;
pub mod handle;
pub mod handshake;
pub mod wire;
