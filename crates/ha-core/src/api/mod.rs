//! API layer: validation of what NCCL passes in, panic safety, error mapping. Safe Rust only;
//! the `abi` adapters convert C pointers into the plain values these functions take.

pub mod error;
pub mod gdr;
pub mod handles;
pub mod log;
mod mem;
mod nofile;
pub mod ops;
pub mod state;

pub use error::{ApiError, ApiResult, Code};
