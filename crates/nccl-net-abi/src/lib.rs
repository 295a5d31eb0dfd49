//! `#[repr(C)]` mirrors of NCCL's ext-net plugin ABI: one module per version (`v8` … `v12`:
//! the function table, properties and the structures they take) and the constants and
//! callback types every version shares (`common`). Data only: no code runs here.
//!
//! Each layout is checked field by field against `include/nccl_net_ha.h` (compiled with the
//! system C compiler) by `tests/c_layout.rs`. Both the plugin (`nccl-net-ha`, which exports
//! these tables) and the loader (`nccl-net-loader`, which calls any plugin's tables) use them.

pub mod common;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v8;
pub mod v9;
