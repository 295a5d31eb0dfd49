//! What the drill tests share: the repository root and the freshly built plugin.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (scripts live under it).
pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// `target/<profile>/libnccl_net_ha.so`, built fresh by cargo first: a test binary of this
/// crate does not depend on the plugin's cdylib, so an edit there would otherwise drill a stale
/// library.
pub fn so_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    if let Ok(cargo) = std::env::var("CARGO") {
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "nccl-net-ha", "--lib"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let ok = cmd.output().map(|o| o.status.success()).unwrap_or(false);
        assert!(ok, "cargo build -p nccl-net-ha failed");
    }
    dir.join("libnccl_net_ha.so")
}
