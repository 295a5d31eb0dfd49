//! The picture, top to bottom: title and start time; one summary line per failover (cut →
//! detection → switch → stall → redundancy back); the labels of the marks; the throughput
//! chart (per path, delivered, each stall shaded and measured); two lanes — which path carries
//! the traffic, and whether a standby is there (red: none) — with the marks running through
//! chart and lanes; the time axis; the legend; notes on the inputs.

use super::episodes::MarkKind;
use super::model::{LaneBin, Model};
use super::scale::{nice_step, rate_unit, tick, wrap};
use super::svg::{text_width, Anchor, Font, Svg};

const W: f64 = 1400.0;
const LEFT: f64 = 100.0;
const RIGHT: f64 = 30.0;
const CHART_H: f64 = 340.0;
const LANE_H: f64 = 22.0;
const LABEL_ROWS: usize = 4;
const ROW_H: f64 = 17.0;

pub const PATH_COLORS: [&str; 2] = ["#1f77b4", "#ff7f0e"];
const GREEN: &str = "#2ca02c";
const AMBER: &str = "#e6a800";
const RED: &str = "#d62728";
const GRAY: &str = "#555555";

/// Colour, width and dash of a mark.
fn style(k: MarkKind) -> (&'static str, f64, &'static str) {
    match k {
        MarkKind::Cut => (RED, 2.0, "7 4"),
        MarkKind::Restore => ("#17becf", 2.0, "7 4"),
        MarkKind::Detect => ("#ff9800", 1.5, "2 3"),
        MarkKind::Switch => ("#6a3d9a", 2.0, ""),
        MarkKind::StandbyLost => ("#e377c2", 2.0, "4 3"),
        MarkKind::Rearmed => (GREEN, 2.0, ""),
        MarkKind::Lost => ("#000000", 3.0, ""),
        MarkKind::Other => ("#7f7f7f", 1.5, "3 3"),
    }
}

struct Frame<'a> {
    m: &'a Model,
    cw: f64,
}

impl Frame<'_> {
    fn x(&self, t: f64) -> f64 {
        LEFT + (t - self.m.t0) / (self.m.t1 - self.m.t0) * self.cw
    }
    fn bin_x(&self, i: usize) -> f64 {
        self.x(self.m.t0 + i as f64 * self.m.bin_ms)
    }
}

/// The picture as SVG; `title` names the run.
pub fn render(m: &Model, title: &str) -> String {
    let f = Frame {
        m,
        cw: W - LEFT - RIGHT,
    };
    let mut s = Svg::new(W, 100.0);
    let mut y = 32.0;
    let mut head = format!("Failover timeline: {title}");
    let mut size = 22.0;
    while text_width(&head, size) * 1.06 > W - 40.0 && size > 15.0 {
        size -= 1.0;
    }
    let fit = ((W - 40.0) / (size * 0.58 * 1.06)) as usize;
    if head.chars().count() > fit {
        head = head.chars().take(fit.saturating_sub(3)).collect::<String>() + "...";
    }
    s.text(LEFT - 80.0, y, &head, Font::new(size, "#111").bold());
    y += 22.0;
    let sub = format!(
        "start {} UTC · {} sending connection(s) in {} process(es) · {:.1} s shown",
        crate::stats::units::utc(m.t0.max(0.0) as u64),
        m.conns,
        m.processes,
        (m.t1 - m.t0) / 1000.0
    );
    s.text(LEFT - 80.0, y, &sub, Font::new(13.0, GRAY));
    y += 12.0;
    let chars = ((W - 40.0) / (14.0 * 0.58)) as usize;
    if m.summary.is_empty() {
        y += 20.0;
        s.text(
            LEFT - 80.0,
            y,
            "no failover, cut or standby loss in the inputs",
            Font::new(14.0, "#111"),
        );
    }
    for line in &m.summary {
        for (k, l) in wrap(line, chars - 2).iter().enumerate() {
            y += 19.0;
            let bullet = if k == 0 { "■ " } else { "  " };
            s.text(
                LEFT - 80.0,
                y,
                &format!("{bullet}{l}"),
                Font::new(14.0, "#111"),
            );
        }
    }
    y += 14.0;
    let band_top = y;
    let chart_top = band_top + LABEL_ROWS as f64 * ROW_H + 8.0;
    let chart_bottom = chart_top + CHART_H;
    let lane1 = chart_bottom + 8.0;
    let lane2 = lane1 + LANE_H + 5.0;
    let lanes_bottom = lane2 + LANE_H;
    chart(&mut s, &f, chart_top, chart_bottom);
    lanes(&mut s, &f, lane1, lane2);
    marks(&mut s, &f, band_top, chart_top, lanes_bottom);
    let y = time_axis(&mut s, &f, lanes_bottom);
    let y = legend(&mut s, m, y + 26.0);
    let mut y = y + 8.0;
    for n in &m.notes {
        for l in wrap(n, ((W - 40.0) / (12.0 * 0.58)) as usize) {
            y += 16.0;
            s.text(LEFT - 80.0, y, &l, Font::new(12.0, GRAY));
        }
    }
    s.height = y + 16.0;
    s.finish()
}

/// Throughput per path (steps per bin), delivered (grey area), stalls shaded and labelled.
fn chart(s: &mut Svg, f: &Frame, top: f64, bottom: f64) {
    let m = f.m;
    let max = m
        .paths
        .iter()
        .chain(&m.delivered)
        .flat_map(|p| p.rates.iter().copied())
        .fold(0.0, f64::max);
    let (unit, div) = rate_unit(max);
    let step = nice_step(max / div, 5.0);
    let ymax = ((max / div / step).ceil() * step).max(step);
    let y = |v: f64| bottom - (v / div / ymax) * (bottom - top);
    s.rect(LEFT, top, f.cw, bottom - top, "#fafafa", 1.0);
    let mut v = 0.0;
    while v <= ymax + step / 2.0 {
        let yy = bottom - v / ymax * (bottom - top);
        s.line(LEFT, yy, LEFT + f.cw, yy, "#e3e3e3", 1.0, "");
        s.text(
            LEFT - 6.0,
            yy + 4.0,
            &tick(v),
            Font::new(12.0, GRAY).anchor(Anchor::End),
        );
        v += step;
    }
    s.text(
        LEFT - 6.0,
        top - 6.0,
        unit,
        Font::new(12.0, GRAY).anchor(Anchor::End),
    );
    for sp in &m.spans {
        let (a, b) = (f.x(sp.from), f.x(sp.to).max(f.x(sp.from) + 2.0));
        s.rect(a, top, b - a, bottom - top, RED, 0.13);
    }
    if let Some(d) = &m.delivered {
        let mut pts = vec![(f.bin_x(0), bottom)];
        for (i, r) in d.rates.iter().enumerate() {
            pts.push((f.bin_x(i), y(*r)));
            pts.push((f.bin_x(i + 1), y(*r)));
        }
        pts.push((f.bin_x(d.rates.len()), bottom));
        s.polygon(&pts, "#9e9e9e", 0.45);
    }
    // Each path's steps where connections lived (no line where there was none to measure).
    let alive = |i: usize| {
        m.lanes.get(i).is_none_or(|l| l.conns() > 0) || m.lanes.iter().all(|l| l.conns() == 0)
    };
    for (k, p) in m.paths.iter().enumerate() {
        let mut pts = Vec::with_capacity(2 * p.rates.len());
        for (i, r) in p.rates.iter().enumerate() {
            if !alive(i) {
                s.polyline(&pts, PATH_COLORS[k.min(1)], 2.2);
                pts.clear();
                continue;
            }
            pts.push((f.bin_x(i), y(*r)));
            pts.push((f.bin_x(i + 1), y(*r)));
        }
        s.polyline(&pts, PATH_COLORS[k.min(1)], 2.2);
    }
    if m.paths.iter().all(|p| p.rates.iter().all(|&r| r == 0.0)) && m.delivered.is_none() {
        s.text(
            LEFT + f.cw / 2.0,
            (top + bottom) / 2.0,
            "no throughput in the inputs (periodic lines: HA_NCCL_STATS_INTERVAL_MS; or --stream-timeline)",
            Font::new(14.0, GRAY).anchor(Anchor::Middle),
        );
    }
    // Stall labels, stacked below the chart's top.
    for (k, sp) in m.spans.iter().enumerate() {
        let (a, b) = (f.x(sp.from), f.x(sp.to).max(f.x(sp.from) + 2.0));
        let yy = top + 22.0 + (k % 3) as f64 * 20.0;
        s.line(a, yy, b, yy, RED, 2.0, "");
        s.line(a, yy - 6.0, a, yy + 6.0, RED, 2.0, "");
        s.line(b, yy - 6.0, b, yy + 6.0, RED, 2.0, "");
        let w = text_width(&sp.label, 14.0);
        let fits_right = b + 6.0 + w < LEFT + f.cw;
        let (x, anchor) = if fits_right {
            (b + 6.0, Anchor::Start)
        } else {
            (a - 6.0, Anchor::End)
        };
        s.text(
            x,
            yy + 5.0,
            &sp.label,
            Font::new(14.0, RED).bold().anchor(anchor),
        );
    }
}

/// Runs of bins equal in what `key` picks, as (first bin, end bin, value).
fn runs<T: PartialEq + Copy>(
    lanes: &[LaneBin],
    key: impl Fn(&LaneBin) -> T,
) -> Vec<(usize, usize, T)> {
    let mut out: Vec<(usize, usize, T)> = Vec::new();
    for (i, b) in lanes.iter().enumerate() {
        let v = key(b);
        match out.last_mut() {
            Some(r) if r.2 == v => r.1 = i + 1,
            _ => out.push((i, i + 1, v)),
        }
    }
    out
}

/// "traffic on": the share of connections on path 0 and path 1; "standby": proven, being
/// verified, missing (red, labelled where wide enough).
fn lanes(s: &mut Svg, f: &Frame, y1: f64, y2: f64) {
    s.text(
        LEFT - 6.0,
        y1 + 15.0,
        "traffic on",
        Font::new(12.0, "#111").anchor(Anchor::End),
    );
    s.text(
        LEFT - 6.0,
        y2 + 15.0,
        "standby",
        Font::new(12.0, "#111").anchor(Anchor::End),
    );
    s.rect(LEFT, y1, f.cw, LANE_H, "#f0f0f0", 1.0);
    s.rect(LEFT, y2, f.cw, LANE_H, "#f0f0f0", 1.0);
    for (a, b, on) in runs(&f.m.lanes, |l| l.on) {
        let n = on[0] + on[1];
        if n == 0 {
            continue;
        }
        let (xa, xb) = (f.bin_x(a), f.bin_x(b));
        let h0 = LANE_H * f64::from(on[0]) / f64::from(n);
        s.rect(xa, y1, xb - xa, h0, PATH_COLORS[0], 0.85);
        s.rect(xa, y1 + h0, xb - xa, LANE_H - h0, PATH_COLORS[1], 0.85);
        let only = if on[0] == n {
            Some(0)
        } else if on[1] == n {
            Some(1)
        } else {
            None
        };
        let text = match only {
            Some(p) => format!("path {p}"),
            None => format!("path 0: {} / path 1: {}", on[0], on[1]),
        };
        if xb - xa > text_width(&text, 11.0) + 8.0 {
            s.text(
                (xa + xb) / 2.0,
                y1 + 15.0,
                &text,
                Font::new(11.0, "#ffffff").bold().anchor(Anchor::Middle),
            );
        }
    }
    for (a, b, v) in runs(&f.m.lanes, |l| (l.ok, l.verifying, l.lost)) {
        let v = LaneBin {
            on: [0, 0],
            ok: v.0,
            verifying: v.1,
            lost: v.2,
        };
        let n = v.conns();
        if n == 0 {
            continue;
        }
        let (xa, xb) = (f.bin_x(a), f.bin_x(b));
        let mut yy = y2;
        for (c, color) in [(v.ok, GREEN), (v.verifying, AMBER), (v.lost, RED)] {
            let h = LANE_H * f64::from(c) / f64::from(n);
            s.rect(xa, yy, xb - xa, h, color, 0.85);
            yy += h;
        }
        let label = |k: u32, what: &str| {
            if n == 1 {
                what.to_string()
            } else {
                format!("{what} ({k}/{n})")
            }
        };
        if v.lost > 0 && xb - xa > text_width("NO STANDBY (00/00)", 11.0) + 8.0 {
            let t = label(v.lost, "NO STANDBY");
            s.text(
                (xa + xb) / 2.0,
                y2 + 15.0,
                &t,
                Font::new(11.0, "#ffffff").bold().anchor(Anchor::Middle),
            );
        }
    }
}

/// Vertical marks through chart and lanes, each labelled in the band above the chart (the
/// first row where it does not overlap the label before it).
fn marks(s: &mut Svg, f: &Frame, band_top: f64, chart_top: f64, bottom: f64) {
    let mut ends = [f64::NEG_INFINITY; LABEL_ROWS];
    for mk in &f.m.marks {
        let (color, width, dash) = style(mk.kind);
        let x = f.x(mk.t);
        if let Some(u) = mk.until {
            // The command ran until `u`: the cut took effect somewhere in between.
            s.rect(
                x,
                chart_top,
                (f.x(u) - x).max(1.0),
                bottom - chart_top,
                color,
                0.07,
            );
        }
        let w = text_width(&mk.label, 12.0);
        let right = x + 4.0 + w <= LEFT + f.cw;
        let (lx, anchor, left, end) = if right {
            (x + 4.0, Anchor::Start, x, x + 4.0 + w)
        } else {
            (x - 4.0, Anchor::End, x - 4.0 - w, x)
        };
        let row = (0..LABEL_ROWS)
            .find(|&r| ends[r] + 6.0 < left)
            .unwrap_or_else(|| {
                (0..LABEL_ROWS)
                    .min_by(|&a, &b| ends[a].total_cmp(&ends[b]))
                    .unwrap_or(0)
            });
        ends[row] = ends[row].max(end);
        let ly = band_top + (row as f64 + 1.0) * ROW_H - 4.0;
        s.text(
            lx,
            ly,
            &mk.label,
            Font::new(12.0, color).bold().anchor(anchor),
        );
        s.line(x, ly - 12.0, x, chart_top, color, 1.0, "1 2");
        s.line(x, chart_top, x, bottom, color, width, dash);
    }
}

/// Ticks in seconds since the start, under the lanes; returns the y below it.
fn time_axis(s: &mut Svg, f: &Frame, y: f64) -> f64 {
    let span = (f.m.t1 - f.m.t0) / 1000.0;
    let step = nice_step(span, 12.0);
    let mut t = 0.0;
    while t <= span + 1e-9 {
        let x = f.x(f.m.t0 + t * 1000.0);
        s.line(x, y, x, y + 5.0, GRAY, 1.0, "");
        s.text(
            x,
            y + 18.0,
            &format!("{} s", tick(t)),
            Font::new(12.0, GRAY).anchor(Anchor::Middle),
        );
        t += step;
    }
    s.text(
        LEFT + f.cw / 2.0,
        y + 36.0,
        "time since the start of the picture",
        Font::new(12.0, GRAY).anchor(Anchor::Middle),
    );
    y + 36.0
}

/// Swatches and names of what is drawn; returns the y below it.
fn legend(s: &mut Svg, m: &Model, y: f64) -> f64 {
    let mut items: Vec<(&str, String, bool)> = Vec::new();
    for (k, p) in m.paths.iter().enumerate() {
        items.push((PATH_COLORS[k.min(1)], p.label.clone(), true));
    }
    if let Some(d) = &m.delivered {
        items.push(("#9e9e9e", d.label.clone(), false));
    }
    let estimated = m.spans.iter().any(|sp| sp.label.contains('≈'));
    items.push((
        RED,
        if estimated {
            "stall (shaded; ≈: estimated)".into()
        } else {
            "stall (shaded; measured)".into()
        },
        false,
    ));
    if m.marks.iter().any(|mk| mk.until.is_some()) {
        items.push((
            "#9e9e9e",
            "light band: a link command still running".into(),
            false,
        ));
    }
    items.push((GREEN, "standby ok".into(), false));
    items.push((AMBER, "standby verifying".into(), false));
    items.push((RED, "no standby".into(), false));
    let (mut x, mut y) = (LEFT - 80.0, y);
    for (color, label, line) in items {
        let w = 26.0 + text_width(&label, 12.0) + 18.0;
        if x + w > W - 20.0 {
            x = LEFT - 80.0;
            y += 20.0;
        }
        if line {
            s.line(x, y - 4.0, x + 20.0, y - 4.0, color, 3.0, "");
        } else {
            s.rect(x, y - 11.0, 20.0, 12.0, color, 0.6);
        }
        s.text(x + 26.0, y, &label, Font::new(12.0, "#111"));
        x += w;
    }
    y
}
