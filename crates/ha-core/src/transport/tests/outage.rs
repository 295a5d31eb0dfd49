//! A long outage, compressed through the knobs: the standby's link stays dark (ports up,
//! queue pairs connect, nothing gets through) for hundreds of re-arm attempts, each building
//! a queue pair at both ends (with their threads and TCP streams) that then fails to verify.
//! Traffic keeps flowing on the primary; attempts never stop; the process's queue pairs,
//! threads, sockets and memory stay flat; CPU per attempt is printed. The link's return
//! re-arms the path.

use super::*;
use crate::fabric::counters;

/// Resident set size of this process, KiB.
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) of this process, in clock ticks (1/100 s on Linux).
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the last ')'.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the ')'.
    num(11) + num(12)
}

#[test]
fn hundreds_of_rearm_attempts_keep_resources_and_memory_flat() {
    // Alone: resource counters and memory are the process's.
    let _l = TEST_LOCK.write();
    let mut cfg = home_cfg(Duration::from_millis(300));
    cfg.rearm_hold = Duration::from_millis(1);
    cfg.home.rearm_backoff_max = Duration::from_millis(4);
    cfg.heartbeat = Duration::from_millis(20);
    let mut p = Pair::split(cfg, "");
    let mut flow = Flow::new(&p, 8, 16 << 10);
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    p.ctl.dark(1, true);
    pump_until(
        &mut p,
        &mut flow,
        Duration::from_secs(10),
        "standby lost",
        |p| !p.send.link.usable(1),
    );
    let attempts = |p: &Pair| p.send.link.rearm_attempts();
    let run_to = |p: &mut Pair, flow: &mut Flow, n: u64| {
        pump_until(p, flow, Duration::from_secs(120), "attempts", |p| {
            attempts(p) >= n
        });
    };
    // Warm up (allocator pools, thread stacks reused), then measure.
    run_to(&mut p, &mut flow, 50);
    let (a0, rss0, cpu0, t0) = (attempts(&p), rss_kib(), cpu_ticks(), Instant::now());
    let base = counters::snapshot();
    let mut most = base;
    while attempts(&p) < a0 + 300 {
        let next = attempts(&p) + 10;
        run_to(&mut p, &mut flow, next);
        let now = counters::snapshot();
        most.qps = most.qps.max(now.qps);
        most.threads = most.threads.max(now.threads);
        most.sockets = most.sockets.max(now.sockets);
    }
    let (a1, rss1, cpu1) = (attempts(&p), rss_kib(), cpu_ticks());
    let n = a1 - a0;
    eprintln!(
        "outage: {n} re-arm attempts in {:.1} s; CPU {:.2} ms per attempt (both ends, with the traffic); RSS {rss0} -> {rss1} KiB; live qps/threads/sockets at most {}/{}/{} (base {}/{}/{})",
        t0.elapsed().as_secs_f64(),
        (cpu1 - cpu0) as f64 * 10.0 / n as f64,
        most.qps,
        most.threads,
        most.sockets,
        base.qps,
        base.threads,
        base.sockets
    );
    // At most one attempt's queue pairs (one per end), their threads (three per queue pair)
    // and streams (two per queue pair, both ends' in this process) beyond the base.
    assert!(most.qps <= base.qps + 2, "{most:?} vs {base:?}");
    assert!(most.threads <= base.threads + 12, "{most:?} vs {base:?}");
    assert!(most.sockets <= base.sockets + 8, "{most:?} vs {base:?}");
    assert!(
        rss1 <= rss0 + 4096,
        "RSS grew {} KiB over {n} attempts",
        rss1.saturating_sub(rss0)
    );
    assert!(
        p.send.stats().rearm_failed >= n / 2,
        "attempts failed to verify"
    );
    // The link comes back: the path re-arms and the connection carries on, intact.
    p.ctl.dark(1, false);
    pump_until(&mut p, &mut flow, Duration::from_secs(20), "re-arm", |p| {
        rearmed(p, 1)
    });
    flow.run(&mut p, 100, Duration::from_secs(30)).unwrap();
    assert_eq!(p.recv.duplicates(), 0);
    assert_eq!((p.send.link.active, p.send.stats().failovers), (0, 0));
}
