//! `ha-harness timeline`: a picture of what happened to a job's connections, rendered from
//! what the run left behind — the plugin's stats file, a drill's events, a harness stream's
//! completion timeline, NCCL logs ([`inputs`]) — as SVG (our own writer, [`svg`], [`draw`]) and
//! PNG (the same SVG through resvg, [`png`]). [`model`] and [`episodes`] decide what is drawn:
//! throughput per path, which path carries traffic, whether a standby is there, and marks for
//! cuts, detection, switch (replayed count), standby losses, re-arms and any other event, each
//! failover's stall measured and labelled.

pub mod draw;
pub mod episodes;
pub mod inputs;
pub mod model;
pub mod png;
pub mod scale;
pub mod svg;

use inputs::Inputs;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: ha-harness timeline --stats FILE [--stream-timeline FILE] [--events FILE] [--nccl-log FILE]
                           -o OUT.svg [--png OUT.png] [--title TEXT] [--font FILE]

Draws what happened to a run's connections: throughput per path over time, which path carried
the traffic, whether a standby was there, and marks for link cuts, failure detection, the switch
(with the replayed count), standby losses, re-arms (redundancy back) and any other event; each
failover's stall is measured and labelled. A summary line per failover heads the picture.

  --stats FILE            HA_NCCL_STATS_FILE of the run (repeatable: one per host or rank);
                          periodic lines (HA_NCCL_STATS_INTERVAL_MS) give the throughput
  --stream-timeline FILE  `ha-harness stream --json` output: completions measure the stall
  --events FILE           events of the drill (repeatable): JSON lines
                          {\"event\":\"cut\",\"unix_ms\":...,\"rail\":0}, or a stream's
                          '<CLOCK_MONOTONIC ns> <label>' lines (needs --stream-timeline)
  --nccl-log FILE         NCCL log (repeatable): the plugin's NET/HA lines are counted
  -o, --svg OUT.svg       the picture as SVG (required)
  --png OUT.png           also as PNG (fonts: the system's, <exe dir>/fonts, --font)
  --title TEXT            names the run in the title (default: the stats file's name)
  --font FILE             a .ttf/.otf file or a folder of them for the PNG (repeatable)
";

#[derive(Debug, Default, PartialEq)]
struct Opts {
    stats: Vec<PathBuf>,
    stream: Option<PathBuf>,
    events: Vec<PathBuf>,
    nccl: Vec<PathBuf>,
    svg: Option<PathBuf>,
    png: Option<PathBuf>,
    title: Option<String>,
    fonts: Vec<PathBuf>,
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| format!("{a} needs a value (or is unknown)"))?;
        let p = PathBuf::from(v);
        match a.as_str() {
            "--stats" => o.stats.push(p),
            "--stream-timeline" => o.stream = Some(p),
            "--events" => o.events.push(p),
            "--nccl-log" => o.nccl.push(p),
            "-o" | "--svg" => o.svg = Some(p),
            "--png" => o.png = Some(p),
            "--title" => o.title = Some(v.clone()),
            "--font" => o.fonts.push(p),
            s => return Err(format!("unknown option {s}")),
        }
    }
    if o.svg.is_none() {
        return Err("-o OUT.svg is required".into());
    }
    if o.stats.is_empty() && o.stream.is_none() {
        return Err("give --stats FILE (or at least --stream-timeline FILE)".into());
    }
    Ok(o)
}

fn read(p: &PathBuf) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Everything read, the model built, notes added: the SVG text and the summary.
fn picture(o: &Opts) -> Result<(String, Vec<String>), String> {
    let mut inp = Inputs::default();
    let mut notes = Vec::new();
    let mut names = Vec::new();
    if let Some(p) = &o.stream {
        inp.add_stream(&p.display().to_string(), &read(p)?)?;
        names.push(format!("stream {}", p.display()));
    }
    for p in &o.stats {
        let text = read(p)?;
        inp.add_stats(&p.display().to_string(), &text);
        names.push(format!(
            "stats {} ({} lines)",
            p.display(),
            text.lines().count()
        ));
    }
    for p in &o.events {
        inp.add_events(&p.display().to_string(), &read(p)?)?;
        names.push(format!("events {}", p.display()));
    }
    for p in &o.nccl {
        inp.add_nccl_log(&read(p)?);
        names.push(format!("NCCL log {}", p.display()));
    }
    let mut m = model::build(&inp)?;
    notes.push(format!("inputs: {}", names.join(", ")));
    if let Some(s) = &inp.stream {
        notes.push(format!(
            "stream: {} messages, lost {}, duplicated {}, corrupted {}, errors {}: {}",
            s.messages,
            s.counts[0],
            s.counts[1],
            s.counts[2],
            s.counts[3],
            if s.clean { "clean" } else { "NOT CLEAN" }
        ));
    }
    if let Some(n) = &inp.nccl {
        notes.push(format!(
            "NCCL log: {} failover WARN line(s), {} re-armed, {} standby lost, {} connection(s) lost",
            n.failovers, n.rearmed, n.standby_lost, n.lost
        ));
    }
    notes.push(format!(
        "throughput: bytes the sending connections posted per path (from consecutive stats lines), in bins of {:.0} ms{}; a stall is measured between stream completions where a stream is given, else estimated from the cut (or the first work left waiting) to the switch",
        m.bin_ms,
        if inp.stream.is_some() { "; grey: bytes delivered to the stream's receiver" } else { "" }
    ));
    if let Some((f, l, why)) = inp.bad.first() {
        notes.push(format!(
            "{} unreadable line(s) skipped, the first: {f} line {l}: {why}",
            inp.bad.len()
        ));
    }
    m.notes = notes;
    let title = o.title.clone().unwrap_or_else(|| {
        o.stats
            .first()
            .or(o.stream.as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    });
    Ok((draw::render(&m, &title), m.summary.clone()))
}

/// `ha-harness timeline ...` (args after `timeline`); the exit status.
pub fn main_with_args(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return 0;
    }
    let o = match parse_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ha-harness timeline: {e}\n{USAGE}");
            return 2;
        }
    };
    let (svg, summary) = match picture(&o) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ha-harness timeline: {e}");
            return 1;
        }
    };
    let out = o.svg.as_ref().expect("checked");
    if let Err(e) = std::fs::write(out, &svg) {
        eprintln!("ha-harness timeline: writing {}: {e}", out.display());
        return 1;
    }
    for l in &summary {
        println!("timeline: {l}");
    }
    println!("timeline: wrote {}", out.display());
    if let Some(p) = &o.png {
        match png::write(&svg, p, &o.fonts) {
            Ok(warn) => {
                if let Some(w) = warn {
                    eprintln!("ha-harness timeline: warning: {w}");
                }
                println!("timeline: wrote {}", p.display());
            }
            Err(e) => {
                eprintln!("ha-harness timeline: PNG: {e}");
                return 1;
            }
        }
    }
    0
}

/// `ha-harness svg2png IN.svg OUT.png`: rasterise any SVG the way `timeline --png` does (for
/// the benchmark scripts' pictures: scripts/calibration_plot.py).
pub fn svg2png_main(args: &[String]) -> i32 {
    let [input, out] = args else {
        eprintln!("usage: ha-harness svg2png IN.svg OUT.png");
        return 2;
    };
    let svg = match std::fs::read_to_string(input) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ha-harness svg2png: {input}: {e}");
            return 1;
        }
    };
    match png::write(&svg, std::path::Path::new(out), &[]) {
        Ok(warning) => {
            if let Some(w) = warning {
                eprintln!("ha-harness svg2png: {w}");
            }
            0
        }
        Err(e) => {
            eprintln!("ha-harness svg2png: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let a = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
        let o = parse_args(&a(
            "--stats s --stats t --stream-timeline j --events e --nccl-log n -o x.svg --png x.png --title T --font f",
        ))
        .unwrap();
        assert_eq!(o.stats, [PathBuf::from("s"), PathBuf::from("t")]);
        assert_eq!((o.svg, o.png), (Some("x.svg".into()), Some("x.png".into())));
        assert_eq!((o.title.as_deref(), o.fonts.len()), (Some("T"), 1));
        assert!(parse_args(&a("--stats s")).unwrap_err().contains("-o"));
        assert!(parse_args(&a("-o x.svg")).unwrap_err().contains("--stats"));
        assert!(parse_args(&a("--bogus 1 -o x"))
            .unwrap_err()
            .contains("--bogus"));
        assert!(parse_args(&a("-o")).unwrap_err().contains("needs a value"));
    }
}
