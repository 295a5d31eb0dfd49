//! `ha-harness limit`: the plugin's 8-byte half round trip next to the wire's limit on the same
//! address — a raw TCP ping-pong between two processes (blocking reads, and busy-polling
//! reads) — with the thread wake-ups each needs per round trip, in one run.
//!
//! Wake-ups are counted without perf: every time a thread blocks it is later woken once, and
//! the kernel counts those blocks per process as voluntary context switches
//! (`getrusage(RUSAGE_CHILDREN).ru_nvcsw` over the waited-for children and their children).
//! Each measurement runs as child processes of this one; a run with 3 iterations is
//! subtracted so that set-up (connect, registration, thread starts) does not count.
//!
//! ```text
//! ha-harness limit --plugin PATH [--ip 127.0.0.1] [--rounds 3] [--iters 5000] [--size 8]
//! ```

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

/// How the raw TCP reader waits for the next message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A blocking `read` (one wake-up per message).
    Block,
    /// Non-blocking reads in a loop (no wake-up; one core busy).
    Spin,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Block => "block",
            Wait::Spin => "spin",
        }
    }
    fn parse(s: &str) -> Option<Wait> {
        match s {
            "block" => Some(Wait::Block),
            "spin" => Some(Wait::Spin),
            _ => None,
        }
    }
}

/// Options of `ha-harness limit`.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitOpts {
    pub plugin: String,
    pub ip: IpAddr,
    pub rounds: usize,
    pub iters: usize,
    pub size: usize,
}

fn usage() -> String {
    "usage: ha-harness limit --plugin PATH [--ip ADDR] [--rounds N] [--iters N] [--size BYTES]\n\
     the plugin's half round trip (ha-harness bench --mode procs) next to a raw TCP ping-pong \
     between two processes on ADDR (default 127.0.0.1), with wake-ups per round trip; \
     N rounds (default 3) of N round trips (default 5000) of BYTES (default 8)"
        .into()
}

/// Parse `limit`'s options (after the command word).
pub fn parse(args: &[String]) -> Result<LimitOpts, String> {
    let mut o = LimitOpts {
        plugin: String::new(),
        ip: IpAddr::from([127, 0, 0, 1]),
        rounds: 3,
        iters: 5000,
        size: 8,
    };
    let mut i = 0;
    while i < args.len() {
        let val = |i: usize| {
            args.get(i + 1)
                .cloned()
                .ok_or_else(|| format!("limit: {} needs a value", args[i]))
        };
        let num = |i: usize, lo: usize, hi: usize| -> Result<usize, String> {
            let v = val(i)?;
            match v.parse::<usize>() {
                Ok(n) if (lo..=hi).contains(&n) => Ok(n),
                _ => Err(format!("limit: {} {v}: accepted {lo}..={hi}", args[i])),
            }
        };
        match args[i].as_str() {
            "--plugin" => o.plugin = val(i)?,
            "--ip" => {
                let v = val(i)?;
                o.ip = v
                    .parse()
                    .map_err(|_| format!("limit: --ip {v}: not an IP address"))?;
            }
            "--rounds" => o.rounds = num(i, 1, 100)?,
            "--iters" => o.iters = num(i, 10, 10_000_000)?,
            "--size" => o.size = num(i, 1, 1 << 20)?,
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("limit: unknown option {other}\n{}", usage())),
        }
        i += 2;
    }
    if o.plugin.is_empty() {
        return Err(format!("limit: --plugin is required\n{}", usage()));
    }
    Ok(o)
}

/// Voluntary context switches of every waited-for child process so far.
fn children_nvcsw() -> i64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0, |u| u.voluntary_context_switches())
}

/// One measurement: the median half round trip (µs) and the wake-ups of all its processes.
struct Sample {
    half_rtt_us: f64,
    wakeups: i64,
}

/// Run `cmd` to completion; its stdout and the wake-ups of it and its children.
fn run_counted(cmd: &mut Command) -> Result<(String, i64), String> {
    let before = children_nvcsw();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("limit: cannot run {cmd:?}: {e}"))?;
    let after = children_nvcsw();
    if !out.status.success() {
        return Err(format!("limit: {cmd:?} failed: {}", out.status));
    }
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        after - before,
    ))
}

fn me() -> Result<std::path::PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("limit: own executable: {e}"))
}

/// The plugin's half round trip through `ha-harness bench --mode procs`.
fn plugin_sample(o: &LimitOpts, iters: usize) -> Result<Sample, String> {
    let (out, wakeups) = run_counted(Command::new(me()?).args([
        "bench",
        "--plugin",
        &o.plugin,
        "--mode",
        "procs",
        "--min",
        &o.size.to_string(),
        "--max",
        &o.size.to_string(),
        "--iters",
        &iters.to_string(),
        "--lat-bytes",
        "1G",
        "--bw-bytes",
        &o.size.to_string(),
        "--bw-max-msgs",
        "8",
    ]))?;
    let lat = out
        .lines()
        .filter_map(|l| {
            let mut f = l.split('|').map(str::trim);
            let size = f.next()?.parse::<usize>().ok()?;
            let lat = f.next()?.parse::<f64>().ok()?;
            (size == o.size).then_some(lat)
        })
        .next()
        .ok_or_else(|| format!("limit: no {} B row in the bench output:\n{out}", o.size))?;
    Ok(Sample {
        half_rtt_us: lat,
        wakeups,
    })
}

/// A raw TCP ping-pong between this program's `tcp-ping` and `tcp-echo` children.
fn tcp_sample(o: &LimitOpts, wait: Wait, iters: usize) -> Result<Sample, String> {
    let (out, wakeups) = run_counted(Command::new(me()?).args([
        "limit-tcp-ping",
        &o.ip.to_string(),
        wait.name(),
        &iters.to_string(),
        &o.size.to_string(),
    ]))?;
    let lat = out
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("limit: tcp ping printed {out:?}"))?;
    Ok(Sample {
        half_rtt_us: lat,
        wakeups,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// One row: median [min..max] of the rounds' half round trips and wake-ups per round trip.
fn row(name: &str, rounds: &[Sample], setup: i64, iters: usize, floor: Option<f64>) -> String {
    let mut lat: Vec<f64> = rounds.iter().map(|s| s.half_rtt_us).collect();
    let mut wk: Vec<f64> = rounds
        .iter()
        .map(|s| (s.wakeups - setup).max(0) as f64 / iters as f64)
        .collect();
    let (lo, hi) = (
        lat.iter().cloned().fold(f64::INFINITY, f64::min),
        lat.iter().cloned().fold(0.0, f64::max),
    );
    let m = median(&mut lat);
    let w = median(&mut wk);
    let ratio = floor.map_or(String::from("1.00x"), |f| format!("{:.2}x", m / f));
    format!("{name:<22} | {m:>9.2} [{lo:.2}..{hi:.2}] | {w:>9.2} | {ratio}")
}

/// `ha-harness limit ...`.
pub fn main_with_args(args: &[String]) -> i32 {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    match run(&o) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn run(o: &LimitOpts) -> Result<(), String> {
    // Set-up costs, once each.
    let plugin_setup = plugin_sample(o, 3)?.wakeups;
    let block_setup = tcp_sample(o, Wait::Block, 3)?.wakeups;
    let spin_setup = tcp_sample(o, Wait::Spin, 3)?.wakeups;
    let (mut plugin, mut block, mut spin) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..o.rounds {
        // Interleaved, so load changes hit every column alike.
        plugin.push(plugin_sample(o, o.iters)?);
        block.push(tcp_sample(o, Wait::Block, o.iters)?);
        spin.push(tcp_sample(o, Wait::Spin, o.iters)?);
        eprintln!("limit: round {} of {} done", r + 1, o.rounds);
    }
    let floor = {
        let mut v: Vec<f64> = block.iter().map(|s| s.half_rtt_us).collect();
        median(&mut v)
    };
    println!(
        "{} B half round trip on {}, {} rounds x {} round trips (median [min..max]); wake-ups per round trip, both processes",
        o.size, o.ip, o.rounds, o.iters
    );
    println!(
        "{:<22} | {:>9} [min..max] | {:>9} | vs tcp-block",
        "", "us", "wake-ups"
    );
    println!(
        "{}",
        row("plugin", &plugin, plugin_setup, o.iters, Some(floor))
    );
    println!(
        "{}",
        row("raw TCP, blocking read", &block, block_setup, o.iters, None)
    );
    println!(
        "{}",
        row(
            "raw TCP, busy read",
            &spin,
            spin_setup,
            o.iters,
            Some(floor)
        )
    );
    Ok(())
}

/// `ha-harness limit-tcp-ping IP WAIT ITERS SIZE`: start an echo child, ping-pong, print the
/// median half round trip in µs.
pub fn tcp_ping_main(args: &[String]) -> i32 {
    match tcp_ping(args) {
        Ok(us) => {
            println!("{us:.3}");
            0
        }
        Err(e) => {
            eprintln!("limit-tcp-ping: {e}");
            1
        }
    }
}

fn tcp_ping(args: &[String]) -> Result<f64, String> {
    let [ip, wait, iters, size] = args else {
        return Err("usage: limit-tcp-ping IP block|spin ITERS SIZE".into());
    };
    let ip: IpAddr = ip.parse().map_err(|_| format!("bad IP {ip}"))?;
    let wait = Wait::parse(wait).ok_or_else(|| format!("bad wait {wait}"))?;
    let iters: usize = iters.parse().map_err(|_| "bad ITERS".to_string())?;
    let size: usize = size.parse().map_err(|_| "bad SIZE".to_string())?;
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| format!("bind {ip}: {e}"))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let mut child = Command::new(me()?)
        .args([
            "limit-tcp-echo",
            &addr.to_string(),
            wait.name(),
            &iters.to_string(),
            &size.to_string(),
        ])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn echo: {e}"))?;
    let (mut s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    if wait == Wait::Spin {
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
    }
    let mut buf = vec![0u8; size];
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..iters {
        buf[0] = i as u8;
        let t = Instant::now();
        write_all(&mut s, &buf)?;
        read_exact(&mut s, &mut buf)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        if buf[0] != i as u8 {
            return Err(format!("echo {i} came back wrong"));
        }
    }
    drop(s);
    let st = child.wait().map_err(|e| e.to_string())?;
    if !st.success() {
        return Err(format!("echo child: {st}"));
    }
    Ok(median(&mut rtts))
}

/// `ha-harness limit-tcp-echo ADDR WAIT ITERS SIZE`: connect and echo ITERS messages.
pub fn tcp_echo_main(args: &[String]) -> i32 {
    let r = (|| -> Result<(), String> {
        let [addr, wait, iters, size] = args else {
            return Err("usage: limit-tcp-echo ADDR block|spin ITERS SIZE".into());
        };
        let addr: SocketAddr = addr.parse().map_err(|_| format!("bad address {addr}"))?;
        let wait = Wait::parse(wait).ok_or_else(|| format!("bad wait {wait}"))?;
        let iters: usize = iters.parse().map_err(|_| "bad ITERS".to_string())?;
        let size: usize = size.parse().map_err(|_| "bad SIZE".to_string())?;
        let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        if wait == Wait::Spin {
            s.set_nonblocking(true).map_err(|e| e.to_string())?;
        }
        let mut buf = vec![0u8; size];
        for _ in 0..iters {
            read_exact(&mut s, &mut buf)?;
            write_all(&mut s, &buf)?;
        }
        Ok(())
    })();
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("limit-tcp-echo: {e}");
            1
        }
    }
}

/// `read_exact` that also works on a non-blocking stream (spinning on `WouldBlock`).
fn read_exact(s: &mut TcpStream, buf: &mut [u8]) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err("peer closed".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    Ok(())
}

/// `write_all` that also works on a non-blocking stream.
fn write_all(s: &mut TcpStream, buf: &[u8]) -> Result<(), String> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(n) => put += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_parse_with_defaults_and_reject_bad_values() {
        let o = parse(&args("--plugin x.so")).unwrap();
        assert_eq!(
            o,
            LimitOpts {
                plugin: "x.so".into(),
                ip: IpAddr::from([127, 0, 0, 1]),
                rounds: 3,
                iters: 5000,
                size: 8
            }
        );
        let o = parse(&args(
            "--plugin p --ip 127.0.0.2 --rounds 5 --iters 100 --size 64",
        ))
        .unwrap();
        assert_eq!((o.rounds, o.iters, o.size), (5, 100, 64));
        assert_eq!(o.ip, IpAddr::from([127, 0, 0, 2]));
        assert!(parse(&args("--ip 127.0.0.1"))
            .unwrap_err()
            .contains("--plugin is required"));
        assert!(parse(&args("--plugin p --rounds 0"))
            .unwrap_err()
            .contains("--rounds 0: accepted 1..=100"));
        assert!(parse(&args("--plugin p --ip nowhere"))
            .unwrap_err()
            .contains("not an IP address"));
        assert!(parse(&args("--plugin p --bogus 1"))
            .unwrap_err()
            .contains("unknown option --bogus"));
    }

    #[test]
    fn rows_report_median_spread_and_wakeups_net_of_setup() {
        let s = |us, w| Sample {
            half_rtt_us: us,
            wakeups: w,
        };
        let r = row(
            "x",
            &[s(10.0, 1100), s(30.0, 2100), s(20.0, 1600)],
            100,
            500,
            Some(5.0),
        );
        // Median 20 us of 10..30; wake-ups (1500 net)/500 = 3.00 per round trip; 20/5 = 4x.
        assert!(r.contains("20.00 [10.00..30.00]"), "{r}");
        assert!(r.contains("3.00"), "{r}");
        assert!(r.ends_with("4.00x"), "{r}");
    }
}
