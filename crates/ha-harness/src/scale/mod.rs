//! `ha-harness scale`: what a rank pays per connection. For each connection count N, this
//! process (side A) and a child (side B) open N connections through the plugin (each a send
//! and a receive comm, as NCCL has per channel and peer), then ping-pong 8 bytes round-robin
//! over all of them, and print per side: threads, resident memory and open file descriptors
//! (from `/proc/self`, after the traffic), the half round trip (median of each round; the
//! median of the rounds and their spread), and voluntary context switches per round trip
//! (`getrusage(RUSAGE_SELF)`, both sides summed: each is one thread blocking, later woken).
//! Then, with every connection open and nothing moving (a 1 s settle, then `--idle-ms`), both
//! sides' voluntary context switches per second and CPU time: what idle connections cost.
//!
//! ```text
//! ha-harness scale --plugin PATH [--conns 1,16,64,256] [--iters 2000] [--rounds 3]
//!                  [--dev 0] [--peer-dev D] [--size 8] [--idle-ms 2000]
//! ```
//!
//! The child is this program (`scale-peer`), talking over its stdin/stdout: connection
//! handles (`H <hex>`), its figures (`S threads rss_kib fds csw`), then, with an idle window,
//! `IDLE` and `END` from the parent around it and the child's `I csw cpu_us`, then `BYE` from
//! the parent before both close.

mod figures;

use self::figures::{IdleFigures, SideFigures};
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
    /// Milliseconds both sides stay idle after the rounds (after a 1 s settle) while their
    /// context switches and CPU time are counted (0: no idle window).
    pub idle_ms: u64,
}

const USAGE: &str = "usage: ha-harness scale --plugin PATH [--conns 1,16,64,256] [--iters N] \
[--rounds N] [--dev N] [--peer-dev N] [--size BYTES] [--idle-ms MS]\n\
per connection count: threads, RSS, fds, the half round trip of SIZE bytes (default 8) \
ping-ponged round-robin over all connections (ITERS round trips per round, default 2000; \
ROUNDS rounds, default 3) and context switches per round trip, for this process and a child; \
then, with every connection open and idle (MS milliseconds after a 1 s settle, default 2000; \
0 = skip), the wake-ups per second and the CPU both processes spend doing nothing";

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
        idle_ms: 2000,
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
            "--idle-ms" => o.idle_ms = num(0, 600_000)? as u64,
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

/// What one connection count measured.
struct Count {
    a: SideFigures,
    b: SideFigures,
    /// Median half round trip of each round, microseconds.
    medians: Vec<f64>,
    /// Both sides over the idle window (when there was one).
    idle: Option<(IdleFigures, IdleFigures)>,
}

/// Side A's idle window: settle, then count both sides while nothing moves.
fn idle_window<R: BufRead, W: Write>(
    lines: &mut Lines<R, W>,
    ms: u64,
) -> Result<(IdleFigures, IdleFigures), String> {
    // The threads that had just carried the rounds settle into their idle waits first.
    std::thread::sleep(Duration::from_secs(1));
    lines.send("IDLE")?;
    let f0 = IdleFigures::now();
    std::thread::sleep(Duration::from_millis(ms));
    let a = IdleFigures::now().since(f0);
    lines.send("END")?;
    let line = lines.next()?;
    let b = IdleFigures::parse(&line)
        .ok_or_else(|| format!("scale: the peer said {line:?}, expected its idle figures"))?;
    Ok((a, b))
}

/// One connection count, side A.
fn one_count(plugin: &Plugin, o: &ScaleOpts, n: usize) -> Result<Count, String> {
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
    let run = (|| -> Result<Count, String> {
        let mut c = open_conns(plugin, o.dev, n, o.size, &mut lines)?;
        let csw0 = IdleFigures::now().csw;
        let medians = ping(&mut c, o)?;
        let a = SideFigures::measured(IdleFigures::now().csw - csw0);
        let line = lines.next()?;
        let b = SideFigures::parse(&line)
            .ok_or_else(|| format!("scale: the peer said {line:?}, expected its figures"))?;
        let idle = match o.idle_ms {
            0 => None,
            ms => Some(idle_window(&mut lines, ms)?),
        };
        lines.send("BYE")?;
        close_conns(c)?;
        Ok(Count {
            a,
            b,
            medians,
            idle,
        })
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
    println!("| connections | threads A / B | RSS MiB A / B | fds A / B | half round trip us, median (min-max of rounds) | context switches per round trip (A+B) | idle: wake-ups per s (A+B) | idle: CPU % of a core (A+B) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &o.conns {
        match one_count(&plugin, &o, n) {
            Ok(Count {
                a,
                b,
                medians: mut m,
                idle,
            }) => {
                let (lo, hi) = m
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
                let rts = (o.rounds * o.iters) as f64;
                let idle = idle.map_or("- | -".to_string(), |(ia, ib)| {
                    let secs = o.idle_ms as f64 / 1000.0;
                    format!(
                        "{:.0} | {:.2}",
                        (ia.csw + ib.csw) as f64 / secs,
                        (ia.cpu_us + ib.cpu_us) as f64 / 1e4 / secs
                    )
                });
                println!(
                    "| {n} | {} / {} | {:.1} / {:.1} | {} / {} | {:.1} ({lo:.1}-{hi:.1}) | {:.2} | {idle} |",
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
        let plugin = load(&o.plugin, o.dev)?;
        let stdin = std::io::stdin();
        let mut lines = Lines {
            rd: stdin.lock(),
            wr: std::io::stdout(),
        };
        let mut c = open_conns(&plugin, o.dev, n, o.size, &mut lines)?;
        let csw0 = IdleFigures::now().csw;
        pong(&mut c, &o)?;
        let f = SideFigures::measured(IdleFigures::now().csw - csw0);
        lines.send(&f.line())?;
        let mut bye = lines.next()?;
        if bye == "IDLE" {
            let f0 = IdleFigures::now();
            let end = lines.next()?;
            if end != "END" {
                return Err(format!("scale-peer: expected END, got {end:?}"));
            }
            lines.send(&IdleFigures::now().since(f0).line())?;
            bye = lines.next()?;
        }
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
mod tests;
