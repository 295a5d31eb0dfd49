//! Failover drills through the built `.so` on the `sock` fabric, with real link cuts: two
//! network namespaces joined by two veth rails (+ one for the out-of-band channel); the two
//! ranks run as child processes of this test, one per namespace, streaming verified messages;
//! the test cuts the rail in use (`ip link set ... down`, near or far end) mid-stream,
//! restores it, waits for the re-arm, then cuts the other rail. Every message must arrive
//! exactly once, in order, byte-exact; both ranks must exit 0; the stats must show the
//! failovers. Needs root and iproute2 — otherwise it says why and skips.
//!
//! `HA_DRILLS=N` sets the drills per end (default 10; CI runs the default, the long run is
//! `HA_DRILLS=50 cargo test --release --test ha_netns`). `HA_PAUSE=1` also stops one rank at
//! random (`kill -STOP`, 0.5–3 s, at a random moment) in every drill: a paused peer must not
//! cost a message or a connection. The drill always cuts the rail both sides' traffic is on
//! (a pause may have moved it: a soft timeout may move traffic to a verified standby), so a
//! standby loss in the stats is a false alarm unless a cut hit that side's standby because it
//! had just moved; the false ones are summed and printed.

mod ranks;
#[path = "../so/mod.rs"]
mod so;
mod topo;

use ranks::{role_recv, role_send};
use topo::{netns_available, Topo};

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MAX_MSG: usize = 512 << 10;
const WINDOW: usize = 8;

fn main() {
    match std::env::var("HA_ROLE").as_deref() {
        Ok("send") => std::process::exit(role_send()),
        Ok("recv") => std::process::exit(role_recv()),
        _ => {}
    }
    if let Err(why) = netns_available() {
        println!("ha_netns: skipped: {why}");
        println!("0 passed, 0 failed, 1 skipped");
        return;
    }
    let per_end: usize = std::env::var("HA_DRILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let pause = std::env::var("HA_PAUSE").is_ok_and(|v| v == "1");
    let (mut passed, mut failed) = (0, 0);
    let mut recoveries = Vec::new();
    let mut standby_lost = 0;
    let mut pauses = 0;
    for i in 0..per_end * 2 {
        let far = i % 2 == 1;
        match drill(i, far, pause) {
            Ok(r) => {
                let end = |k: usize| if (k == 0) == far { "far" } else { "near" };
                let cut = |k: usize| {
                    r.cuts
                        .get(k)
                        .map_or("?".to_string(), |c| format!("rail{c}/{}", end(k)))
                };
                println!(
                    "drill {i}: cut {} -> failover ok ({} ms stall), re-arm ok, cut {} -> failover ok ({} ms stall), {} messages verified, false standby losses {}{}",
                    cut(0),
                    r.stall1_ms,
                    cut(1),
                    r.stall2_ms,
                    r.messages,
                    r.standby_lost,
                    r.paused.as_deref().map(|p| format!(", {p}")).unwrap_or_default()
                );
                standby_lost += r.standby_lost;
                pauses += u64::from(r.paused.is_some());
                recoveries.push(r.stall1_ms);
                recoveries.push(r.stall2_ms);
                passed += 1;
            }
            Err(e) => {
                println!("drill {i}: FAILED: {e}");
                failed += 1;
            }
        }
    }
    match double_cut() {
        Ok(ms) => {
            println!("double cut: both rails down -> both ranks got ncclRemoteError after {ms} ms (limit 2 x RTO = 2000 ms), no hang");
            passed += 1;
        }
        Err(e) => {
            println!("double cut: FAILED: {e}");
            failed += 1;
        }
    }
    recoveries.sort_unstable();
    if !recoveries.is_empty() {
        let pct = |p: f64| recoveries[((recoveries.len() - 1) as f64 * p).round() as usize];
        println!(
            "recovery (longest completion gap around a cut): p50 {} ms, p99 {} ms, max {} ms over {} failovers",
            pct(0.5),
            pct(0.99),
            recoveries.last().unwrap(),
            recoveries.len()
        );
    }
    println!("false standby losses (stats standby_lost, both sides, all drills): {standby_lost}; ranks paused in {pauses} drills");
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

/// Wait (bounded) for a child to exit 0; killed if it does not exit.
fn wait_exit(mut c: Child, who: &'static str) -> Result<(), String> {
    let pid = c.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(st)) if st.success() => Ok(()),
        Ok(Ok(st)) => Err(format!("{who} exited with {st}")),
        Ok(Err(e)) => Err(format!("{who}: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            Err(format!("{who} did not exit"))
        }
    }
}

/// Cut both rails mid-stream: each rank must fail with ncclRemoteError within 2 x RTO.
fn double_cut() -> Result<u64, String> {
    let topo = Topo::up(&format!("{}", std::process::id() % 10000))?;
    let dir = std::env::temp_dir().join(format!("ha-netns-{}-dc", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut recv = spawn_role(&topo.b, "recv", &dir, "10.88.0.2,10.88.1.2", "oob")?;
    let mut send = spawn_role(&topo.a, "send", &dir, "10.88.0.1,10.88.1.1", "ooa")?;
    let mut send_in = send.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel();
    pump(&mut recv, "recv", tx.clone());
    pump(&mut send, "send", tx);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut cut_at = None;
    let mut failed = std::collections::BTreeMap::new();
    while failed.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (who, line) = rx.recv_timeout(left).map_err(|_| {
            format!("no error after the double cut (hang?); failed so far: {failed:?}")
        })?;
        if let Some(h) = line.strip_prefix("HANDLE ") {
            writeln!(send_in, "{h}").map_err(|e| e.to_string())?;
        }
        if cut_at.is_none() && who == "recv" && line.starts_with("PROGRESS") {
            topo.link(0, false, false)?;
            topo.link(1, true, false)?;
            cut_at = Some(Instant::now());
        }
        if line.starts_with("FAIL") {
            let Some(t) = cut_at else {
                return Err(format!("{who} failed before the cut: {line}"));
            };
            if !line.contains("ncclRemoteError") {
                return Err(format!("{who}: expected ncclRemoteError: {line}"));
            }
            failed.insert(who, t.elapsed().as_millis() as u64);
        }
    }
    drop(send_in);
    wait_exit(send, "send")
        .err()
        .ok_or("send exited 0 after losing both paths")?;
    wait_exit(recv, "recv")
        .err()
        .ok_or("recv exited 0 after losing both paths")?;
    let worst = failed.values().copied().max().unwrap_or(0);
    if worst > 2000 {
        return Err(format!("errors came after {failed:?} ms, over 2 x RTO"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(worst)
}

struct DrillResult {
    stall1_ms: u64,
    stall2_ms: u64,
    messages: u64,
    /// Standby losses counted by both sides that no cut explains (false alarms).
    standby_lost: u64,
    /// Which rank was paused when, for how long.
    paused: Option<String>,
    /// The rails cut, in order.
    cuts: Vec<usize>,
}

/// Where a drill is: which rail each side's traffic is on (send, recv), the rail cut last,
/// which sides got off it, and standby losses the cuts explain (a cut that hit a side's
/// standby because a soft timeout had just moved its traffic).
#[derive(Default)]
struct Plan {
    active: [usize; 2],
    cut: usize,
    handled: [bool; 2],
    explained: u64,
    /// Every rail cut, in order.
    cuts: Vec<usize>,
}

/// The rail a failover line — or a planned switch's (`return`, `drain`) — moved to
/// (`... -> path N (dev D), ...`).
fn switched_to(line: &str) -> Option<usize> {
    if !["NET/HA : failover", "NET/HA : return", "NET/HA : drain"]
        .iter()
        .any(|k| line.contains(k))
    {
        return None;
    }
    let rest = line.split(" -> path ").nth(1)?;
    rest.split("(dev ").nth(1)?.split(')').next()?.parse().ok()
}

/// Stops one of `pids` for a random 0.5–3 s at a random moment 0.5–6 s from now (the pause
/// is the test); always continues it. Returns what it did.
fn pause_one(pids: [(u32, &'static str); 2], seed: u64) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        // splitmix64
        let mut x = seed;
        let mut next = move || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let at = 500 + next() % 5500;
        let len = 500 + next() % 2500;
        let (pid, who) = pids[(next() % 2) as usize];
        std::thread::sleep(Duration::from_millis(at));
        // SAFETY: kill(2) on our own child's pid.
        let stopped = unsafe { libc::kill(pid as i32, libc::SIGSTOP) } == 0;
        std::thread::sleep(Duration::from_millis(len));
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        if stopped {
            format!("{who} paused {len} ms at +{at} ms")
        } else {
            format!("{who} had exited before its pause")
        }
    })
}

/// Lines from a child's stdout and stderr, tagged.
fn pump(child: &mut Child, tag: &'static str, tx: mpsc::Sender<(&'static str, String)>) {
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send((tag, line)).is_err() {
                    break;
                }
            }
        });
    }
}

fn spawn_role(ns: &str, role: &str, dir: &Path, rails: &str, oob: &str) -> Result<Child, String> {
    spawn_role_on(ns, role, dir, rails, oob, 0)
}

/// `dev`: the device the rank uses (NCCL picks it per rank: the two ranks may differ).
fn spawn_role_on(
    ns: &str,
    role: &str,
    dir: &Path,
    rails: &str,
    oob: &str,
    dev: usize,
) -> Result<Child, String> {
    let exe = std::env::current_exe().unwrap();
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(&exe)
        .env("HA_ROLE", role)
        .env("HA_DEV", dev.to_string())
        .env("HA_DIR", dir)
        .env("HA_NCCL_FABRIC", "sock")
        .env("HA_NCCL_SOCK_RAILS", rails)
        .env("NCCL_SOCKET_IFNAME", oob)
        .env("HA_NCCL_SOCK_RETRY_MS", "500")
        .env("HA_NCCL_RTO_MS", "1000")
        .env("HA_NCCL_HEARTBEAT_MS", "200")
        .env("HA_NCCL_REARM_HOLD_MS", "200")
        .env("HA_NCCL_KEEPALIVE_MS", "200")
        // The drill's plan (cut the rail in use, restore, re-arm, cut the other) assumes traffic
        // stays where the failover put it: no return home within a drill, whatever the host's
        // load (home_drill.rs drills the return); `HA_NCCL_RETURN_HOLD_MS` in the environment
        // overrides it.
        .env(
            "HA_NCCL_RETURN_HOLD_MS",
            std::env::var("HA_NCCL_RETURN_HOLD_MS").unwrap_or_else(|_| "300000".into()),
        )
        .env("HA_NCCL_STATS_FILE", dir.join(format!("stats-{role}.json")))
        .env("NCCL_DEBUG", "INFO")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning {role}: {e}"))
}

fn drill(i: usize, far: bool, pause: bool) -> Result<DrillResult, String> {
    let topo = Topo::up(&format!("{}", std::process::id() % 10000))?;
    let dir = std::env::temp_dir().join(format!("ha-netns-{}-{i}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // Every other pair of drills, the receiver uses device 1 while the sender uses device 0
    // (as NCCL may choose): paths must still stay rail-disjoint.
    let recv_dev = (i / 2) % 2;
    let mut recv = spawn_role_on(
        &topo.b,
        "recv",
        &dir,
        "10.88.0.2,10.88.1.2",
        "oob",
        recv_dev,
    )?;
    let mut send = spawn_role(&topo.a, "send", &dir, "10.88.0.1,10.88.1.1", "ooa")?;
    let mut send_in = send.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel();
    pump(&mut recv, "recv", tx.clone());
    pump(&mut send, "send", tx);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (i as u64) << 32;
    let pauser = pause.then(|| pause_one([(recv.id(), "recv"), (send.id(), "send")], seed));
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut log = Vec::new();
    let mut stage = 0;
    let mut plan = Plan::default();
    let result = (|| -> Result<(), String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (who, line) = rx
                .recv_timeout(left)
                .map_err(|_| format!("drill timed out at stage {stage}"))?;
            log.push(format!("{who}: {line}"));
            if let Some(h) = line.strip_prefix("HANDLE ") {
                // The receiver listens: hand its handle to the sender (as NCCL's bootstrap does).
                writeln!(send_in, "{h}").map_err(|e| e.to_string())?;
            }
            let side = usize::from(who == "recv");
            if let Some(d) = switched_to(&line) {
                plan.active[side] = d;
            }
            let progress = who == "recv" && line.starts_with("PROGRESS");
            match stage {
                // Traffic flows on one rail at both ends: cut it.
                0 | 4 if progress && plan.active[0] == plan.active[1] => {
                    plan.cut = plan.active[0];
                    plan.cuts.push(plan.cut);
                    plan.handled = [false; 2];
                    topo.link(plan.cut, if stage == 0 { far } else { !far }, false)?;
                    stage += 1;
                }
                // Redundancy went away before a cut (a standby lost, or a failover that fenced
                // a path): wait for the next re-arm before taking the rail in use away.
                0 | 4
                    if line.contains("NET/HA : failover")
                        || (line.contains("standby path") && line.contains("lost")) =>
                {
                    stage = 3;
                }
                // Each side must get off the cut rail: a failover, or — when a soft timeout (a
                // paused peer) had already moved it — the cut rail lost as its standby.
                1 | 5 => {
                    if line.contains("NET/HA : failover") {
                        plan.handled[side] = true;
                    } else if line.contains(&format!("standby path {} lost", plan.cut)) {
                        plan.handled[side] = true;
                        plan.explained += 1;
                    }
                    if plan.handled == [true; 2] {
                        if stage == 1 {
                            // Bring the rail back, wait for the re-arm.
                            topo.link(plan.cut, far, true)?;
                            stage = 3;
                        } else {
                            std::fs::write(dir.join("stop"), b"").map_err(|e| e.to_string())?;
                            stage = 7;
                        }
                    }
                }
                3 if who == "send" && line.contains("re-armed as the standby") => {
                    stage = 4;
                }
                _ => {}
            }
            if line.starts_with("FAIL") {
                return Err(format!("{who}: {line}"));
            }
            if who == "recv" && line.starts_with("DONE") {
                // Only now may the sender close (a real rank never vanishes mid-connection).
                let _ = writeln!(send_in, "BYE");
                return Ok(());
            }
        }
    })();
    let paused = pauser.map(|t| t.join().unwrap_or_else(|_| "pause thread panicked".into()));
    let outcome = result
        .and_then(|_| wait_exit(send, "send"))
        .and_then(|_| wait_exit(recv, "recv"));
    while let Ok((who, line)) = rx.try_recv() {
        log.push(format!("{who}: {line}"));
    }
    if let Err(e) = outcome {
        // The whole log of a failed drill stays for diagnosis (its path is in the error).
        let kept = keep_log("failed", i, &log);
        let tail: Vec<&String> = log
            .iter()
            .filter(|l| l.contains("HA NET") || l.contains("FAIL") || l.contains("panicked"))
            .rev()
            .take(40)
            .collect();
        let tail: Vec<&String> = tail.into_iter().rev().collect();
        return Err(format!(
            "{e} (whole log: {})\n  last lines:\n  {}",
            kept.display(),
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        ));
    }
    let field = |who: &str, key: &str| -> Option<u64> {
        let s = std::fs::read_to_string(dir.join(format!("stats-{who}.json"))).ok()?;
        s.lines()
            .filter_map(|l| {
                let i = l.find(&format!("\"{key}\":"))? + key.len() + 3;
                l[i..].split([',', '}']).next()?.parse::<u64>().ok()
            })
            .max()
    };
    for who in ["send", "recv"] {
        // At least the two cuts (a starved probe on a loaded machine may add a spurious one;
        // exactly-once delivery is checked message by message either way).
        if field(who, "failovers").unwrap_or(0) < 2 {
            return Err(format!(
                "{who} stats: failovers {:?}, expected at least 2",
                field(who, "failovers")
            ));
        }
        if field(who, "rearms").unwrap_or(0) < 1 {
            return Err(format!("{who} stats: no re-arm"));
        }
    }
    if field("recv", "duplicates_dropped").unwrap_or(0) != 0 {
        return Err("receiver dropped duplicates: a delivered message was replayed".into());
    }
    let grab = |key: &str| -> u64 {
        log.iter()
            .filter_map(|l| l.strip_prefix(&format!("recv: {key} ")))
            .filter_map(|v| v.trim().parse().ok())
            .next_back()
            .unwrap_or(0)
    };
    let lost: u64 = ["send", "recv"]
        .iter()
        .map(|who| sum_field(&dir, who, "standby_lost"))
        .sum::<u64>()
        .saturating_sub(plan.explained);
    if lost > 0 {
        // A false standby loss is what ends a drill when the next cut follows it: keep the
        // evidence of one that did not.
        let kept = keep_log("standby-lost", i, &log);
        eprintln!(
            "drill {i}: {lost} false standby loss(es): log kept in {}",
            kept.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(DrillResult {
        stall1_ms: grab("GAP1"),
        stall2_ms: grab("GAP2"),
        messages: grab("MESSAGES"),
        standby_lost: lost,
        paused,
        cuts: plan.cuts.clone(),
    })
}

/// Write drill `i`'s whole log to `<tmp>/ha-netns-<what>-<pid>-<i>.log` and return the path.
fn keep_log(what: &str, i: usize, log: &[String]) -> PathBuf {
    let kept = std::env::temp_dir().join(format!("ha-netns-{what}-{}-{i}.log", std::process::id()));
    let _ = std::fs::write(&kept, log.join("\n"));
    kept
}

/// The sum of numeric field `key` over every connection's closing line in `who`'s stats file.
fn sum_field(dir: &Path, who: &str, key: &str) -> u64 {
    let Ok(s) = std::fs::read_to_string(dir.join(format!("stats-{who}.json"))) else {
        return 0;
    };
    s.lines()
        .filter(|l| l.starts_with("{\"event\":\"closed\""))
        .filter_map(|l| {
            let i = l.find(&format!("\"{key}\":"))? + key.len() + 3;
            l[i..].split([',', '}']).next()?.parse::<u64>().ok()
        })
        .sum()
}
