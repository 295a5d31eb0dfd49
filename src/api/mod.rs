//! API layer: validation of what NCCL passes in, panic safety, error mapping.

pub mod log;
