//! `ha-harness scale`: what a rank pays per connection. For each connection count N, this
//! process (side A) and a child (side B) open N connections through the plugin (each a send
//! and a receive comm, as NCCL has per channel and peer), then ping-pong 8 bytes round-robin
//! over all of them, and print per side: threads, resident memory and open file descriptors
//! (from `/proc/self`, after the traffic), the half round trip (median of each round; the
//! median of the rounds and their spread), and voluntary context switches per round trip
//! (`getrusage(RUSAGE_SELF)`, both sides summed: each is one thread blocking, later woken).
//!
//! ```text
//! ha-harness scale --plugin PATH [--conns 1,16,64,256] [--iters 2000] [--rounds 3]
//!                  [--dev 0] [--peer-dev D] [--size 8]
//! ```
//!
//! The child is this program (`scale-peer`), talking over its stdin/stdout: connection
//! handles (`H <hex>`), its figures (`S threads rss_kib fds csw`), then `BYE` from the parent
//! before both close.

use super::conn::{self, Endpoint, HandleExchange};
use super::driver::{self, Buf, Ctl};
use super::report::median;
use super::wire::{hex_decode_handle, hex_encode, Handle};
use nccl_net_loader::Plugin;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Options of `ha-harness scale` (and of its child).
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleOpts {
    pub plugin: PathBuf,
    pub conns: Vec<usize>,
    pub iters: usize,
    pub rounds: usize,
    pub dev: i32,
    pub peer_dev: i32,
    pub size: usize,
}

const USAGE: &str = "usage: ha-harness scale --plugin PATH [--conns 1,16,64,256] [--iters N] \
[--rounds N] [--dev N] [--peer-dev N] [--size BYTES]\n\
per connection count: threads, RSS, fds, the half round trip of SIZE bytes (default 8) \
ping-ponged round-robin over all connections (ITERS round trips per round, default 2000; \
ROUNDS rounds, default 3) and context switches per round trip, for this process and a child";

/// Parse `scale`'s options (after the command word).
pub fn parse(args: &[String]) -> Result<ScaleOpts, String> {
    let mut o = ScaleOpts {
        plugin: PathBuf::new(),
        conns: vec![1, 16, 64, 256],
        iters: 2000,
        rounds: 3,
        dev: 0,
        peer_dev: -1,
        size: 8,
    };
    let mut i = 0;
    while i < args.len() {
        let v = args
            .get(i + 1)
            .ok_or_else(|| format!("scale: {} needs a value\n{USAGE}", args[i]))?;
        let num = |lo: usize, hi: usize| -> Result<usize, String> {
            v.parse::<usize>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| format!("scale: {} {v}: expected {lo}..={hi}", args[i]))
        };
        match args[i].as_str() {
            "--plugin" => o.plugin = PathBuf::from(v),
            "--conns" => {
                o.conns = v
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|n| (1..=4096).contains(n))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        format!("scale: --conns {v}: expected counts 1..=4096, comma-separated")
                    })?;
            }
            "--iters" => o.iters = num(1, 10_000_000)?,
            "--rounds" => o.rounds = num(1, 100)?,
            "--dev" => o.dev = num(0, 1024)? as i32,
            "--peer-dev" => o.peer_dev = num(0, 1024)? as i32,
            "--size" => o.size = num(1, 1 << 20)?,
            other => return Err(format!("scale: unknown option {other}\n{USAGE}")),
        }
        i += 2;
    }
    if o.plugin.as_os_str().is_empty() {
        return Err(format!("scale: --plugin is required\n{USAGE}"));
    }
    if o.peer_dev < 0 {
        o.peer_dev = o.dev;
    }
    Ok(o)
}

/// What one side reports for one connection count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SideFigures {
    pub threads: u64,
    pub rss_kib: u64,
    pub fds: u64,
    /// Voluntary context switches during the timed rounds.
    pub csw: u64,
}

impl SideFigures {
    /// This process now, with `csw` context switches counted over its timed rounds.
    fn measured(csw: u64) -> SideFigures {
        let (threads, rss_kib, fds) = sample_self();
        SideFigures {
            threads,
            rss_kib,
            fds,
            csw,
        }
    }

    fn line(&self) -> String {
        format!(
            "S {} {} {} {}",
            self.threads, self.rss_kib, self.fds, self.csw
        )
    }

    fn parse(line: &str) -> Option<SideFigures> {
        let mut it = line.strip_prefix("S ")?.split_whitespace();
        let mut n = || it.next()?.parse::<u64>().ok();
        Some(SideFigures {
            threads: n()?,
            rss_kib: n()?,
            fds: n()?,
            csw: n()?,
        })
    }
}

/// `Threads:` and `VmRSS:` of `/proc/self/status` and the entries of `/proc/self/fd`.
fn sample_self() -> (u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    (field("Threads:"), field("VmRSS:"), fds)
}

/// Many connections need many descriptors (every `sock` queue pair holds a few): the soft
/// limit goes up to the hard one, as a job launcher's `ulimit -n` would.
fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

fn own_csw() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0, |u| u.voluntary_context_switches() as u64)
}

/// The handle exchange over a pair of line streams.
struct Lines<R: BufRead, W: Write> {
    rd: R,
    wr: W,
}

impl<R: BufRead, W: Write> Lines<R, W> {
    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.wr, "{line}")
            .and_then(|()| self.wr.flush())
            .map_err(|e| format!("scale: writing to the peer: {e}"))
    }

    fn next(&mut self) -> Result<String, String> {
        let mut s = String::new();
        match self.rd.read_line(&mut s) {
            Ok(0) => Err("scale: the peer closed its end".into()),
            Ok(_) => Ok(s.trim_end().to_string()),
            Err(e) => Err(format!("scale: reading from the peer: {e}")),
        }
    }
}

impl<R: BufRead, W: Write> HandleExchange for Lines<R, W> {
    fn exchange(&mut self, mine: &Handle, _deadline: Instant) -> Result<Handle, String> {
        self.send(&format!("H {}", hex_encode(mine)))?;
        let line = self.next()?;
        let hex = line
            .strip_prefix("H ")
            .ok_or_else(|| format!("scale: expected a handle, got {line:?}"))?;
        hex_decode_handle(hex)
    }
}

/// One side's connections and their buffers.
struct Conns<'p> {
    eps: Vec<Endpoint<'p>>,
    bufs: Vec<(Buf, Buf)>,
}

fn open_conns<'p>(
    plugin: &'p Plugin,
    dev: i32,
    n: usize,
    size: usize,
    x: &mut dyn HandleExchange,
) -> Result<Conns<'p>, String> {
    let abort = AtomicBool::new(false);
    let mut c = Conns {
        eps: Vec::with_capacity(n),
        bufs: Vec::with_capacity(n),
    };
    for k in 0..n {
        let ep = conn::establish(plugin, dev, x, Duration::from_secs(60), &abort)
            .map_err(|e| format!("connection {k} of {n}: {e}"))?;
        let s = Buf::register(plugin, &ep.send, size)?;
        let r = Buf::register(plugin, &ep.recv, size)?;
        c.eps.push(ep);
        c.bufs.push((s, r));
    }
    Ok(c)
}

fn close_conns(c: Conns<'_>) -> Result<(), String> {
    for (ep, (s, r)) in c.eps.into_iter().zip(c.bufs) {
        s.deregister(ep.plugin, &ep.send)?;
        r.deregister(ep.plugin, &ep.recv)?;
        ep.close()?;
    }
    Ok(())
}

fn ctl(abort: &AtomicBool) -> Ctl<'_> {
    Ctl {
        timeout: Duration::from_secs(60),
        abort,
        window: 1,
        may_sleep: false,
    }
}

/// Side A's timed rounds: the median half round trip of each, in microseconds.
fn ping(c: &mut Conns<'_>, o: &ScaleOpts) -> Result<Vec<f64>, String> {
    let abort = AtomicBool::new(false);
    let ctl = ctl(&abort);
    let n = c.eps.len();
    let mut medians = Vec::with_capacity(o.rounds);
    // Round trip `t` of the whole run goes over connection `t % n`, as side B expects.
    let mut t = 0;
    for round in 0..=o.rounds {
        // Round 0 warms every connection up (registrations, first clear-to-sends).
        let iters = if round == 0 {
            n.max(o.iters / 10)
        } else {
            o.iters
        };
        let mut samples = Vec::with_capacity(iters);
        for i in 0..iters {
            let k = t % n;
            t += 1;
            let (ep, (s, r)) = (&c.eps[k], &mut c.bufs[k]);
            let at = |e: String| format!("round {round}, round trip {i}, connection {k}: {e}");
            let t0 = Instant::now();
            let rreq = driver::post_recv_one(ep, r, o.size, 1, &ctl).map_err(at)?;
            let sreq = driver::post_send_one(ep, s, o.size, 1, &ctl).map_err(at)?;
            driver::wait(ep, sreq, &mut [0], &ctl).map_err(at)?;
            let mut got = [-1];
            driver::wait(ep, rreq, &mut got, &ctl).map_err(at)?;
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            if usize::try_from(got[0]).ok() != Some(o.size) {
                return Err(format!("pong of {} bytes on connection {k}", got[0]));
            }
        }
        if round > 0 {
            medians.push(median(&mut samples));
        }
    }
    Ok(medians)
}

/// Side B: answer every ping on the connection it came on (the next receive is posted
/// before the answer goes out).
fn pong(c: &mut Conns<'_>, o: &ScaleOpts) -> Result<(), String> {
    let abort = AtomicBool::new(false);
    let ctl = ctl(&abort);
    let n = c.eps.len();
    let total = n.max(o.iters / 10) + o.rounds * o.iters;
    let mut next = Some(driver::post_recv_one(
        &c.eps[0],
        &mut c.bufs[0].1,
        o.size,
        1,
        &ctl,
    )?);
    for i in 0..total {
        let k = i % n;
        let at = |e: String| format!("round trip {i}, connection {k}: {e}");
        let mut got = [-1];
        if let Some(r) = next.take() {
            driver::wait(&c.eps[k], r, &mut got, &ctl).map_err(at)?;
        }
        if usize::try_from(got[0]).ok() != Some(o.size) {
            return Err(format!("ping of {} bytes on connection {k}", got[0]));
        }
        if i + 1 < total {
            let j = (i + 1) % n;
            next = Some(driver::post_recv_one(
                &c.eps[j],
                &mut c.bufs[j].1,
                o.size,
                1,
                &ctl,
            )?);
        }
        let sreq =
            driver::post_send_one(&c.eps[k], &mut c.bufs[k].0, o.size, 1, &ctl).map_err(at)?;
        driver::wait(&c.eps[k], sreq, &mut [0], &ctl).map_err(at)?;
    }
    Ok(())
}

/// The plugin opened and initialised on device `dev` (as every harness command opens it).
fn load(path: &std::path::Path, dev: i32) -> Result<Plugin, String> {
    super::stream::load(path, None, dev).map(|(plugin, _)| plugin)
}

/// One connection count, side A: (A's figures, B's figures, round medians).
fn one_count(
    plugin: &Plugin,
    o: &ScaleOpts,
    n: usize,
) -> Result<(SideFigures, SideFigures, Vec<f64>), String> {
    let me = std::env::current_exe().map_err(|e| format!("scale: own executable: {e}"))?;
    let mut child = Command::new(me)
        .args([
            "scale-peer".to_string(),
            "--plugin".into(),
            o.plugin.display().to_string(),
            "--conns".into(),
            n.to_string(),
            "--iters".into(),
            o.iters.to_string(),
            "--rounds".into(),
            o.rounds.to_string(),
            "--dev".into(),
            o.peer_dev.to_string(),
            "--size".into(),
            o.size.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("scale: spawning the peer: {e}"))?;
    let mut lines = Lines {
        rd: BufReader::new(child.stdout.take().expect("piped")),
        wr: child.stdin.take().expect("piped"),
    };
    let run = (|| -> Result<(SideFigures, SideFigures, Vec<f64>), String> {
        let mut c = open_conns(plugin, o.dev, n, o.size, &mut lines)?;
        let csw0 = own_csw();
        let medians = ping(&mut c, o)?;
        let a = SideFigures::measured(own_csw() - csw0);
        let line = lines.next()?;
        let b = SideFigures::parse(&line)
            .ok_or_else(|| format!("scale: the peer said {line:?}, expected its figures"))?;
        lines.send("BYE")?;
        close_conns(c)?;
        Ok((a, b, medians))
    })();
    drop(lines);
    let status = child
        .wait()
        .map_err(|e| format!("scale: waiting for the peer: {e}"))?;
    let out = run?;
    if !status.success() {
        return Err(format!("scale: the peer exited with {status}"));
    }
    Ok(out)
}

/// `ha-harness scale ...`: the table, one line per connection count.
pub fn main_with_args(args: &[String]) -> i32 {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ha-harness {e}");
            return 2;
        }
    };
    raise_nofile();
    let plugin = match load(&o.plugin, o.dev) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ha-harness scale: {e}");
            return 1;
        }
    };
    println!(
        "scale: plugin {} ({}), devices {} <-> {}, {} B round-robin ping-pong over all connections, {} rounds x {} round trips",
        plugin.name(),
        o.plugin.display(),
        o.dev,
        o.peer_dev,
        o.size,
        o.rounds,
        o.iters
    );
    println!("| connections | threads A / B | RSS MiB A / B | fds A / B | half round trip us, median (min-max of rounds) | context switches per round trip (A+B) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for &n in &o.conns {
        match one_count(&plugin, &o, n) {
            Ok((a, b, mut m)) => {
                let (lo, hi) = m
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
                let rts = (o.rounds * o.iters) as f64;
                println!(
                    "| {n} | {} / {} | {:.1} / {:.1} | {} / {} | {:.1} ({lo:.1}-{hi:.1}) | {:.2} |",
                    a.threads,
                    b.threads,
                    a.rss_kib as f64 / 1024.0,
                    b.rss_kib as f64 / 1024.0,
                    a.fds,
                    b.fds,
                    median(&mut m),
                    (a.csw + b.csw) as f64 / rts
                );
            }
            Err(e) => {
                println!("| {n} | failed: {e} |");
                return 1;
            }
        }
    }
    0
}

/// `ha-harness scale-peer ...`: side B, driven by the parent over stdin/stdout.
pub fn peer_main(args: &[String]) -> i32 {
    let run = || -> Result<(), String> {
        let o = parse(args)?;
        let n = *o.conns.first().ok_or("scale-peer: no connection count")?;
        raise_nofile();
        let plugin = load(&o.plugin, o.dev)?;
        let stdin = std::io::stdin();
        let mut lines = Lines {
            rd: stdin.lock(),
            wr: std::io::stdout(),
        };
        let mut c = open_conns(&plugin, o.dev, n, o.size, &mut lines)?;
        let csw0 = own_csw();
        pong(&mut c, &o)?;
        let f = SideFigures::measured(own_csw() - csw0);
        lines.send(&f.line())?;
        let bye = lines.next()?;
        if bye != "BYE" {
            return Err(format!("scale-peer: expected BYE, got {bye:?}"));
        }
        close_conns(c)
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ha-harness scale-peer: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
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
}
