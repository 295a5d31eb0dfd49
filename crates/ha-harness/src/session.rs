//! Running a command end to end: load the plugin, start the two endpoints (two threads, or
//! this thread plus a child process speaking the `wire` protocol), collect their reports,
//! print results and pick the exit status.

use super::args::{child_args, Command, Mode, Options, USAGE};
use super::bench::{self, BenchPlan};
use super::check::{self, Case, Outcome};
use super::conn::{self, HandleExchange, Side};
use super::driver::Ctl;
use super::report::{self, BenchRow, RunInfo};
use super::wire::{self, Handle, Msg};
use nccl_net_abi::common::NCCL_NET_HANDLE_MAXSIZE;
use nccl_net_loader::{Abi, Plugin, Props};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Writes one line to stderr with a single `write` (lines from the parent, the child and the
/// plugin share the terminal or pipe and must not interleave mid-line).
fn err_line(msg: &str) {
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

/// Exit status for bad usage.
pub const EXIT_USAGE: i32 = 2;

/// What the two endpoints run.
enum Job {
    Check(Vec<Case>),
    Bench(BenchPlan),
}

/// Reports from the endpoints to the coordinating thread.
enum Event {
    Case(Side, usize, Outcome),
    Row(BenchRow),
    Done(Side),
    Failed(Side, String),
}

/// A plugin, initialised, with the chosen device's properties.
struct Loaded {
    plugin: Plugin,
    ndev: i32,
    props: Props,
}

fn load(path: &Path, abi: Option<Abi>, dev: i32) -> Result<Loaded, String> {
    let mut plugin = Plugin::open_abi(path, abi)?;
    // Other plugins may call the logger unchecked (NCCL always passes one).
    plugin.set_logger(nccl_net_loader::logger_for(&plugin.name()));
    plugin.init().map_err(|e| format!("init: {e}"))?;
    // After `init`: a plugin may fill its table there (NCCL reads it after `init` too).
    let missing = plugin.missing_entries();
    if !missing.is_empty() {
        err_line(&format!(
            "warning: {}: NULL table entries: {}",
            path.display(),
            missing.join(", ")
        ));
    }
    let ndev = plugin.devices().map_err(|e| format!("devices: {e}"))?;
    if dev >= ndev {
        return Err(format!("--dev {dev}: the plugin has {ndev} device(s)"));
    }
    let props = plugin
        .properties(dev)
        .map_err(|e| format!("getProperties({dev}): {e}"))?;
    Ok(Loaded {
        plugin,
        ndev,
        props,
    })
}

/// The properties line of side B's device (`--peer-dev`), or why it cannot be used.
fn check_peer_dev(loaded: &Loaded, peer: i32) -> Result<String, String> {
    if peer >= loaded.ndev {
        return Err(format!(
            "--peer-dev {peer}: the plugin has {} device(s)",
            loaded.ndev
        ));
    }
    let props = loaded
        .plugin
        .properties(peer)
        .map_err(|e| format!("getProperties({peer}): {e}"))?;
    Ok(report::describe_props(peer, &props))
}

/// Entry point of `ha-harness`: returns the process exit status.
pub fn main_with_args(args: &[String]) -> i32 {
    let opts = match super::args::parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            err_line(&format!("ha-harness: {e}\n\n{USAGE}"));
            return EXIT_USAGE;
        }
    };
    if opts.command == Command::Help {
        print!("{USAGE}");
        return 0;
    }
    if opts.child {
        return child_main(&opts);
    }
    let loaded = match load(&opts.plugin, opts.abi, opts.dev) {
        Ok(l) => l,
        Err(e) => {
            err_line(&format!("ha-harness: {e}"));
            return 1;
        }
    };
    println!(
        "plugin: {} ({}), {} device(s), mode {}, ext-net {}",
        loaded.plugin.name(),
        opts.plugin.display(),
        loaded.ndev,
        opts.mode.as_str(),
        loaded.plugin.abi()
    );
    println!("{}", report::describe_props(opts.dev, &loaded.props));
    let peer = opts.peer_dev();
    if peer != opts.dev {
        match check_peer_dev(&loaded, peer) {
            Ok(line) => println!("side B on {line}"),
            Err(e) => {
                err_line(&format!("ha-harness: {e}"));
                return 1;
            }
        }
    }
    let job = match opts.command {
        Command::Check => {
            let (cases, notes) = check::plan(opts.max_size, loaded.props.max_recvs);
            for n in notes {
                println!("# {n}");
            }
            Job::Check(cases)
        }
        _ => Job::Bench(bench_plan(&opts)),
    };
    let mut coord = Coordinator::new(&job);
    match opts.mode {
        Mode::Threads => run_threads(&opts, &loaded.plugin, &job, &mut coord),
        Mode::Procs => run_procs(&opts, &loaded.plugin, &job, &mut coord),
    }
    coord.finish(&opts, &loaded)
}

fn bench_plan(o: &Options) -> BenchPlan {
    BenchPlan::from_options(o)
}

fn make_ctl<'a>(opts: &Options, abort: &'a AtomicBool, job: &Job) -> Ctl<'a> {
    Ctl {
        timeout: Duration::from_secs(opts.timeout_s),
        abort,
        window: nccl_net_abi::common::NCCL_NET_MAX_REQUESTS,
        may_sleep: matches!(job, Job::Check(_)),
    }
}

/// One endpoint from connection setup to close; every outcome goes to `emit`.
fn side_main(
    plugin: &Plugin,
    opts: &Options,
    side: Side,
    xchg: &mut dyn HandleExchange,
    abort: &AtomicBool,
    job: &Job,
    emit: &mut dyn FnMut(Event),
) {
    let timeout = Duration::from_secs(opts.timeout_s);
    let dev = match side {
        Side::A => opts.dev,
        Side::B => opts.peer_dev(),
    };
    let ep = match conn::establish(plugin, dev, xchg, timeout, abort) {
        Ok(ep) => ep,
        Err(e) => return emit(Event::Failed(side, e)),
    };
    let ctl = make_ctl(opts, abort, job);
    let clean = match job {
        Job::Check(cases) => check::run_side(&ep, side, cases, &ctl, &mut |i, o| {
            emit(Event::Case(side, i, o))
        }),
        Job::Bench(plan) => {
            match bench::run_side(&ep, side, plan, &ctl, &mut |r| emit(Event::Row(r))) {
                Ok(()) => true,
                Err(e) => return emit(Event::Failed(side, e)),
            }
        }
    };
    if !clean {
        // Requests may still be in flight: leave the comms open rather than close them under
        // the plugin's feet.
        return emit(Event::Done(side));
    }
    // Out-of-band barrier (a second, all-zero handle exchange) so that neither side closes
    // while the other still waits for its last completions.
    if let Err(e) = xchg.exchange(&[0u8; NCCL_NET_HANDLE_MAXSIZE], Instant::now() + timeout) {
        return emit(Event::Failed(side, format!("barrier before close: {e}")));
    }
    match ep.close() {
        Ok(()) => emit(Event::Done(side)),
        Err(e) => emit(Event::Failed(side, e)),
    }
}

/// Collects events, prints case verdicts in order, and decides the exit status.
struct Coordinator {
    check: Option<Vec<String>>,
    outcomes: Vec<[Option<Outcome>; 2]>,
    printed: usize,
    passed: usize,
    failed: usize,
    rows: Vec<BenchRow>,
    finished: [bool; 2],
    errors: Vec<String>,
}

impl Coordinator {
    fn new(job: &Job) -> Self {
        let names = match job {
            Job::Check(cases) => Some(cases.iter().map(|c| c.name.clone()).collect::<Vec<_>>()),
            Job::Bench(_) => None,
        };
        let n = names.as_ref().map_or(0, Vec::len);
        if names.is_none() {
            println!("{}", report::table_header());
        }
        Coordinator {
            check: names,
            outcomes: vec![[None, None]; n],
            printed: 0,
            passed: 0,
            failed: 0,
            rows: Vec::new(),
            finished: [false; 2],
            errors: Vec::new(),
        }
    }

    fn all_finished(&self) -> bool {
        self.finished.iter().all(|&f| f)
    }

    /// Handles one event; returns true if the peers must be told to stop.
    fn handle(&mut self, ev: Event) -> bool {
        match ev {
            Event::Case(side, idx, o) => {
                let fatal = matches!(o, Outcome::Fatal(_));
                if let Some(slot) = self.outcomes.get_mut(idx) {
                    slot[side.index()] = Some(o);
                }
                self.print_ready(false);
                fatal
            }
            Event::Row(r) => {
                println!("{}", report::format_row(&r));
                self.rows.push(r);
                false
            }
            Event::Done(side) => {
                self.finished[side.index()] = true;
                false
            }
            Event::Failed(side, e) => {
                self.finished[side.index()] = true;
                self.errors.push(format!("side {}: {e}", side.name()));
                err_line(&format!("ha-harness: side {}: {e}", side.name()));
                true
            }
        }
    }

    /// Prints verdicts of cases both sides reported (all remaining ones when `all`).
    fn print_ready(&mut self, all: bool) {
        let Some(names) = &self.check else { return };
        while self.printed < names.len() {
            let [a, b] = &self.outcomes[self.printed];
            if !all && (a.is_none() || b.is_none()) {
                break;
            }
            let name = &names[self.printed];
            match check::combine(a.as_ref(), b.as_ref()) {
                Ok(()) => {
                    self.passed += 1;
                    println!("ok {name}");
                }
                Err(why) => {
                    self.failed += 1;
                    println!("FAIL {name}: {why}");
                }
            }
            self.printed += 1;
        }
    }

    fn finish(mut self, opts: &Options, loaded: &Loaded) -> i32 {
        if self.check.is_some() {
            self.print_ready(true);
            println!("{} passed, {} failed", self.passed, self.failed);
            return i32::from(self.failed > 0 || !self.errors.is_empty());
        }
        if let Some(path) = &opts.json {
            let name = loaded.plugin.name();
            let plugin_path = opts.plugin.to_string_lossy();
            let info = RunInfo {
                plugin_name: &name,
                plugin_path: &plugin_path,
                dev: opts.dev,
                props: &loaded.props,
                mode: opts.mode.as_str(),
                window: opts.window,
            };
            if let Err(e) = std::fs::write(path, report::bench_json(&info, &self.rows)) {
                err_line(&format!("ha-harness: writing {}: {e}", path.display()));
                return 1;
            }
        }
        i32::from(!self.errors.is_empty())
    }
}

fn run_threads(opts: &Options, plugin: &Plugin, job: &Job, coord: &mut Coordinator) {
    let aborts = [AtomicBool::new(false), AtomicBool::new(false)];
    let (tx, rx) = mpsc::channel::<Event>();
    let (xa, xb) = conn::channel_pair();
    std::thread::scope(|s| {
        for (side, mut xchg) in [(Side::A, xa), (Side::B, xb)] {
            let tx = tx.clone();
            let abort = &aborts[side.index()];
            s.spawn(move || {
                side_main(plugin, opts, side, &mut xchg, abort, job, &mut |ev| {
                    let _ = tx.send(ev);
                })
            });
        }
        drop(tx);
        while !coord.all_finished() {
            let Ok(ev) = rx.recv() else { break };
            if coord.handle(ev) {
                for a in &aborts {
                    a.store(true, Ordering::Relaxed);
                }
            }
        }
    });
}

/// The parent's half of the handle exchange with its child.
struct ParentExchange {
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    rx: mpsc::Receiver<Handle>,
}

fn send_to_child(stdin: &Mutex<Option<ChildStdin>>, m: &Msg) -> Result<(), String> {
    let mut guard = stdin.lock().unwrap_or_else(|p| p.into_inner());
    let pipe = guard
        .as_mut()
        .ok_or_else(|| "child stdin already closed".to_string())?;
    writeln!(pipe, "{}", wire::encode(m))
        .and_then(|()| pipe.flush())
        .map_err(|e| format!("writing to child: {e}"))
}

impl HandleExchange for ParentExchange {
    fn exchange(&mut self, mine: &Handle, deadline: Instant) -> Result<Handle, String> {
        send_to_child(&self.stdin, &Msg::Handle(*mine))?;
        conn::recv_handle(&self.rx, deadline).map_err(|e| format!("child: {e}"))
    }
}

fn spawn_child(opts: &Options) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating own executable: {e}"))?;
    std::process::Command::new(&exe)
        .args(child_args(opts))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", exe.display()))
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
            Err(e) => return Err(format!("waiting for child: {e}")),
        }
    }
}

fn run_procs(opts: &Options, plugin: &Plugin, job: &Job, coord: &mut Coordinator) {
    let mut child = match spawn_child(opts) {
        Ok(c) => c,
        Err(e) => {
            coord.handle(Event::Failed(Side::B, e));
            coord.handle(Event::Done(Side::A));
            return;
        }
    };
    let stdin = Arc::new(Mutex::new(child.stdin.take()));
    let stdout = child.stdout.take();
    let (tx, rx) = mpsc::channel::<Event>();
    let (htx, hrx) = mpsc::channel::<Handle>();
    let abort_a = AtomicBool::new(false);
    std::thread::scope(|s| {
        let tx_child = tx.clone();
        s.spawn(move || read_child(stdout, htx, tx_child));
        let tx_a = tx.clone();
        let mut xchg = ParentExchange {
            stdin: Arc::clone(&stdin),
            rx: hrx,
        };
        let abort = &abort_a;
        s.spawn(move || {
            side_main(plugin, opts, Side::A, &mut xchg, abort, job, &mut |ev| {
                let _ = tx_a.send(ev);
            })
        });
        drop(tx);
        while !coord.all_finished() {
            let Ok(ev) = rx.recv() else { break };
            if coord.handle(ev) {
                abort_a.store(true, Ordering::Relaxed);
                let _ = send_to_child(&stdin, &Msg::Abort);
            }
        }
        // EOF on its stdin tells a child that is still running to stop.
        stdin.lock().unwrap_or_else(|p| p.into_inner()).take();
        let grace = Duration::from_secs(opts.timeout_s + 5);
        if let Err(e) = reap(&mut child, grace) {
            coord.handle(Event::Failed(Side::B, e));
        }
    });
}

/// Turns the child's stdout into events (handles go to `htx`); other lines are logged.
fn read_child(
    stdout: Option<std::process::ChildStdout>,
    htx: mpsc::Sender<Handle>,
    tx: mpsc::Sender<Event>,
) {
    let mut ended = false;
    if let Some(out) = stdout {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let ev = match wire::decode(&line) {
                None => {
                    err_line(&format!("[child] {line}"));
                    continue;
                }
                Some(Ok(Msg::Handle(h))) => {
                    let _ = htx.send(h);
                    continue;
                }
                Some(Ok(Msg::Case { idx, outcome })) => Event::Case(Side::B, idx, outcome),
                Some(Ok(Msg::Done)) => Event::Done(Side::B),
                Some(Ok(Msg::Error(e))) => Event::Failed(Side::B, e),
                Some(Ok(Msg::Abort)) => continue,
                Some(Err(e)) => Event::Failed(Side::B, e),
            };
            ended |= matches!(ev, Event::Done(_) | Event::Failed(..));
            let _ = tx.send(ev);
        }
    }
    if !ended {
        let _ = tx.send(Event::Failed(
            Side::B,
            "child exited without reporting".into(),
        ));
    }
}

/// The child's half of the handle exchange: our handle on stdout, the parent's from stdin.
struct ChildExchange {
    rx: mpsc::Receiver<Handle>,
}

impl HandleExchange for ChildExchange {
    fn exchange(&mut self, mine: &Handle, deadline: Instant) -> Result<Handle, String> {
        emit_line(&Msg::Handle(*mine));
        conn::recv_handle(&self.rx, deadline).map_err(|e| format!("parent: {e}"))
    }
}

fn emit_line(m: &Msg) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", wire::encode(m));
    let _ = out.flush();
}

/// `--child`: side B of a `procs` run. Reports over stdout; stops on `abort` or stdin EOF.
fn child_main(opts: &Options) -> i32 {
    let loaded = match load(&opts.plugin, opts.abi, opts.peer_dev()) {
        Ok(l) => l,
        Err(e) => {
            emit_line(&Msg::Error(e));
            return 1;
        }
    };
    let job = match opts.command {
        Command::Check => Job::Check(check::plan(opts.max_size, loaded.props.max_recvs).0),
        _ => Job::Bench(bench_plan(opts)),
    };
    let abort = Arc::new(AtomicBool::new(false));
    let (htx, hrx) = mpsc::channel::<Handle>();
    let abort_w = Arc::clone(&abort);
    // Not joined: it blocks on stdin until the parent closes it or this process exits.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref().map(wire::decode) {
                Ok(Some(Ok(Msg::Handle(h)))) => {
                    let _ = htx.send(h);
                }
                Ok(Some(Ok(Msg::Abort))) | Err(_) => break,
                _ => {}
            }
        }
        abort_w.store(true, Ordering::Relaxed);
    });
    let mut ok = true;
    let mut xchg = ChildExchange { rx: hrx };
    side_main(
        &loaded.plugin,
        opts,
        Side::B,
        &mut xchg,
        &abort,
        &job,
        &mut |ev| {
            let m = match ev {
                Event::Case(_, idx, outcome) => Msg::Case { idx, outcome },
                Event::Done(_) => Msg::Done,
                Event::Failed(_, e) => {
                    ok = false;
                    Msg::Error(e)
                }
                Event::Row(_) => return,
            };
            emit_line(&m);
        },
    );
    i32::from(!ok)
}
