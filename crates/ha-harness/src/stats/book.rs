//! What a stats file says about each connection, folded line by line: where it stands (active
//! path, standby, phase), its counters, its last failover, and whether it still lives.

use super::record::{ConnKey, Record};
use std::collections::BTreeMap;

/// The last failover of a connection, from its `failover` event (or, without one, from the
/// counters' `last_failover_*`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastFailover {
    pub unix_ms: u64,
    pub from: Option<u64>,
    pub to: Option<u64>,
    pub cause: String,
    /// Work waiting (or detection) to the switch, ms.
    pub stall_ms: Option<u64>,
    /// Detection to the switch, µs.
    pub took_us: u64,
    pub replayed: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conn {
    pub key: Option<ConnKey>,
    pub comm: String,
    pub role: String,
    pub devices: Vec<String>,
    pub active: u64,
    pub phase: String,
    pub standby: String,
    pub bytes: Vec<u64>,
    pub failovers: u64,
    pub rearms: u64,
    /// Re-arm attempts that failed (the standby's rail still down, say).
    pub rearm_failed: u64,
    pub standby_lost: u64,
    pub replays: u64,
    pub last_failover: Option<LastFailover>,
    /// When the standby was last lost (an event or a change seen in periodic lines).
    pub standby_lost_at: Option<u64>,
    pub first_ms: u64,
    pub last_ms: u64,
    /// `interval_ms` of its periodic lines (0: none seen).
    pub interval_ms: u64,
    pub closed: bool,
}

impl Conn {
    /// Running without a standby: a second failure would end it.
    pub fn exposed(&self) -> bool {
        !self.closed
            && (matches!(self.standby.as_str(), "lost" | "rearming" | "none")
                || self.phase == "dead")
    }

    /// Live but silent for more than three intervals (its process may be gone).
    pub fn stale(&self, now_ms: u64) -> bool {
        !self.closed
            && self.interval_ms > 0
            && now_ms.saturating_sub(self.last_ms) > 3 * self.interval_ms + 1000
    }

    /// The device of path `i` (or the index).
    pub fn dev(&self, i: u64) -> String {
        self.devices
            .get(i as usize)
            .cloned()
            .unwrap_or_else(|| format!("path {i}"))
    }
}

/// Every connection of a file, and the events that belong to none (a drill's cuts).
#[derive(Debug, Default)]
pub struct Book {
    pub conns: BTreeMap<ConnKey, Conn>,
    /// Closing lines without a connection key (the format before events).
    pub anonymous: Vec<Conn>,
    pub events: Vec<Record>,
    pub last_ms: u64,
}

impl Book {
    pub fn feed(&mut self, r: &Record) {
        self.last_ms = self.last_ms.max(r.unix_ms);
        let Some(key) = r.conn.clone() else {
            if r.event == "closed" {
                let mut c = Conn::default();
                apply(&mut c, r);
                self.anonymous.push(c);
            } else {
                self.events.push(r.clone());
            }
            return;
        };
        let c = self.conns.entry(key.clone()).or_insert_with(|| Conn {
            key: Some(key),
            first_ms: r.unix_ms,
            standby: "verifying".into(),
            phase: "normal".into(),
            ..Conn::default()
        });
        apply(c, r);
    }

    /// Live connections first (by process and number), then closed ones.
    pub fn ordered(&self) -> Vec<&Conn> {
        let mut v: Vec<&Conn> = self.conns.values().chain(&self.anonymous).collect();
        v.sort_by_key(|c| c.closed);
        v
    }
}

/// Fold one line of a connection into what is known of it.
fn apply(c: &mut Conn, r: &Record) {
    c.last_ms = c.last_ms.max(r.unix_ms);
    if let Some(s) = r.str("comm") {
        c.comm = s.to_string();
    }
    if let Some(s) = r.str("role") {
        c.role = s.to_string();
    }
    let devs = r.strs("devices");
    if !devs.is_empty() {
        c.devices = devs;
    }
    match r.event.as_str() {
        "periodic" | "closed" => {
            let was = c.standby.clone();
            if let Some(v) = r.u64("active") {
                c.active = v;
            }
            if let Some(s) = r.str("standby") {
                c.standby = s.to_string();
            }
            if let Some(s) = r.str("phase") {
                c.phase = s.to_string();
            }
            if c.standby != was && matches!(c.standby.as_str(), "lost" | "rearming") {
                c.standby_lost_at.get_or_insert(r.unix_ms);
            }
            if c.standby == "ok" {
                c.standby_lost_at = None;
            }
            let b = r.nums("bytes");
            if !b.is_empty() {
                c.bytes = b;
            }
            for (k, f) in [
                ("failovers", &mut c.failovers),
                ("rearms", &mut c.rearms),
                ("rearm_failed", &mut c.rearm_failed),
                ("standby_lost", &mut c.standby_lost),
                ("replays", &mut c.replays),
            ] {
                if let Some(v) = r.u64(k) {
                    *f = v;
                }
            }
            if let Some(i) = r.u64("interval_ms") {
                c.interval_ms = i;
            }
            let at = r.u64("last_failover_unix_ms").unwrap_or(0);
            if at > 0
                && c.last_failover
                    .as_ref()
                    .is_none_or(|l| l.unix_ms + 1000 < at)
            {
                c.last_failover = Some(LastFailover {
                    unix_ms: at,
                    took_us: r.u64("last_failover_us").unwrap_or(0),
                    ..LastFailover::default()
                });
            }
            if r.event == "closed" {
                c.closed = true;
            }
        }
        "failover" => {
            c.failovers = r.u64("failovers").unwrap_or(c.failovers + 1);
            if let Some(to) = r.u64("to") {
                c.active = to;
            }
            c.standby = "lost".into();
            c.standby_lost_at = Some(r.unix_ms);
            c.last_failover = Some(LastFailover {
                unix_ms: r.unix_ms,
                from: r.u64("from"),
                to: r.u64("to"),
                cause: r.str("cause").unwrap_or("").to_string(),
                stall_ms: r.u64("stall_ms"),
                took_us: r.u64("took_us").unwrap_or(0),
                replayed: r.u64("replayed"),
            });
        }
        "lost" => {
            c.phase = "dead".into();
        }
        "standby_lost" => {
            c.standby_lost += 1;
            c.standby = "lost".into();
            c.standby_lost_at.get_or_insert(r.unix_ms);
        }
        "switch" if r.str("kind") != Some("failover") => {
            // A planned switch (return home, drain): only the active path changes.
            if let Some(to) = r.u64("to") {
                c.active = to;
            }
        }
        "rearmed" => {
            c.rearms = r.u64("rearms").unwrap_or(c.rearms + 1);
            c.standby = "ok".into();
            c.standby_lost_at = None;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::parse;
    use super::*;

    fn book(lines: &[&str]) -> Book {
        let mut b = Book::default();
        for l in lines {
            b.feed(&parse(l).unwrap().unwrap());
        }
        b
    }

    const ID: &str = r#""host":"h","pid":1,"conn":2,"comm":"send [x]","role":"send""#;

    #[test]
    fn a_failover_then_a_rearm() {
        let open = format!(r#"{{"event":"open","unix_ms":1000,{ID},"devices":["r0","r1"]}}"#);
        let per = |t: u64, a: u64, sb: &str, b0: u64, b1: u64| {
            format!(
                r#"{{"event":"periodic","unix_ms":{t},{ID},"interval_ms":100,"active":{a},"standby":"{sb}","phase":"normal","bytes":[{b0},{b1}],"failovers":{},"rearms":0}}"#,
                u64::from(a == 1)
            )
        };
        let fo = format!(
            r#"{{"event":"failover","unix_ms":1500,{ID},"from":0,"to":1,"cause":"port down","stall_ms":420,"took_us":3000,"replayed":3,"failovers":1}}"#
        );
        let p1 = per(1100, 0, "ok", 100, 0);
        let p2 = per(1600, 1, "lost", 150, 50);
        let b = book(&[&open, &p1, &fo, &p2]);
        let c = b.conns.values().next().unwrap();
        assert_eq!((c.active, c.standby.as_str(), c.failovers), (1, "lost", 1));
        assert_eq!(c.bytes, [150, 50]);
        assert_eq!(c.devices, ["r0", "r1"]);
        assert!(c.exposed());
        assert_eq!(c.standby_lost_at, Some(1500));
        let lf = c.last_failover.clone().unwrap();
        assert_eq!(
            (lf.unix_ms, lf.cause.as_str(), lf.stall_ms, lf.replayed),
            (1500, "port down", Some(420), Some(3))
        );
        // The periodic line's counters do not replace the event's details.
        assert_eq!(lf.from, Some(0));
        assert!(!c.stale(1600 + 1300) && c.stale(1600 + 1301));
        let re = format!(r#"{{"event":"rearmed","unix_ms":3000,{ID},"path":0,"rearms":1}}"#);
        let b = book(&[&open, &p1, &fo, &p2, &re]);
        let c = b.conns.values().next().unwrap();
        assert_eq!((c.standby.as_str(), c.rearms), ("ok", 1));
        assert!(!c.exposed() && c.standby_lost_at.is_none());
        let closed = format!(
            r#"{{"event":"closed","unix_ms":4000,{ID},"active":1,"standby":"ok","bytes":[150,900],"failovers":1,"rearms":1}}"#
        );
        let b = book(&[
            &open,
            &p1,
            &fo,
            &p2,
            &re,
            &closed,
            r#"{"event":"cut","unix_ms":1400,"rail":0}"#,
        ]);
        let c = b.conns.values().next().unwrap();
        assert!(c.closed && !c.stale(99_999));
        assert_eq!(b.events.len(), 1);
        assert_eq!(b.last_ms, 4000);
    }

    #[test]
    fn single_path_and_old_lines() {
        let b = book(&[
            &format!(
                r#"{{"event":"periodic","unix_ms":1,{ID},"active":0,"standby":"none","phase":"normal"}}"#
            ),
            r#"{"comm":"old","role":"recv","failovers":2,"bytes":[1,2]}"#,
        ]);
        let o = b.ordered();
        assert_eq!(o.len(), 2);
        assert!(o[0].exposed(), "one path: no standby");
        assert!(o[1].closed && o[1].failovers == 2 && o[1].comm == "old");
    }
}
