//! `ha-harness stats FILE [--follow]`: what a job's `HA_NCCL_STATS_FILE` says, per connection
//! — active path, standby, failovers, re-arms, bytes per path, last failover — with every live
//! connection that runs without a standby flagged. `--follow` re-reads the file as the plugin
//! appends to it (periodic lines every `HA_NCCL_STATS_INTERVAL_MS`, events as they happen).
//! [`record`] reads lines, [`book`] folds them per connection; the timeline picture
//! (`crate::picture`) reads the same records.

pub mod book;
pub mod record;
pub mod table;
pub mod units;

use book::Book;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::time::Duration;

pub const USAGE: &str = "\
usage: ha-harness stats FILE [--follow] [--every SECS] [--all] [--check] [--now UNIX_MS]

Reads a stats file (HA_NCCL_STATS_FILE: periodic lines every HA_NCCL_STATS_INTERVAL_MS, event
lines, closing lines) and prints, per connection (process, comm): the active path, the standby
(ok, verifying, LOST, REARMING, NONE), failovers, re-arms (and failed attempts), bytes per path
and the last failover (when, cause, stall, replayed). Live connections that run without a
standby are listed first, in a WARNING.

  --follow      keep reading as the file grows; print the report again when it changed
  --every SECS  how often --follow looks (default 2)
  --count N     --follow: stop after N reports
  --all         list closed connections too (always listed when none lives)
  --check       exit 1 when a live connection runs without a standby (for monitoring)
  --now UNIX_MS the time \"ago\" is counted from (default: now): a saved file's report as it
                read at that moment, the same every time
";

#[derive(Debug, Default, PartialEq)]
struct Opts {
    file: String,
    follow: bool,
    every: f64,
    count: Option<u64>,
    all: bool,
    check: bool,
    now: Option<u64>,
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        every: 2.0,
        ..Opts::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--follow" | "-f" => o.follow = true,
            "--all" => o.all = true,
            "--check" => o.check = true,
            "--every" => {
                o.every = val("--every")?
                    .parse()
                    .ok()
                    .filter(|v: &f64| *v > 0.0 && v.is_finite())
                    .ok_or("--every takes seconds > 0")?
            }
            "--count" => {
                o.count = Some(
                    val("--count")?
                        .parse()
                        .map_err(|_| "--count takes a number")?,
                )
            }
            "--now" => {
                o.now = Some(
                    val("--now")?
                        .parse()
                        .map_err(|_| "--now takes ms since 1970")?,
                )
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s if o.file.is_empty() => o.file = s.to_string(),
            s => return Err(format!("one file only ({s}?)")),
        }
    }
    if o.file.is_empty() {
        return Err("no stats file given".into());
    }
    Ok(o)
}

/// `ha-harness stats ...` (args after `stats`); the exit status.
pub fn main_with_args(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return 0;
    }
    let o = match parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ha-harness stats: {e}\n{USAGE}");
            return 2;
        }
    };
    let mut reader = Tail::default();
    let mut book = Book::default();
    let mut reports = 0u64;
    loop {
        match reader.read_new(&o.file) {
            Ok(Some(text)) => {
                let (recs, bad) = record::parse_all(&text);
                for r in &recs {
                    book.feed(r);
                }
                reader.bad += bad.len();
                if reader.first_bad.is_none() {
                    reader.first_bad = bad.into_iter().next();
                }
            }
            Ok(None) if reports > 0 => {
                if wait_more(&o, reports) {
                    continue;
                }
                break;
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("ha-harness stats: {}: {e}", o.file);
                return 2;
            }
        }
        let now = o.now.unwrap_or_else(units::now_unix_ms);
        let mut text = table::report(&book, &o.file, now, o.all);
        if let Some((line, why)) = &reader.first_bad {
            text += &format!(
                "({} unreadable line(s), the first: line {line}: {why})\n",
                reader.bad
            );
        }
        if o.follow && std::io::stdout().is_terminal() {
            text = format!("\x1b[H\x1b[2J{text}");
        } else if reports > 0 {
            text = format!("\n{text}");
        }
        let _ = std::io::stdout().write_all(text.as_bytes());
        let _ = std::io::stdout().flush();
        reports += 1;
        if !wait_more(&o, reports) {
            break;
        }
    }
    let exposed = book.ordered().iter().any(|c| c.exposed());
    i32::from(o.check && exposed)
}

/// Whether to look again (sleeping first): only with `--follow`, until `--count`.
fn wait_more(o: &Opts, reports: u64) -> bool {
    if !o.follow || o.count.is_some_and(|n| reports >= n) {
        return false;
    }
    std::thread::sleep(Duration::from_secs_f64(o.every));
    true
}

/// Reads what was appended to a file since the last look, whole lines only.
#[derive(Default)]
struct Tail {
    offset: u64,
    bad: usize,
    first_bad: Option<(usize, String)>,
}

impl Tail {
    /// New whole lines (`None`: nothing new). A file that shrank is read again from the start.
    fn read_new(&mut self, path: &str) -> std::io::Result<Option<String>> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        if len < self.offset {
            self.offset = 0;
        }
        if len == self.offset {
            return Ok(None);
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.take(len - self.offset).read_to_end(&mut buf)?;
        let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
            return Ok(None); // a line still being written
        };
        buf.truncate(end + 1);
        self.offset += buf.len() as u64;
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let a = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        let o = parse_args(&a(
            "f.jsonl --follow --every 0.5 --count 3 --all --check --now 17",
        ))
        .unwrap();
        assert_eq!(
            o,
            Opts {
                file: "f.jsonl".into(),
                follow: true,
                every: 0.5,
                count: Some(3),
                all: true,
                check: true,
                now: Some(17)
            }
        );
        assert!(parse_args(&a("--all"))
            .unwrap_err()
            .contains("no stats file"));
        assert!(parse_args(&a("a b")).unwrap_err().contains("one file"));
        assert!(parse_args(&a("a --every 0")).is_err());
        assert!(parse_args(&a("a --now soon"))
            .unwrap_err()
            .contains("--now"));
        assert!(parse_args(&a("a --bogus")).unwrap_err().contains("--bogus"));
    }

    #[test]
    fn tail_reads_whole_lines_as_they_come() {
        let p = std::env::temp_dir().join(format!("ha-tail-{}.jsonl", std::process::id()));
        let path = p.to_string_lossy().into_owned();
        std::fs::write(&p, "a\nb").unwrap();
        let mut t = Tail::default();
        assert_eq!(t.read_new(&path).unwrap().as_deref(), Some("a\n"));
        assert_eq!(t.read_new(&path).unwrap(), None, "b is not finished");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"\nc\n")
            .unwrap();
        assert_eq!(t.read_new(&path).unwrap().as_deref(), Some("b\nc\n"));
        std::fs::write(&p, "x\n").unwrap();
        assert_eq!(
            t.read_new(&path).unwrap().as_deref(),
            Some("x\n"),
            "truncated"
        );
        let _ = std::fs::remove_file(&p);
        assert!(t.read_new(&path).is_err());
    }
}
