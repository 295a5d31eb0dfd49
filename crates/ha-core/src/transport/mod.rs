//! Connection drivers: apply the sans-IO handshake and data machines to fabric queue pairs
//! and OOB sockets. `listen` + `connect` build connections; `send` and `recv` carry data.

pub mod budget;
pub mod connect;
mod cts_backlog;
pub mod drain_list;
pub mod error;
pub mod flush;
pub mod ha;
pub mod link;
pub mod listen;
pub mod mr;
pub mod oob_io;
pub mod path;
pub mod recv;
pub mod region;
pub mod send;
pub mod setup;
pub mod stats;

pub use error::{Error, Result};

#[cfg(test)]
mod tests;
