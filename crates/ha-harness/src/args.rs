//! Command-line parsing for `ha-harness` (a small hand-written parser), size parsing with
//! K/M/G suffixes, and the argument list a `--mode procs` parent gives its child.

use nccl_net_loader::Abi;
use std::path::PathBuf;

/// Largest message a v8 plugin can be asked to move (`isend` takes an `int` size).
pub const MAX_MESSAGE: usize = i32::MAX as usize;
/// `NCCL_NET_MAX_REQUESTS`: the bound on requests in flight per comm.
pub const MAX_WINDOW: usize = nccl_net_abi::common::NCCL_NET_MAX_REQUESTS;

pub const USAGE: &str = "\
usage: ha-harness <check|bench|stream|now|help> --plugin PATH [options]   (stream: `ha-harness stream --help`)
       ha-harness stats FILE [--follow]       live state of a plugin's stats file (`ha-harness stats --help`)
       ha-harness timeline --stats FILE -o OUT.svg [--png OUT.png] ...   picture of a run (`--help`)
       ha-harness <drain|undrain|drained> [DEV...]   the node's drain list (`ha-harness drain --help`)
       ha-harness limit --plugin PATH [--ip ADDR]   8 B round trip vs a raw TCP ping-pong, wake-ups (`--help`)
       ha-harness scale --plugin PATH [--conns 1,16,64,256]   threads, RSS, fds, 8 B round trip per connection count

common options:
  --plugin PATH       ext-net library to load (required); its newest exported ABI is used
  --abi VERSION       drive this ABI instead: v8 ... v12 (the library must export it)
  --dev N             device index (default 0)
  --peer-dev N        device index of side B (the receiver side in procs mode); default
                      --dev. Two ends of one link (two RDMA ports) give a real wire path.
  --mode MODE         threads (default): sender and receiver threads in one process;
                      procs: the receiver side runs in a child process
  --timeout SECS      deadline for connect/accept and for any request to progress (default 30)

check options:
  --max-size SIZE     largest message of the size cases (default 64M)

bench options:
  --min SIZE          smallest message (default 8)
  --max SIZE          largest message (default 64M)
  --factor N          size multiplier between rows (default 4)
  --window N          sends in flight for the bandwidth test, 1..32 (default 32)
  --iters N           latency iterations per size, capped by volume (default 200)
  --lat-bytes SIZE    caps latency iterations to about this many bytes per size, at least 3
                      (default 256M)
  --bw-bytes SIZE     bytes the bandwidth test moves per size (default 1G), in at least 8
                      and at most --bw-max-msgs messages (default 20000)
  --json FILE         also write the results as JSON

SIZE accepts K, M and G suffixes (powers of 1024), e.g. 4K, 64M.
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Check,
    Bench,
    Help,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Check => "check",
            Command::Bench => "bench",
            Command::Help => "help",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Threads,
    Procs,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Threads => "threads",
            Mode::Procs => "procs",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub command: Command,
    pub plugin: PathBuf,
    /// `--abi`: the ext-net version to drive (`None`: the newest the library exports).
    pub abi: Option<Abi>,
    pub dev: i32,
    /// Device of side B (`--peer-dev`); `None` = the same as `dev`.
    pub peer_dev: Option<i32>,
    pub mode: Mode,
    pub timeout_s: u64,
    pub max_size: usize,
    pub min: usize,
    pub max: usize,
    pub factor: usize,
    pub window: usize,
    pub iters: usize,
    /// Latency iterations move at most about this many bytes per size (`--lat-bytes`).
    pub lat_bytes: usize,
    /// Bytes each bandwidth run moves per size (`--bw-bytes`).
    pub bw_bytes: usize,
    /// Most messages of one bandwidth run (`--bw-max-msgs`).
    pub bw_max_msgs: usize,
    pub json: Option<PathBuf>,
    /// Set (by the parent, via the hidden `--child` flag) in the receiver process of `procs`.
    pub child: bool,
}

impl Options {
    fn defaults(command: Command) -> Self {
        Options {
            command,
            plugin: PathBuf::new(),
            abi: None,
            dev: 0,
            peer_dev: None,
            mode: Mode::Threads,
            timeout_s: 30,
            max_size: 64 << 20,
            min: 8,
            max: 64 << 20,
            factor: 4,
            window: MAX_WINDOW,
            iters: 200,
            lat_bytes: 256 << 20,
            bw_bytes: 1 << 30,
            bw_max_msgs: 20_000,
            json: None,
            child: false,
        }
    }

    /// The device side B uses.
    pub fn peer_dev(&self) -> i32 {
        self.peer_dev.unwrap_or(self.dev)
    }
}

/// Parses `4096`, `4K`, `64M`, `1G` (also lower case, and a trailing `B`/`iB`) into bytes.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                _ => return Err(format!("bad size '{s}': unknown suffix '{c}'")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("bad size '{s}'"));
    }
    let n: usize = digits
        .parse()
        .map_err(|_| format!("bad size '{s}': too large"))?;
    n.checked_mul(1usize << shift)
        .ok_or_else(|| format!("bad size '{s}': too large"))
}

fn parse_num<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{opt}: '{v}' is not a valid number"))
}

/// Options that take a value.
const VALUE_OPTIONS: [&str; 16] = [
    "--plugin",
    "--abi",
    "--dev",
    "--peer-dev",
    "--mode",
    "--timeout",
    "--max-size",
    "--min",
    "--max",
    "--factor",
    "--window",
    "--iters",
    "--lat-bytes",
    "--bw-bytes",
    "--bw-max-msgs",
    "--json",
];

/// Parses the arguments after the program name.
pub fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut it = args.iter();
    let command = match it.next().map(String::as_str) {
        Some("check") => Command::Check,
        Some("bench") => Command::Bench,
        Some("help" | "-h" | "--help") | None => Command::Help,
        Some(other) => return Err(format!("unknown command '{other}'")),
    };
    let mut o = Options::defaults(command);
    if command == Command::Help {
        return Ok(o);
    }
    let mut have_plugin = false;
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if name == "--child" && inline.is_none() {
            o.child = true;
            continue;
        }
        if name == "-h" || name == "--help" {
            o.command = Command::Help;
            return Ok(o);
        }
        if !name.starts_with("--") {
            return Err(format!("unexpected argument '{arg}'"));
        }
        if !VALUE_OPTIONS.contains(&name) {
            return Err(format!("unknown option '{name}'"));
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        let bench_only = |o: &Options| {
            if o.command == Command::Bench {
                Ok(())
            } else {
                Err(format!("{name} is a bench option"))
            }
        };
        match name {
            "--plugin" => {
                o.plugin = PathBuf::from(value);
                have_plugin = true;
            }
            "--abi" => o.abi = Some(Abi::parse(&value)?),
            "--dev" => o.dev = parse_num(name, &value)?,
            "--peer-dev" => o.peer_dev = Some(parse_num(name, &value)?),
            "--mode" => {
                o.mode = match value.as_str() {
                    "threads" => Mode::Threads,
                    "procs" => Mode::Procs,
                    _ => return Err(format!("--mode: '{value}' is not threads or procs")),
                }
            }
            "--timeout" => o.timeout_s = parse_num(name, &value)?,
            "--max-size" if o.command == Command::Check => o.max_size = parse_size(&value)?,
            "--max-size" => return Err("--max-size is a check option (bench uses --max)".into()),
            "--min" => {
                bench_only(&o)?;
                o.min = parse_size(&value)?
            }
            "--max" => {
                bench_only(&o)?;
                o.max = parse_size(&value)?
            }
            "--factor" => {
                bench_only(&o)?;
                o.factor = parse_num(name, &value)?
            }
            "--window" => {
                bench_only(&o)?;
                o.window = parse_num(name, &value)?
            }
            "--iters" => {
                bench_only(&o)?;
                o.iters = parse_num(name, &value)?
            }
            "--lat-bytes" => {
                bench_only(&o)?;
                o.lat_bytes = parse_size(&value)?
            }
            "--bw-bytes" => {
                bench_only(&o)?;
                o.bw_bytes = parse_size(&value)?
            }
            "--bw-max-msgs" => {
                bench_only(&o)?;
                o.bw_max_msgs = parse_num(name, &value)?
            }
            "--json" => {
                bench_only(&o)?;
                o.json = Some(PathBuf::from(value))
            }
            _ => return Err(format!("unknown option '{name}'")),
        }
    }
    if !have_plugin {
        return Err("--plugin PATH is required".into());
    }
    validate(&o)?;
    Ok(o)
}

fn validate(o: &Options) -> Result<(), String> {
    if o.dev < 0 {
        return Err("--dev must be >= 0".into());
    }
    if o.peer_dev.is_some_and(|d| d < 0) {
        return Err("--peer-dev must be >= 0".into());
    }
    if o.timeout_s == 0 {
        return Err("--timeout must be >= 1".into());
    }
    if o.max_size > MAX_MESSAGE {
        return Err(format!(
            "--max-size must be <= {MAX_MESSAGE} (v8 sizes are int)"
        ));
    }
    if o.min == 0 || o.min > o.max {
        return Err("need 1 <= --min <= --max".into());
    }
    if o.max > MAX_MESSAGE {
        return Err(format!("--max must be <= {MAX_MESSAGE} (v8 sizes are int)"));
    }
    if o.factor < 2 {
        return Err("--factor must be >= 2".into());
    }
    if o.window == 0 || o.window > MAX_WINDOW {
        return Err(format!("--window must be in 1..={MAX_WINDOW}"));
    }
    if o.iters == 0 {
        return Err("--iters must be >= 1".into());
    }
    if o.bw_bytes == 0 || o.lat_bytes == 0 {
        return Err("--lat-bytes and --bw-bytes must be >= 1".into());
    }
    if o.bw_max_msgs < 8 {
        return Err("--bw-max-msgs must be >= 8".into());
    }
    Ok(())
}

/// The arguments that make a copy of this program the receiver side of `o` (`procs` mode).
pub fn child_args(o: &Options) -> Vec<String> {
    let mut a = vec![
        o.command.as_str().to_string(),
        "--child".to_string(),
        "--plugin".to_string(),
        o.plugin.to_string_lossy().into_owned(),
        "--dev".to_string(),
        o.dev.to_string(),
        "--mode".to_string(),
        o.mode.as_str().to_string(),
        "--timeout".to_string(),
        o.timeout_s.to_string(),
    ];
    if let Some(d) = o.peer_dev {
        a.extend(["--peer-dev".to_string(), d.to_string()]);
    }
    if let Some(abi) = o.abi {
        a.extend(["--abi".to_string(), abi.to_string()]);
    }
    match o.command {
        Command::Check => a.extend(["--max-size".to_string(), o.max_size.to_string()]),
        Command::Bench => {
            for (k, v) in [
                ("--min", o.min),
                ("--max", o.max),
                ("--factor", o.factor),
                ("--window", o.window),
                ("--iters", o.iters),
                ("--lat-bytes", o.lat_bytes),
                ("--bw-bytes", o.bw_bytes),
                ("--bw-max-msgs", o.bw_max_msgs),
            ] {
                a.extend([k.to_string(), v.to_string()]);
            }
        }
        Command::Help => {}
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("8B"), Ok(8));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("4T").unwrap_err().contains("unknown suffix"));
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999999G")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn check_defaults_and_options() {
        let o = parse_args(&args("check --plugin /x/lib.so")).unwrap();
        assert_eq!(o.command, Command::Check);
        assert_eq!(o.plugin, PathBuf::from("/x/lib.so"));
        assert_eq!(
            (o.dev, o.mode, o.max_size, o.timeout_s),
            (0, Mode::Threads, 64 << 20, 30)
        );
        assert!(!o.child);
        let o = parse_args(&args(
            "check --plugin=p.so --dev 2 --mode=procs --max-size 1M --timeout 5",
        ))
        .unwrap();
        assert_eq!(
            (o.dev, o.mode, o.max_size, o.timeout_s),
            (2, Mode::Procs, 1 << 20, 5)
        );
    }

    #[test]
    fn bench_options() {
        let o = parse_args(&args(
            "bench --plugin p.so --min 1K --max 16M --factor 2 --window 8 --iters 50 --json r.json",
        ))
        .unwrap();
        assert_eq!(
            (o.min, o.max, o.factor, o.window, o.iters, o.bw_bytes),
            (1024, 16 << 20, 2, 8, 50, 1 << 30)
        );
        assert_eq!((o.dev, o.peer_dev()), (0, 0), "side B defaults to --dev");
        assert_eq!(o.lat_bytes, 256 << 20);
        assert_eq!(o.json, Some(PathBuf::from("r.json")));
        let o = parse_args(&args(
            "bench --plugin p.so --dev 1 --peer-dev 0 --lat-bytes 1M --bw-bytes 64M",
        ))
        .unwrap();
        assert_eq!(
            (o.dev, o.peer_dev(), o.lat_bytes, o.bw_bytes),
            (1, 0, 1 << 20, 64 << 20)
        );
        assert_eq!(o.bw_max_msgs, 20_000);
    }

    #[test]
    fn errors() {
        let err = |s: &str| parse_args(&args(s)).unwrap_err();
        assert!(err("frobnicate --plugin p").contains("unknown command"));
        assert!(err("check").contains("--plugin"));
        assert!(err("check --plugin").contains("needs a value"));
        assert!(err("check --plugin p --bogus 1").contains("unknown option '--bogus'"));
        assert!(err("check --bogus").contains("unknown option '--bogus'"));
        assert!(err("check --plugin p stray").contains("unexpected argument"));
        assert!(err("check --plugin p --dev x").contains("not a valid number"));
        assert!(err("check --plugin p --dev -1").contains(">= 0"));
        assert!(err("check --plugin p --peer-dev -2").contains("--peer-dev must be >= 0"));
        assert!(err("check --plugin p --bw-bytes 1M").contains("bench option"));
        assert!(err("bench --plugin p --bw-bytes 0").contains("--bw-bytes"));
        assert!(err("bench --plugin p --bw-max-msgs 7").contains("--bw-max-msgs"));
        assert!(err("check --plugin p --mode fork").contains("threads or procs"));
        assert!(err("check --plugin p --window 4").contains("bench option"));
        assert!(err("bench --plugin p --max-size 4").contains("check option"));
        assert!(err("bench --plugin p --window 33").contains("1..=32"));
        assert!(err("bench --plugin p --window 0").contains("1..=32"));
        assert!(err("bench --plugin p --min 1M --max 1K").contains("--min"));
        assert!(err("bench --plugin p --max 4G").contains("int"));
        assert!(err("bench --plugin p --factor 1").contains("--factor"));
        assert!(err("check --plugin p --timeout 0").contains("--timeout"));
    }

    #[test]
    fn help() {
        assert_eq!(parse_args(&[]).unwrap().command, Command::Help);
        assert_eq!(parse_args(&args("help")).unwrap().command, Command::Help);
        assert_eq!(
            parse_args(&args("check -h")).unwrap().command,
            Command::Help
        );
    }

    #[test]
    fn abi_option() {
        assert_eq!(parse_args(&args("check --plugin x.so")).unwrap().abi, None);
        let o = parse_args(&args("check --plugin x.so --abi v9")).unwrap();
        assert_eq!(o.abi, Some(Abi::V9));
        let o = parse_args(&args("bench --plugin x.so --abi=11")).unwrap();
        assert_eq!(o.abi, Some(Abi::V11));
        let o = parse_args(&args("check --plugin x.so --abi v12")).unwrap();
        assert_eq!(o.abi, Some(Abi::V12));
        let e = parse_args(&args("check --plugin x.so --abi v7")).unwrap_err();
        assert!(e.contains("v8, v9, v10, v11 or v12"), "{e}");
    }

    #[test]
    fn child_args_round_trip() {
        for line in [
            "check --plugin /a/b.so --dev 1 --mode procs --max-size 4M --timeout 7",
            "check --plugin /a/b.so --abi v10 --mode procs",
            "bench --plugin b.so --mode procs --min 16 --max 1M --factor 8 --window 4 --iters 9",
            "bench --plugin b.so --dev 1 --peer-dev 0 --mode procs --lat-bytes 2M --bw-bytes 4M --bw-max-msgs 99",
        ] {
            let parent = parse_args(&args(line)).unwrap();
            let child = parse_args(&child_args(&parent)).unwrap();
            assert!(child.child);
            assert_eq!(
                Options {
                    child: false,
                    ..child
                },
                parent
            );
        }
    }
}
