//! What the picture shows, computed from the inputs: the time range, throughput per path (the
//! plugin's bytes posted by sending connections, from consecutive lines of each connection)
//! and delivered (a stream's completions), and per time bin which path carries the traffic and
//! what the standbys are worth. The marks, stalls and summary come from [`super::episodes`].

use super::episodes::{self, Mark, Span};
use super::inputs::Inputs;
use crate::stats::record::{ConnKey, Record};
use std::collections::BTreeMap;

/// Bins across the picture, at most.
const BINS: f64 = 300.0;

/// A throughput curve: bytes per second in each bin.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub rates: Vec<f64>,
}

/// The connections in one bin: how many carry traffic on path 0 and path 1, and how many have
/// a standby that is proven, being verified, or missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneBin {
    pub on: [u32; 2],
    pub ok: u32,
    pub verifying: u32,
    pub lost: u32,
}

impl LaneBin {
    pub fn conns(&self) -> u32 {
        self.ok + self.verifying + self.lost
    }
}

#[derive(Debug)]
pub struct Model {
    /// Shown range, ms since the Unix epoch.
    pub t0: f64,
    pub t1: f64,
    pub bin_ms: f64,
    pub paths: Vec<Series>,
    pub delivered: Option<Series>,
    pub lanes: Vec<LaneBin>,
    pub marks: Vec<Mark>,
    pub spans: Vec<Span>,
    pub summary: Vec<String>,
    pub notes: Vec<String>,
    /// Sending connections drawn, and processes seen.
    pub conns: usize,
    pub processes: usize,
}

impl Model {
    pub fn bins(&self) -> usize {
        self.lanes.len()
    }
    /// Seconds since the start of `t` (ms since the epoch).
    pub fn secs(&self, t: f64) -> f64 {
        (t - self.t0) / 1000.0
    }
}

/// One connection's lines in time order.
struct ConnLines<'a> {
    role: &'a str,
    lines: Vec<&'a Record>,
}

/// The connections whose traffic is drawn: the senders that moved bytes (their bytes are the
/// payload; an idle reverse connection says nothing of the job), else every sender, else every
/// connection.
fn conns(records: &[Record]) -> BTreeMap<&ConnKey, ConnLines<'_>> {
    let mut m: BTreeMap<&ConnKey, ConnLines> = BTreeMap::new();
    for r in records {
        if let Some(k) = &r.conn {
            let c = m.entry(k).or_insert(ConnLines {
                role: "",
                lines: Vec::new(),
            });
            if let Some(role) = r.str("role") {
                c.role = role;
            }
            c.lines.push(r);
        }
    }
    for c in m.values_mut() {
        c.lines.sort_by_key(|r| r.unix_ms);
    }
    if m.values().any(|c| c.role == "send") {
        m.retain(|_, c| c.role == "send");
    }
    let moved = |c: &ConnLines| {
        c.lines
            .iter()
            .any(|r| r.nums("bytes").iter().any(|&b| b > 0))
    };
    if m.values().any(moved) {
        m.retain(|_, c| moved(c));
    }
    m
}

/// The range shown: every timed line and the stream, with a margin.
fn range(inp: &Inputs) -> Option<(f64, f64)> {
    let mut ts: Vec<f64> = inp
        .records
        .iter()
        .filter(|r| r.unix_ms > 0)
        .map(|r| r.unix_ms as f64)
        .collect();
    if let Some(s) = &inp.stream {
        ts.push(s.start_unix_ms);
        ts.push(s.start_unix_ms + s.end_ms);
    }
    let lo = ts.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ts.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        return None;
    }
    let pad = ((hi - lo) * 0.02).max(50.0);
    Some((lo - pad, hi + pad))
}

/// Spread `bytes`, moved over [a, b), over the bins it overlaps (in proportion).
fn spread(acc: &mut [f64], t0: f64, bin: f64, a: f64, b: f64, bytes: f64) {
    if acc.is_empty() {
        return;
    }
    let last = acc.len() - 1;
    if b <= a {
        let i = (((a - t0) / bin).floor().max(0.0) as usize).min(last);
        acc[i] += bytes;
        return;
    }
    let first = ((a - t0) / bin).floor().max(0.0) as usize;
    let end = (((b - t0) / bin).ceil().max(0.0) as usize).min(acc.len());
    for (i, slot) in acc.iter_mut().enumerate().take(end).skip(first.min(last)) {
        let lo = (t0 + i as f64 * bin).max(a);
        let hi = (t0 + (i + 1) as f64 * bin).min(b);
        if hi > lo {
            *slot += bytes * (hi - lo) / (b - a);
        }
    }
}

pub fn build(inp: &Inputs) -> Result<Model, String> {
    let (t0, t1) = range(inp).ok_or("nothing with a time in the inputs")?;
    // Bins no finer than half the periodic lines' interval (finer bins only repeat them).
    let interval = inp
        .records
        .iter()
        .filter_map(|r| r.u64("interval_ms"))
        .filter(|&i| i > 0)
        .min()
        .unwrap_or(0) as f64;
    let bin_ms = ((t1 - t0) / BINS).max(interval / 2.0).max(5.0);
    let n = ((t1 - t0) / bin_ms).ceil() as usize;
    let cs = conns(&inp.records);
    // Bytes per path index, from consecutive lines of each connection.
    let mut bytes: Vec<Vec<f64>> = vec![vec![0.0; n]; 2];
    let mut devs: [Vec<String>; 2] = Default::default();
    let mut lanes = vec![LaneBin::default(); n];
    for c in cs.values() {
        let mut prev: Option<(f64, Vec<u64>)> = None;
        for r in &c.lines {
            for (i, d) in r.strs("devices").into_iter().take(2).enumerate() {
                if !devs[i].contains(&d) {
                    devs[i].push(d);
                }
            }
            let b = match r.event.as_str() {
                "open" => vec![0, 0],
                "periodic" | "closed" => r.nums("bytes"),
                _ => continue,
            };
            let t = r.unix_ms as f64;
            if let Some((pt, pb)) = &prev {
                for (i, acc) in bytes.iter_mut().enumerate() {
                    let d = b.get(i).copied().unwrap_or(0) as f64
                        - pb.get(i).copied().unwrap_or(0) as f64;
                    if d > 0.0 {
                        spread(acc, t0, bin_ms, *pt, t, d);
                    }
                }
            }
            prev = Some((t, b));
        }
        states(c, t0, bin_ms, &mut lanes);
    }
    let per_s = 1000.0 / bin_ms;
    let paths = (0..2)
        .filter(|&i| i == 0 || bytes[i].iter().any(|&b| b > 0.0) || !devs[i].is_empty())
        .map(|i| Series {
            label: path_label(i, &devs[i]),
            rates: bytes[i].iter().map(|b| b * per_s).collect(),
        })
        .collect();
    let delivered = inp.stream.as_ref().map(|s| {
        let mut acc = vec![0.0; n];
        for &(ms, b) in &s.completions {
            let t = s.start_unix_ms + ms;
            spread(&mut acc, t0, bin_ms, t, t, b as f64);
        }
        Series {
            label: "delivered (stream, receiver side)".into(),
            rates: acc.iter().map(|b| b * per_s).collect(),
        }
    });
    let ep = episodes::build(&inp.records, inp.stream.as_ref(), t0);
    let processes = {
        let mut p: Vec<String> = cs.keys().map(|k| k.process()).collect();
        p.dedup();
        p.len()
    };
    Ok(Model {
        t0,
        t1,
        bin_ms,
        paths,
        delivered,
        lanes,
        marks: ep.marks,
        spans: ep.spans,
        summary: ep.summary,
        notes: Vec::new(),
        conns: cs.len(),
        processes,
    })
}

fn path_label(i: usize, devs: &[String]) -> String {
    let role = if i == 0 { "primary" } else { "standby" };
    match devs.len() {
        0 => format!("path {i} ({role} at setup)"),
        1..=3 => format!("path {i} ({role} at setup): {}", devs.join(", ")),
        k => format!(
            "path {i} ({role} at setup): {}, ... ({k} devices)",
            devs[..2].join(", ")
        ),
    }
}

/// What a connection's lines say of its state over time, counted into each bin it lived in.
fn states(c: &ConnLines, t0: f64, bin_ms: f64, lanes: &mut [LaneBin]) {
    // (from, active, standby class: 0 ok, 1 verifying, 2 lost); the last sample ends at close.
    let mut samples: Vec<(f64, u64, u8)> = Vec::new();
    let mut end = None;
    let mut active = 0;
    let class = |s: &str| match s {
        "ok" => 0,
        "verifying" => 1,
        _ => 2,
    };
    for r in &c.lines {
        let t = r.unix_ms as f64;
        let cur = samples.last().map_or(1, |s| s.2);
        let (a, sb) = match r.event.as_str() {
            "open" => {
                let single = r.strs("devices").len() == 1;
                (0, if single { 2 } else { 1 })
            }
            "periodic" | "closed" => (
                r.u64("active").unwrap_or(active),
                if r.str("phase") == Some("dead") {
                    2
                } else {
                    r.str("standby").map_or(cur, class)
                },
            ),
            "failover" => (r.u64("to").unwrap_or(active), 2),
            "standby_lost" => (active, 2),
            "rearmed" => (active, 0),
            // A planned switch (return home, drain): the other path stays the standby.
            "switch" if r.str("kind") != Some("failover") => (r.u64("to").unwrap_or(active), cur),
            _ => continue,
        };
        active = a;
        samples.push((t, a, sb));
        if r.event == "closed" {
            end = Some(t);
        }
    }
    let Some(start) = samples.first().map(|s| s.0) else {
        return;
    };
    let end = end.unwrap_or(f64::INFINITY);
    for (i, lane) in lanes.iter_mut().enumerate() {
        let mid = t0 + (i as f64 + 0.5) * bin_ms;
        if mid < start || mid > end {
            continue;
        }
        let Some(s) = samples.iter().rev().find(|s| s.0 <= mid) else {
            continue;
        };
        lane.on[(s.1 as usize).min(1)] += 1;
        match s.2 {
            0 => lane.ok += 1,
            1 => lane.verifying += 1,
            _ => lane.lost += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_spread_over_the_bins_they_were_moved_in() {
        let mut acc = vec![0.0; 4];
        spread(&mut acc, 0.0, 10.0, 5.0, 25.0, 200.0);
        assert_eq!(acc, [50.0, 100.0, 50.0, 0.0]);
        spread(&mut acc, 0.0, 10.0, 39.0, 39.0, 1.0);
        assert_eq!(acc[3], 1.0);
        // Past the end: clamped.
        spread(&mut acc, 0.0, 10.0, 99.0, 99.0, 2.0);
        assert_eq!(acc[3], 3.0);
    }
}
