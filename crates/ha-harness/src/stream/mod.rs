//! `ha-harness stream`: verified traffic from side A (sender) to side B (receiver) for a
//! duration or a number of messages, for failover drills. See [`opts::USAGE`] for the command
//! line. Both sides derive the same [`schedule`] from the seed; the receiver checks every
//! byte ([`message`]) and classifies every slot ([`tracker`]); completion times give stalls and
//! recovery after external events ([`timeline`]); [`summary`] prints and writes the results.
//! The receiver runs in a thread (`--mode threads`) or in a child process (`--mode procs`,
//! [`procs`]), possibly in another network namespace.

pub mod clock;
pub mod link;
pub mod message;
pub mod opts;
pub mod procs;
pub mod proto;
pub mod receiver;
pub mod schedule;
pub mod sender;
pub mod slot;
pub mod summary;
pub mod timeline;
pub mod tracker;
pub mod watchdog;

use self::clock::Clock;
use self::link::ErrorKind;
use self::opts::{Length, Request, StreamOpts, MAX_MULTI, USAGE};
use self::receiver::RecvReport;
use self::sender::{Progress, SendReport};
use self::summary::Failure;
use self::watchdog::Watchdog;
use crate::args::Mode;
use crate::conn::{self, Endpoint, HandleExchange};
use crate::report::{format_size, json_string};
use nccl_net_abi::common::NCCL_NET_HANDLE_MAXSIZE;
use nccl_net_loader::{Abi, Plugin, Props};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Exit status for bad usage.
pub const EXIT_USAGE: i32 = 2;

/// Writes one line to stderr with a single `write` (no interleaving with the child's lines).
pub(crate) fn err_line(msg: &str) {
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

/// Everything both sides must agree on, plus the sender's pacing.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamCfg {
    pub seed: u64,
    pub max_size: usize,
    pub window: usize,
    pub multi_max: usize,
    /// `--messages`.
    pub messages: Option<u64>,
    /// `--duration` (the sender's deadline; the receiver learns the end by the stop handshake).
    pub duration_s: Option<f64>,
    pub timeout_s: u64,
    pub progress_s: Option<f64>,
    /// One registration for all parts of a receive slot.
    pub shared_mr: bool,
}

/// What a side's loop needs besides its endpoint and link.
pub struct Ctx<'a> {
    pub cfg: &'a StreamCfg,
    pub clock: &'a Clock,
    /// Set when the other side failed: stop waiting.
    pub abort: &'a AtomicBool,
    /// Called on every loop iteration (the watchdog's heartbeat).
    pub beat: &'a (dyn Fn() + Sync),
}

/// Extra time the watchdog allows beyond `--timeout` (connection setup and the barrier wait
/// up to `--timeout` without a heartbeat).
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(10);

/// The watchdog's verdict; the process then exits with status 1.
pub(crate) fn stuck_why(ms: u64) -> String {
    format!(
        "stuck for {:.1} s (a plugin call that never returned)",
        ms as f64 / 1e3
    )
}

impl StreamCfg {
    pub fn from_opts(o: &StreamOpts, multi_max: usize) -> Self {
        let (messages, duration_s) = match o.length {
            Length::Messages(n) => (Some(n), None),
            Length::Duration(s) => (None, Some(s)),
        };
        StreamCfg {
            seed: o.seed,
            max_size: o.max_size,
            window: o.window,
            multi_max,
            messages,
            duration_s,
            timeout_s: o.timeout_s,
            progress_s: (o.progress_s > 0.0).then_some(o.progress_s),
            shared_mr: o.shared_mr,
        }
    }

    pub fn total_messages(&self) -> Option<u64> {
        self.messages
    }
}

/// Opens and initialises the plugin; returns it with the device's properties.
pub(crate) fn load(path: &Path, abi: Option<Abi>, dev: i32) -> Result<(Plugin, Props), String> {
    let mut plugin = Plugin::open_abi(path, abi)?;
    plugin.set_logger(nccl_net_loader::logger_for(&plugin.name()));
    plugin.init().map_err(|e| format!("init: {e}"))?;
    let ndev = plugin.devices().map_err(|e| format!("devices: {e}"))?;
    if dev >= ndev {
        return Err(format!("--dev {dev}: the plugin has {ndev} device(s)"));
    }
    let props = plugin
        .properties(dev)
        .map_err(|e| format!("getProperties({dev}): {e}"))?;
    Ok((plugin, props))
}

/// After a clean stream: an out-of-band barrier (an all-zero handle exchange) so that
/// neither side closes while the other still waits, then close both comms.
pub(crate) fn finish_side(
    ep: Endpoint<'_>,
    xchg: &mut dyn HandleExchange,
    timeout: Duration,
    abort: &AtomicBool,
) -> Result<(), (ErrorKind, String)> {
    if let Err(e) = xchg.exchange(&[0u8; NCCL_NET_HANDLE_MAXSIZE], Instant::now() + timeout) {
        let kind = if abort.load(Ordering::Relaxed) {
            ErrorKind::Aborted
        } else {
            ErrorKind::Setup
        };
        return Err((kind, format!("barrier before close: {e}")));
    }
    ep.close().map_err(|e| (ErrorKind::Setup, e))
}

/// Entry point of `ha-harness stream ...` and `ha-harness now`: the exit status.
pub fn main_with_args(args: &[String]) -> i32 {
    match opts::parse(args) {
        Err(e) => {
            err_line(&format!("ha-harness: {e}\n\n{USAGE}"));
            EXIT_USAGE
        }
        Ok(Request::Help) => {
            print!("{USAGE}");
            0
        }
        Ok(Request::Now) => match clock::now_ns() {
            Ok(ns) => {
                println!("{ns}");
                0
            }
            Err(e) => {
                err_line(&format!("ha-harness: {e}"));
                1
            }
        },
        Ok(Request::Stream(o)) if o.child => procs::child_main(&o),
        Ok(Request::Stream(o)) => run(&o),
    }
}

fn run(o: &StreamOpts) -> i32 {
    let clock = match Clock::start() {
        Ok(c) => c,
        Err(e) => {
            err_line(&format!("ha-harness: {e}"));
            return 1;
        }
    };
    let (plugin, props) = match load(&o.plugin, o.abi, o.dev) {
        Ok(l) => l,
        Err(e) => {
            err_line(&format!("ha-harness: {e}"));
            return 1;
        }
    };
    let max_recvs = usize::try_from(props.max_recvs).unwrap_or(1).max(1);
    let multi_max = match o.multi_max {
        Some(m) if m > max_recvs => {
            err_line(&format!(
                "ha-harness: --multi-max {m} exceeds the device's maxRecvs={max_recvs}"
            ));
            return EXIT_USAGE;
        }
        Some(m) => m,
        None => MAX_MULTI.min(max_recvs),
    };
    let cfg = StreamCfg::from_opts(o, multi_max);
    let length = match o.length {
        Length::Messages(n) => format!("{n} messages"),
        Length::Duration(s) => format!("{s} s"),
    };
    println!(
        "stream: plugin {} ({}), device {} ({}), mode {}, {length}, max-size {}, window {}, multi-max {}, seed {}",
        plugin.name(),
        o.plugin.display(),
        o.dev,
        props.name,
        o.mode.as_str(),
        format_size(o.max_size),
        o.window,
        multi_max,
        o.seed
    );
    println!("stream: start monotonic_ns={}", clock.start_ns());
    let _ = std::io::stdout().flush();
    let mut progress = |why: Progress, r: &SendReport| {
        match why {
            Progress::Started => {
                println!("stream: traffic started at_ms={:.1}", r.end_ns as f64 / 1e6)
            }
            Progress::Tick => println!(
                "stream: t={:.1}s sent {} messages, {:.1} MB",
                r.end_ns as f64 / 1e9,
                r.messages,
                r.bytes as f64 / 1e6
            ),
        }
        let _ = std::io::stdout().flush();
    };
    let (sent, recv, extra) = match o.mode {
        Mode::Threads => {
            let (s, r) = run_threads(&plugin, o.dev, &cfg, &clock, &mut progress);
            (s, Some(r), Vec::new())
        }
        Mode::Procs => procs::run_parent(o, &plugin, &cfg, &clock, &mut progress),
    };
    let recv = recv.unwrap_or_else(|| RecvReport {
        start_ns: clock.start_ns(),
        ..RecvReport::default()
    });
    let offset =
        i64::try_from(i128::from(recv.start_ns) - i128::from(clock.start_ns())).unwrap_or(0);
    let mut extra = extra;
    let events = match &o.events {
        None => Vec::new(),
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))
            .and_then(|t| timeline::parse_events(&t, clock.start_ns()))
        {
            Ok(ev) => ev,
            Err(e) => {
                // A missing events file means no events (the drill did not cut anything).
                if path.exists() {
                    extra.push(Failure {
                        side: "harness",
                        at_ns: clock.elapsed_ns(),
                        what: e,
                        counts: true,
                    });
                }
                Vec::new()
            }
        },
    };
    let s = summary::build(sent, recv, offset, extra, &events);
    for line in s.lines() {
        println!("{line}");
    }
    if let Some(path) = &o.json {
        let info = [
            ("plugin", json_string(&plugin.name())),
            ("path", json_string(&o.plugin.to_string_lossy())),
            ("mode", json_string(o.mode.as_str())),
            ("dev", o.dev.to_string()),
            ("seed", o.seed.to_string()),
            ("max_size", o.max_size.to_string()),
            ("window", o.window.to_string()),
            ("multi_max", multi_max.to_string()),
            ("start_monotonic_ns", clock.start_ns().to_string()),
            // The same moment on the wall clock (for `ha-harness timeline`, which places the
            // completions among the plugin's stats lines).
            (
                "start_unix_ms",
                format!(
                    "{:.3}",
                    crate::stats::units::now_unix_ms() as f64
                        - clock.start_instant().elapsed().as_secs_f64() * 1e3
                ),
            ),
        ];
        if let Err(e) = std::fs::write(path, s.json(&info)) {
            err_line(&format!("ha-harness: writing {}: {e}", path.display()));
            return 1;
        }
    }
    i32::from(!s.clean())
}

/// Both sides as threads of this process.
fn run_threads(
    plugin: &Plugin,
    dev: i32,
    cfg: &StreamCfg,
    clock: &Clock,
    progress: &mut dyn FnMut(Progress, &SendReport),
) -> (SendReport, RecvReport) {
    let abort = AtomicBool::new(false);
    let (mut xa, mut xb) = conn::channel_pair();
    let (mut la, mut lb) = link::channel_link();
    let timeout = Duration::from_secs(cfg.timeout_s);
    let wd = Watchdog::new(["A (sender)", "B (receiver)"], timeout + WATCHDOG_GRACE);
    // A setup failure after the other side failed is that side's doing.
    let setup_err = |e: String, abort: &AtomicBool| {
        let kind = if abort.load(Ordering::Relaxed) {
            ErrorKind::Aborted
        } else {
            ErrorKind::Setup
        };
        link::SideError::new(clock.elapsed_ns(), kind, e)
    };
    std::thread::scope(|s| {
        let (abort, wd) = (&abort, &wd);
        s.spawn(move || {
            wd.watch(&|side, ms| {
                println!("stream: error: side {side} {}; exiting", stuck_why(ms));
                let _ = std::io::stdout().flush();
                std::process::exit(1);
            })
        });
        let receiver = s.spawn(move || {
            wd.beat(1);
            let beat = || wd.beat(1);
            let ctx = Ctx {
                cfg,
                clock,
                abort,
                beat: &beat,
            };
            let rep = match conn::establish(plugin, dev, &mut xb, timeout, abort) {
                Err(e) => RecvReport {
                    start_ns: clock.start_ns(),
                    error: Some(setup_err(e, abort)),
                    ..RecvReport::default()
                },
                Ok(ep) => {
                    let mut rep = receiver::run(&ep, &ctx, &mut lb);
                    if rep.error.is_none() {
                        if let Err((kind, e)) = finish_side(ep, &mut xb, timeout, abort) {
                            rep.error = Some(link::SideError::new(clock.elapsed_ns(), kind, e));
                        }
                    }
                    rep
                }
            };
            if rep.error.is_some() {
                abort.store(true, Ordering::Relaxed);
            }
            wd.idle(1);
            rep
        });
        wd.beat(0);
        let beat = || wd.beat(0);
        let ctx = Ctx {
            cfg,
            clock,
            abort,
            beat: &beat,
        };
        let sent = match conn::establish(plugin, dev, &mut xa, timeout, abort) {
            Err(e) => SendReport {
                error: Some(setup_err(e, abort)),
                end_ns: clock.elapsed_ns(),
                ..SendReport::default()
            },
            Ok(ep) => {
                let mut sent = sender::run(&ep, &ctx, &mut la, progress);
                if sent.error.is_none() {
                    if let Err((kind, e)) = finish_side(ep, &mut xa, timeout, abort) {
                        sent.error = Some(link::SideError::new(clock.elapsed_ns(), kind, e));
                    }
                }
                sent
            }
        };
        if sent.error.is_some() {
            abort.store(true, Ordering::Relaxed);
        }
        wd.idle(0);
        // Unblock a receiver waiting for the barrier or the stop handshake.
        drop(xa);
        drop(la);
        let recv = receiver.join().unwrap_or_else(|_| RecvReport {
            start_ns: clock.start_ns(),
            error: Some(link::SideError::new(
                clock.elapsed_ns(),
                ErrorKind::Setup,
                "receiver thread panicked".into(),
            )),
            ..RecvReport::default()
        });
        wd.stop();
        (sent, recv)
    })
}
