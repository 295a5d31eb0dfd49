//! `ha-harness stats` and `ha-harness timeline` on the stats file of a real run, with the exact
//! report expected. tests/data/sock-drill.stats.jsonl and .events.jsonl are what
//! `scripts/drill/sock-drill.sh --drills 1 --restore 1 --second-cut 1 --duration 8 --stats-ms 200
//! --env HA_NCCL_SOCK_RETRY_MS=300 --env HA_NCCL_REARM_HOLD_MS=200 --env HA_NCCL_HEARTBEAT_MS=100
//! --keep DIR` left behind (two processes, four connections; rail 0 cut near, restored, the
//! sender re-armed, rail 1 cut near, traffic back on path 0 with no standby until the close),
//! unedited. Prefixes of the file are the live state a reader saw at that moment (`--now`).
//! `sock_drill` runs the reader on a fresh drill's file too.

use std::path::PathBuf;
use std::process::Command;

fn data(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data")).join(name)
}

/// `ha-harness ARGS`: exit status, stdout (the file's path in the first line said as FILE),
/// stderr.
fn harness(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ha-harness"))
        .args(args)
        .output()
        .expect("running ha-harness");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let out = match out.split_once(": ") {
        Some((head, rest)) if head.starts_with("stats ") => format!("stats FILE: {rest}"),
        _ => out,
    };
    (
        o.status.code().unwrap_or(-1),
        out,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn lines() -> Vec<String> {
    std::fs::read_to_string(data("sock-drill.stats.jsonl"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// The file's first `n` lines, as a file of their own.
fn prefix(n: usize, tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ha-stats-real-{}-{tag}.jsonl", std::process::id()));
    std::fs::write(&p, lines()[..n].join("\n") + "\n").unwrap();
    p
}

/// Index (0-based) of the first line after `from` that holds all of `want`.
fn find(from: usize, want: &[&str]) -> usize {
    let l = lines();
    (from..l.len())
        .find(|&i| want.iter().all(|w| l[i].contains(w)))
        .unwrap_or_else(|| panic!("no line with {want:?} after line {from}"))
}

const SENDER: &str = r#""pid":17829,"conn":1,"#;

#[test]
fn the_closed_run_lists_every_connection_with_its_failovers() {
    let f = data("sock-drill.stats.jsonl");
    let (code, out, err) = harness(&[
        "stats",
        "--all",
        "--now",
        "1795582601000",
        &f.to_string_lossy(),
    ]);
    assert_eq!((code, err.as_str()), (0, ""), "{out}");
    assert_eq!(out, FULL);
    // Nothing live: nothing to flag.
    let (code, _, _) = harness(&["stats", "--check", &f.to_string_lossy()]);
    assert_eq!(code, 0);
}

#[test]
fn after_the_first_failover_the_live_connections_without_standby_are_flagged() {
    let fo = find(0, &[r#""event":"failover""#, SENDER]);
    let next = find(fo + 1, &[r#""event":"periodic""#, SENDER]);
    let p = prefix(next + 1, "first");
    let (code, out, _) = harness(&["stats", "--now", "1795582594300", &p.to_string_lossy()]);
    assert_eq!(code, 0);
    assert_eq!(out, LIVE_AFTER_FIRST);
    let (code, _, _) = harness(&[
        "stats",
        "--check",
        "--now",
        "1795582594300",
        &p.to_string_lossy(),
    ]);
    assert_eq!(code, 1, "--check: a live connection has no standby");
    // Once both ends re-armed, nothing is flagged and --check is content.
    let r = find(fo, &[r#""event":"rearmed""#, r#""pid":17831,"conn":2,"#]);
    let r = find(
        r.max(find(fo, &[r#""event":"rearmed""#, SENDER])) + 1,
        &[r#""event":"periodic""#],
    );
    let p2 = prefix(r + 1, "rearmed");
    let (code, out, _) = harness(&["stats", "--check", &p2.to_string_lossy()]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("WARNING"), "{out}");
    for p in [p, p2] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn after_the_second_cut_the_sender_runs_on_path_0_without_standby() {
    let first = find(0, &[r#""event":"failover""#, SENDER]);
    let fo = find(first + 1, &[r#""event":"failover""#, SENDER]);
    let next = find(fo + 1, &[r#""event":"periodic""#, SENDER]);
    let p = prefix(next + 1, "second");
    let (code, out, _) = harness(&[
        "stats",
        "--check",
        "--now",
        "1795582597000",
        &p.to_string_lossy(),
    ]);
    assert_eq!(code, 1);
    assert_eq!(out, LIVE_AFTER_SECOND);
    let _ = std::fs::remove_file(p);
}

#[test]
fn the_timeline_of_the_real_run_tells_both_failovers() {
    let svg = std::env::temp_dir().join(format!("ha-stats-real-{}.svg", std::process::id()));
    let (code, out, err) = harness(&[
        "timeline",
        "--stats",
        &data("sock-drill.stats.jsonl").to_string_lossy(),
        "--events",
        &data("sock-drill.events.jsonl").to_string_lossy(),
        "-o",
        &svg.to_string_lossy(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let summary: Vec<&str> = out.lines().take(2).collect();
    assert_eq!(summary, TIMELINE);
    let doc = std::fs::read_to_string(&svg).unwrap();
    for want in [
        "cut rail 0 (near) (command ran 92 ms)",
        "restore rail 0 (command ran 166 ms)",
        "cut rail 1 (near) (command ran 56 ms)",
        "switch 0→1, replayed 0",
        "switch 1→0, replayed 21",
        "re-armed path 0: redundancy back",
        "stall ≈ 585 ms (work waiting → switch)",
        "stall ≈ 580 ms (work waiting → switch)",
        ">NO STANDBY<",
        "path 0 (primary at setup): sock:r0a",
        "path 1 (standby at setup): sock:r1a",
    ] {
        assert!(doc.contains(want), "{want} missing from the picture");
    }
    let _ = std::fs::remove_file(svg);
}

const FULL: &str = r#"stats FILE: 4 connection(s), 0 live, 4 closed; last line 2026-11-25 04:56:40.761 UTC (239 ms ago)
PROCESS   CONN  ROLE  ACTIVE        STANDBY            FAILOVERS  RE-ARMS       BYTES PATH 0 / PATH 1  LAST FAILOVER                                                                                            COMM
vm:17829  1     send  0 (sock:r0a)  verifying, closed  2          1 (6 failed)  1.99 GiB / 734.9 MiB   04:56:36.562 (4.4 s ago) 1->0 payload write completed with RetryExcErr, stall 580 ms, replayed 21        send [dev 0 qp 1 | dev 1 qp 2]
vm:17829  2     recv  0 (sock:r0a)  verifying, closed  0          0             0 B / 0 B              -                                                                                                        recv [dev 0 qp 3 | dev 1 qp 4]
vm:17831  1     send  0 (sock:r0b)  verifying, closed  0          0             0 B / 0 B              -                                                                                                        send [dev 0 qp 1 | dev 1 qp 2]
vm:17831  2     recv  0 (sock:r0b)  verifying, closed  2          1             3.7 MiB / 1.4 MiB      04:56:36.559 (4.4 s ago) 1->0 clear-to-send write completed with RetryExcErr, stall 577 ms, replayed 32  recv [dev 0 qp 3 | dev 1 qp 4]
"#;

const LIVE_AFTER_FIRST: &str = r#"stats FILE: 4 connection(s), 4 live, 0 closed; last line 2026-11-25 04:56:34.220 UTC (80 ms ago)
WARNING: 2 live connection(s) run WITHOUT A STANDBY (one more failure ends them):
  vm:17829 conn 1 send [dev 0 qp 1 | dev 1 qp 2]: standby lost since 04:56:34.133 (167 ms), traffic on path 1 (sock:r1a)
  vm:17831 conn 2 recv [dev 0 qp 3 | dev 1 qp 4]: standby lost since 04:56:34.132 (168 ms), traffic on path 1 (sock:r1b)
PROCESS   CONN  ROLE  ACTIVE        STANDBY    FAILOVERS  RE-ARMS  BYTES PATH 0 / PATH 1  LAST FAILOVER                                                                                             COMM
vm:17829  1     send  1 (sock:r1a)  LOST       1          0        18.1 MiB / 87.5 MiB    04:56:34.133 (167 ms ago) 0->1 the peer's path failed, stall 585 ms, replayed 0                           send [dev 0 qp 1 | dev 1 qp 2]
vm:17829  2     recv  0 (sock:r0a)  verifying  0          0        0 B / 0 B              -                                                                                                         recv [dev 0 qp 3 | dev 1 qp 4]
vm:17831  1     send  0 (sock:r0b)  verifying  0          0        0 B / 0 B              -                                                                                                         send [dev 0 qp 1 | dev 1 qp 2]
vm:17831  2     recv  1 (sock:r1b)  LOST       1          0        46.5 KiB / 0 B         04:56:34.132 (168 ms ago) 0->1 clear-to-send write completed with RetryExcErr, stall 539 ms, replayed 32  recv [dev 0 qp 3 | dev 1 qp 4]
"#;

const LIVE_AFTER_SECOND: &str = r#"stats FILE: 4 connection(s), 4 live, 0 closed; last line 2026-11-25 04:56:36.712 UTC (288 ms ago)
WARNING: 2 live connection(s) run WITHOUT A STANDBY (one more failure ends them):
  vm:17829 conn 1 send [dev 0 qp 1 | dev 1 qp 2]: standby lost since 04:56:36.562 (438 ms), traffic on path 0 (sock:r0a)
  vm:17831 conn 2 recv [dev 0 qp 3 | dev 1 qp 4]: standby lost since 04:56:36.559 (441 ms), traffic on path 0 (sock:r0b)
PROCESS   CONN  ROLE  ACTIVE        STANDBY    FAILOVERS  RE-ARMS       BYTES PATH 0 / PATH 1  LAST FAILOVER                                                                                             COMM
vm:17829  1     send  0 (sock:r0a)  LOST       2          1 (1 failed)  167.4 MiB / 734.9 MiB  04:56:36.562 (438 ms ago) 1->0 payload write completed with RetryExcErr, stall 580 ms, replayed 21        send [dev 0 qp 1 | dev 1 qp 2]
vm:17829  2     recv  0 (sock:r0a)  verifying  0          0             0 B / 0 B              -                                                                                                         recv [dev 0 qp 3 | dev 1 qp 4]
vm:17831  1     send  0 (sock:r0b)  verifying  0          0             0 B / 0 B              -                                                                                                         send [dev 0 qp 1 | dev 1 qp 2]
vm:17831  2     recv  0 (sock:r0b)  LOST       2          1             319.9 KiB / 1.4 MiB    04:56:36.559 (441 ms ago) 1->0 clear-to-send write completed with RetryExcErr, stall 577 ms, replayed 32  recv [dev 0 qp 3 | dev 1 qp 4]
"#;

const TIMELINE: [&str; 2] = [
    "timeline: cut rail 0 (near) (command ran 92 ms) at 0.92 s → detected +535 ms (clear-to-send write completed with RetryExcErr) → switched path 0 → 1 +536 ms, 0 replayed → stall ≈ 585 ms (work waiting → switch) → redundancy back at 2.30 s (+755 ms)",
    "timeline: cut rail 1 (near) (command ran 56 ms) at 3.34 s → detected +541 ms (payload write completed with RetryExcErr) → switched path 1 → 0 +578 ms, 21 replayed → stall ≈ 580 ms (work waiting → switch) → NO STANDBY after it (not re-armed)",
];
