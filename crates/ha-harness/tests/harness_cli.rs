//! `ha-harness` end to end against the C mock plugin: verdict lines, summary and exit status
//! for a correct plugin and for injected faults (corrupted byte, wrong size, NULL requests),
//! `bench` output, `procs` mode plumbing, and usage errors.

#[path = "../../nccl-net-loader/tests/common/mod.rs"]
mod common;

use ha_harness::check;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

fn mock() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| common::mock_plugin("cli", &[]))
}

/// The loopback-TCP mock: works across processes.
fn sock_mock() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| common::mock_plugin_from("mock_sock_v8.c", "cli_sock", &[]))
}

fn harness(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ha-harness"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running ha-harness")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn check_64k(env: &[(&str, &str)]) -> Output {
    let plugin = mock().to_str().unwrap();
    harness(&["check", "--plugin", plugin, "--max-size", "64K"], env)
}

#[test]
fn check_passes_every_case_on_a_correct_plugin() {
    let out = check_64k(&[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("plugin: MOCK ("), "{}", lines[0]);
    assert!(
        lines[1].starts_with("device 0: name=mock0 "),
        "{}",
        lines[1]
    );
    let (cases, _) = check::plan(64 << 10, 8);
    let verdicts: Vec<&str> = lines[2..lines.len() - 1].to_vec();
    let expected: Vec<String> = cases.iter().map(|c| format!("ok {}", c.name)).collect();
    assert_eq!(verdicts, expected);
    assert_eq!(
        lines.last(),
        Some(&format!("{} passed, 0 failed", cases.len()).as_str())
    );
}

#[test]
fn null_requests_are_retried() {
    let out = check_64k(&[("MOCK_NULL_EVERY", "2")]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.ends_with(" passed, 0 failed\n"));
}

#[test]
fn a_corrupted_byte_fails_exactly_its_case() {
    let out = check_64k(&[("MOCK_CORRUPT_AT", "1")]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 1, "{text}");
    // The first non-empty message is a 1-byte one; the mock flips its only byte.
    assert!(
        fails[0].starts_with("FAIL sendrecv size=1: "),
        "{}",
        fails[0]
    );
    assert!(fails[0].contains("data: byte 0 is "), "{}", fails[0]);
    let n = check::plan(64 << 10, 8).0.len();
    assert!(
        text.ends_with(&format!("{} passed, 1 failed\n", n - 1)),
        "{text}"
    );
}

#[test]
fn a_wrong_reported_size_fails_its_case() {
    let out = check_64k(&[("MOCK_BAD_SIZE_AT", "1")]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 1, "{text}");
    assert!(
        fails[0].starts_with("FAIL sendrecv size=0: "),
        "{}",
        fails[0]
    );
    assert!(
        fails[0].contains("test() reported size 1, sent 0"),
        "{}",
        fails[0]
    );
}

#[test]
fn multi_recv_cases_follow_max_recvs() {
    let plugin = common::mock_plugin("maxrecvs1", &["MOCK_MAXRECVS=1"]);
    let out = harness(
        &[
            "check",
            "--plugin",
            plugin.to_str().unwrap(),
            "--max-size",
            "4K",
        ],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("maxRecvs=1"));
    assert!(text.contains("# multirecv n=2..8 not run"), "{text}");
    assert!(!text.contains("ok multirecv"), "{text}");
}

#[test]
fn bench_prints_a_table_and_writes_json() {
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench_mock.json");
    let _ = std::fs::remove_file(&json);
    let plugin = mock().to_str().unwrap();
    let out = harness(
        &[
            "bench",
            "--plugin",
            plugin,
            "--min",
            "8",
            "--max",
            "4K",
            "--iters",
            "20",
            "--window",
            "8",
            "--json",
            json.to_str().unwrap(),
        ],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[2], "        size |     lat_us |   bw_GBps");
    let sizes: Vec<usize> = lines[3..]
        .iter()
        .map(|l| l.split('|').next().unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(sizes, [8, 32, 128, 512, 2048]);
    for l in &lines[3..] {
        let cols: Vec<f64> = l.split('|').map(|c| c.trim().parse().unwrap()).collect();
        assert!(cols[1] > 0.0 && cols[2] >= 0.0, "{l}");
    }
    let doc = std::fs::read_to_string(&json).unwrap();
    let numbers_after = |key: &str| -> Vec<f64> {
        doc.split(key)
            .skip(1)
            .map(|rest| {
                rest.split([',', '}'])
                    .next()
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            })
            .collect()
    };
    let lat = numbers_after("\"lat_us\": ");
    let bw = numbers_after("\"bw_GBps\": ");
    assert_eq!((lat.len(), bw.len()), (5, 5));
    assert!(
        lat.iter().chain(&bw).all(|v| v.is_finite() && *v > 0.0),
        "{doc}"
    );
    assert!(doc.contains("\"plugin\": \"MOCK\""));
    assert_eq!(doc.matches("\"size\": ").count(), 5);
    assert!(doc.contains("\"size\": 2048, \"lat_us\": "));
}

/// The mock cannot carry data between processes, but it checks where a handle comes from:
/// both sides failing with "handle from another process" shows that the child was started,
/// that the listen handles crossed in both directions, and that the child's error came back
/// over its stdout.
#[test]
fn procs_mode_exchanges_handles_with_the_child() {
    let plugin = mock().to_str().unwrap();
    let out = harness(
        &[
            "check",
            "--plugin",
            plugin,
            "--mode",
            "procs",
            "--max-size",
            "8",
        ],
        &[],
    );
    let (text, err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}\n{err}");
    assert_eq!(
        err.matches("handle from another process").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains("side A: connect(dev 0): ncclSystemError (2)"),
        "{err}"
    );
    assert!(
        err.contains("side B: connect(dev 0): ncclSystemError (2)"),
        "{err}"
    );
    assert!(text.contains("mode procs"));
    assert!(
        text.ends_with(" failed\n") && text.contains("0 passed, "),
        "{text}"
    );
}

#[test]
fn procs_mode_check_passes_across_processes() {
    let plugin = sock_mock().to_str().unwrap();
    let out = harness(
        &[
            "check",
            "--plugin",
            plugin,
            "--mode",
            "procs",
            "--max-size",
            "64K",
        ],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let (cases, _) = check::plan(64 << 10, 8);
    let verdicts: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("plugin: "))
        .collect();
    let mut expected: Vec<String> = vec![verdicts[0].to_string()];
    expected.extend(cases.iter().map(|c| format!("ok {}", c.name)));
    expected.push(format!("{} passed, 0 failed", cases.len()));
    assert!(verdicts[0].starts_with("device 0: name=lo "), "{text}");
    assert_eq!(verdicts, expected);
}

/// Each process corrupts the first non-empty message it receives: both sides must report
/// the same case, the child's report arriving over its stdout.
#[test]
fn procs_mode_reports_failures_from_both_sides() {
    let plugin = sock_mock().to_str().unwrap();
    let out = harness(
        &[
            "check",
            "--plugin",
            plugin,
            "--mode",
            "procs",
            "--max-size",
            "4K",
        ],
        &[("MOCK_CORRUPT_AT", "1")],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 1, "{text}");
    assert!(
        fails[0].starts_with("FAIL sendrecv size=1: A: "),
        "{}",
        fails[0]
    );
    assert!(fails[0].contains("; B: iteration 0"), "{}", fails[0]);
    assert_eq!(
        fails[0].matches("data: byte 0 is ").count(),
        2,
        "{}",
        fails[0]
    );
    assert!(text.ends_with(" passed, 1 failed\n"), "{text}");
}

#[test]
fn procs_mode_bench_runs() {
    let plugin = sock_mock().to_str().unwrap();
    let out = harness(
        &[
            "bench", "--plugin", plugin, "--mode", "procs", "--min", "1K", "--max", "64K",
            "--factor", "8", "--iters", "10",
        ],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let sizes: Vec<&str> = text
        .lines()
        .skip(3)
        .map(|l| l.split('|').next().unwrap().trim())
        .collect();
    assert_eq!(sizes, ["1024", "8192", "65536"]);
}

#[test]
fn usage_and_load_errors() {
    let out = harness(&["check", "--bogus"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown option '--bogus'"));
    let out = harness(&["help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("usage: ha-harness"));
    let out = harness(&["check", "--plugin", "/nonexistent/lib.so"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("dlopen /nonexistent/lib.so"));
    let plugin = mock().to_str().unwrap();
    let out = harness(&["check", "--plugin", plugin, "--dev", "3"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--dev 3: the plugin has 1 device(s)"));
}
