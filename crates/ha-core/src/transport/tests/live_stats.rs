//! The stats file while connections live: periodic lines written by the stats writer even
//! when nobody calls into the connections, the failover, standby and re-arm events when they
//! happen, the state they leave (active path, standby), and the closing line last.

use super::*;
use crate::transport::path::Health;
use crate::transport::stats;

/// The value of `"key":` in a JSON line (up to the next `,` or `}` outside a string).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    if let Some(s) = rest.strip_prefix('"') {
        return s.split('"').next();
    }
    if rest.starts_with('[') {
        return rest.split(']').next().map(|s| &s[1..]);
    }
    rest.split([',', '}']).next()
}

fn lines(file: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Lines of connection `id` with event `e`.
fn of(file: &std::path::Path, id: u64, e: &str) -> Vec<String> {
    lines(file)
        .into_iter()
        .filter(|l| field(l, "conn") == Some(&id.to_string()) && field(l, "event") == Some(e))
        .collect()
}

/// Wait (without calling into the connections) until `f` holds for the file.
fn wait_file(file: &std::path::Path, what: &str, f: impl Fn(&std::path::Path) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f(file) {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_stats_file_follows_a_failover_and_a_rearm_while_the_connections_live() {
    // Exclusive: the interval of periodic lines is the process's.
    let _l = TEST_LOCK.write();
    let file = std::env::temp_dir().join(format!("ha-live-stats-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    stats::set_interval(Duration::from_millis(25));
    let mut p = Pair::with_stats(cfg(), &file.to_string_lossy());
    let (s, r) = (p.send.link.stats.id, p.recv.link.stats.id);
    assert_eq!(of(&file, s, "open").len(), 1);
    let mut flow = Flow::new(&p, 8, 64 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "standby verified",
        |p| p.send.link.path(1).health == Health::Healthy,
    );
    let sent = p.send.stats().bytes[0];
    assert!(sent > 0);
    // Nobody calls in now: the writer still reports both connections, with what they did.
    wait_file(&file, "periodic lines of both sides", |f| {
        of(f, s, "periodic")
            .last()
            .is_some_and(|l| field(l, "bytes") == Some(&format!("{sent},0")))
            && !of(f, r, "periodic").is_empty()
    });
    let l = of(&file, s, "periodic").pop().unwrap();
    assert_eq!(field(&l, "active"), Some("0"));
    assert_eq!(field(&l, "standby"), Some("ok"));
    assert_eq!(field(&l, "phase"), Some("normal"));
    assert_eq!(field(&l, "role"), Some("send"));
    assert_eq!(
        field(&l, "devices"),
        Some("\"sock:127.0.0.1\",\"sock:127.0.0.2\"")
    );

    // The primary fails: a failover event on both sides, then lines saying path 1 carries
    // traffic without a standby.
    p.ctl
        .inject(error_completion(p.qpn(true, 0), WcStatus::RetryExcErr));
    pump_until(&mut p, &mut flow, Duration::from_secs(10), "switch", |p| {
        p.send.link.epoch == 1 && p.recv.link.epoch == 1
    });
    for id in [s, r] {
        let f = of(&file, id, "failover");
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (field(&f[0], "from"), field(&f[0], "to")),
            (Some("0"), Some("1"))
        );
        assert_eq!(field(&f[0], "to_dev"), Some("sock:127.0.0.2"));
        assert!(field(&f[0], "cause").is_some_and(|c| !c.is_empty()));
        let detect: u64 = field(&f[0], "detect_unix_ms").unwrap().parse().unwrap();
        let at: u64 = field(&f[0], "unix_ms").unwrap().parse().unwrap();
        assert!(detect <= at && at - detect < 30_000, "{}", f[0]);
        assert!(field(&f[0], "replayed").unwrap().parse::<u64>().is_ok());
    }
    let st = p.send.stats();
    assert_eq!(st.failovers, 1);
    wait_file(&file, "a line after the switch", |f| {
        of(f, s, "periodic")
            .last()
            .is_some_and(|l| field(l, "active") == Some("1"))
    });
    let l = of(&file, s, "periodic").pop().unwrap();
    assert!(
        matches!(field(&l, "standby"), Some("lost" | "rearming")),
        "{l}"
    );
    assert_eq!(field(&l, "failovers"), Some("1"));

    // The failed path is re-armed: a `rearmed` event on both sides, then a standby again.
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "re-arm", |p| {
        p.send.stats().rearms == 1 && p.recv.stats().rearms == 1
    });
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "verified",
        |p| p.recv.link.path(0).health == Health::Healthy,
    );
    for id in [s, r] {
        let e = of(&file, id, "rearmed");
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(field(&e[0], "path"), Some("0"));
    }
    wait_file(&file, "standby back in the periodic lines", |f| {
        of(f, s, "periodic")
            .last()
            .is_some_and(|l| field(l, "standby") == Some("ok") && field(l, "active") == Some("1"))
    });

    // Closing: the closing line is each connection's last, and the writer stops.
    drop(flow);
    drop(p);
    stats::set_interval(Duration::ZERO);
    for id in [s, r] {
        let last = lines(&file)
            .into_iter()
            .rfind(|l| field(l, "conn") == Some(&id.to_string()))
            .unwrap();
        assert_eq!(field(&last, "event"), Some("closed"), "{last}");
        assert_eq!(field(&last, "failovers"), Some("1"));
        assert_eq!(field(&last, "rearms"), Some("1"));
    }
    let n = lines(&file).len();
    std::thread::sleep(Duration::from_millis(100)); // the wait is the test: nothing more comes
    assert_eq!(lines(&file).len(), n, "lines after every connection closed");
    let _ = std::fs::remove_file(&file);
}
