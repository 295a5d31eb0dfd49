//! Link flags of the plugin library: a stable SONAME and `-z nodelete`, because NCCL from
//! version 2.28.3 on dlcloses net plugins after their last communicator while our threads may
//! still be winding down.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net-ha.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
