//! The `sock` drill end to end in network namespaces (scripts/drill/sock-drill.sh around
//! `ha-harness stream` and the built plugin), without failover expectations: an uncut stream
//! between the namespaces is clean, and cutting the only rail in use (near end, then far end)
//! ends the stream with a request error within a bounded time. Each drill's timeline picture
//! (`--pictures`, drawn by `ha-harness timeline` from the drill's stats file, stream and cuts)
//! shows what happened: the cut, the switch and its stall, or the connection lost. Needs root
//! and iproute2 with network namespaces; skipped (with the reason printed) where those are
//! missing.

mod common;

use common::{root, so_path};
use std::path::Path;
use std::process::{Command, Output};

fn ok(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

/// Why the drill cannot run here, if it cannot.
fn unavailable(prefix: &str) -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    if !ok(Command::new("ip").arg("-V")) {
        return Some("iproute2 ('ip') not found".into());
    }
    let probe = format!("{prefix}probe");
    if !ok(Command::new("ip").args(["netns", "add", &probe])) {
        return Some("cannot create a network namespace".into());
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    if !so_path().exists() {
        return Some(format!(
            "{} missing: run `cargo build` first",
            so_path().display()
        ));
    }
    None
}

fn drill(prefix: &str, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(root().join("scripts/drill/sock-drill.sh"))
        .args(["--harness", env!("CARGO_BIN_EXE_ha-harness")])
        .arg("--plugin")
        .arg(so_path())
        .args(["--max-size", "256K", "--timeout", "10", "--seed", "7"])
        .args(args)
        .env("HA_RAILS_PREFIX", prefix)
        .output()
        .expect("running sock-drill.sh")
}

/// `ha-harness stats ARGS FILE`: the exit status and the report.
fn stats(args: &[&str], file: &Path) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ha-harness"))
        .arg("stats")
        .args(args)
        .arg(file)
        .output()
        .expect("running ha-harness stats");
    (o.status.code().unwrap_or(-1), text(&o))
}

/// The table rows of a report (after its PROCESS header), cells split on runs of 2+ spaces.
fn rows(report: &str) -> Vec<Vec<String>> {
    report
        .lines()
        .skip_while(|l| !l.starts_with("PROCESS "))
        .skip(1)
        .take_while(|l| !l.starts_with('(') && !l.starts_with("events:") && !l.is_empty())
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn uncut_stream_is_clean_a_cut_is_survived_and_without_standby_fails_in_bounded_time() {
    let prefix = format!("hat{}-", std::process::id());
    if let Some(why) = unavailable(&prefix) {
        eprintln!("SKIPPED sock drill: {why}");
        return;
    }
    // Baseline: nothing cut, every message intact.
    let o = drill(&prefix, &["--no-cut", "--duration", "1.5"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("drill 1: no cut → clean: "), "{out}");
    assert!(
        out.contains("summary: lost 0, duplicated 0, corrupted 0, reordered 0"),
        "{out}"
    );
    assert!(out.contains("1 passed, 0 failed"), "{out}");

    // With the standby: a cut of rail 0 (near, then far end) is survived, nothing lost; the
    // pictures show the cut, the switch to path 1 and the stall it caused.
    let pics = std::env::temp_dir().join(format!("ha-drill-pics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pics);
    let pics_s = pics.to_string_lossy().into_owned();
    let keep = std::env::temp_dir().join(format!("ha-drill-keep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&keep);
    let survived = keep.join("survived").to_string_lossy().into_owned();
    let o = drill(
        &prefix,
        &[
            "--drills",
            "2",
            "--end",
            "alternate",
            "--cut-at",
            "0.3-0.6",
            "--env",
            "HA_NCCL_SOCK_RETRY_MS=300",
            "--pictures",
            &pics_s,
            "--keep",
            &survived,
        ],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("summary: lost 0, duplicated 0, corrupted 0, reordered 0"),
        "{out}"
    );
    assert!(out.contains("2 passed, 0 failed"), "{out}");
    // `ha-harness stats` on each drill's stats file: the sender that moved the stream failed
    // over once, to path 1 (rail 1), and closed there; nothing live is flagged.
    for n in [1, 2] {
        let f = keep.join(format!("survived/drill{n}/stats.jsonl"));
        let (code, report) = stats(&["--all", "--check"], &f);
        assert_eq!(code, 0, "{report}");
        assert!(!report.contains("WARNING"), "{report}");
        let sender = rows(&report)
            .into_iter()
            .find(|r| r[2] == "send" && !r[7].starts_with("0 B / "))
            .unwrap_or_else(|| panic!("drill {n}: no sending row:\n{report}"));
        assert_eq!(sender[3], "1 (sock:r1a)", "drill {n}: {report}");
        assert_eq!(sender[5], "1", "drill {n}: one failover: {report}");
        assert!(sender[4].ends_with(", closed"), "drill {n}: {report}");
        assert!(sender[8].contains(" 0->1 "), "drill {n}: {report}");
        assert!(sender[8].contains(", replayed "), "drill {n}: {report}");
    }
    for (n, end) in [(1, "near"), (2, "far")] {
        assert!(
            out.contains(&format!("  timeline: {pics_s}/drill{n}.png")),
            "{out}"
        );
        let svg = std::fs::read_to_string(pics.join(format!("drill{n}.svg"))).unwrap();
        for want in [
            format!("cut rail 0 ({end})"),
            "switch 0→1".to_string(),
            ">stall ".to_string(),
            "path 1 (standby at setup): sock:r1a".to_string(),
        ] {
            assert!(
                svg.contains(&want),
                "drill {n}: {want} missing from the picture"
            );
        }
        let png = std::fs::read(pics.join(format!("drill{n}.png"))).unwrap();
        assert_eq!(&png[..4], b"\x89PNG");
    }

    // One path per connection (HA_NCCL_ENABLE_BACKUP=0): the same cut must end the stream with
    // a request error (an ncclResult) within --error-within ms, losing nothing.
    let o = drill(
        &prefix,
        &[
            "--expect",
            "error",
            "--drills",
            "2",
            "--end",
            "alternate",
            "--cut-at",
            "0.3-0.6",
            "--error-within",
            "5000",
            "--env",
            "HA_NCCL_SOCK_RETRY_MS=300",
            "--env",
            "HA_NCCL_KEEPALIVE_MS=200",
            "--env",
            "HA_NCCL_ENABLE_BACKUP=0",
            "--pictures",
            &pics_s,
            "--keep",
            &keep.join("single").to_string_lossy(),
        ],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    // The live state before the first connection closed (the stats file's lines up to there):
    // the sender runs with one path, and the reader flags it.
    let f = keep.join("single/drill1/stats.jsonl");
    let all = std::fs::read_to_string(&f).unwrap();
    let live: Vec<&str> = all
        .lines()
        .take_while(|l| !l.contains(r#""event":"closed""#))
        .collect();
    let live_f = keep.join("single/live.jsonl");
    std::fs::write(&live_f, live.join("\n") + "\n").unwrap();
    let (code, report) = stats(&["--check"], &live_f);
    assert_eq!(
        code, 1,
        "--check flags a connection without standby: {report}"
    );
    assert!(
        report.contains("live connection(s) run WITHOUT A STANDBY"),
        "{report}"
    );
    let flagged = report
        .lines()
        .find(|l| l.starts_with("  ") && l.contains(" conn ") && l.contains("send ["))
        .unwrap_or_else(|| panic!("the sender is not flagged:\n{report}"));
    assert!(
        flagged.contains("one path only") || flagged.contains("connection lost"),
        "{flagged}"
    );
    let _ = std::fs::remove_dir_all(&keep);
    // One path: no standby all along, and the connection lost at the cut.
    let svg = std::fs::read_to_string(pics.join("drill1.svg")).unwrap();
    assert!(svg.contains("connection lost"), "{svg}");
    assert!(svg.contains(">NO STANDBY<"), "{svg}");
    let _ = std::fs::remove_dir_all(&pics);
    for (n, end) in [(1, "near"), (2, "far")] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("drill {n}: cut=rail0/{end} at ")))
            .unwrap_or_else(|| panic!("no line for drill {n}:\n{out}"));
        assert!(line.contains(" → error after "), "{line}");
        assert!(
            line.contains("ncclRemoteError") || line.contains("ncclSystemError"),
            "{line}"
        );
    }
    assert!(
        out.contains("summary: lost 0, duplicated 0, corrupted 0, reordered 0"),
        "{out}"
    );
    assert!(out.contains("2 passed, 0 failed"), "{out}");
    // The namespaces are gone afterwards.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&ns.stdout).contains(&prefix));
}
