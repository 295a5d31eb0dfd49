//! How times and sizes read in the reports: wall-clock times in UTC, durations and byte counts
//! in the unit that fits.

/// Wall-clock time now, ms since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `2026-11-27 10:00:01.234` (UTC) of a Unix time in ms.
pub fn utc(ms: u64) -> String {
    let (days, rem) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// `10:00:01.234` (UTC).
pub fn utc_time(ms: u64) -> String {
    utc(ms)[11..].to_string()
}

/// Year, month, day of `days` since 1970-01-01 (proleptic Gregorian; H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `850 ms`, `4.2 s`, `3 min 05 s`.
pub fn duration_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{} min {:02} s", ms / 60_000, ms / 1000 % 60)
    } else {
        format!("{} h {:02} min", ms / 3_600_000, ms / 60_000 % 60)
    }
}

/// `512 B`, `1.5 KiB`, `300.0 MiB`, `1.20 GiB`.
pub fn bytes(n: u64) -> String {
    const K: f64 = 1024.0;
    let f = n as f64;
    if f < K {
        format!("{n} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / K / K)
    } else if f < K * K * K * K {
        format!("{:.2} GiB", f / K / K / K)
    } else {
        format!("{:.2} TiB", f / K / K / K / K)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(951_782_400_000 + 3_723_004), "2000-02-29 01:02:03.004");
        assert_eq!(utc(1_798_761_599_999), "2026-12-31 23:59:59.999");
        assert_eq!(utc_time(1_798_761_599_999), "23:59:59.999");
        assert_eq!(duration_ms(850), "850 ms");
        assert_eq!(duration_ms(4_249), "4.2 s");
        assert_eq!(duration_ms(185_000), "3 min 05 s");
        assert_eq!(duration_ms(7_260_000), "2 h 01 min");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(300 << 20), "300.0 MiB");
        assert_eq!(bytes(1288490189), "1.20 GiB");
    }
}
