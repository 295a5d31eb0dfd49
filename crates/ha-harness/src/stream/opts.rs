//! Command line of `ha-harness stream` (and `ha-harness now`), and the argument list a
//! `--mode procs` parent gives its child.

use crate::args::{parse_size, Mode, MAX_MESSAGE, MAX_WINDOW};
use nccl_net_loader::Abi;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: ha-harness stream --plugin PATH (--duration SECS | --messages N) [options]
       ha-harness now     print CLOCK_MONOTONIC in nanoseconds (timestamps for drill scripts)

Streams verified traffic from side A (the sender) to side B (the receiver): mixed sizes,
multi-receive groups with shuffled tags, up to --window requests in flight, every byte checked
against a pattern keyed by the message's sequence number. Prints
  messages N, bytes B, lost L, duplicated D, corrupted C, errors E, max_stall_ms S
A request error ends the stream (the error is printed with its ncclResult name).

options:
  --plugin PATH        ext-net library to load (required); its newest exported ABI is used
  --abi VERSION        drive this ABI instead: v8 ... v12
  --dev N              device index, both sides (default 0)
  --mode MODE          threads (default): both sides in this process;
                       procs: side B runs in a child process
  --duration SECS      stream for SECS seconds (decimals allowed)
  --messages N         stream exactly N messages
  --max-size SIZE      largest message, K/M/G suffixes (default 4M)
  --window N           requests in flight per side, 1..32 (default 32)
  --multi-max N        largest multi-receive group; 1 = none (default min(8, maxRecvs))
  --seed N             seed of the schedule and the data (default 1)
  --timeout SECS       a side that makes no progress for SECS fails (default 30)
  --json FILE          also write the results as JSON
  --events FILE        when the stream ends, read events from FILE, one per line:
                       '<CLOCK_MONOTONIC ns> <label>' (a drill appends them while the stream
                       runs, e.g. $(ha-harness now) cut rail0/near), and report for each the
                       first completion after it and the longest stall
  --progress SECS      print the sender's progress every SECS seconds
  --shared-mr          register each receive slot once and pass that one registration for
                       every part of a multi-receive (as NCCL does); default: one
                       registration per part
  --child-prefix CMD   procs: start the child through CMD, split on whitespace
                       (e.g. \"ip netns exec ha-b\"); the handle exchange runs over the child's
                       stdin/stdout, so it works across network namespaces
  --child-env K=V      procs: set K=V in the child's environment (repeatable), e.g.
                       --child-env HA_NCCL_SOCK_RAILS=r0b,r1b --child-env NCCL_SOCKET_IFNAME=ob

Completion times are receiver-side, in ms since the stream's start; the start is printed as
'stream: start monotonic_ns=N'. Exit status: 0 = every message intact and no error, 1 = not,
2 = bad usage.
";

/// How long the stream runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Length {
    Duration(f64),
    Messages(u64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StreamOpts {
    pub plugin: PathBuf,
    /// `--abi`: the ext-net version to drive (`None`: the newest the library exports).
    pub abi: Option<Abi>,
    pub dev: i32,
    pub mode: Mode,
    pub length: Length,
    pub max_size: usize,
    pub window: usize,
    /// `None`: min(8, maxRecvs) of the device.
    pub multi_max: Option<usize>,
    pub seed: u64,
    pub timeout_s: u64,
    pub json: Option<PathBuf>,
    pub events: Option<PathBuf>,
    pub progress_s: f64,
    pub child_prefix: Vec<String>,
    pub child_env: Vec<(String, String)>,
    pub shared_mr: bool,
    /// Set (by the parent, via the hidden `--child` flag) in the receiver process of `procs`.
    pub child: bool,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Stream(StreamOpts),
    Now,
    Help,
}

/// Largest multi-receive group the stream uses.
pub const MAX_MULTI: usize = 8;

const VALUE_OPTIONS: [&str; 16] = [
    "--plugin",
    "--abi",
    "--dev",
    "--mode",
    "--duration",
    "--messages",
    "--max-size",
    "--window",
    "--multi-max",
    "--seed",
    "--timeout",
    "--json",
    "--events",
    "--progress",
    "--child-prefix",
    "--child-env",
];

fn num<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{opt}: '{v}' is not a valid number"))
}

fn seconds(opt: &str, v: &str) -> Result<f64, String> {
    let s: f64 = num(opt, v)?;
    if s.is_finite() && s > 0.0 && s <= 1e7 {
        Ok(s)
    } else {
        Err(format!("{opt} must be a positive number of seconds"))
    }
}

/// Parses the arguments after the program name (`stream ...` or `now`).
pub fn parse(args: &[String]) -> Result<Request, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("now") => {
            return match it.next() {
                None => Ok(Request::Now),
                Some(a) => Err(format!("now: unexpected argument '{a}'")),
            }
        }
        Some("stream") => {}
        other => return Err(format!("not a stream command: {other:?}")),
    }
    let mut o = StreamOpts {
        plugin: PathBuf::new(),
        abi: None,
        dev: 0,
        mode: Mode::Threads,
        length: Length::Messages(0),
        max_size: 4 << 20,
        window: MAX_WINDOW,
        multi_max: None,
        seed: 1,
        timeout_s: 30,
        json: None,
        events: None,
        progress_s: 0.0,
        child_prefix: Vec::new(),
        child_env: Vec::new(),
        shared_mr: false,
        child: false,
    };
    let (mut have_plugin, mut have_length) = (false, false);
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if name == "--child" && inline.is_none() {
            o.child = true;
            continue;
        }
        if name == "--shared-mr" && inline.is_none() {
            o.shared_mr = true;
            continue;
        }
        if name == "-h" || name == "--help" {
            return Ok(Request::Help);
        }
        if !name.starts_with("--") {
            return Err(format!("unexpected argument '{arg}'"));
        }
        if !VALUE_OPTIONS.contains(&name) {
            return Err(format!("unknown option '{name}'"));
        }
        let v = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        match name {
            "--plugin" => {
                o.plugin = PathBuf::from(v);
                have_plugin = true;
            }
            "--abi" => o.abi = Some(Abi::parse(&v)?),
            "--dev" => o.dev = num(name, &v)?,
            "--mode" => {
                o.mode = match v.as_str() {
                    "threads" => Mode::Threads,
                    "procs" => Mode::Procs,
                    _ => return Err(format!("--mode: '{v}' is not threads or procs")),
                }
            }
            "--duration" | "--messages" if have_length => {
                return Err("give one of --duration and --messages".into())
            }
            "--duration" => {
                o.length = Length::Duration(seconds(name, &v)?);
                have_length = true;
            }
            "--messages" => {
                o.length = Length::Messages(num(name, &v)?);
                have_length = true;
            }
            "--max-size" => o.max_size = parse_size(&v)?,
            "--window" => o.window = num(name, &v)?,
            "--multi-max" => o.multi_max = Some(num(name, &v)?),
            "--seed" => o.seed = num(name, &v)?,
            "--timeout" => o.timeout_s = num(name, &v)?,
            "--json" => o.json = Some(PathBuf::from(v)),
            "--events" => o.events = Some(PathBuf::from(v)),
            "--progress" => o.progress_s = seconds(name, &v)?,
            "--child-prefix" => o.child_prefix = v.split_whitespace().map(String::from).collect(),
            "--child-env" => match v.split_once('=') {
                Some((k, val)) if !k.is_empty() && !k.contains(char::is_whitespace) => {
                    o.child_env.push((k.to_string(), val.to_string()))
                }
                _ => return Err(format!("--child-env: '{v}' is not K=V")),
            },
            _ => return Err(format!("unknown option '{name}'")),
        }
    }
    if !have_plugin {
        return Err("--plugin PATH is required".into());
    }
    if !have_length {
        return Err("give --duration SECS or --messages N".into());
    }
    validate(&o)?;
    Ok(Request::Stream(o))
}

fn validate(o: &StreamOpts) -> Result<(), String> {
    if o.dev < 0 {
        return Err("--dev must be >= 0".into());
    }
    if o.timeout_s == 0 {
        return Err("--timeout must be >= 1".into());
    }
    if o.length == Length::Messages(0) {
        return Err("--messages must be >= 1".into());
    }
    if let Length::Messages(n) = o.length {
        if n > super::schedule::MAX_SEQ {
            return Err(format!(
                "--messages must be <= {}",
                super::schedule::MAX_SEQ
            ));
        }
    }
    if o.max_size > MAX_MESSAGE {
        return Err(format!(
            "--max-size must be <= {MAX_MESSAGE} (v8 sizes are int)"
        ));
    }
    if o.window == 0 || o.window > MAX_WINDOW {
        return Err(format!("--window must be in 1..={MAX_WINDOW}"));
    }
    if o.multi_max.is_some_and(|m| m == 0 || m > MAX_MULTI) {
        return Err(format!("--multi-max must be in 1..={MAX_MULTI}"));
    }
    if o.mode == Mode::Threads && (!o.child_prefix.is_empty() || !o.child_env.is_empty()) {
        return Err("--child-prefix and --child-env need --mode procs".into());
    }
    Ok(())
}

/// The arguments that make a copy of this program side B of `o`, with `multi_max` resolved
/// by the parent (both sides must derive the same schedule).
pub fn child_args(o: &StreamOpts, multi_max: usize) -> Vec<String> {
    let mut a: Vec<String> = vec!["stream".into(), "--child".into()];
    let mut kv = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    kv("--plugin", o.plugin.to_string_lossy().into_owned());
    kv("--dev", o.dev.to_string());
    if let Some(abi) = o.abi {
        kv("--abi", abi.to_string());
    }
    kv("--max-size", o.max_size.to_string());
    kv("--window", o.window.to_string());
    kv("--multi-max", multi_max.to_string());
    kv("--seed", o.seed.to_string());
    kv("--timeout", o.timeout_s.to_string());
    match o.length {
        Length::Duration(s) => kv("--duration", s.to_string()),
        Length::Messages(n) => kv("--messages", n.to_string()),
    }
    if o.shared_mr {
        a.push("--shared-mr".into());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn stream(s: &str) -> StreamOpts {
        match parse(&args(s)) {
            Ok(Request::Stream(o)) => o,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let o = stream("stream --plugin p.so --messages 100");
        assert_eq!(o.length, Length::Messages(100));
        assert_eq!(
            (
                o.dev,
                o.mode,
                o.max_size,
                o.window,
                o.multi_max,
                o.seed,
                o.timeout_s
            ),
            (0, Mode::Threads, 4 << 20, 32, None, 1, 30)
        );
        assert!(o.child_prefix.is_empty() && o.child_env.is_empty() && !o.child && !o.shared_mr);
    }

    #[test]
    fn all_options() {
        let o = stream(
            "stream --plugin=p.so --dev 1 --mode procs --duration 2.5 --max-size 1M --window 8 \
             --multi-max 4 --seed 77 --timeout 5 --json r.json --events ev.txt --progress 1 \
             --child-env HA_NCCL_SOCK_RAILS=r0b,r1b --child-env=NCCL_SOCKET_IFNAME=ob",
        );
        assert_eq!(o.length, Length::Duration(2.5));
        assert_eq!(
            (
                o.dev,
                o.mode,
                o.max_size,
                o.window,
                o.multi_max,
                o.seed,
                o.timeout_s
            ),
            (1, Mode::Procs, 1 << 20, 8, Some(4), 77, 5)
        );
        assert_eq!(o.json, Some(PathBuf::from("r.json")));
        assert_eq!(o.events, Some(PathBuf::from("ev.txt")));
        assert_eq!(o.progress_s, 1.0);
        assert_eq!(
            o.child_env,
            [
                ("HA_NCCL_SOCK_RAILS".to_string(), "r0b,r1b".to_string()),
                ("NCCL_SOCKET_IFNAME".to_string(), "ob".to_string())
            ]
        );
    }

    #[test]
    fn child_prefix_is_split_on_whitespace() {
        let mut a = args("stream --plugin p --messages 5 --mode procs --child-prefix");
        a.push("ip netns  exec ha-b".into());
        match parse(&a).unwrap() {
            Request::Stream(o) => assert_eq!(o.child_prefix, ["ip", "netns", "exec", "ha-b"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors() {
        let err = |s: &str| parse(&args(s)).unwrap_err();
        assert!(err("stream --messages 5").contains("--plugin"));
        assert!(err("stream --plugin p").contains("--duration SECS or --messages N"));
        assert!(err("stream --plugin p --messages 5 --duration 1").contains("one of"));
        assert!(err("stream --plugin p --messages 0").contains(">= 1"));
        assert!(err("stream --plugin p --duration 0").contains("positive"));
        assert!(err("stream --plugin p --duration -1").contains("positive"));
        assert!(err("stream --plugin p --duration nan").contains("positive"));
        assert!(err("stream --plugin p --messages x").contains("not a valid number"));
        assert!(err("stream --plugin p --messages 5 --window 33").contains("1..=32"));
        assert!(err("stream --plugin p --messages 5 --window 0").contains("1..=32"));
        assert!(err("stream --plugin p --messages 5 --multi-max 9").contains("1..=8"));
        assert!(err("stream --plugin p --messages 5 --max-size 3G").contains("int"));
        assert!(err("stream --plugin p --messages 5 --timeout 0").contains("--timeout"));
        assert!(err("stream --plugin p --messages 5 --dev -1").contains(">= 0"));
        assert!(err("stream --plugin p --messages 5 --child-env X").contains("K=V"));
        assert!(err("stream --plugin p --messages 5 --child-env =1").contains("K=V"));
        assert!(err("stream --plugin p --messages 5 --child-env A=1").contains("procs"));
        assert!(err("stream --plugin p --messages 5 --bogus 1").contains("unknown option"));
        assert!(err("stream --plugin p --messages 5 stray").contains("unexpected"));
        assert!(err("stream --plugin p --messages").contains("needs a value"));
        assert!(err("now extra").contains("unexpected"));
    }

    #[test]
    fn now_and_help() {
        assert_eq!(parse(&args("now")), Ok(Request::Now));
        assert_eq!(parse(&args("stream --help")), Ok(Request::Help));
    }

    #[test]
    fn child_args_round_trip() {
        for line in [
            "stream --plugin /a/b.so --dev 1 --mode procs --messages 1000 --max-size 64K \
             --window 4 --seed 9 --timeout 7 --child-prefix ip --json x --events y --shared-mr",
            "stream --plugin b.so --duration 0.5",
            "stream --plugin b.so --abi v9 --mode procs --messages 10",
        ] {
            let parent = stream(line);
            let child = stream(&child_args(&parent, 3).join(" "));
            assert!(child.child);
            assert_eq!(child.multi_max, Some(3));
            assert_eq!(child.shared_mr, parent.shared_mr);
            assert_eq!(child.abi, parent.abi);
            assert_eq!(
                (
                    child.plugin,
                    child.dev,
                    child.length,
                    child.max_size,
                    child.window,
                    child.seed,
                    child.timeout_s
                ),
                (
                    parent.plugin,
                    parent.dev,
                    parent.length,
                    parent.max_size,
                    parent.window,
                    parent.seed,
                    parent.timeout_s
                )
            );
            // The child writes no files and starts no children.
            assert!(
                child.json.is_none() && child.events.is_none() && child.child_prefix.is_empty()
            );
        }
    }
}
