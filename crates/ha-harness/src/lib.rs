//! `ha-harness`: drives any ext-net v8 plugin the way NCCL's proxy does, through
//! [`nccl_net_loader`]. `check` runs a functional suite with every byte verified; `bench`
//! measures latency and bandwidth per message size. `stats` reads a plugin's stats file,
//! `timeline` draws it (see [`stats`], [`picture`]). Two endpoints talk to each other: two
//! threads of one process (`--mode threads`) or this process and a child (`--mode procs`).
//! `drain|undrain|drained` edit the node's drain list the plugin watches ([`drain`]); `limit`
//! and `scale` print what a message and a connection cost ([`limit`], [`scale`]), `calls` what
//! the plugin's own software costs per call ([`calls`]).

pub mod args;
pub mod backoff;
pub mod bench;
pub mod calls;
pub mod check;
pub mod conn;
pub mod drain;
pub mod driver;
pub mod limit;
pub mod outcome;
pub mod pattern;
pub mod picture;
pub mod plan;
pub mod report;
pub mod scale;
pub mod session;
pub mod stats;
pub mod stream;
pub mod wire;

pub use session::main_with_args;
