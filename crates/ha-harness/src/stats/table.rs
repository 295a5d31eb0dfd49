//! The report of `ha-harness stats`: a header, a warning naming every live connection that runs
//! without a standby, one row per connection (process, connection, role, active path, standby,
//! failovers, re-arms, bytes per path, last failover, comm), and the events of drill scripts.

use super::book::{Book, Conn};
use super::units::{bytes, duration_ms, utc, utc_time};

/// Rows listed in the warning before "and N more".
const WARN_ROWS: usize = 20;

/// The report at `now_ms`; `all` lists closed connections too (they are listed anyway when
/// none lives).
pub fn report(book: &Book, file: &str, now_ms: u64, all: bool) -> String {
    let conns = book.ordered();
    let live = conns.iter().filter(|c| !c.closed).count();
    let mut out = format!(
        "stats {file}: {} connection(s), {live} live, {} closed",
        conns.len(),
        conns.len() - live
    );
    if book.last_ms > 0 {
        out += &format!(
            "; last line {} UTC ({} ago)",
            utc(book.last_ms),
            duration_ms(now_ms.saturating_sub(book.last_ms))
        );
    }
    out.push('\n');
    let exposed: Vec<&&Conn> = conns.iter().filter(|c| c.exposed()).collect();
    if !exposed.is_empty() {
        out += &format!(
            "WARNING: {} live connection(s) run WITHOUT A STANDBY (one more failure ends them):\n",
            exposed.len()
        );
        for c in exposed.iter().take(WARN_ROWS) {
            out += &format!("  {} {}: {}\n", who(c), c.comm, exposure(c, now_ms));
        }
        if exposed.len() > WARN_ROWS {
            out += &format!("  ... and {} more\n", exposed.len() - WARN_ROWS);
        }
    }
    let stale = conns.iter().filter(|c| c.stale(now_ms)).count();
    if stale > 0 {
        out += &format!(
            "NOTE: {stale} connection(s) without a line for over 3 intervals and never closed (process gone, or the file is not this job's)\n"
        );
    }
    let shown: Vec<&&Conn> = conns
        .iter()
        .filter(|c| all || live == 0 || !c.closed)
        .collect();
    let mut rows = vec![[
        "PROCESS",
        "CONN",
        "ROLE",
        "ACTIVE",
        "STANDBY",
        "FAILOVERS",
        "RE-ARMS",
        "BYTES PATH 0 / PATH 1",
        "LAST FAILOVER",
        "COMM",
    ]
    .map(String::from)];
    for c in &shown {
        rows.push(row(c, now_ms));
    }
    out += &align(&rows);
    if shown.len() < conns.len() {
        out += &format!(
            "({} closed connection(s) not listed: --all lists them)\n",
            conns.len() - shown.len()
        );
    }
    if !book.events.is_empty() {
        let ev: Vec<String> = book
            .events
            .iter()
            .rev()
            .take(10)
            .rev()
            .map(|e| format!("{} {}", utc_time(e.unix_ms), e.label()))
            .collect();
        out += &format!("events: {}\n", ev.join("; "));
    }
    out
}

fn who(c: &Conn) -> String {
    match &c.key {
        Some(k) => format!("{} conn {}", k.process(), k.conn),
        None => "(closed, old format)".into(),
    }
}

/// Why a connection has no standby, and since when.
fn exposure(c: &Conn, now_ms: u64) -> String {
    let mut s = match (c.phase.as_str(), c.standby.as_str()) {
        ("dead", _) => "connection lost (every path failed)".to_string(),
        (_, "none") => "one path only (no standby configured or the peer has none)".to_string(),
        (_, "rearming") => "standby lost, re-arm under way".to_string(),
        _ => "standby lost".to_string(),
    };
    if let Some(t) = c.standby_lost_at {
        s += &format!(
            " since {} ({})",
            utc_time(t),
            duration_ms(now_ms.saturating_sub(t))
        );
    }
    s + &format!(", traffic on path {} ({})", c.active, c.dev(c.active))
}

fn row(c: &Conn, now_ms: u64) -> [String; 10] {
    let (process, conn) = match &c.key {
        Some(k) => (k.process(), k.conn.to_string()),
        None => ("-".into(), "-".into()),
    };
    let mut standby = if c.exposed() {
        c.standby.to_uppercase()
    } else {
        c.standby.clone()
    };
    if c.phase == "failing" {
        standby += " (switching)";
    }
    if c.phase == "dead" {
        standby = "DEAD".into();
    }
    if c.closed {
        standby += ", closed";
    } else if c.stale(now_ms) {
        standby += &format!(", silent {}", duration_ms(now_ms.saturating_sub(c.last_ms)));
    }
    let b = |i: usize| bytes(c.bytes.get(i).copied().unwrap_or(0));
    [
        process,
        conn,
        c.role.clone(),
        format!("{} ({})", c.active, c.dev(c.active)),
        standby,
        c.failovers.to_string(),
        if c.rearm_failed > 0 {
            format!("{} ({} failed)", c.rearms, c.rearm_failed)
        } else {
            c.rearms.to_string()
        },
        format!("{} / {}", b(0), b(1)),
        last_failover(c, now_ms),
        c.comm.clone(),
    ]
}

fn last_failover(c: &Conn, now_ms: u64) -> String {
    let Some(f) = &c.last_failover else {
        return "-".into();
    };
    let mut s = format!(
        "{} ({} ago)",
        utc_time(f.unix_ms),
        duration_ms(now_ms.saturating_sub(f.unix_ms))
    );
    if let (Some(a), Some(b)) = (f.from, f.to) {
        s += &format!(" {a}->{b}");
    }
    if !f.cause.is_empty() {
        let cause: String = f.cause.chars().take(48).collect();
        let more = if f.cause.chars().count() > 48 {
            "..."
        } else {
            ""
        };
        s += &format!(" {cause}{more}");
    }
    match f.stall_ms {
        Some(st) => s += &format!(", stall {st} ms"),
        None if f.took_us > 0 => s += &format!(", switch {} ms", f.took_us / 1000),
        None => {}
    }
    if let Some(r) = f.replayed {
        s += &format!(", replayed {r}");
    }
    s
}

/// Columns padded to their widest cell (the last one not padded).
fn align(rows: &[[String; 10]]) -> String {
    let mut w = [0usize; 10];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == r.len() {
                    c.clone()
                } else {
                    format!("{c:<width$}", width = w[i])
                }
            })
            .collect();
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::record::parse;
    use super::*;

    #[test]
    fn a_connection_without_standby_is_flagged_with_its_failover() {
        let id = r#""host":"n1","pid":42,"conn":7,"comm":"send [dev 0 qp 5 | dev 1 qp 6]","role":"send","devices":["mlx5_0","mlx5_1"]"#;
        let mut b = Book::default();
        for l in [
            format!(r#"{{"event":"open","unix_ms":1000,{id}}}"#),
            format!(
                r#"{{"event":"failover","unix_ms":61000,{id},"from":0,"to":1,"cause":"port of device 0 is down (asynchronous event)","stall_ms":312,"took_us":2100,"replayed":3,"failovers":1}}"#
            ),
            format!(
                r#"{{"event":"periodic","unix_ms":62000,{id},"interval_ms":10000,"active":1,"standby":"lost","phase":"normal","bytes":[1073741824,524288000],"failovers":1,"rearms":0}}"#
            ),
            r#"{"event":"cut","unix_ms":60700,"rail":0,"end":"near"}"#.to_string(),
            r#"{"event":"closed","unix_ms":5000,"host":"n1","pid":42,"conn":8,"comm":"recv [x]","role":"recv","active":0,"standby":"ok","bytes":[5,0],"failovers":0,"rearms":0}"#.to_string(),
        ] {
            b.feed(&parse(&l).unwrap().unwrap());
        }
        let r = report(&b, "s.jsonl", 64000, false);
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(
            lines[0],
            "stats s.jsonl: 2 connection(s), 1 live, 1 closed; last line 1970-01-01 00:01:02.000 UTC (2.0 s ago)"
        );
        assert_eq!(
            lines[1],
            "WARNING: 1 live connection(s) run WITHOUT A STANDBY (one more failure ends them):"
        );
        assert_eq!(
            lines[2],
            "  n1:42 conn 7 send [dev 0 qp 5 | dev 1 qp 6]: standby lost since 00:01:01.000 (3.0 s), traffic on path 1 (mlx5_1)"
        );
        assert!(
            lines[3].starts_with("PROCESS  CONN  ROLE  ACTIVE"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("n1:42    7     send  1 (mlx5_1)  LOST     1"),
            "{}",
            lines[4]
        );
        assert!(
            lines[4].contains("1.00 GiB / 500.0 MiB   00:01:01.000 (3.0 s ago) 0->1 port of device 0 is down (asynchronous event), stall 312 ms, replayed 3  send [dev 0"),
            "{}",
            lines[4]
        );
        assert_eq!(
            lines[5],
            "(1 closed connection(s) not listed: --all lists them)"
        );
        assert_eq!(lines[6], "events: 00:01:00.700 cut rail 0 (near)");
        let all = report(&b, "s.jsonl", 64000, true);
        assert!(all.contains("ok, closed"), "{all}");
        // Silent for over three intervals: noted.
        let later = report(&b, "s.jsonl", 62000 + 31_001, false);
        assert!(
            later.contains("NOTE: 1 connection(s) without a line"),
            "{later}"
        );
        assert!(later.contains("LOST, silent 31.0 s"), "{later}");
    }
}
