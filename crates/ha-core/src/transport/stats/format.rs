//! The lines of the stats file: one flat JSON object per line, `"event"` and `"unix_ms"` first,
//! then the connection's identity and the event's own fields (README, "Live statistics", has
//! the table). Values are numbers, strings, or arrays of them; only the closing line carries an
//! object (`"resources"`).

/// A field's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    Num(u64),
    Str(String),
    /// Already JSON (an array or object).
    Raw(String),
}

impl From<u64> for Field {
    fn from(v: u64) -> Field {
        Field::Num(v)
    }
}

impl From<usize> for Field {
    fn from(v: usize) -> Field {
        Field::Num(v as u64)
    }
}

impl From<&str> for Field {
    fn from(v: &str) -> Field {
        Field::Str(v.to_string())
    }
}

impl From<String> for Field {
    fn from(v: String) -> Field {
        Field::Str(v)
    }
}

/// One line being built.
pub struct Line(String);

impl Line {
    pub fn new(event: &str, unix_ms: u64) -> Line {
        Line(format!(
            "{{\"event\":{},\"unix_ms\":{unix_ms}",
            json_str(event)
        ))
    }

    pub fn field(mut self, key: &str, value: impl Into<Field>) -> Line {
        self.push(key, &value.into());
        self
    }

    pub fn push(&mut self, key: &str, value: &Field) {
        self.0.push(',');
        self.0.push_str(&json_str(key));
        self.0.push(':');
        match value {
            Field::Num(n) => self.0.push_str(&n.to_string()),
            Field::Str(s) => self.0.push_str(&json_str(s)),
            Field::Raw(r) => self.0.push_str(r),
        }
    }

    /// The line, without its newline.
    pub fn finish(mut self) -> String {
        self.0.push('}');
        self.0
    }
}

/// `s` as a JSON string (quoted, escaped).
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `[1,2]`.
pub fn nums(v: &[u64]) -> Field {
    let items: Vec<String> = v.iter().map(u64::to_string).collect();
    Field::Raw(format!("[{}]", items.join(",")))
}

/// `["a","b"]`.
pub fn strs(v: &[String]) -> Field {
    let items: Vec<String> = v.iter().map(|s| json_str(s)).collect();
    Field::Raw(format!("[{}]", items.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_flat_object() {
        let l = Line::new("failover", 17)
            .field("from", 0u64)
            .field("cause", "port \"x\" down\n")
            .field("bytes", nums(&[1, 2]))
            .field("devices", strs(&["r0a".into(), "r1\\a".into()]))
            .finish();
        assert_eq!(
            l,
            "{\"event\":\"failover\",\"unix_ms\":17,\"from\":0,\"cause\":\"port \\\"x\\\" down\\n\",\"bytes\":[1,2],\"devices\":[\"r0a\",\"r1\\\\a\"]}"
        );
        assert_eq!(json_str("a\u{1}b"), "\"a\\u0001b\"");
    }
}
