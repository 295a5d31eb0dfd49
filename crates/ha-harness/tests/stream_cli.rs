//! `ha-harness stream` end to end against the C mock plugins: a clean stream (fixed length and
//! timed, threads and procs), injected faults counted as corruption, a failing call and a
//! stalled plugin ending the stream with an error (never a hang), the child environment and
//! prefix reaching a `procs` child, the JSON document, and usage errors.

#[path = "../../nccl-net-loader/tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn mock() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| common::mock_plugin("stream", &[]))
}

fn sock_mock() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| common::mock_plugin_from("mock_sock_v8.c", "stream_sock", &[]))
}

fn stream(plugin: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ha-harness"))
        .arg("stream")
        .arg("--plugin")
        .arg(plugin)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running ha-harness")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The counts of the result line: messages, bytes, lost, duplicated, corrupted, errors.
fn counts(o: &Output) -> [u64; 6] {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("messages "))
        .unwrap_or_else(|| panic!("no result line:\n{}", text(o)));
    let nums: Vec<u64> = line
        .split(", ")
        .map(|f| f.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(nums.len(), 7, "{line}");
    [nums[0], nums[1], nums[2], nums[3], nums[4], nums[5]]
}

#[test]
fn a_fixed_length_stream_delivers_every_message_intact() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = dir.join(format!("stream-{}.json", std::process::id()));
    let o = stream(
        mock(),
        &[
            "--messages",
            "500",
            "--max-size",
            "64K",
            "--seed",
            "3",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let [msgs, bytes, lost, dup, corrupt, errors] = counts(&o);
    assert_eq!((msgs, lost, dup, corrupt, errors), (500, 0, 0, 0, 0));
    assert!(bytes > 0);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("stream: start monotonic_ns="), "{out}");
    assert!(out.contains("stream: sent 500 messages"), "{out}");
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.contains("\"messages\": 500,"), "{j}");
    assert!(j.contains("\"clean\": true,"), "{j}");
    assert!(j.contains("\"longest_gaps\": ["), "{j}");
    assert_eq!(j.matches('{').count(), j.matches('}').count());
    let _ = std::fs::remove_file(&json);
}

#[test]
fn a_timed_stream_stops_cleanly_on_both_sides() {
    for (plugin, mode) in [(mock(), "threads"), (sock_mock(), "procs")] {
        let o = stream(
            plugin,
            &["--duration", "0.5", "--max-size", "16K", "--mode", mode],
            &[("MOCK_NULL_EVERY", "3")],
        );
        assert_eq!(o.status.code(), Some(0), "{mode}: {}", text(&o));
        let [msgs, _, lost, dup, corrupt, errors] = counts(&o);
        assert!(msgs > 0, "{mode}");
        assert_eq!((lost, dup, corrupt, errors), (0, 0, 0, 0), "{mode}");
        // Every message the sender sent was received: the stop handshake lost nothing.
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!("stream: sent {msgs} messages")),
            "{mode}: {out}"
        );
        assert!(
            out.contains("stream: traffic started at_ms="),
            "{mode}: {out}"
        );
    }
}

#[test]
fn corrupted_and_mis_sized_deliveries_are_counted() {
    for fault in ["MOCK_CORRUPT_AT", "MOCK_BAD_SIZE_AT"] {
        let o = stream(
            mock(),
            &["--messages", "300", "--max-size", "8K"],
            &[(fault, "20")],
        );
        assert_eq!(o.status.code(), Some(1), "{fault}: {}", text(&o));
        let [msgs, _, lost, dup, corrupt, errors] = counts(&o);
        assert_eq!(
            (msgs, lost, dup, corrupt, errors),
            (299, 0, 0, 1, 0),
            "{fault}"
        );
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("stream: first problem: slot of message"),
            "{fault}: {}",
            text(&o)
        );
    }
}

#[test]
fn child_env_and_prefix_reach_the_receiver_process() {
    // The fault is set only in the child (the receiver): one corrupted message.
    let o = stream(
        sock_mock(),
        &[
            "--messages",
            "200",
            "--max-size",
            "8K",
            "--mode",
            "procs",
            "--child-env",
            "MOCK_CORRUPT_AT=5",
        ],
        &[],
    );
    assert_eq!(counts(&o)[4], 1, "{}", text(&o));
    let o = stream(
        sock_mock(),
        &[
            "--messages",
            "200",
            "--max-size",
            "8K",
            "--mode",
            "procs",
            "--child-prefix",
            "env MOCK_CORRUPT_AT=7",
        ],
        &[],
    );
    assert_eq!(counts(&o)[4], 1, "{}", text(&o));
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn a_failing_call_ends_the_stream_with_its_ncclresult() {
    let plugin = common::mock_plugin("stream_noisend", &["MOCK_NO_ISEND"]);
    let o = stream(&plugin, &["--messages", "100"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("stream: error: side A (sender) at ") && out.contains("ncclInternalError (3)"),
        "{out}"
    );
    assert_eq!(counts(&o)[5], 1);
}

#[test]
fn a_stalled_plugin_ends_the_stream_after_the_timeout() {
    let started = Instant::now();
    let o = stream(
        mock(),
        &["--messages", "100", "--timeout", "1"],
        &[("MOCK_TEST_DELAY", "2000000000")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("no progress for 1s"), "{out}");
    assert!(counts(&o)[5] >= 1);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn usage_errors_and_now() {
    let o = stream(mock(), &["--messages", "0"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(env!("CARGO_BIN_EXE_ha-harness"))
        .arg("now")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let ns: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    assert!(ns > 0);
}

#[test]
fn a_child_that_never_starts_fails_the_stream_at_once() {
    let started = Instant::now();
    // `false <harness> stream --child ...` exits at once without a word.
    let o = stream(
        sock_mock(),
        &[
            "--messages",
            "10",
            "--mode",
            "procs",
            "--child-prefix",
            "false",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("stream: error: side B (receiver) at ")
            && out.contains("child exited without reporting (child exited with exit status: 1)"),
        "{out}"
    );
    assert_eq!(counts(&o)[5], 1, "one failure, counted once: {}", text(&o));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}
