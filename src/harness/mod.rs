//! `ha-harness`: drives any ext-net v8 plugin the way NCCL's proxy does, through
//! [`crate::abi::loader`]. `check` runs a functional suite with every byte verified; `bench`
//! measures latency and bandwidth per message size. Two endpoints talk to each other: two
//! threads of one process (`--mode threads`) or this process and a child (`--mode procs`).

pub mod args;
pub mod bench;
pub mod check;
pub mod conn;
pub mod driver;
pub mod pattern;
pub mod report;
pub mod session;
pub mod stream;
pub mod wire;

pub use session::main_with_args;
