//! What a run leaves behind, read for the picture: stats files (periodic and event lines of
//! the plugin, and event lines a drill script appended), side files of events (JSON lines with
//! `unix_ms`, or a stream's `<CLOCK_MONOTONIC ns> <label>` lines), a harness stream's JSON
//! (its completion timeline), and NCCL logs (the plugin's NET/HA lines, counted).

use crate::stats::record::{self, Record};
use serde_json::Value;

/// A harness stream's completions on the wall clock.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stream {
    /// The stream's start: ms since the Unix epoch, and on `CLOCK_MONOTONIC` (ns).
    pub start_unix_ms: f64,
    pub start_monotonic_ns: u64,
    /// (ms since the start, bytes) per receiver completion.
    pub completions: Vec<(f64, u64)>,
    /// When it ended (ms since the start).
    pub end_ms: f64,
    pub clean: bool,
    /// lost, duplicated, corrupted, errors.
    pub counts: [u64; 4],
    pub messages: u64,
}

/// What NCCL's log says of the plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclLog {
    pub failovers: usize,
    pub rearmed: usize,
    pub standby_lost: usize,
    pub lost: usize,
}

#[derive(Debug, Default)]
pub struct Inputs {
    pub records: Vec<Record>,
    pub stream: Option<Stream>,
    pub nccl: Option<NcclLog>,
    /// Lines that could not be read: (file, line, why).
    pub bad: Vec<(String, usize, String)>,
}

impl Inputs {
    /// A stats file (or a side file of JSON event lines).
    pub fn add_stats(&mut self, name: &str, text: &str) {
        let (recs, bad) = record::parse_all(text);
        self.records.extend(recs);
        self.bad
            .extend(bad.into_iter().map(|(l, e)| (name.to_string(), l, e)));
    }

    /// A side file of events: JSON lines, or `<CLOCK_MONOTONIC ns> <label>` lines (placed on
    /// the wall clock through the stream's start, so the stream must be read first).
    pub fn add_events(&mut self, name: &str, text: &str) -> Result<(), String> {
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with('{') {
                match record::parse(line) {
                    Ok(Some(r)) => self.records.push(r),
                    Ok(None) => {}
                    Err(e) => self.bad.push((name.to_string(), i + 1, e)),
                }
                continue;
            }
            let (ns, label) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let ns: u64 = ns.parse().map_err(|_| {
                format!(
                    "{name} line {}: neither JSON nor '<monotonic ns> <label>'",
                    i + 1
                )
            })?;
            let s = self.stream.as_ref().ok_or_else(|| {
                format!("{name}: CLOCK_MONOTONIC times need --stream-timeline (the stream's start places them)")
            })?;
            let unix = s.start_unix_ms + (ns as f64 - s.start_monotonic_ns as f64) / 1e6;
            let label = label.trim();
            let event = label.split_whitespace().next().unwrap_or("event");
            let mut fields = serde_json::Map::new();
            fields.insert("label".into(), Value::String(label.to_string()));
            self.records.push(Record {
                event: event.to_string(),
                unix_ms: unix.max(0.0).round() as u64,
                conn: None,
                fields,
            });
        }
        Ok(())
    }

    /// A harness stream's JSON (`ha-harness stream --json`).
    pub fn add_stream(&mut self, name: &str, text: &str) -> Result<(), String> {
        self.stream = Some(parse_stream(text).map_err(|e| format!("{name}: {e}"))?);
        Ok(())
    }

    /// An NCCL log: count the plugin's failover, re-arm, standby-loss and lost-connection lines.
    pub fn add_nccl_log(&mut self, text: &str) {
        let n = self.nccl.get_or_insert_with(NcclLog::default);
        for l in text.lines().filter(|l| l.contains("NET/HA")) {
            if l.contains("NET/HA : failover ") {
                n.failovers += 1;
            } else if l.contains("re-armed as the standby") {
                n.rearmed += 1;
            } else if l.contains("standby path") && l.contains(" lost (") {
                n.standby_lost += 1;
            } else if l.contains("connection lost") {
                n.lost += 1;
            }
        }
    }
}

fn parse_stream(text: &str) -> Result<Stream, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let num = |k: &str| v.get(k).and_then(Value::as_f64);
    let start_unix_ms = num("start_unix_ms").ok_or(
        "no start_unix_ms (written by ha-harness stream since the timeline command; rerun the stream)",
    )?;
    let completions = v
        .get("completions")
        .and_then(Value::as_array)
        .ok_or("no completion list (a stream with more than 200000 completions lists none)")?
        .iter()
        .filter_map(|c| {
            let c = c.as_array()?;
            Some((c.first()?.as_f64()?, c.get(2)?.as_u64()?))
        })
        .collect();
    let count = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    Ok(Stream {
        start_unix_ms,
        start_monotonic_ns: count("start_monotonic_ns"),
        completions,
        end_ms: num("end_ms").unwrap_or(0.0),
        clean: v.get("clean").and_then(Value::as_bool).unwrap_or(false),
        counts: [
            count("lost"),
            count("duplicated"),
            count("corrupted"),
            count("errors"),
        ],
        messages: count("messages"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = r#"{"plugin": "HA", "start_monotonic_ns": 5000000000, "start_unix_ms": 1700000000000.500,
        "clean": true, "messages": 3, "lost": 0, "duplicated": 0, "corrupted": 0, "errors": 0, "end_ms": 30.0,
        "completions": [[1.5, 1, 100], [2.0, 2, 300], [29.0, 1, 5]]}"#;

    #[test]
    fn a_stream_and_its_monotonic_events_on_the_wall_clock() {
        let mut i = Inputs::default();
        assert!(i
            .add_events("ev", "5001000000 cut rail0/near\n")
            .unwrap_err()
            .contains("--stream-timeline"));
        i.add_stream("s.json", STREAM).unwrap();
        let s = i.stream.clone().unwrap();
        assert_eq!(s.completions, [(1.5, 100), (2.0, 300), (29.0, 5)]);
        assert!(s.clean && s.messages == 3 && s.end_ms == 30.0);
        i.add_events(
            "ev",
            "# drill\n5001000000 cut rail0/near\n{\"event\":\"restore\",\"unix_ms\":1700000000900,\"rail\":0}\n",
        )
        .unwrap();
        assert_eq!(i.records.len(), 2);
        assert_eq!(
            (i.records[0].event.as_str(), i.records[0].unix_ms),
            ("cut", 1_700_000_000_002)
        );
        assert_eq!(i.records[0].label(), "cut rail0/near");
        assert_eq!(i.records[1].label(), "restore rail 0");
        assert!(i
            .add_events("ev", "12x cut\n")
            .unwrap_err()
            .contains("line 1"));
        assert!(i
            .add_stream("t", "{}")
            .unwrap_err()
            .contains("start_unix_ms"));
    }

    #[test]
    fn nccl_log_lines_counted() {
        let mut i = Inputs::default();
        i.add_nccl_log(
            "h:1:2 [0] NCCL WARN NET/HA : failover send [..]: path 0 (dev 0) -> path 1 (dev 1), cause: x, replayed 2, took 5 us\n\
             h:1:2 [0] NCCL INFO NET/HA : send [..]: path 0 re-armed as the standby (verified)\n\
             h:1:2 [0] NCCL WARN NET/HA : recv [..]: standby path 1 lost (probe); redundancy lost until it is re-armed\n\
             h:1:2 [0] NCCL INFO something else\n",
        );
        assert_eq!(
            i.nccl,
            Some(NcclLog {
                failovers: 1,
                rearmed: 1,
                standby_lost: 1,
                lost: 0
            })
        );
    }
}
