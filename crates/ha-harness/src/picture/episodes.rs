//! The story of a run: events grouped across connections (one link cut fails over every
//! connection on it within moments), drawn as marks — cut, restore, detection, switch, standby
//! lost, re-armed, connection lost, and any other event under its own name — with the stall of
//! each failover measured (from a stream's completions when there is one, else from the cut or
//! the first work left waiting to the switch) and one summary line per failover or cut.

use super::inputs::Stream;
use crate::stats::record::Record;
use crate::stats::units::duration_ms;

/// Events of one kind this close (ms) belong to one group.
const GROUP_GAP_MS: u64 = 1000;
/// A cut more than this long before a failover did not cause it.
const CAUSE_WINDOW_MS: u64 = 60_000;
/// Summary lines, at most.
const SUMMARY_LINES: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    Cut,
    Restore,
    Detect,
    Switch,
    StandbyLost,
    Rearmed,
    Lost,
    Other,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub t: f64,
    pub kind: MarkKind,
    pub label: String,
    /// A script's command that ran a while (say, a slow `ip link set`): when it returned.
    pub until: Option<f64>,
}

/// Commands shorter than this (ms) are not drawn as running.
const SLOW_COMMAND_MS: u64 = 50;

/// When a script's event had surely taken effect: when its command returned (`done_unix_ms`),
/// else when it was issued.
fn effective(r: &Record) -> u64 {
    r.u64("done_unix_ms").unwrap_or(r.unix_ms).max(r.unix_ms)
}

/// A script's event's label, with how long its command ran when that was long.
fn script_label(r: &Record) -> String {
    let took = effective(r) - r.unix_ms;
    if took >= SLOW_COMMAND_MS {
        format!("{} (command ran {})", r.label(), duration_ms(took))
    } else {
        r.label()
    }
}

/// A stall: traffic stopped from `from` to `to` (ms since the epoch).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub from: f64,
    pub to: f64,
    pub label: String,
}

#[derive(Debug, Default)]
pub struct Episodes {
    pub marks: Vec<Mark>,
    pub spans: Vec<Span>,
    pub summary: Vec<String>,
}

/// Records of one event close in time.
struct Group<'a> {
    recs: Vec<&'a Record>,
}

impl<'a> Group<'a> {
    /// The sending side's records when there are any (both ends of a connection report a
    /// failover; the sender's replay is the one that counts), else all.
    fn senders(&self) -> Group<'a> {
        let send: Vec<&Record> = self
            .recs
            .iter()
            .copied()
            .filter(|r| r.str("role") == Some("send"))
            .collect();
        Group {
            recs: if send.is_empty() {
                self.recs.clone()
            } else {
                send
            },
        }
    }
    fn first(&self) -> u64 {
        self.recs.iter().map(|r| r.unix_ms).min().unwrap_or(0)
    }
    fn last(&self) -> u64 {
        self.recs.iter().map(|r| r.unix_ms).max().unwrap_or(0)
    }
    /// Earliest detection of a failover group.
    fn detect(&self) -> u64 {
        self.recs
            .iter()
            .map(|r| r.u64("detect_unix_ms").unwrap_or(r.unix_ms))
            .min()
            .unwrap_or(0)
    }
    fn sum(&self, k: &str) -> u64 {
        self.recs.iter().filter_map(|r| r.u64(k)).sum()
    }
    /// The most common value of `k` (as text), ties to the earliest.
    fn common(&self, k: &str) -> Option<String> {
        let vals: Vec<String> = self.recs.iter().filter_map(|r| r.text(k)).collect();
        vals.iter()
            .max_by_key(|v| {
                (
                    vals.iter().filter(|x| x == v).count(),
                    usize::MAX - vals.iter().position(|x| x == *v).unwrap_or(0),
                )
            })
            .cloned()
    }
    fn times(&self) -> String {
        if self.recs.len() > 1 {
            format!(" ×{}", self.recs.len())
        } else {
            String::new()
        }
    }
}

/// Group `recs` (sorted by time) whose times are within [`GROUP_GAP_MS`] of the previous.
fn group<'a>(recs: &[&'a Record], at: impl Fn(&Record) -> u64) -> Vec<Group<'a>> {
    let mut sorted: Vec<&Record> = recs.to_vec();
    sorted.sort_by_key(|r| at(r));
    let mut out: Vec<Group> = Vec::new();
    let mut last = 0;
    for r in sorted {
        let t = at(r);
        match out.last_mut() {
            Some(g) if t <= last + GROUP_GAP_MS => g.recs.push(r),
            _ => out.push(Group { recs: vec![r] }),
        }
        last = last.max(t);
    }
    out
}

fn mark(t: u64, kind: MarkKind, label: String) -> Mark {
    Mark {
        t: t as f64,
        kind,
        label,
        until: None,
    }
}

pub fn build(records: &[Record], stream: Option<&Stream>, t0: f64) -> Episodes {
    let rel = |t: f64| format!("{:.2} s", (t - t0) / 1000.0);
    let mut ep = Episodes::default();
    let of = |e: &str| -> Vec<&Record> {
        records
            .iter()
            .filter(|r| r.conn.is_some() && r.event == e)
            .collect()
    };
    // A script's events: cuts, restores, anything else under its own label.
    let mut cuts: Vec<&Record> = Vec::new();
    for r in records.iter().filter(|r| r.conn.is_none() && r.unix_ms > 0) {
        let kind = match r.event.as_str() {
            "cut" => MarkKind::Cut,
            "restore" => MarkKind::Restore,
            "closed" => continue,
            _ => MarkKind::Other,
        };
        if kind == MarkKind::Cut {
            cuts.push(r);
        }
        let mut m = mark(r.unix_ms, kind, script_label(r));
        if effective(r) - r.unix_ms >= SLOW_COMMAND_MS {
            m.until = Some(effective(r) as f64);
        }
        ep.marks.push(m);
    }
    cuts.sort_by_key(|r| r.unix_ms);
    let failovers = group(&of("failover"), |r| {
        r.u64("detect_unix_ms").unwrap_or(r.unix_ms)
    });
    let lost = group(&of("standby_lost"), |r| r.unix_ms);
    let rearmed = group(&of("rearmed"), |r| r.unix_ms);
    for g in &lost {
        let path = g.common("path").unwrap_or_default();
        ep.marks.push(mark(
            g.first(),
            MarkKind::StandbyLost,
            format!("standby lost (path {path}){}", g.senders().times()),
        ));
    }
    for g in &rearmed {
        let path = g.common("path").unwrap_or_default();
        ep.marks.push(mark(
            g.first(),
            MarkKind::Rearmed,
            format!(
                "re-armed path {path}{}: redundancy back",
                g.senders().times()
            ),
        ));
    }
    // Connections that died: the first line of each that says so.
    let mut dead: Vec<&Record> = Vec::new();
    for r in records.iter().filter(|r| r.str("phase") == Some("dead")) {
        match dead.iter_mut().find(|d| d.conn == r.conn) {
            Some(d) if d.unix_ms > r.unix_ms => *d = r,
            Some(_) => {}
            None if r.conn.is_some() => dead.push(r),
            None => {}
        }
    }
    for g in group(&dead, |r| r.unix_ms) {
        ep.marks.push(mark(
            g.first(),
            MarkKind::Lost,
            format!("connection lost{}", g.senders().times()),
        ));
    }
    // Any other event of a connection (say, a planned return or a drain), under its name.
    let known = [
        "open",
        "periodic",
        "closed",
        "failover",
        "standby_lost",
        "rearmed",
        "lost",
    ];
    let mut others: Vec<&str> = records
        .iter()
        .filter(|r| r.conn.is_some() && !known.contains(&r.event.as_str()))
        // A failover's switch line repeats its `failover` line; planned ones are marked.
        .filter(|r| !(r.event == "switch" && r.str("kind") == Some("failover")))
        .map(|r| r.event.as_str())
        .collect();
    others.sort_unstable();
    others.dedup();
    for e in others {
        let recs: Vec<&Record> = of(e)
            .into_iter()
            .filter(|r| !(r.event == "switch" && r.str("kind") == Some("failover")))
            .collect();
        for g in group(&recs, |r| r.unix_ms) {
            let label = g.recs[0].label();
            ep.marks.push(mark(
                g.first(),
                MarkKind::Other,
                format!("{label}{}", g.senders().times()),
            ));
        }
    }
    // Failovers: detection, switch, the stall, and a summary line each.
    let mut prev_switch = 0u64;
    let mut used_cuts: Vec<u64> = Vec::new();
    for (k, g) in failovers.iter().enumerate() {
        let (detect, switch) = (g.detect(), g.last());
        let cause = g.common("cause").unwrap_or_default();
        let (from, to) = (
            g.common("from").unwrap_or_default(),
            g.common("to").unwrap_or_default(),
        );
        let s = g.senders();
        ep.marks.push(mark(
            detect,
            MarkKind::Detect,
            format!("detected{}", s.times()),
        ));
        let replayed = s.sum("replayed");
        ep.marks.push(mark(
            switch,
            MarkKind::Switch,
            format!("switch {from}→{to}{}, replayed {replayed}", s.times()),
        ));
        let cut = cuts
            .iter()
            .rev()
            .find(|c| {
                c.unix_ms <= detect
                    && c.unix_ms + CAUSE_WINDOW_MS >= detect
                    && c.unix_ms >= prev_switch
            })
            .copied();
        if let Some(c) = cut {
            used_cuts.push(c.unix_ms);
        }
        let waiting = g
            .recs
            .iter()
            .filter_map(|r| r.u64("waiting_since_unix_ms"))
            .filter(|&w| w > 0)
            .min();
        let start = [Some(detect), waiting, cut.map(effective)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(detect);
        let span = measured_stall(stream, start as f64, switch as f64)
            .map(|(a, b)| Span {
                from: a,
                to: b,
                label: format!("stall {}", duration_ms((b - a).round() as u64)),
            })
            .unwrap_or_else(|| Span {
                from: start as f64,
                to: switch as f64,
                label: format!(
                    "stall ≈ {} ({} → switch)",
                    duration_ms(switch.saturating_sub(start)),
                    if cut.is_some_and(|c| effective(c) == start) {
                        "cut"
                    } else if waiting == Some(start) {
                        "work waiting"
                    } else {
                        "detection"
                    }
                ),
            });
        let next = failovers.get(k + 1).map_or(u64::MAX, |n| n.detect());
        let back = rearmed
            .iter()
            .find(|r| r.first() >= switch && r.first() < next);
        let mut line = match cut {
            Some(c) => format!("{} at {}", script_label(c), rel(c.unix_ms as f64)),
            None => format!("failure at {}", rel(start as f64)),
        };
        // Times count from when the cut command returned (the link surely down by then); a
        // failure detected while the command still ran counts from when it was issued.
        let during = cut.is_some_and(|c| detect < effective(c));
        let base = match cut {
            Some(c) if during => c.unix_ms,
            Some(c) => effective(c),
            None => start,
        };
        line += &format!(
            " → detected {}+{} ({})",
            if during {
                "while the command ran, "
            } else {
                ""
            },
            duration_ms(detect.saturating_sub(base)),
            shorten(&cause, 60)
        );
        line += &format!(
            " → switched path {from} → {to} +{}{}, {replayed} replayed",
            duration_ms(switch.saturating_sub(base)),
            if s.recs.len() > 1 {
                format!(" ({} connections)", s.recs.len())
            } else {
                String::new()
            }
        );
        line += &format!(" → {}", span.label);
        line += &match back {
            Some(b) => format!(
                " → redundancy back at {} (+{})",
                rel(b.first() as f64),
                duration_ms(b.first().saturating_sub(switch))
            ),
            None => " → NO STANDBY after it (not re-armed)".into(),
        };
        ep.summary.push(line);
        ep.spans.push(span);
        prev_switch = switch;
    }
    // Cuts that caused no failover: a standby lost, or nothing seen.
    for c in cuts.iter().filter(|c| !used_cuts.contains(&c.unix_ms)) {
        let after = lost
            .iter()
            .find(|g| g.first() >= c.unix_ms && g.first() <= c.unix_ms + CAUSE_WINDOW_MS);
        ep.summary.push(match after {
            Some(g) => format!(
                "{} at {} → standby lost +{}{}; traffic stayed on its path",
                script_label(c),
                rel(c.unix_ms as f64),
                duration_ms(g.first().saturating_sub(effective(c))),
                g.senders().times()
            ),
            None => format!(
                "{} at {} → no failover and no standby loss reported",
                script_label(c),
                rel(c.unix_ms as f64)
            ),
        });
    }
    if ep.summary.len() > SUMMARY_LINES {
        let more = ep.summary.len() - (SUMMARY_LINES - 1);
        ep.summary.truncate(SUMMARY_LINES - 1);
        ep.summary
            .push(format!("... and {more} more (see the marks)"));
    }
    ep.marks.sort_by(|a, b| a.t.total_cmp(&b.t));
    ep
}

/// The longest gap between a stream's completions that starts from `start` - 1 s up to the
/// switch and ends after `start` (ms since the epoch): the stall a failover caused.
fn measured_stall(stream: Option<&Stream>, start: f64, switch: f64) -> Option<(f64, f64)> {
    let s = stream?;
    let times: Vec<f64> = s
        .completions
        .iter()
        .map(|c| s.start_unix_ms + c.0)
        .collect();
    times
        .windows(2)
        .map(|w| (w[0], w[1]))
        .filter(|&(a, b)| a >= start - 1000.0 && a <= switch && b > start)
        .max_by(|x, y| (x.1 - x.0).total_cmp(&(y.1 - y.0)))
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 3).collect::<String>() + "..."
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::record::parse;

    fn recs(lines: &[String]) -> Vec<Record> {
        lines.iter().map(|l| parse(l).unwrap().unwrap()).collect()
    }

    fn conn(n: u64) -> String {
        format!(r#""host":"h","pid":1,"conn":{n},"role":"send""#)
    }

    #[test]
    fn a_cut_two_connections_fail_over_and_the_standby_comes_back() {
        let fo = |n: u64, det: u64, at: u64| {
            format!(
                r#"{{"event":"failover","unix_ms":{at},{},"from":0,"to":1,"cause":"port of device 0 is down","detect_unix_ms":{det},"waiting_since_unix_ms":0,"replayed":2}}"#,
                conn(n)
            )
        };
        let r = recs(&[
            r#"{"event":"cut","unix_ms":10000,"rail":0,"end":"near"}"#.into(),
            fo(1, 10300, 10310),
            fo(2, 10305, 10320),
            format!(
                r#"{{"event":"rearmed","unix_ms":12500,{},"path":0}}"#,
                conn(1)
            ),
            format!(
                r#"{{"event":"rearmed","unix_ms":12600,{},"path":0}}"#,
                conn(2)
            ),
            r#"{"event":"cut","unix_ms":15000,"rail":1,"end":"far"}"#.into(),
            format!(
                r#"{{"event":"standby_lost","unix_ms":15400,{},"path":1}}"#,
                conn(1)
            ),
            format!(
                r#"{{"event":"drain","unix_ms":16000,{},"label":"drain rail 1"}}"#,
                conn(1)
            ),
        ]);
        let ep = build(&r, None, 9000.0);
        let kinds: Vec<(f64, MarkKind, &str)> = ep
            .marks
            .iter()
            .map(|m| (m.t, m.kind, m.label.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (10000.0, MarkKind::Cut, "cut rail 0 (near)"),
                (10300.0, MarkKind::Detect, "detected ×2"),
                (10320.0, MarkKind::Switch, "switch 0→1 ×2, replayed 4"),
                (
                    12500.0,
                    MarkKind::Rearmed,
                    "re-armed path 0 ×2: redundancy back"
                ),
                (15000.0, MarkKind::Cut, "cut rail 1 (far)"),
                (15400.0, MarkKind::StandbyLost, "standby lost (path 1)"),
                (16000.0, MarkKind::Other, "drain rail 1"),
            ]
        );
        assert_eq!(
            ep.spans,
            [Span {
                from: 10000.0,
                to: 10320.0,
                label: "stall ≈ 320 ms (cut → switch)".into()
            }]
        );
        assert_eq!(
            ep.summary,
            [
                "cut rail 0 (near) at 1.00 s → detected +300 ms (port of device 0 is down) → switched path 0 → 1 +320 ms (2 connections), 4 replayed → stall ≈ 320 ms (cut → switch) → redundancy back at 3.50 s (+2.2 s)",
                "cut rail 1 (far) at 6.00 s → standby lost +400 ms; traffic stayed on its path",
            ]
        );
    }

    #[test]
    fn a_failure_detected_while_the_cut_command_ran_counts_from_its_start() {
        let r = recs(&[
            r#"{"event":"cut","unix_ms":10000,"done_unix_ms":11400,"label":"down far rail A"}"#
                .into(),
            format!(
                r#"{{"event":"failover","unix_ms":11215,{},"from":0,"to":1,"cause":"port down","detect_unix_ms":11200,"replayed":1}}"#,
                conn(1)
            ),
        ]);
        let ep = build(&r, None, 9000.0);
        assert_eq!(
            ep.summary[0],
            "down far rail A (command ran 1.4 s) at 1.00 s → detected while the command ran, +1.2 s (port down) → switched path 0 → 1 +1.2 s, 1 replayed → stall ≈ 15 ms (detection → switch) → NO STANDBY after it (not re-armed)"
        );
    }

    #[test]
    fn a_stream_measures_the_stall_and_a_failover_without_rearm_is_flagged() {
        let r = recs(&[format!(
            r#"{{"event":"failover","unix_ms":1500,{},"from":1,"to":0,"cause":"x","detect_unix_ms":1400,"waiting_since_unix_ms":1100,"replayed":0}}"#,
            conn(1)
        )]);
        let s = Stream {
            start_unix_ms: 1000.0,
            completions: vec![(0.0, 1), (50.0, 1), (90.0, 1), (550.0, 1), (560.0, 1)],
            ..Stream::default()
        };
        let ep = build(&r, Some(&s), 1000.0);
        assert_eq!(
            ep.spans,
            [Span {
                from: 1090.0,
                to: 1550.0,
                label: "stall 460 ms".into()
            }]
        );
        assert!(
            ep.summary[0].starts_with("failure at 0.10 s → detected +300 ms (x)"),
            "{}",
            ep.summary[0]
        );
        assert!(ep.summary[0].ends_with("NO STANDBY after it (not re-armed)"));
    }
}
