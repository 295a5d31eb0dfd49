//! `ha-harness stats` and `ha-harness timeline` on a stats file as the plugin writes it (open,
//! periodic, failover, re-arm, standby loss lines of two processes' connections), a drill's
//! side file of cuts, and an event neither tool knows (drawn under its own name).

use std::path::PathBuf;
use std::process::Command;

fn harness(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ha-harness"))
        .args(args)
        .output()
        .expect("running ha-harness");
    (
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

const T0: u64 = 1_800_000_000_000;

/// One connection of process `pid` over 10 s: 100 MB/s on path 0, the cut at 3 s fails it over
/// to path 1 at 3.4 s, re-armed at 5 s, the standby lost again at 8 s (still live at the end).
fn stats_lines(pid: u64, role: &str) -> Vec<String> {
    let id = format!(
        r#""host":"n1","pid":{pid},"conn":1,"comm":"{role} [dev 0 qp 1 | dev 1 qp 2]","role":"{role}""#
    );
    let mut v = vec![format!(
        r#"{{"event":"open","unix_ms":{T0},{id},"devices":["mlx5_0","mlx5_1"]}}"#
    )];
    let (mut b0, mut b1) = (0u64, 0u64);
    for k in 1..=100u64 {
        let t = T0 + k * 100;
        let (active, standby) = match t - T0 {
            0..=3399 => (0, "ok"),
            3400..=4999 => (1, "lost"),
            5000..=7999 => (1, "ok"),
            _ => (1, "lost"),
        };
        if t - T0 != 3400 && t - T0 != 3300 {
            if active == 0 {
                b0 += 10_000_000;
            } else {
                b1 += 10_000_000;
            }
        }
        if t - T0 == 3400 {
            v.push(format!(
                r#"{{"event":"failover","unix_ms":{t},{id},"from":0,"to":1,"from_dev":"mlx5_0","to_dev":"mlx5_1","cause":"port of device 0 is down (asynchronous event)","detect_unix_ms":{},"waiting_since_unix_ms":{},"took_us":40000,"stall_ms":390,"replayed":7,"failovers":1}}"#,
                t - 40,
                T0 + 3010
            ));
        }
        if t - T0 == 5000 {
            v.push(format!(
                r#"{{"event":"rearmed","unix_ms":{t},{id},"path":0,"dev":"mlx5_0","rearms":1}}"#
            ));
        }
        if t - T0 == 8000 {
            v.push(format!(
                r#"{{"event":"standby_lost","unix_ms":{t},{id},"path":0,"dev":"mlx5_0","cause":"probe"}}"#
            ));
            v.push(format!(
                r#"{{"event":"drain","unix_ms":{},{id},"label":"operator drain mlx5_0"}}"#,
                t + 200
            ));
        }
        v.push(format!(
            r#"{{"event":"periodic","unix_ms":{t},{id},"interval_ms":100,"devices":["mlx5_0","mlx5_1"],"active":{active},"phase":"normal","standby":"{standby}","bytes":[{b0},{b1}],"wrs":[1,1],"failovers":{},"replays":0,"rearms":{},"future_field":{{"x":[1,2]}}}}"#,
            u64::from(active == 1),
            u64::from(t - T0 >= 5000)
        ));
    }
    v
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ha-tl-{}-{name}", std::process::id()))
}

#[test]
fn stats_flags_the_exposed_connection_and_timeline_draws_the_failover() {
    let stats = temp("stats.jsonl");
    let mut lines = stats_lines(41, "send");
    lines.extend(stats_lines(42, "recv"));
    lines.push("garbage that is not JSON".into());
    std::fs::write(&stats, lines.join("\n") + "\n").unwrap();
    let events = temp("events.jsonl");
    std::fs::write(
        &events,
        format!(
            "{{\"event\":\"cut\",\"unix_ms\":{},\"done_unix_ms\":{},\"rail\":0,\"end\":\"near\"}}\n{{\"event\":\"restore\",\"unix_ms\":{},\"rail\":0}}\n",
            T0 + 3000,
            T0 + 3005,
            T0 + 4500
        ),
    )
    .unwrap();
    let s = stats.to_string_lossy().into_owned();

    let (code, out) = harness(&["stats", &s]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("WARNING: 2 live connection(s) run WITHOUT A STANDBY"),
        "{out}"
    );
    assert!(
        out.contains("n1:41 conn 1 send [dev 0 qp 1 | dev 1 qp 2]: standby lost since"),
        "{out}"
    );
    assert!(out.contains("1 (mlx5_1)  LOST"), "{out}");
    assert!(
        out.contains("port of device 0 is down (asynchronous event), stall 390 ms, replayed 7"),
        "{out}"
    );
    assert!(
        out.contains("(1 unreadable line(s), the first: line 211"),
        "{out}"
    );
    let (code, out) = harness(&["stats", "--check", &s]);
    assert_eq!(code, 1, "--check with an exposed connection: {out}");
    let (code, out) = harness(&["stats", "/nonexistent/stats.jsonl"]);
    assert_eq!(code, 2, "{out}");

    let svg = temp("t.svg");
    let png = temp("t.png");
    let (code, out) = harness(&[
        "timeline",
        "--stats",
        &s,
        "--events",
        &events.to_string_lossy(),
        "--title",
        "synthetic run",
        "-o",
        &svg.to_string_lossy(),
        "--png",
        &png.to_string_lossy(),
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("timeline: cut rail 0 (near) at 3.20 s"),
        "the summary names the cut: {out}"
    );
    assert!(
        out.contains("→ detected +355 ms (port of device 0 is down (asynchronous event))"),
        "{out}"
    );
    assert!(out.contains("switched path 0 → 1 +395 ms, 7 replayed → stall ≈ 395 ms (cut → switch) → redundancy back at"), "{out}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    for want in [
        "Failover timeline: synthetic run",
        "cut rail 0 (near)",
        "restore rail 0",
        "switch 0→1, replayed 7",
        "re-armed path 0: redundancy back",
        "standby lost (path 0)",
        "operator drain mlx5_0",
        "path 1 (standby at setup): mlx5_1",
        "stall ≈ 395 ms (cut → switch)",
    ] {
        assert!(doc.contains(want), "{want} missing from the SVG");
    }
    let p = std::fs::read(&png).unwrap();
    assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
    // The width is the SVG's (1400 px): the IHDR chunk's first field.
    assert_eq!(u32::from_be_bytes([p[16], p[17], p[18], p[19]]), 1400);
    for f in [stats, events, svg, png] {
        let _ = std::fs::remove_file(f);
    }
    let (code, out) = harness(&["timeline", "--stats", "/nonexistent", "-o", "/tmp/x.svg"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("/nonexistent"), "{out}");
}
