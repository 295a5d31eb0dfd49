//! C ABI layer: one file per ext-net version (repr(C) types, the exported table, thin
//! adapters onto `api`), plus a loader that drives any ext-net library through its table.

pub mod adapt;
pub mod common;
pub mod loader;
pub mod logger;
pub mod v10;
pub mod v10_types;
pub mod v11;
pub mod v11_types;
pub mod v8;
pub mod v8_types;
pub mod v9;
pub mod v9_types;
