//! The plugin and the open-file limit, end to end through `ha-harness scale`: 24 `sock`
//! connections with their standbys, about 200 descriptors per process. Under a soft limit of
//! 128 (a shell's `ulimit -Sn 128`) the plugin raises it to the hard one at init and the run
//! succeeds. Under a hard limit of 128 as well, the plugin warns at init, and connection setup
//! then fails within seconds, no hang, with errors that name the limit, warned sparingly.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `ha-harness scale` over 24 connections after `ulimit`ing with `ulimit_args`.
fn scale_under(ulimit_args: &str) -> (Output, Duration, String) {
    let so = common::so_path();
    let t0 = Instant::now();
    let out = Command::new("sh")
        .args([
            "-c",
            &format!(
                "ulimit {ulimit_args} && exec \"$0\" scale --plugin \"$1\" --conns 24 --iters 50 \
                 --rounds 1"
            ),
            env!("CARGO_BIN_EXE_ha-harness"),
            so.to_str().unwrap(),
        ])
        .env("HA_NCCL_FABRIC", "sock")
        .env("HA_NCCL_SOCK_RAILS", "127.0.0.1,127.0.0.2")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_DEBUG", "INFO")
        .env("HA_NCCL_HANDSHAKE_TIMEOUT_MS", "3000")
        .output()
        .expect("running ha-harness scale");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, t0.elapsed(), text)
}

/// The hard limit must leave room above 128, or the first case shows nothing.
fn hard_limit() -> u64 {
    let out = Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    s.parse().unwrap_or(u64::MAX)
}

#[test]
fn the_plugin_raises_a_low_soft_limit_and_24_connections_run() {
    assert!(
        hard_limit() >= 1024,
        "this test needs a hard open-file limit of 1024 or more"
    );
    let (out, _, t) = scale_under("-Sn 128");
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains("raised this process's open-file limit (RLIMIT_NOFILE) from 128 to "),
        "no INFO line about the raise: {t}"
    );
    let row = t
        .lines()
        .find(|l| l.starts_with("| 24 |"))
        .unwrap_or_else(|| panic!("no row for 24 connections: {t}"));
    assert!(!row.contains("failed"), "{row}");
}

#[test]
fn out_of_descriptors_setup_fails_soon_and_names_the_limit() {
    let (out, took, t) = scale_under("-n 128");
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("| 24 | failed: "), "{t}");
    // At init, before anything fails: the warning with the numbers.
    assert!(
        t.contains("this process's open-file limit is 128 (hard 128)")
            && t.contains("so about 9 fit; raise `ulimit -Hn`"),
        "no init warning: {t}"
    );
    // When it fails: the side that ran out names the limit ...
    assert!(
        t.contains("Too many open files (os error 24); this process's open-file limit is 128"),
        "no error naming the limit: {t}"
    );
    // ... at most once per 5 s per process, not once per call or per connection.
    let warned = t.matches("more such failure").count() + t.matches("(os error 24); this").count();
    assert!(warned <= 12, "{warned} warnings: {t}");
    assert!(took < Duration::from_secs(40), "took {took:?}");
}
