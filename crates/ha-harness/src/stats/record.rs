//! One line of a stats file (`HA_NCCL_STATS_FILE`, or a drill's side file of events) as a
//! record: its event, its wall-clock time, the connection it belongs to (none for events a
//! script wrote, such as a link cut), and every field as JSON. Fields a reader does not know
//! are kept and ignored; a line of the format before events (no `"event"`) is a closing line.

use serde_json::{Map, Value};

/// Which connection: host, process and the process's connection number.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnKey {
    pub host: String,
    pub pid: u64,
    pub conn: u64,
}

impl ConnKey {
    /// `host:pid` (just `pid` without a host name).
    pub fn process(&self) -> String {
        if self.host.is_empty() {
            self.pid.to_string()
        } else {
            format!("{}:{}", self.host, self.pid)
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub event: String,
    /// Wall-clock time, ms since the Unix epoch (0: the line had none).
    pub unix_ms: u64,
    /// The connection (`None`: a process-wide or script event).
    pub conn: Option<ConnKey>,
    pub fields: Map<String, Value>,
}

impl Record {
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// A field as text: strings as they are, numbers and the rest as JSON.
    pub fn text(&self, key: &str) -> Option<String> {
        self.fields.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        })
    }

    /// An array of numbers (missing entries as 0).
    pub fn nums(&self, key: &str) -> Vec<u64> {
        self.fields
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_u64().unwrap_or(0)).collect())
            .unwrap_or_default()
    }

    /// An array of strings.
    pub fn strs(&self, key: &str) -> Vec<String> {
        self.fields
            .get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What a person calls this event: its `label`, else the event and its rail or path.
    pub fn label(&self) -> String {
        if let Some(l) = self.str("label").filter(|l| !l.is_empty()) {
            return l.to_string();
        }
        if self.event == "switch" {
            // A planned switch of the plugin (`kind` return or drain): say which and where.
            let kind = match self.str("kind") {
                Some("return") => "return home",
                Some(k) => k,
                None => "switch",
            };
            let (from, to) = (self.text("from"), self.text("to"));
            return match (from, to) {
                (Some(f), Some(t)) => format!("{kind} (path {f} -> {t})"),
                _ => kind.to_string(),
            };
        }
        let mut s = self.event.replace('_', " ");
        if let Some(r) = self.text("rail") {
            s += &format!(" rail {r}");
        } else if let Some(p) = self.text("path") {
            s += &format!(" path {p}");
        }
        if let Some(e) = self.str("end") {
            s += &format!(" ({e})");
        }
        s
    }
}

/// Parse one line; `Ok(None)` for a blank line, an error naming what is wrong otherwise.
pub fn parse(line: &str) -> Result<Option<Record>, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let Value::Object(fields) = v else {
        return Err("not a JSON object".into());
    };
    let event = match fields.get("event") {
        Some(Value::String(e)) => e.clone(),
        Some(_) => return Err("\"event\" is not a string".into()),
        None if fields.contains_key("comm") => "closed".into(),
        None => return Err("no \"event\" field".into()),
    };
    let unix_ms = fields.get("unix_ms").and_then(Value::as_u64).unwrap_or(0);
    let conn = match (fields.get("pid"), fields.get("conn")) {
        (Some(p), Some(c)) => Some(ConnKey {
            host: fields
                .get("host")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            pid: p.as_u64().unwrap_or(0),
            conn: c.as_u64().unwrap_or(0),
        }),
        _ => None,
    };
    Ok(Some(Record {
        event,
        unix_ms,
        conn,
        fields,
    }))
}

/// Every record of `text`, and the (1-based) numbers of lines that could not be read.
pub fn parse_all(text: &str) -> (Vec<Record>, Vec<(usize, String)>) {
    let mut recs = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match parse(line) {
            Ok(Some(r)) => recs.push(r),
            Ok(None) => {}
            Err(e) => bad.push((i + 1, e)),
        }
    }
    (recs, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_every_kind() {
        let r = parse(r#"{"event":"periodic","unix_ms":5,"host":"h","pid":7,"conn":3,"bytes":[1,2],"devices":["a","b"],"future":{"x":1}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(r.event, "periodic");
        assert_eq!(r.unix_ms, 5);
        let k = r.conn.clone().unwrap();
        assert_eq!((k.process(), k.conn), ("h:7".to_string(), 3));
        assert_eq!(r.nums("bytes"), [1, 2]);
        assert_eq!(r.strs("devices"), ["a", "b"]);
        assert_eq!(r.u64("missing"), None);
        // A script's event: no connection; its label.
        let c = parse(r#"{"event":"cut","unix_ms":9,"rail":0,"end":"near"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.conn.clone(), c.label()),
            (None, "cut rail 0 (near)".to_string())
        );
        let l = parse(r#"{"event":"drain","unix_ms":9,"label":"drain rail1 by operator"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(l.label(), "drain rail1 by operator");
        // The closing line of the format before events.
        let old = parse(r#"{"comm":"c","role":"send","failovers":1}"#)
            .unwrap()
            .unwrap();
        assert_eq!((old.event.as_str(), old.unix_ms), ("closed", 0));
        assert_eq!(parse("  ").unwrap(), None);
        assert!(parse("{\"x\":1}").unwrap_err().contains("event"));
        assert!(parse("[1]").unwrap_err().contains("object"));
        assert!(parse("{nope").unwrap_err().contains("JSON"));
        let (recs, bad) = parse_all("{\"event\":\"a\"}\n\nbroken\n{\"event\":\"b\"}\n");
        assert_eq!(recs.len(), 2);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].0, 3);
    }
}
