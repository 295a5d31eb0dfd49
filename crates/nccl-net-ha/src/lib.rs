//! nccl-net-ha: an NCCL network plugin whose connections survive the loss of a NIC port,
//! cable or switch port. This crate is the shipped `libnccl-net-ha.so` and holds only the C
//! ABI: one exported table per ext-net version (`v8` … `v12`, built on `nccl_net_abi`'s
//! layouts), the entry points they share (`shared`), argument conversion (`adapt`) and the
//! bridge to NCCL's logger (`logger`), and the check of NCCL 2.28/2.29's plugin reload that
//! every `init` runs (`reload`). Every entry point is a thin adapter onto `ha_core::api`,
//! which does the work.

mod adapt;
mod logger;
mod reload;
mod shared;
mod v10;
mod v11;
mod v12;
mod v8;
mod v9;
