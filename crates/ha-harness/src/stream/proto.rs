//! Stream lines between a `--mode procs` parent (side A) and its child (side B), next to the
//! `@ha handle` lines of [`crate::wire`] that carry the connection handles. Stream
//! lines start with `@hs `:
//!
//! parent → child: `stop <P>` (the sender started P operations and asks to stop)
//! child → parent: `stopped <L>` (both sides run L operations), then at the end the report:
//! `report k=v ...`, `problem <text>`, `error <kind> <at_ns> <text>`, `rx <t>,<n>,<b> ...`
//! (completions, in batches), and `end`.

use super::link::{ErrorKind, SideError};
use super::receiver::{Completion, RecvReport};

pub const PREFIX: &str = "@hs ";
/// Completions per `rx` line.
const RX_BATCH: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Stop(u64),
    Stopped(u64),
    Report(Vec<(String, u64)>),
    Problem(String),
    Error(SideError),
    Rx(Vec<Completion>),
    End,
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

pub fn encode(l: &Line) -> String {
    let body = match l {
        Line::Stop(p) => format!("stop {p}"),
        Line::Stopped(l) => format!("stopped {l}"),
        Line::Report(kv) => {
            let fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("report {}", fields.join(" "))
        }
        Line::Problem(p) => format!("problem {}", one_line(p)),
        Line::Error(e) => format!("error {} {} {}", e.kind.word(), e.at_ns, one_line(&e.what)),
        Line::Rx(cs) => {
            let items: Vec<String> = cs
                .iter()
                .map(|c| format!("{},{},{}", c.t_ns, c.messages, c.bytes))
                .collect();
            format!("rx {}", items.join(" "))
        }
        Line::End => "end".to_string(),
    };
    format!("{PREFIX}{body}")
}

/// `None` for lines that are not stream lines; `Some(Err)` for malformed ones.
pub fn decode(line: &str) -> Option<Result<Line, String>> {
    let body = line.trim_end_matches(['\n', '\r']).strip_prefix(PREFIX)?;
    let (word, rest) = body.split_once(' ').unwrap_or((body, ""));
    let bad = || format!("malformed stream line '{line}'");
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    Some(match word {
        "stop" => num(rest).map(Line::Stop),
        "stopped" => num(rest).map(Line::Stopped),
        "end" if rest.is_empty() => Ok(Line::End),
        "problem" => Ok(Line::Problem(rest.to_string())),
        "report" => rest
            .split_whitespace()
            .map(|f| {
                let (k, v) = f.split_once('=').ok_or_else(bad)?;
                Ok((k.to_string(), num(v)?))
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Line::Report),
        "error" => (|| {
            let mut it = rest.splitn(3, ' ');
            let kind = ErrorKind::from_word(it.next().ok_or_else(bad)?).ok_or_else(bad)?;
            let at_ns = num(it.next().ok_or_else(bad)?)?;
            let what = it.next().unwrap_or("").to_string();
            Ok(Line::Error(SideError { at_ns, kind, what }))
        })(),
        "rx" => rest
            .split_whitespace()
            .map(|item| {
                let mut f = item.split(',');
                let (Some(t), Some(n), Some(b), None) = (f.next(), f.next(), f.next(), f.next())
                else {
                    return Err(bad());
                };
                Ok(Completion {
                    t_ns: num(t)?,
                    messages: u32::try_from(num(n)?).map_err(|_| bad())?,
                    bytes: num(b)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Line::Rx),
        _ => Err(bad()),
    })
}

/// The lines that carry a receiver report, ending with `end`.
pub fn report_lines(r: &RecvReport) -> Vec<String> {
    let kv = [
        ("start_ns", r.start_ns),
        ("end_ns", r.end_ns),
        ("posted", r.posted),
        ("messages", r.messages),
        ("bytes", r.bytes),
        ("lost", r.lost),
        ("duplicated", r.duplicated),
        ("reordered", r.reordered),
        ("corrupted", r.corrupted),
    ];
    let mut out = vec![encode(&Line::Report(
        kv.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    ))];
    if let Some(p) = &r.first_problem {
        out.push(encode(&Line::Problem(p.clone())));
    }
    if let Some(e) = &r.error {
        out.push(encode(&Line::Error(e.clone())));
    }
    for chunk in r.completions.chunks(RX_BATCH) {
        out.push(encode(&Line::Rx(chunk.to_vec())));
    }
    out.push(encode(&Line::End));
    out
}

/// Rebuilds a receiver report from its lines (fed one by one).
#[derive(Debug, Default)]
pub struct ReportBuilder {
    report: RecvReport,
    have_report: bool,
}

impl ReportBuilder {
    /// Takes one decoded line; returns the report after `end`.
    pub fn feed(&mut self, l: Line) -> Result<Option<RecvReport>, String> {
        let r = &mut self.report;
        match l {
            Line::Report(kv) => {
                for (k, v) in kv {
                    let field = match k.as_str() {
                        "start_ns" => &mut r.start_ns,
                        "end_ns" => &mut r.end_ns,
                        "posted" => &mut r.posted,
                        "messages" => &mut r.messages,
                        "bytes" => &mut r.bytes,
                        "lost" => &mut r.lost,
                        "duplicated" => &mut r.duplicated,
                        "reordered" => &mut r.reordered,
                        "corrupted" => &mut r.corrupted,
                        _ => continue,
                    };
                    *field = v;
                }
                self.have_report = true;
            }
            Line::Problem(p) => r.first_problem = Some(p),
            Line::Error(e) => r.error = Some(e),
            Line::Rx(cs) => r.completions.extend(cs),
            Line::End if self.have_report => return Ok(Some(std::mem::take(r))),
            Line::End => return Err("receiver report ended without its counts".into()),
            Line::Stop(_) | Line::Stopped(_) => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> RecvReport {
        RecvReport {
            start_ns: 123_456_789_012,
            end_ns: 5_000_000_000,
            posted: 1000,
            messages: 990,
            bytes: 1 << 33,
            lost: 1,
            duplicated: 2,
            reordered: 3,
            corrupted: 4,
            first_problem: Some("slot of message 7:\nbyte 3".into()),
            completions: (0..150)
                .map(|i| Completion {
                    t_ns: i * 1_000_003,
                    messages: 1 + (i % 8) as u32,
                    bytes: i * 4099,
                })
                .collect(),
            error: Some(SideError {
                at_ns: 4_999_000_000,
                kind: ErrorKind::Request(6),
                what: "test(recv, op 12): ncclRemoteError (6)".into(),
            }),
        }
    }

    #[test]
    fn report_round_trip() {
        let r = report();
        let lines = report_lines(&r);
        assert_eq!(lines.len(), 1 + 1 + 1 + 3 + 1);
        let mut b = ReportBuilder::default();
        let mut got = None;
        for l in &lines {
            assert!(!l.contains('\n'));
            let decoded = decode(l).unwrap().unwrap();
            if let Some(r) = b.feed(decoded).unwrap() {
                got = Some(r);
            }
        }
        let mut want = r;
        want.first_problem = Some("slot of message 7: byte 3".into());
        assert_eq!(got, Some(want));
        // A clean, empty report.
        let lines = report_lines(&RecvReport::default());
        let mut b = ReportBuilder::default();
        let last = lines
            .iter()
            .map(|l| b.feed(decode(l).unwrap().unwrap()).unwrap())
            .last();
        assert_eq!(last, Some(Some(RecvReport::default())));
    }

    #[test]
    fn control_lines() {
        for l in [Line::Stop(5), Line::Stopped(37), Line::End] {
            assert_eq!(decode(&encode(&l)), Some(Ok(l)));
        }
        assert_eq!(decode("@ha handle 00"), None);
        assert_eq!(decode("plugin log line"), None);
        for bad in [
            "@hs stop x",
            "@hs bogus",
            "@hs rx 1,2",
            "@hs rx 1,2,3,4",
            "@hs report a",
            "@hs error nope 1 x",
            "@hs end x",
        ] {
            assert!(matches!(decode(bad), Some(Err(_))), "{bad}");
        }
        let mut b = ReportBuilder::default();
        assert!(b.feed(Line::End).is_err());
    }
}
