//! Options of `ha-harness scale` and the lines its two processes exchange.

use super::figures::sample_self;
use super::*;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn options_and_defaults() {
    let o = parse(&args("--plugin p.so")).unwrap();
    assert_eq!(o.conns, vec![1, 16, 64, 256]);
    assert_eq!(
        (o.iters, o.rounds, o.dev, o.peer_dev, o.size),
        (2000, 3, 0, 0, 8)
    );
    let o = parse(&args(
        "--plugin p.so --conns 2,8 --iters 10 --rounds 1 --dev 1 --peer-dev 0",
    ))
    .unwrap();
    assert_eq!(
        (o.conns.clone(), o.iters, o.rounds, o.dev, o.peer_dev),
        (vec![2, 8], 10, 1, 1, 0)
    );
    assert!(parse(&args("--conns 1"))
        .unwrap_err()
        .contains("--plugin is required"));
    assert!(parse(&args("--plugin p --conns 0"))
        .unwrap_err()
        .contains("1..=4096"));
    assert!(parse(&args("--plugin p --iters"))
        .unwrap_err()
        .contains("needs a value"));
    assert_eq!(parse(&args("--plugin p")).unwrap().idle_ms, 2000);
    assert_eq!(parse(&args("--plugin p --idle-ms 0")).unwrap().idle_ms, 0);
    assert!(parse(&args("--plugin p --idle-ms 600001"))
        .unwrap_err()
        .contains("0..=600000"));
    let f = IdleFigures {
        csw: 41,
        cpu_us: 12_345,
    };
    assert_eq!(IdleFigures::parse(&f.line()), Some(f));
    assert_eq!(IdleFigures::parse("S 1 2 3 4"), None);
    assert!(parse(&args("--plugin p --bogus 1"))
        .unwrap_err()
        .contains("unknown option"));
}

#[test]
fn figures_travel_as_a_line() {
    let f = SideFigures {
        threads: 12,
        rss_kib: 34567,
        fds: 89,
        csw: 1000,
    };
    assert_eq!(SideFigures::parse(&f.line()), Some(f));
    assert_eq!(SideFigures::parse("S 1 2 3"), None);
    assert_eq!(SideFigures::parse("H 00"), None);
}

#[test]
fn sampling_self_sees_this_process() {
    let (threads, rss, fds) = sample_self();
    assert!(threads >= 1 && rss > 0 && fds >= 3, "{threads} {rss} {fds}");
}
