//! Axis scales and text layout for the picture: round tick steps, the throughput unit that
//! fits, and summary lines wrapped to the picture's width.

/// A round step (1, 2 or 5 × 10^k) giving about `ticks` steps over `span`.
pub fn nice_step(span: f64, ticks: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / ticks;
    let p = 10f64.powf(raw.log10().floor());
    let f = raw / p;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * p
}

/// The unit for a throughput axis whose largest value is `max` bytes/s: (name, divisor).
pub fn rate_unit(max: f64) -> (&'static str, f64) {
    if max >= 2e9 {
        ("GB/s", 1e9)
    } else if max >= 2e6 {
        ("MB/s", 1e6)
    } else if max >= 2e3 {
        ("kB/s", 1e3)
    } else {
        ("B/s", 1.0)
    }
}

/// A tick value as text: no trailing zeros.
pub fn tick(v: f64) -> String {
    let s = format!("{:.3}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Split `line` into lines of at most `chars` characters, breaking after " → " (else at a
/// space); continuation lines start with two spaces.
pub fn wrap(line: &str, chars: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for piece in line.split_inclusive(" → ") {
        let fits = cur.chars().count() + piece.chars().count() <= chars;
        if !cur.is_empty() && !fits {
            out.push(cur.trim_end().to_string());
            cur = "  ".into();
        }
        if cur.chars().count() + piece.chars().count() > chars {
            for word in piece.split_inclusive(' ') {
                if !cur.trim().is_empty() && cur.chars().count() + word.chars().count() > chars {
                    out.push(cur.trim_end().to_string());
                    cur = "  ".into();
                }
                cur += word;
            }
        } else {
            cur += piece;
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim_end().to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_units_ticks_and_wrapping() {
        assert_eq!(nice_step(10.0, 10.0), 1.0);
        assert_eq!(nice_step(8.3, 10.0), 1.0);
        assert_eq!(nice_step(17.0, 10.0), 2.0);
        assert_eq!(nice_step(0.4, 5.0), 0.1);
        assert_eq!(nice_step(3600.0, 10.0), 500.0);
        assert_eq!(rate_unit(3e9), ("GB/s", 1e9));
        assert_eq!(rate_unit(5e8), ("MB/s", 1e6));
        assert_eq!(rate_unit(10.0), ("B/s", 1.0));
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(3.0), "3");
        assert_eq!(tick(0.30000000000000004), "0.3");
        let w = wrap(
            "cut rail 0 at 1.00 s → detected +300 ms (port down) → switched path 0 → 1",
            40,
        );
        assert_eq!(
            w,
            [
                "cut rail 0 at 1.00 s →",
                "  detected +300 ms (port down) →",
                "  switched path 0 → 1"
            ]
        );
        assert_eq!(wrap("short", 40), ["short"]);
        let long = wrap("aaaa bbbb cccc dddd", 10);
        assert_eq!(long, ["aaaa bbbb", "  cccc", "  dddd"]);
    }
}
