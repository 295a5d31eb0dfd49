//! The line protocol between a `--mode procs` parent and its child, carried over the child's
//! stdin and stdout. Protocol lines start with `@ha `; anything else a plugin prints on stdout
//! is passed through as log output.
//!
//! child → parent: `handle <hex>`, `case <idx> ok|fail <why>|fatal <why>`, `done`, `error <why>`
//! parent → child: `handle <hex>`, `abort`
//!
//! Each side sends `handle` twice: its listen handle, then an all-zero one as the barrier
//! before closing its comms.

use super::outcome::Outcome;
use nccl_net_abi::common::NCCL_NET_HANDLE_MAXSIZE;

pub const PREFIX: &str = "@ha ";

/// A connection handle as NCCL ships it between ranks.
pub type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];

#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    Handle(Handle),
    Case { idx: usize, outcome: Outcome },
    Done,
    Error(String),
    Abort,
}

pub fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn hex_decode_handle(s: &str) -> Result<Handle, String> {
    let s = s.trim();
    if s.len() != 2 * NCCL_NET_HANDLE_MAXSIZE {
        return Err(format!(
            "handle has {} hex digits, expected {}",
            s.len(),
            2 * NCCL_NET_HANDLE_MAXSIZE
        ));
    }
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    for (i, b) in h.iter_mut().enumerate() {
        let pair = s
            .get(2 * i..2 * i + 2)
            .ok_or_else(|| "handle is not ASCII hex".to_string())?;
        *b = u8::from_str_radix(pair, 16).map_err(|_| format!("bad hex digits '{pair}'"))?;
    }
    Ok(h)
}

/// Reasons travel on one line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

pub fn encode(m: &Msg) -> String {
    let body = match m {
        Msg::Handle(h) => format!("handle {}", hex_encode(h)),
        Msg::Case { idx, outcome } => match outcome {
            Outcome::Pass => format!("case {idx} ok"),
            Outcome::Fail(why) => format!("case {idx} fail {}", one_line(why)),
            Outcome::Fatal(why) => format!("case {idx} fatal {}", one_line(why)),
        },
        Msg::Done => "done".to_string(),
        Msg::Error(why) => format!("error {}", one_line(why)),
        Msg::Abort => "abort".to_string(),
    };
    format!("{PREFIX}{body}")
}

/// `None` for lines that are not protocol lines; `Some(Err)` for malformed protocol lines.
pub fn decode(line: &str) -> Option<Result<Msg, String>> {
    let body = line.trim_end_matches(['\n', '\r']).strip_prefix(PREFIX)?;
    let (word, rest) = body.split_once(' ').unwrap_or((body, ""));
    Some(match word {
        "handle" => hex_decode_handle(rest).map(Msg::Handle),
        "done" if rest.is_empty() => Ok(Msg::Done),
        "abort" if rest.is_empty() => Ok(Msg::Abort),
        "error" => Ok(Msg::Error(rest.to_string())),
        "case" => decode_case(rest),
        _ => Err(format!("malformed protocol line '{line}'")),
    })
}

fn decode_case(rest: &str) -> Result<Msg, String> {
    let bad = || format!("malformed case report '{rest}'");
    let (idx, rest) = rest.split_once(' ').ok_or_else(bad)?;
    let idx: usize = idx.parse().map_err(|_| bad())?;
    let (kind, why) = rest.split_once(' ').unwrap_or((rest, ""));
    let outcome = match kind {
        "ok" if why.is_empty() => Outcome::Pass,
        "fail" => Outcome::Fail(why.to_string()),
        "fatal" => Outcome::Fatal(why.to_string()),
        _ => return Err(bad()),
    };
    Ok(Msg::Case { idx, outcome })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        for (i, b) in h.iter_mut().enumerate() {
            *b = (i * 37) as u8;
        }
        let s = hex_encode(&h);
        assert_eq!(s.len(), 256);
        assert_eq!(&s[..6], "00254a");
        assert_eq!(hex_decode_handle(&s), Ok(h));
        assert!(hex_decode_handle(&s[2..])
            .unwrap_err()
            .contains("254 hex digits"));
        let bad = format!("zz{}", &s[2..]);
        assert!(hex_decode_handle(&bad).unwrap_err().contains("bad hex"));
    }

    #[test]
    fn messages_round_trip() {
        let msgs = [
            Msg::Handle([7u8; NCCL_NET_HANDLE_MAXSIZE]),
            Msg::Case {
                idx: 0,
                outcome: Outcome::Pass,
            },
            Msg::Case {
                idx: 12,
                outcome: Outcome::Fail("byte 3 is 0x01, expected 0x02".into()),
            },
            Msg::Case {
                idx: 5,
                outcome: Outcome::Fatal("isend: ncclSystemError (2)".into()),
            },
            Msg::Done,
            Msg::Error("dlopen x: no such file".into()),
            Msg::Abort,
        ];
        for m in msgs {
            let line = encode(&m);
            assert!(line.starts_with(PREFIX));
            assert!(!line.contains('\n'));
            assert_eq!(decode(&format!("{line}\n")), Some(Ok(m)));
        }
    }

    #[test]
    fn newlines_in_reasons_are_flattened() {
        let line = encode(&Msg::Error("a\nb".into()));
        assert_eq!(decode(&line), Some(Ok(Msg::Error("a b".into()))));
    }

    #[test]
    fn foreign_and_malformed_lines() {
        assert_eq!(decode("NET/HA : INFO something"), None);
        assert_eq!(decode(""), None);
        assert!(matches!(decode("@ha bogus"), Some(Err(_))));
        assert!(matches!(decode("@ha case x ok"), Some(Err(_))));
        assert!(matches!(decode("@ha case 1 maybe"), Some(Err(_))));
        assert!(matches!(decode("@ha case 1 ok trailing"), Some(Err(_))));
        assert!(matches!(decode("@ha handle 00"), Some(Err(_))));
    }
}
