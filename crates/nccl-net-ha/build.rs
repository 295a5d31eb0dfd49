//! Link flags of the plugin library: a stable SONAME and `-z nodelete`, because NCCL from
//! version 2.28.3 on dlcloses net plugins after their last communicator while our threads may
//! still be winding down.
//!
//! `HA_ABI_MAX` (8, 9, 10, 11 or 12; default 12): the newest ext-net ABI the library exports.
//! NCCL takes the newest `ncclNetPlugin_vN` symbol `dlsym` finds, so a library built with
//! `HA_ABI_MAX=10` makes NCCL 2.28 fall back to v10 (`scripts/build.sh --abi-variants`), and
//! one built with `HA_ABI_MAX=11` makes NCCL 2.30 load v11 through its compatibility layer.
//! Each version N in 9..=max sets `cfg(ha_abi_vN)`, which exports that table.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net-ha.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=HA_ABI_MAX");
    println!("cargo:rustc-check-cfg=cfg(ha_abi_v9, ha_abi_v10, ha_abi_v11, ha_abi_v12)");
    let max = match std::env::var("HA_ABI_MAX") {
        Err(_) => 12,
        Ok(v) if v.trim().is_empty() => 12,
        Ok(v) => match v.trim().trim_start_matches(['v', 'V']).parse::<u32>() {
            Ok(n @ 8..=12) => n,
            _ => panic!("HA_ABI_MAX={v:?}: expected 8, 9, 10, 11 or 12"),
        },
    };
    for v in 9..=max {
        println!("cargo:rustc-cfg=ha_abi_v{v}");
    }
}
