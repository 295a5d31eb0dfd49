//! Result formatting: the bench table (`size | lat_us | bw_GBps`), its JSON form, the device
//! summary line, and small statistics helpers.

use nccl_net_loader::Props;

/// One row of bench results.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub size: usize,
    /// Half round trip of a ping-pong, median over `lat_iters`, in µs.
    pub lat_us: f64,
    /// Bytes moved / time, 1 GB = 1e9 bytes.
    pub bw_gbps: f64,
    pub lat_iters: usize,
    pub bw_iters: usize,
}

/// Median of `v` (sorts it); NaN for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// `1048576` → `1M`, `4096` → `4K`, `1000` → `1000` (exact multiples only).
pub fn format_size(n: usize) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        let unit = 1usize << shift;
        if n >= unit && n % unit == 0 {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

pub fn table_header() -> String {
    format!("{:>12} | {:>10} | {:>9}", "size", "lat_us", "bw_GBps")
}

pub fn format_row(r: &BenchRow) -> String {
    format!("{:>12} | {:>10.2} | {:>9.3}", r.size, r.lat_us, r.bw_gbps)
}

/// The whole table, one line per row after the header, each line ending in a newline.
pub fn format_table(rows: &[BenchRow]) -> String {
    let mut s = table_header();
    s.push('\n');
    for r in rows {
        s.push_str(&format_row(r));
        s.push('\n');
    }
    s
}

/// One line describing a device, printed before any test.
pub fn describe_props(dev: i32, p: &Props) -> String {
    format!(
        "device {dev}: name={} pci={} guid={:#x} ptrSupport={:#x} speed={}Mbps port={} \
         latency={}us maxComms={} maxRecvs={} regIsGlobal={}",
        p.name,
        p.pci_path.as_deref().unwrap_or("(none)"),
        p.guid,
        p.ptr_support,
        p.speed,
        p.port,
        p.latency,
        p.max_comms,
        p.max_recvs,
        p.reg_is_global
    )
}

/// A JSON string literal for `s`.
pub fn json_string(s: &str) -> String {
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

/// A JSON number; non-finite values (which JSON cannot hold) become `null`.
fn json_f64(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".to_string()
    }
}

/// What the JSON results say about the run besides the rows.
pub struct RunInfo<'a> {
    pub plugin_name: &'a str,
    pub plugin_path: &'a str,
    pub dev: i32,
    pub props: &'a Props,
    pub mode: &'a str,
    pub window: usize,
}

/// Machine-readable bench results.
pub fn bench_json(info: &RunInfo<'_>, rows: &[BenchRow]) -> String {
    let p = info.props;
    let results: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "    {{\"size\": {}, \"lat_us\": {}, \"bw_GBps\": {}, \"lat_iters\": {}, \"bw_iters\": {}}}",
                r.size,
                json_f64(r.lat_us),
                json_f64(r.bw_gbps),
                r.lat_iters,
                r.bw_iters
            )
        })
        .collect();
    format!(
        "{{\n  \"plugin\": {},\n  \"path\": {},\n  \"dev\": {},\n  \"mode\": {},\n  \"window\": {},\n  \
         \"props\": {{\"name\": {}, \"pci_path\": {}, \"guid\": {}, \"ptr_support\": {}, \"speed\": {}, \
         \"port\": {}, \"latency\": {}, \"max_comms\": {}, \"max_recvs\": {}, \"reg_is_global\": {}}},\n  \
         \"results\": [\n{}\n  ]\n}}\n",
        json_string(info.plugin_name),
        json_string(info.plugin_path),
        info.dev,
        json_string(info.mode),
        info.window,
        json_string(&p.name),
        p.pci_path.as_deref().map_or("null".to_string(), json_string),
        p.guid,
        p.ptr_support,
        p.speed,
        p.port,
        json_f64(f64::from(p.latency)),
        p.max_comms,
        p.max_recvs,
        p.reg_is_global,
        results.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props() -> Props {
        Props {
            name: "mlx5_0".into(),
            pci_path: None,
            guid: 0xabc,
            ptr_support: 1,
            speed: 100000,
            port: 1,
            latency: 0.0,
            max_comms: 65536,
            max_recvs: 8,
            reg_is_global: 0,
            force_flush: 0,
            vdevs: vec![0],
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 512 << 20,
            max_multi_request_size: 1,
            rail_id: -1,
            plane_id: -1,
        }
    }

    #[test]
    fn medians() {
        assert!(median(&mut []).is_nan());
        assert_eq!(median(&mut [3.0]), 3.0);
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn sizes() {
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(7), "7");
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(4097), "4097");
        assert_eq!(format_size(64 << 20), "64M");
        assert_eq!(format_size(3 << 30), "3G");
        assert_eq!(format_size(1536), "1536");
    }

    #[test]
    fn table_layout() {
        let rows = [
            BenchRow {
                size: 8,
                lat_us: 3.14659,
                bw_gbps: 0.0021,
                lat_iters: 10,
                bw_iters: 10,
            },
            BenchRow {
                size: 64 << 20,
                lat_us: 5000.0,
                bw_gbps: 12.3456,
                lat_iters: 5,
                bw_iters: 16,
            },
        ];
        let t = format_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "        size |     lat_us |   bw_GBps");
        assert_eq!(lines[1], "           8 |       3.15 |     0.002");
        assert_eq!(lines[2], "    67108864 |    5000.00 |    12.346");
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
    }

    #[test]
    fn json_escaping() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(json_f64(f64::NAN), "null");
        assert_eq!(json_f64(1.5), "1.5");
    }

    #[test]
    fn json_document() {
        let p = props();
        let info = RunInfo {
            plugin_name: "HA",
            plugin_path: "/t/libnccl-net-ha.so",
            dev: 0,
            props: &p,
            mode: "threads",
            window: 32,
        };
        let rows = [BenchRow {
            size: 8,
            lat_us: 2.5,
            bw_gbps: 0.25,
            lat_iters: 100,
            bw_iters: 1000,
        }];
        let j = bench_json(&info, &rows);
        assert!(j.contains("\"plugin\": \"HA\""));
        assert!(j.contains("\"pci_path\": null"));
        assert!(j.contains(
            "{\"size\": 8, \"lat_us\": 2.5, \"bw_GBps\": 0.25, \"lat_iters\": 100, \"bw_iters\": 1000}"
        ));
        // Balanced braces and brackets (no stray characters from the format string).
        let opens = j.matches('{').count() + j.matches('[').count();
        let closes = j.matches('}').count() + j.matches(']').count();
        assert_eq!(opens, closes);
        assert!(j.ends_with("}\n"));
    }

    #[test]
    fn device_line() {
        let line = describe_props(1, &props());
        assert!(line.starts_with("device 1: name=mlx5_0 pci=(none) guid=0xabc"));
        assert!(line.contains("maxRecvs=8"));
    }
}
