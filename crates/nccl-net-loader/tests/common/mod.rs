//! Builds the C mock plugins (tests/mock_plugin/) with the system C compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the in-process mock (`mock_net_v8.c`) with `defines`.
pub fn mock_plugin(variant: &str, defines: &[&str]) -> PathBuf {
    mock_plugin_from("mock_net_v8.c", variant, defines)
}

/// Compiles `tests/mock_plugin/<source>` with `defines` into
/// `<target tmp>/libmock_<variant>.so`. The file is written under a temporary name and
/// renamed, so parallel tests never load a half-written library.
pub fn mock_plugin_from(source: &str, variant: &str, defines: &[&str]) -> PathBuf {
    // The sources live with the loader's tests; the harness's tests build them too.
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nccl-net-loader/tests/mock_plugin")
        .join(source);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let out = dir.join(format!("libmock_{variant}.so"));
    let tmp = dir.join(format!(
        "libmock_{variant}.so.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let status = Command::new("cc")
        .args([
            "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
        ])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("running cc (a C compiler is needed to build the mock plugin)");
    assert!(status.success(), "cc failed to build the mock plugin");
    std::fs::rename(&tmp, &out).expect("renaming the mock plugin into place");
    out
}
