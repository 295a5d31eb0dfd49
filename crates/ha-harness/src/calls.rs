//! `ha-harness calls`: what the plugin's own software costs per call, with nothing moving on
//! the wire. Two endpoints in this process (threads A and B connect through the plugin, as in
//! `--mode threads`), then A's thread times, in rounds, the two calls NCCL's proxy repeats
//! most while it waits:
//!
//! - `test()` of a receive that nothing arrives for (what each proxy loop pays per request
//!   in flight between completions);
//! - `isend()` to a peer that has posted no receive (no request comes back: NCCL calls it
//!   again until the peer's clear-to-send has arrived).
//!
//! Per call: nanoseconds, the median of the rounds and their spread. Then B sends the message
//! that completes A's receive and both close. A plugin with a background thread of its own
//! shares the core with it, so run it on an otherwise quiet machine.
//!
//! ```text
//! ha-harness calls --plugin PATH [--iters 200000] [--rounds 5] [--dev 0]
//! ```

use super::conn::{self, Endpoint};
use super::driver::{self, Buf, Ctl};
use super::report::median;
use nccl_net_loader::Plugin;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Options of `ha-harness calls`.
#[derive(Clone, Debug, PartialEq)]
pub struct CallsOpts {
    pub plugin: PathBuf,
    pub iters: usize,
    pub rounds: usize,
    pub dev: i32,
}

const USAGE: &str = "usage: ha-harness calls --plugin PATH [--iters N] [--rounds N] [--dev N]\n\
nanoseconds per test() of a receive nothing arrives for, and per isend() to a peer with no \
receive posted (ITERS calls per round, default 200000; ROUNDS rounds, default 5)";

/// Parse `calls`'s options (after the command word).
pub fn parse(args: &[String]) -> Result<CallsOpts, String> {
    let mut o = CallsOpts {
        plugin: PathBuf::new(),
        iters: 200_000,
        rounds: 5,
        dev: 0,
    };
    let mut i = 0;
    while i < args.len() {
        let v = args
            .get(i + 1)
            .ok_or_else(|| format!("calls: {} needs a value\n{USAGE}", args[i]))?;
        let num = |lo: usize, hi: usize| -> Result<usize, String> {
            v.parse::<usize>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| format!("calls: {} {v}: expected {lo}..={hi}", args[i]))
        };
        match args[i].as_str() {
            "--plugin" => o.plugin = PathBuf::from(v),
            "--iters" => o.iters = num(1, 100_000_000)?,
            "--rounds" => o.rounds = num(1, 100)?,
            "--dev" => o.dev = num(0, 1024)? as i32,
            other => return Err(format!("calls: unknown option {other}\n{USAGE}")),
        }
        i += 2;
    }
    if o.plugin.as_os_str().is_empty() {
        return Err(format!("calls: --plugin is required\n{USAGE}"));
    }
    Ok(o)
}

/// Nanoseconds per call of each round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallFigures {
    pub idle_test: Vec<f64>,
    pub isend_no_cts: Vec<f64>,
}

/// `ha-harness calls ...`: exit status.
pub fn main_with_args(args: &[String]) -> i32 {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    match run(&o) {
        Ok(f) => {
            print!("{}", render(&o, &f));
            0
        }
        Err(e) => {
            eprintln!("calls: {e}");
            1
        }
    }
}

fn load(path: &std::path::Path) -> Result<Plugin, String> {
    let mut plugin = Plugin::open(path)?;
    plugin.set_logger(nccl_net_loader::logger_for(&plugin.name()));
    plugin.init().map_err(|e| format!("init: {e}"))?;
    Ok(plugin)
}

/// Connect A and B, time A's calls, complete and close.
pub fn run(o: &CallsOpts) -> Result<CallFigures, String> {
    let plugin = load(&o.plugin)?;
    let abort = AtomicBool::new(false);
    let ctl = Ctl {
        timeout: Duration::from_secs(60),
        abort: &abort,
        window: 1,
        may_sleep: false,
    };
    let (xa, xb) = conn::channel_pair();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (plugin, abort, ctl) = (&plugin, &abort, &ctl);
        let b = s.spawn(move || -> Result<(), String> {
            let mut xb = xb;
            let ep = conn::establish(plugin, o.dev, &mut xb, Duration::from_secs(60), abort)?;
            let mut buf = Buf::register(plugin, &ep.send, 8)?;
            // A times its calls first; then the message that completes A's receive.
            let waited = done_rx.recv();
            let sent = waited
                .map_err(|_| "A stopped before its timing".to_string())
                .and_then(|()| {
                    let req = driver::post_send_one(&ep, &mut buf, 8, 1, ctl)?;
                    driver::wait(&ep, req, &mut [0], ctl)
                });
            let dereg = buf.deregister(plugin, &ep.send);
            let closed = ep.close();
            sent.and(dereg).and(closed)
        });
        let mut xa = xa;
        let a = time_side_a(plugin, o, &mut xa, ctl, abort, done_tx);
        let b = b.join().map_err(|_| "side B panicked".to_string())?;
        let f = a?;
        b?;
        Ok(f)
    })
}

fn time_side_a(
    plugin: &Plugin,
    o: &CallsOpts,
    xa: &mut conn::ChannelExchange,
    ctl: &Ctl<'_>,
    abort: &AtomicBool,
    done: mpsc::Sender<()>,
) -> Result<CallFigures, String> {
    let ep = conn::establish(plugin, o.dev, xa, Duration::from_secs(60), abort)?;
    let mut rbuf = Buf::register(plugin, &ep.recv, 8)?;
    let mut sbuf = Buf::register(plugin, &ep.send, 8)?;
    let r = time_calls(&ep, o, &mut rbuf, &mut sbuf, ctl);
    let _ = done.send(());
    let (f, completed) = match r {
        Ok((req, f)) => (Ok(f), driver::wait(&ep, req, &mut [0], ctl)),
        Err(e) => (Err(e), Ok(())),
    };
    let d1 = rbuf.deregister(plugin, &ep.recv);
    let d2 = sbuf.deregister(plugin, &ep.send);
    let closed = ep.close();
    let f = f?;
    completed.and(d1).and(d2).and(closed)?;
    Ok(f)
}

/// The timed loops; returns A's receive (still pending) and the figures.
fn time_calls(
    ep: &Endpoint<'_>,
    o: &CallsOpts,
    rbuf: &mut Buf,
    sbuf: &mut Buf,
    ctl: &Ctl<'_>,
) -> Result<(nccl_net_loader::Request, CallFigures), String> {
    let req = driver::post_recv_one(ep, rbuf, 8, 1, ctl)?;
    let mut f = CallFigures::default();
    let mut sizes = [0i32];
    let sptr = sbuf.ptr(0);
    for _ in 0..o.rounds {
        let t0 = Instant::now();
        for _ in 0..o.iters {
            if ep
                .plugin
                .test(&req, &mut sizes)
                .map_err(|e| format!("test: {e}"))?
            {
                return Err("the receive completed with nothing sent".into());
            }
        }
        f.idle_test
            .push(t0.elapsed().as_nanos() as f64 / o.iters as f64);
        let t0 = Instant::now();
        for _ in 0..o.iters {
            if ep
                .plugin
                .isend(&ep.send, sptr, 8, 1, sbuf.mr())
                .map_err(|e| format!("isend: {e}"))?
                .is_some()
            {
                return Err("isend matched a receive the peer never posted".into());
            }
        }
        f.isend_no_cts
            .push(t0.elapsed().as_nanos() as f64 / o.iters as f64);
    }
    Ok((req, f))
}

/// The printed table: median [min..max] of the rounds, per call.
pub fn render(o: &CallsOpts, f: &CallFigures) -> String {
    let row = |name: &str, v: &[f64]| {
        let mut s = v.to_vec();
        let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("| {name} | {:.0} [{lo:.0}..{hi:.0}] |\n", median(&mut s))
    };
    format!(
        "calls: {} rounds of {} calls, {}\n| call | ns per call, median [min..max] of rounds |\n|---|---:|\n{}{}",
        o.rounds,
        o.iters,
        o.plugin.display(),
        row("test(), receive pending", &f.idle_test),
        row("isend(), no receive posted", &f.isend_no_cts),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn options_parse_and_refuse_by_name() {
        let o = parse(&s(&["--plugin", "p.so", "--iters", "10", "--rounds", "2"])).unwrap();
        assert_eq!((o.iters, o.rounds, o.dev), (10, 2, 0));
        assert!(parse(&s(&["--iters", "5"]))
            .unwrap_err()
            .contains("--plugin"));
        assert!(parse(&s(&["--plugin", "p", "--rounds", "0"]))
            .unwrap_err()
            .contains("--rounds 0"));
        assert!(parse(&s(&["--plugin", "p", "--bogus", "1"]))
            .unwrap_err()
            .contains("--bogus"));
    }

    #[test]
    fn the_table_gives_median_and_spread() {
        let o = parse(&s(&["--plugin", "p.so"])).unwrap();
        let f = CallFigures {
            idle_test: vec![300.0, 100.0, 200.0],
            isend_no_cts: vec![50.0, 70.0],
        };
        let t = render(&o, &f);
        assert!(
            t.contains("| test(), receive pending | 200 [100..300] |"),
            "{t}"
        );
        assert!(
            t.contains("| isend(), no receive posted | 60 [50..70] |"),
            "{t}"
        );
    }
}
