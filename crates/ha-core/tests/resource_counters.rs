//! 1,000 connections opened and closed through the API (sock fabric on two loopback rails,
//! 127.0.0.1 and 127.0.0.2, so every connection has a primary and a standby path): the live
//! resource counters (`fabric::counters`) count exactly what each connection holds while it
//! is open and return to their starting values once everything is closed, and so do the
//! process's socket descriptors and plugin threads as the kernel sees them. The stats lines
//! written at close carry the counters. One test per binary: nothing else runs here.

mod common;

use common::{eventually, until_token, wait_done};
use ha_core::api::ops::{self, RecvBuf};
use ha_core::fabric::counters::{self, Resource, Resources};
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 1000;
/// Connections open at the same time.
const BATCH: usize = 10;
const MSG: usize = 64;

/// Sockets (`socket:[...]` descriptors) of this process.
fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Threads of this process named like the plugin's (`ha-*`, `sock-*`).
fn plugin_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|n| n.starts_with("ha-") || n.starts_with("sock-"))
        .count()
}

/// `BATCH` connected (send, recv) pairs, listening on device 0 and connecting from it.
fn connect_batch() -> Vec<(u64, u64)> {
    let mut pending = Vec::new();
    for _ in 0..BATCH {
        let mut handle = [0u8; 128];
        let listen = ops::listen(0, &mut handle).expect("listen");
        pending.push((handle, listen, 0u64, 0u64));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while pending.iter().any(|p| p.2 == 0 || p.3 == 0) {
        assert!(Instant::now() < deadline, "handshakes did not finish");
        for p in pending.iter_mut() {
            if p.2 == 0 {
                p.2 = ops::connect(0, &mut p.0).expect("connect");
            }
            if p.3 == 0 {
                p.3 = ops::accept(p.1).expect("accept");
            }
        }
        std::thread::yield_now();
    }
    pending
        .into_iter()
        .map(|(_, listen, send, recv)| {
            ops::close_listen(listen).expect("closeListen");
            (send, recv)
        })
        .collect()
}

/// One verified message each way on every pair: the data path of each connection works.
fn exchange(pairs: &[(u64, u64)], round: usize) {
    let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = (0..pairs.len())
        .map(|i| {
            let fill = (round * BATCH + i) as u8;
            (vec![fill; MSG], vec![!fill; MSG])
        })
        .collect();
    let mut reqs = Vec::new();
    for (&(send, recv), (sb, rb)) in pairs.iter().zip(bufs.iter_mut()) {
        let smr = ops::reg_mr(send, sb.as_ptr() as usize, MSG, 1).expect("regMr send");
        let rmr = ops::reg_mr(recv, rb.as_mut_ptr() as usize, MSG, 1).expect("regMr recv");
        let rr = until_token("irecv", || {
            ops::irecv(
                recv,
                &[RecvBuf {
                    addr: rb.as_mut_ptr() as usize,
                    size: MSG as i64,
                    tag: 5,
                    mr: rmr,
                }],
            )
            .expect("irecv")
        });
        let sr = until_token("isend", || {
            ops::isend(send, sb.as_ptr() as usize, MSG as i64, 5, smr).expect("isend")
        });
        reqs.push((send, recv, smr, rmr, sr, rr));
    }
    for (i, &(send, recv, smr, rmr, sr, rr)) in reqs.iter().enumerate() {
        assert_eq!(wait_done(sr), vec![MSG as u64]);
        assert_eq!(wait_done(rr), vec![MSG as u64]);
        assert!(bufs[i].1 == bufs[i].0, "round {round} pair {i}: bytes");
        ops::dereg_mr(send, smr).expect("deregMr");
        ops::dereg_mr(recv, rmr).expect("deregMr");
    }
}

#[test]
fn a_thousand_connections_leave_no_resource_behind() {
    let stats = std::env::temp_dir().join(format!("ha-res-stats-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    for (k, v) in [
        ("HA_NCCL_FABRIC", "sock"),
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("HA_NCCL_SOCK_RAILS", "127.0.0.1,127.0.0.2"),
        ("HA_NCCL_ENABLE_BACKUP", "1"),
        ("HA_NCCL_STATS_FILE", stats.to_str().unwrap()),
        // The stats writer thread runs while connections live: it must go with the last.
        ("HA_NCCL_STATS_INTERVAL_MS", "20"),
    ] {
        std::env::set_var(k, v);
    }
    ops::init().expect("init");
    assert_eq!(ops::devices().unwrap(), 2, "two rails");
    let base = counters::snapshot();
    let (sockets0, threads0) = (open_sockets(), plugin_threads());
    assert_eq!(
        base,
        Resources::default(),
        "init alone holds no resource: {base:?}"
    );
    let started = Instant::now();
    let mut peak = base;
    for round in 0..CONNECTIONS / BATCH {
        let pairs = connect_batch();
        exchange(&pairs, round);
        let now = counters::snapshot();
        // Exact: every pair is two connections with two paths (a queue pair each) per side,
        // on two devices (a PD and a CQ each, shared by all connections).
        assert_eq!(now.connections, 2 * BATCH, "round {round}: {now:?}");
        assert_eq!(
            now.qps,
            4 * BATCH,
            "round {round}: {now:?} (standby paths on)"
        );
        assert_eq!((now.pds, now.cqs), (2, 2), "round {round}: {now:?}");
        assert!(now.mrs > 0 && now.threads > 0, "round {round}: {now:?}");
        // Each side's listener (PD: two descriptors per rail) plus streams.
        assert!(now.sockets >= 4 + BATCH * 4, "round {round}: {now:?}");
        if now.threads > peak.threads {
            peak = now;
        }
        for (send, recv) in pairs {
            ops::close_send(send).expect("closeSend");
            ops::close_recv(recv).expect("closeRecv");
        }
        let closed = eventually(30, || counters::snapshot() == base);
        assert!(
            closed,
            "round {round}: counters after closing everything: {:?}, at start {base:?}",
            counters::snapshot()
        );
    }
    let elapsed = started.elapsed();
    // What the kernel sees agrees: no socket descriptor and no plugin thread left.
    assert!(
        eventually(30, || open_sockets() == sockets0),
        "socket descriptors: {} now, {sockets0} at start",
        open_sockets()
    );
    assert!(
        eventually(30, || plugin_threads() == threads0),
        "plugin threads: {} now, {threads0} at start",
        plugin_threads()
    );
    // Every connection wrote one opening line and one closing line carrying the counters;
    // the connection closing is still counted in its own line. (Periodic lines come from the
    // stats writer thread, which stopped with the last connection: counted above.)
    let text = std::fs::read_to_string(&stats).expect("stats file");
    let opened = text
        .lines()
        .filter(|l| l.starts_with("{\"event\":\"open\""))
        .count();
    assert_eq!(opened, 2 * CONNECTIONS, "one opening line per comm");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("{\"event\":\"closed\""))
        .collect();
    assert_eq!(lines.len(), 2 * CONNECTIONS, "one closing line per comm");
    for l in &lines {
        let r = l
            .split_once("\"resources\":{")
            .unwrap_or_else(|| panic!("no resources in {l}"))
            .1;
        assert!(r.contains("\"qps\":"), "{l}");
        let conns: usize = r
            .split_once("\"connections\":")
            .and_then(|(_, v)| v.trim_end_matches('}').parse().ok())
            .unwrap_or_else(|| panic!("connections in {l}"));
        assert!((1..=2 * BATCH).contains(&conns), "{l}");
    }
    let _ = std::fs::remove_file(&stats);
    println!(
        "{CONNECTIONS} connections in {:.1} s; peak {peak:?}; all {} counters back to {base:?}",
        elapsed.as_secs_f64(),
        Resource::ALL.len()
    );
}
