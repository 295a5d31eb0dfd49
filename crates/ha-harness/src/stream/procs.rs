//! `--mode procs`: side B runs in a child process, started as
//! `[--child-prefix words...] <this executable> stream --child ...` with the `--child-env`
//! variables added to its environment. Connection handles (`@ha handle`), the stop handshake
//! and the receiver's report (`@hs ...`) travel over the child's stdin and stdout, so the child
//! may live in another network namespace (`ip netns exec ha-b`). Anything else the child
//! prints on stdout is passed to stderr as `[child] ...`.

use super::clock::Clock;
use super::link::{ErrorKind, ReceiverLink, SenderLink, SideError};
use super::opts::{child_args, StreamOpts};
use super::proto::{self, Line, ReportBuilder};
use super::receiver::{self, RecvReport};
use super::summary::Failure;
use super::watchdog::Watchdog;
use super::{err_line, finish_side, load, stuck_why, Ctx, StreamCfg, WATCHDOG_GRACE};
use crate::conn::{self, HandleExchange};
use crate::wire::{self, Handle, Msg};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

type SharedStdin = Arc<Mutex<Option<ChildStdin>>>;

fn write_child(stdin: &SharedStdin, line: &str) -> Result<(), String> {
    let mut guard = stdin.lock().unwrap_or_else(|p| p.into_inner());
    let pipe = guard
        .as_mut()
        .ok_or_else(|| "child stdin already closed".to_string())?;
    writeln!(pipe, "{line}")
        .and_then(|()| pipe.flush())
        .map_err(|e| format!("writing to the child: {e}"))
}

/// The parent's half of the handle exchange.
struct ParentExchange {
    stdin: SharedStdin,
    rx: mpsc::Receiver<Handle>,
}

impl HandleExchange for ParentExchange {
    fn exchange(&mut self, mine: &Handle, deadline: Instant) -> Result<Handle, String> {
        write_child(&self.stdin, &wire::encode(&Msg::Handle(*mine)))?;
        conn::recv_handle(&self.rx, deadline).map_err(|e| format!("child: {e}"))
    }
}

/// The sender's control link to a child receiver.
struct ParentLink {
    stdin: SharedStdin,
    rx: mpsc::Receiver<u64>,
}

impl SenderLink for ParentLink {
    fn request_stop(&mut self, started: u64) -> Result<(), String> {
        write_child(&self.stdin, &proto::encode(&Line::Stop(started)))
    }

    fn stop_reply(&mut self) -> Option<u64> {
        self.rx.try_recv().ok()
    }
}

/// What the reader of the child's stdout collected.
#[derive(Default)]
struct ChildOutcome {
    report: Option<RecvReport>,
    /// `@ha error` from the child, or a protocol problem.
    failure: Option<String>,
    done: bool,
}

fn spawn(o: &StreamOpts, multi_max: usize) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating own executable: {e}"))?;
    let mut words: Vec<String> = o.child_prefix.clone();
    words.push(exe.to_string_lossy().into_owned());
    words.extend(child_args(o, multi_max));
    let mut cmd = std::process::Command::new(&words[0]);
    cmd.args(&words[1..])
        .envs(o.child_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd.spawn()
        .map_err(|e| format!("starting the child ({}): {e}", words.join(" ")))
}

/// Reads the child's stdout until EOF.
fn read_child(
    out: std::process::ChildStdout,
    htx: mpsc::Sender<Handle>,
    stop_tx: mpsc::Sender<u64>,
    abort: &AtomicBool,
) -> ChildOutcome {
    let mut oc = ChildOutcome::default();
    let mut builder = ReportBuilder::default();
    let fail = |oc: &mut ChildOutcome, why: String| {
        abort.store(true, Ordering::Relaxed);
        oc.failure.get_or_insert(why);
    };
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if let Some(m) = wire::decode(&line) {
            match m {
                Ok(Msg::Handle(h)) => {
                    let _ = htx.send(h);
                }
                Ok(Msg::Done) => oc.done = true,
                Ok(Msg::Error(e)) => fail(&mut oc, e),
                Ok(other) => fail(
                    &mut oc,
                    format!("unexpected line from the child: {other:?}"),
                ),
                Err(e) => fail(&mut oc, e),
            }
            continue;
        }
        match proto::decode(&line) {
            None => err_line(&format!("[child] {line}")),
            Some(Err(e)) => fail(&mut oc, e),
            Some(Ok(Line::Stopped(l))) => {
                let _ = stop_tx.send(l);
            }
            Some(Ok(l)) => match builder.feed(l) {
                Ok(Some(r)) => {
                    if r.error.is_some() {
                        // The receiver failed: the sender need not wait any longer.
                        abort.store(true, Ordering::Relaxed);
                    }
                    oc.report = Some(r);
                }
                Ok(None) => {}
                Err(e) => fail(&mut oc, e),
            },
        }
    }
    if oc.report.is_none() || !oc.done {
        abort.store(true, Ordering::Relaxed);
    }
    oc
}

/// Waits for the child, killing it if it does not exit within `grace`.
fn reap(child: &mut Child, grace: Duration) -> Result<(), String> {
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("child exited with {status}")),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "child did not exit within {}s; killed",
                    grace.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for the child: {e}")),
        }
    }
}

/// Side A here, side B in a child. Returns the child's report (if any) and failures that
/// are not in either side's report.
pub fn run_parent(
    o: &StreamOpts,
    plugin: &nccl_net_loader::Plugin,
    cfg: &StreamCfg,
    clock: &Clock,
    progress: &mut dyn FnMut(super::sender::Progress, &super::sender::SendReport),
) -> (super::sender::SendReport, Option<RecvReport>, Vec<Failure>) {
    let mut extra = Vec::new();
    let failure = |what: String| Failure {
        side: "B (receiver)",
        at_ns: clock.elapsed_ns(),
        what,
        counts: true,
    };
    let mut child = match spawn(o, cfg.multi_max) {
        Ok(c) => c,
        Err(e) => {
            let sent = super::sender::SendReport {
                error: Some(SideError::new(
                    clock.elapsed_ns(),
                    ErrorKind::Aborted,
                    "no receiver".into(),
                )),
                ..Default::default()
            };
            return (sent, None, vec![failure(e)]);
        }
    };
    let stdin: SharedStdin = Arc::new(Mutex::new(child.stdin.take()));
    let stdout = child.stdout.take();
    let abort = AtomicBool::new(false);
    let (htx, hrx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel();
    let timeout = Duration::from_secs(cfg.timeout_s);
    let wd = Watchdog::new(["A (sender)", "-"], timeout + WATCHDOG_GRACE);
    let (sent, outcome) = std::thread::scope(|s| {
        let wd = &wd;
        s.spawn(move || {
            wd.watch(&|side, ms| {
                println!("stream: error: side {side} {}; exiting", stuck_why(ms));
                let _ = std::io::stdout().flush();
                std::process::exit(1);
            })
        });
        wd.beat(0);
        let beat = || wd.beat(0);
        let ctx = Ctx {
            cfg,
            clock,
            abort: &abort,
            beat: &beat,
        };
        let abort_r = &abort;
        let reader = s.spawn(move || match stdout {
            Some(out) => read_child(out, htx, stop_tx, abort_r),
            None => ChildOutcome::default(),
        });
        let mut xchg = ParentExchange {
            stdin: Arc::clone(&stdin),
            rx: hrx,
        };
        let sent = match conn::establish(plugin, o.dev, &mut xchg, timeout, &abort) {
            Err(e) => super::sender::SendReport {
                // After the child failed, a setup failure here is its doing.
                error: Some(SideError::new(
                    clock.elapsed_ns(),
                    if abort.load(Ordering::Relaxed) {
                        ErrorKind::Aborted
                    } else {
                        ErrorKind::Setup
                    },
                    e,
                )),
                end_ns: clock.elapsed_ns(),
                ..Default::default()
            },
            Ok(ep) => {
                let mut link = ParentLink {
                    stdin: Arc::clone(&stdin),
                    rx: stop_rx,
                };
                let mut sent = super::sender::run(&ep, &ctx, &mut link, progress);
                if sent.error.is_none() {
                    if let Err(e) = finish_side(ep, &mut xchg, timeout, &abort) {
                        sent.error = Some(SideError::new(clock.elapsed_ns(), e.0, e.1));
                    }
                }
                sent
            }
        };
        if sent.error.is_some() {
            let _ = write_child(&stdin, &wire::encode(&Msg::Abort));
        }
        wd.idle(0);
        // EOF on its stdin tells a child that is still running to stop.
        stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
        let outcome = reader.join().unwrap_or_default();
        wd.stop();
        (sent, outcome)
    });
    let reaped = reap(&mut child, Duration::from_secs(cfg.timeout_s + 5));
    let clean_report = outcome.report.as_ref().is_some_and(|r| r.error.is_none());
    // At most one failure for the child (its report, if any, carries its own error).
    let child_failure = if let Some(f) = outcome.failure {
        Some(f)
    } else if outcome.report.is_none() {
        Some(match reaped {
            Ok(()) => "child exited without reporting".to_string(),
            Err(e) => format!("child exited without reporting ({e})"),
        })
    } else if clean_report && !outcome.done {
        Some("child did not finish closing its connection".to_string())
    } else if clean_report {
        reaped.err()
    } else {
        None
    };
    let mut sent = sent;
    if outcome.report.is_none() && child_failure.is_some() {
        // The child died before reporting: our failing to talk to it (a broken pipe, no
        // handle) is the same failure seen from this side, not a second one.
        if let Some(e) = sent.error.as_mut() {
            if e.what.contains("writing to the child") || e.what.starts_with("child: ") {
                e.kind = ErrorKind::Aborted;
            }
        }
    }
    extra.extend(child_failure.map(failure));
    (sent, outcome.report, extra)
}

/// The child's half of the handle exchange: our handle on stdout, the parent's from stdin.
struct ChildExchange {
    rx: mpsc::Receiver<Handle>,
}

impl HandleExchange for ChildExchange {
    fn exchange(&mut self, mine: &Handle, deadline: Instant) -> Result<Handle, String> {
        emit(&wire::encode(&Msg::Handle(*mine)));
        conn::recv_handle(&self.rx, deadline).map_err(|e| format!("parent: {e}"))
    }
}

struct ChildLink {
    rx: mpsc::Receiver<u64>,
}

impl ReceiverLink for ChildLink {
    fn stop_request(&mut self) -> Option<u64> {
        self.rx.try_recv().ok()
    }

    fn reply_stop(&mut self, limit: u64) -> Result<(), String> {
        emit(&proto::encode(&Line::Stopped(limit)));
        Ok(())
    }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `stream --child`: side B. Reports over stdout; stops on `abort` or stdin EOF.
pub fn child_main(o: &StreamOpts) -> i32 {
    let clock = match Clock::start() {
        Ok(c) => c,
        Err(e) => {
            emit(&wire::encode(&Msg::Error(e)));
            return 1;
        }
    };
    let plugin = match load(&o.plugin, o.abi, o.dev) {
        Ok((plugin, _props)) => plugin,
        Err(e) => {
            emit(&wire::encode(&Msg::Error(e)));
            return 1;
        }
    };
    let cfg = StreamCfg::from_opts(o, o.multi_max.unwrap_or(1));
    let abort = Arc::new(AtomicBool::new(false));
    let (htx, hrx) = mpsc::channel::<Handle>();
    let (stop_tx, stop_rx) = mpsc::channel::<u64>();
    let abort_w = Arc::clone(&abort);
    // Not joined: it blocks on stdin until the parent closes it or this process exits.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match wire::decode(&line) {
                Some(Ok(Msg::Handle(h))) => {
                    let _ = htx.send(h);
                    continue;
                }
                Some(Ok(Msg::Abort)) => break,
                _ => {}
            }
            if let Some(Ok(Line::Stop(p))) = proto::decode(&line) {
                let _ = stop_tx.send(p);
            }
        }
        abort_w.store(true, Ordering::Relaxed);
    });
    let timeout = Duration::from_secs(cfg.timeout_s);
    let wd = Watchdog::new(["-", "B (receiver)"], timeout + WATCHDOG_GRACE);
    std::thread::scope(|s| {
        let wd = &wd;
        s.spawn(move || {
            wd.watch(&|_, ms| {
                emit(&wire::encode(&Msg::Error(stuck_why(ms))));
                std::process::exit(1);
            })
        });
        wd.beat(1);
        let code = child_side(o, &plugin, &cfg, &clock, &abort, hrx, stop_rx, wd);
        wd.idle(1);
        wd.stop();
        code
    })
}

/// Side B from connection setup to close; reports over stdout.
#[allow(clippy::too_many_arguments)]
fn child_side(
    o: &StreamOpts,
    plugin: &nccl_net_loader::Plugin,
    cfg: &StreamCfg,
    clock: &Clock,
    abort: &AtomicBool,
    hrx: mpsc::Receiver<Handle>,
    stop_rx: mpsc::Receiver<u64>,
    wd: &Watchdog,
) -> i32 {
    let timeout = Duration::from_secs(cfg.timeout_s);
    let beat = || wd.beat(1);
    let ctx = Ctx {
        cfg,
        clock,
        abort,
        beat: &beat,
    };
    let mut xchg = ChildExchange { rx: hrx };
    let report = match conn::establish(plugin, o.dev, &mut xchg, timeout, abort) {
        Err(e) => {
            let kind = if abort.load(Ordering::Relaxed) {
                ErrorKind::Aborted
            } else {
                ErrorKind::Setup
            };
            let rep = RecvReport {
                start_ns: clock.start_ns(),
                end_ns: clock.elapsed_ns(),
                error: Some(SideError::new(clock.elapsed_ns(), kind, e)),
                ..RecvReport::default()
            };
            for l in proto::report_lines(&rep) {
                emit(&l);
            }
            emit(&wire::encode(&Msg::Done));
            return 1;
        }
        Ok(ep) => {
            let mut link = ChildLink { rx: stop_rx };
            let rep = receiver::run(&ep, &ctx, &mut link);
            for l in proto::report_lines(&rep) {
                emit(&l);
            }
            if rep.error.is_some() {
                // Requests may still be in flight: leave the comms open.
                emit(&wire::encode(&Msg::Done));
                return 1;
            }
            (ep, rep)
        }
    };
    let (ep, _) = report;
    match finish_side(ep, &mut xchg, timeout, abort) {
        Ok(()) => {
            emit(&wire::encode(&Msg::Done));
            0
        }
        // The parent failed first: not a failure of this side.
        Err((ErrorKind::Aborted, _)) => {
            emit(&wire::encode(&Msg::Done));
            0
        }
        Err((_, e)) => {
            emit(&wire::encode(&Msg::Error(e)));
            1
        }
    }
}
