//! The end of a stream: both sides' reports merged on the sender's clock, the result line
//! (`messages N, bytes B, lost L, duplicated D, corrupted C, errors E, max_stall_ms S`), one
//! `event` line per external event, the JSON document, and the exit status.

use super::link::SideError;
use super::receiver::{Completion, RecvReport};
use super::sender::SendReport;
use super::timeline::{self, EventOutcome, Gap};
use crate::report::json_string;

/// Longest gaps listed in the JSON.
pub const TOP_GAPS: usize = 16;
/// Throughput timeline resolution.
pub const BIN_NS: u64 = 100_000_000;
/// Completions listed one by one in the JSON, at most.
pub const MAX_LISTED: usize = 200_000;

/// A failure, with its time on the sender's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub side: &'static str,
    pub at_ns: u64,
    pub what: String,
    pub counts: bool,
}

#[derive(Debug, Clone)]
pub struct Summary {
    pub sent: SendReport,
    pub recv: RecvReport,
    /// Receiver completions on the sender's clock.
    pub completions: Vec<Completion>,
    pub failures: Vec<Failure>,
    pub errors: u64,
    pub end_ns: u64,
    pub max_stall: Option<Gap>,
    pub gaps: Vec<Gap>,
    pub events: Vec<EventOutcome>,
}

fn shift(t: u64, offset_ns: i64) -> u64 {
    u64::try_from((i128::from(t) + i128::from(offset_ns)).max(0)).unwrap_or(u64::MAX)
}

/// Merges the reports. `recv_offset_ns` converts receiver times to the sender's clock
/// (receiver start minus sender start, in `CLOCK_MONOTONIC` ns); `extra` are failures outside
/// the two reports (a child that died, a close that failed).
pub fn build(
    sent: SendReport,
    recv: RecvReport,
    recv_offset_ns: i64,
    extra: Vec<Failure>,
    events: &[timeline::Event],
) -> Summary {
    let completions: Vec<Completion> = recv
        .completions
        .iter()
        .map(|c| Completion {
            t_ns: shift(c.t_ns, recv_offset_ns),
            ..*c
        })
        .collect();
    let mut failures = Vec::new();
    let side_failure = |side, e: &SideError, offset| Failure {
        side,
        at_ns: shift(e.at_ns, offset),
        what: e.what.clone(),
        counts: e.kind.counts(),
    };
    if let Some(e) = &sent.error {
        failures.push(side_failure("A (sender)", e, 0));
    }
    if let Some(e) = &recv.error {
        failures.push(side_failure("B (receiver)", e, recv_offset_ns));
    }
    failures.extend(extra);
    failures.sort_by_key(|f| f.at_ns);
    let errors = failures.iter().filter(|f| f.counts).count() as u64;
    let first_error = failures.iter().find(|f| f.counts).map(|f| f.at_ns);
    let end_ns = first_error.unwrap_or_else(|| sent.end_ns.max(shift(recv.end_ns, recv_offset_ns)));
    let times: Vec<u64> = completions.iter().map(|c| c.t_ns).collect();
    Summary {
        max_stall: timeline::max_stall(&times, first_error),
        gaps: timeline::longest_gaps(&times, TOP_GAPS),
        events: timeline::analyse_events(&times, events, end_ns, first_error.is_some()),
        sent,
        recv,
        completions,
        failures,
        errors,
        end_ns,
    }
}

impl Summary {
    pub fn clean(&self) -> bool {
        let r = &self.recv;
        self.errors == 0
            && r.lost == 0
            && r.duplicated == 0
            && r.reordered == 0
            && r.corrupted == 0
            && r.messages > 0
    }

    pub fn max_stall_ms(&self) -> f64 {
        self.max_stall.map_or(0.0, |g| timeline::ms(g.len_ns()))
    }

    /// The result line.
    pub fn result_line(&self) -> String {
        let r = &self.recv;
        format!(
            "messages {}, bytes {}, lost {}, duplicated {}, corrupted {}, errors {}, max_stall_ms {}",
            r.messages,
            r.bytes,
            r.lost,
            r.duplicated,
            r.corrupted,
            self.errors,
            self.max_stall_ms().round() as u64
        )
    }

    /// Every line printed at the end, the result line last.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.events {
            out.push(event_line(e));
        }
        for f in &self.failures {
            out.push(format!(
                "stream: {}: side {} at {:.1} ms: {}",
                if f.counts { "error" } else { "stopped" },
                f.side,
                timeline::ms(f.at_ns),
                f.what
            ));
        }
        if let Some(p) = &self.recv.first_problem {
            out.push(format!("stream: first problem: {p}"));
        }
        let s = &self.sent;
        out.push(format!(
            "stream: sent {} messages ({} bytes, {} operations), receives posted for {}, reordered {}, {:.1} s",
            s.messages,
            s.bytes,
            s.ops,
            self.recv.posted,
            self.recv.reordered,
            timeline::ms(self.end_ns) / 1e3
        ));
        out.push(self.result_line());
        out
    }

    /// Machine-readable results; times in ms since the stream's start (`start_monotonic_ns`).
    pub fn json(&self, info: &[(&str, String)]) -> String {
        let r = &self.recv;
        let ms = |ns: u64| format!("{:.3}", timeline::ms(ns));
        let mut f: Vec<String> = info
            .iter()
            .map(|(k, v)| format!("  {}: {v}", json_string(k)))
            .collect();
        let mut num = |k: &str, v: String| f.push(format!("  {}: {v}", json_string(k)));
        num("clean", self.clean().to_string());
        num("messages", r.messages.to_string());
        num("bytes", r.bytes.to_string());
        num("lost", r.lost.to_string());
        num("duplicated", r.duplicated.to_string());
        num("reordered", r.reordered.to_string());
        num("corrupted", r.corrupted.to_string());
        num("errors", self.errors.to_string());
        num("posted", r.posted.to_string());
        num("sent_messages", self.sent.messages.to_string());
        num("sent_bytes", self.sent.bytes.to_string());
        num("end_ms", ms(self.end_ns));
        num("max_stall_ms", format!("{:.3}", self.max_stall_ms()));
        num(
            "max_stall",
            self.max_stall.map_or("null".into(), |g| gap_json(&g)),
        );
        num(
            "first_problem",
            r.first_problem
                .as_deref()
                .map_or("null".into(), json_string),
        );
        let failures: Vec<String> = self
            .failures
            .iter()
            .map(|x| {
                format!(
                    "{{\"side\": {}, \"at_ms\": {}, \"counts\": {}, \"what\": {}}}",
                    json_string(x.side),
                    ms(x.at_ns),
                    x.counts,
                    json_string(&x.what)
                )
            })
            .collect();
        num("failures", format!("[{}]", failures.join(", ")));
        let gaps: Vec<String> = self.gaps.iter().map(gap_json).collect();
        num(
            "longest_gaps",
            format!("[\n    {}\n  ]", gaps.join(",\n    ")),
        );
        let events: Vec<String> = self.events.iter().map(event_json).collect();
        num("events", format!("[\n    {}\n  ]", events.join(",\n    ")));
        let bins: Vec<String> = timeline::bins(
            &self
                .completions
                .iter()
                .map(|c| (c.t_ns, u64::from(c.messages), c.bytes))
                .collect::<Vec<_>>(),
            BIN_NS,
        )
        .iter()
        .map(|(m, b)| format!("[{m}, {b}]"))
        .collect();
        num("bin_ms", (BIN_NS / 1_000_000).to_string());
        num("timeline", format!("[{}]", bins.join(", ")));
        if self.completions.len() <= MAX_LISTED {
            let cs: Vec<String> = self
                .completions
                .iter()
                .map(|c| format!("[{}, {}, {}]", ms(c.t_ns), c.messages, c.bytes))
                .collect();
            num("completions", format!("[{}]", cs.join(", ")));
        } else {
            num("completions", "null".into());
        }
        format!("{{\n{}\n}}\n", f.join(",\n"))
    }
}

fn gap_json(g: &Gap) -> String {
    format!(
        "{{\"from_ms\": {:.3}, \"to_ms\": {:.3}, \"ms\": {:.3}}}",
        timeline::ms(g.from_ns),
        timeline::ms(g.to_ns),
        timeline::ms(g.len_ns())
    )
}

fn opt_ms(v: Option<u64>) -> String {
    v.map_or("null".into(), |ns| format!("{:.3}", timeline::ms(ns)))
}

fn event_json(e: &EventOutcome) -> String {
    format!(
        "{{\"label\": {}, \"at_ms\": {:.3}, \"first_after_ms\": {}, \"stall\": {}, \"stall_closed\": {}, \"back_ms\": {}, \"baseline_ms\": {:.3}}}",
        json_string(&e.event.label),
        timeline::ms_signed(e.event.at_ns),
        opt_ms(e.first_after_ns),
        e.stall.map_or("null".into(), |g| gap_json(&g)),
        e.stall_closed,
        opt_ms(e.back_ns),
        timeline::ms(e.baseline_ns)
    )
}

/// `event at_ms=A first_after_ms=F stall_ms=S stall_end_ms=E back_ms=K baseline_ms=B
/// recovered=yes|no label=L`: `F` is the first completion after the event, `E` the end of
/// the longest stall after it, `K` when traffic was back (see
/// [`EventOutcome::back_ns`]), all relative to the event (`-` when there is none); `B` the
/// longest gap before the event; `recovered=no` when traffic did not come back before the
/// next event or the end.
pub fn event_line(e: &EventOutcome) -> String {
    let at = e.event.at_ns.max(0) as u64;
    let opt = |v: Option<u64>| v.map_or("-".into(), |n| format!("{:.1}", timeline::ms(n)));
    format!(
        "event at_ms={:.1} first_after_ms={} stall_ms={} stall_end_ms={} back_ms={} baseline_ms={:.1} recovered={} label={}",
        timeline::ms_signed(e.event.at_ns),
        opt(e.first_after_ns),
        opt(e.stall.map(|g| g.len_ns())),
        opt(e.stall.map(|g| g.to_ns.saturating_sub(at))),
        opt(e.back_ns),
        timeline::ms(e.baseline_ns),
        if e.stall_closed { "yes" } else { "no" },
        e.event.label
    )
}

#[cfg(test)]
mod tests {
    use super::super::link::ErrorKind;
    use super::*;

    const MS: u64 = 1_000_000;

    fn recv(times_ms: &[u64]) -> RecvReport {
        RecvReport {
            start_ns: 0,
            end_ns: times_ms.last().copied().unwrap_or(0) * MS,
            posted: times_ms.len() as u64,
            messages: times_ms.len() as u64,
            bytes: 100 * times_ms.len() as u64,
            completions: times_ms
                .iter()
                .map(|&t| Completion {
                    t_ns: t * MS,
                    messages: 1,
                    bytes: 100,
                })
                .collect(),
            ..RecvReport::default()
        }
    }

    #[test]
    fn clean_stream() {
        let s = build(SendReport::default(), recv(&[1, 2, 3, 10]), 0, vec![], &[]);
        assert!(s.clean());
        assert_eq!(
            s.result_line(),
            "messages 4, bytes 400, lost 0, duplicated 0, corrupted 0, errors 0, max_stall_ms 7"
        );
        let j = s.json(&[("plugin", json_string("HA"))]);
        assert!(j.contains("\"plugin\": \"HA\""));
        assert!(j.contains("\"max_stall_ms\": 7.000"));
        assert!(j.contains("\"completions\": [[1.000, 1, 100], [2.000, 1, 100]"));
        assert!(j.contains("{\"from_ms\": 3.000, \"to_ms\": 10.000, \"ms\": 7.000}"));
        let opens = j.matches('{').count() + j.matches('[').count();
        let closes = j.matches('}').count() + j.matches(']').count();
        assert_eq!(opens, closes);
    }

    #[test]
    fn receiver_times_move_to_the_sender_clock_and_errors_end_the_stream() {
        let mut r = recv(&[1, 2, 3]);
        r.error = Some(SideError::new(
            503 * MS,
            ErrorKind::Request(6),
            "test(recv, op 3): ncclRemoteError (6)".into(),
        ));
        let sent = SendReport {
            error: Some(SideError::new(
                900 * MS,
                ErrorKind::Aborted,
                "aborted".into(),
            )),
            ..SendReport::default()
        };
        // The receiver started 10 ms after the sender.
        let ev = timeline::Event {
            at_ns: (100 * MS) as i64,
            label: "cut rail0/near".into(),
        };
        let s = build(sent, r, (10 * MS) as i64, vec![], &[ev]);
        assert_eq!(s.completions[0].t_ns, 11 * MS);
        assert_eq!(s.errors, 1, "an abort is not an error of its own");
        assert!(!s.clean());
        assert_eq!(s.end_ns, 513 * MS);
        // The stall that ended the stream: last completion (13 ms) to the error (513 ms).
        assert_eq!(
            s.max_stall.map(|g| (g.from_ns, g.to_ns)),
            Some((13 * MS, 513 * MS))
        );
        assert!(s.result_line().ends_with("errors 1, max_stall_ms 500"));
        let lines = s.lines();
        assert_eq!(
            lines[0],
            "event at_ms=100.0 first_after_ms=- stall_ms=500.0 stall_end_ms=413.0 back_ms=- baseline_ms=1.0 recovered=no label=cut rail0/near"
        );
        assert_eq!(
            lines[1],
            "stream: error: side B (receiver) at 513.0 ms: test(recv, op 3): ncclRemoteError (6)"
        );
        assert!(lines[2].starts_with("stream: stopped: side A (sender) at 900.0 ms"));
    }

    #[test]
    fn any_bad_count_or_no_traffic_is_not_clean() {
        for f in [
            |r: &mut RecvReport| r.lost = 1,
            |r: &mut RecvReport| r.duplicated = 1,
            |r: &mut RecvReport| r.reordered = 1,
            |r: &mut RecvReport| r.corrupted = 1,
            |r: &mut RecvReport| r.messages = 0,
        ] {
            let mut r = recv(&[1, 2]);
            f(&mut r);
            assert!(!build(SendReport::default(), r, 0, vec![], &[]).clean());
        }
        let extra = vec![Failure {
            side: "B (receiver)",
            at_ns: 0,
            what: "child exited without reporting".into(),
            counts: true,
        }];
        let s = build(SendReport::default(), recv(&[1, 2]), 0, extra, &[]);
        assert_eq!((s.errors, s.clean()), (1, false));
    }
}
