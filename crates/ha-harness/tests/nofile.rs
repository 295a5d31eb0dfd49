//! The plugin out of descriptors, end to end through `ha-harness scale`: 24 `sock` connections
//! with their standbys (about 200 descriptors per process) in a shell whose open-file limit
//! is 128, soft and hard (the harness, as NCCL, raises the soft limit to the hard one). At
//! init the plugin warns with the numbers; connection setup then fails soon, with no hang,
//! and the errors name the limit instead of only a handshake timeout.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn out_of_descriptors_setup_fails_soon_and_names_the_limit() {
    let so = common::so_path();
    let t0 = Instant::now();
    let out = Command::new("sh")
        .args([
            "-c",
            "ulimit -n 128 && exec \"$0\" scale --plugin \"$1\" --conns 24 --iters 50 --rounds 1",
            env!("CARGO_BIN_EXE_ha-harness"),
            so.to_str().unwrap(),
        ])
        .env("HA_NCCL_FABRIC", "sock")
        .env("HA_NCCL_SOCK_RAILS", "127.0.0.1,127.0.0.2")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("HA_NCCL_HANDSHAKE_TIMEOUT_MS", "3000")
        .output()
        .expect("running ha-harness scale");
    let took = t0.elapsed();
    let t = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("| 24 | failed: "), "{t}");
    // At init, before anything fails: the warning with the numbers.
    assert!(
        t.contains("the open-file limit is 128 (hard 128)")
            && t.contains("at most about 14 connections fit in this process"),
        "no init warning: {t}"
    );
    // When it fails: the side that ran out names the limit ...
    assert!(
        t.contains("(out of file descriptors: open-file limit 128 (hard 128); "),
        "no error naming the limit: {t}"
    );
    // ... and a listener whose accept keeps failing warns once per 5 s, not per call.
    let warned = t.matches("accept on the OOB listener of device").count();
    assert!(warned <= 6, "{warned} accept warnings: {t}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
}
