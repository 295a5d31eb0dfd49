#!/usr/bin/env python3
"""The detection calibration's table and picture (scripts/softroce/calibrate.sh).

usage: calibration_plot.py POINTS.tsv OUT.svg [STATS_DIR]  > table.md

POINTS.tsv holds the guest's lines
  POINT <impair> <rto_ms> <qp_timeout> false=<n> impaired_s=<s> detect_ms=<a,b,..|-> stream=<ok|FAILED>
Prints two Markdown tables (settings x impairments): false failovers per minute under the
impairment, and the detection time of the blackhole after it (median, min-max over the
connections that failed over). Writes an SVG with the same two panels as grouped bars.
With STATS_DIR (<k>.stats.jsonl for the k-th line of POINTS.tsv), each count of false
failovers also says how many a soft timeout started ("no completion for ..."; the others are
the fabric's own errors, RETRY_EXC_ERR: the queue pair gave up).
"""
import json
import os
import sys
from statistics import median

RETRIES = 6


def window_ms(qpt):
    """The QP's hardware window: (retries + 1) x 4.096 us x 2^timeout."""
    return (RETRIES + 1) * 4.096e-3 * (1 << qpt)


def soft_count(stats, n_false):
    """Of the first `n_false` failovers the sending side logged, those a soft timeout started."""
    ev = []
    for line in open(stats):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("event") == "failover" and d.get("role") == "send":
            ev.append(d)
    ev.sort(key=lambda d: d.get("detect_unix_ms", d["unix_ms"]))
    return sum(1 for d in ev[:n_false] if d.get("cause", "").startswith("no completion for"))


def parse(path, stats_dir=None):
    pts = []
    for k, line in enumerate(open(path), 1):
        f = line.split()
        if len(f) < 8 or f[0] != "POINT":
            continue
        kv = dict(x.split("=", 1) for x in f[4:])
        det = [] if kv["detect_ms"] == "-" else [int(x) for x in kv["detect_ms"].split(",")]
        pts.append({
            "impair": f[1], "rto": int(f[2]), "qpt": int(f[3]),
            "false": int(kv["false"]), "secs": max(1, int(kv["impaired_s"])),
            "detect": det, "ok": kv["stream"] == "ok", "soft": None,
        })
        st = os.path.join(stats_dir, f"{k}.stats.jsonl") if stats_dir else None
        if st and os.path.exists(st):
            pts[-1]["soft"] = soft_count(st, int(kv["false"]))
    return pts


def label_impair(s):
    k, *a = s.split(":")
    if k == "delay":
        return f"delay {a[0]}±{a[1]} ms, reordered"
    if k == "jitter":
        return f"delay {a[0]}±{a[1]} ms, in order"
    if k == "loss":
        return f"loss {a[0]} %"
    if k == "flap":
        return f"flap {a[0]} ms / {int(a[1]) / 1000:g} s"
    return "no impairment"


def label_setting(rto, qpt):
    return f"RTO {rto} ms, QP timeout {qpt} ({window_ms(qpt):.0f} ms)"


def false_cell(p):
    soft = "" if p["soft"] is None else f"; soft {p['soft']}"
    c = f"{p['false'] * 60 / p['secs']:.1f} ({p['false']}{soft})"
    return c if p["ok"] else c + " STREAM FAILED"


def detect_cell(p):
    d = p["detect"]
    return f"{median(d):.0f} ({min(d)}-{max(d)})" if d else "moved"


def tables(pts, impairs, settings):
    by = {(p["impair"], p["rto"], p["qpt"]): p for p in pts}
    head = "| setting | " + " | ".join(label_impair(i) for i in impairs) + " |"
    rule = "|---|" + "---:|" * len(impairs)
    out = []
    for title, cell in [
        ("**False failovers per minute** under the impairment (count in brackets, and how many of them a soft timeout started — the rest are the queue pair's own RETRY_EXC_ERR; a failed stream is marked):", false_cell),
        ("**Detection of the blackhole** that follows, ms: median (min-max) over the connections that failed over from rail A (\"moved\": traffic had already left rail A):", detect_cell),
    ]:
        out += ([""] if out else []) + [title, "", head, rule]
        for rto, qpt in settings:
            cells = [cell(by[(i, rto, qpt)]) if (i, rto, qpt) in by else "-" for i in impairs]
            out.append(f"| {label_setting(rto, qpt)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
          "#ff9da7", "#9c755f", "#17becf", "#7f7f7f", "#bcbd22"]


def svg(pts, impairs, settings):
    by = {(p["impair"], p["rto"], p["qpt"]): p for p in pts}
    W, H = 1100, 840
    left, top, pw, ph = 90, 60, 960, 250
    gap = 110
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="DejaVu Sans, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="16">Soft-RoCE detection calibration: false failovers under impairment, and blackhole detection</text>']
    nset = len(settings)
    group = pw / max(1, nset)
    bar = group * 0.8 / max(1, len(impairs))

    def panel(y0, title, value, ymax, fmt):
        s.append(f'<text x="{left}" y="{y0 - 10}" font-size="13">{title}</text>')
        s.append(f'<line x1="{left}" y1="{y0 + ph}" x2="{left + pw}" y2="{y0 + ph}" stroke="black"/>')
        s.append(f'<line x1="{left}" y1="{y0}" x2="{left}" y2="{y0 + ph}" stroke="black"/>')
        for k in range(5):
            v = ymax * k / 4
            y = y0 + ph - ph * k / 4
            s.append(f'<line x1="{left - 4}" y1="{y}" x2="{left + pw}" y2="{y}" stroke="#ddd"/>')
            s.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{fmt(v)}</text>')
        for gi, (rto, qpt) in enumerate(settings):
            gx = left + gi * group + group * 0.1
            for ii, imp in enumerate(impairs):
                p = by.get((imp, rto, qpt))
                v = value(p) if p else None
                x = gx + ii * bar
                if v is None:
                    s.append(f'<text x="{x + bar / 2}" y="{y0 + ph - 3}" text-anchor="middle" font-size="9">-</text>')
                    continue
                h = ph * min(v, ymax) / ymax if ymax > 0 else 0
                s.append(f'<rect x="{x:.1f}" y="{y0 + ph - h:.1f}" width="{bar * 0.9:.1f}" height="{h:.1f}" fill="{COLORS[ii % len(COLORS)]}"/>')
            s.append(f'<text x="{gx + group * 0.4}" y="{y0 + ph + 16}" text-anchor="middle">RTO {rto} ms</text>')
            s.append(f'<text x="{gx + group * 0.4}" y="{y0 + ph + 30}" text-anchor="middle">QP window {window_ms(qpt):.0f} ms</text>')

    rates = [p["false"] * 60 / p["secs"] for p in pts] or [1]
    panel(top + 20, "False failovers per minute while rail A is only impaired",
          lambda p: p["false"] * 60 / p["secs"], max(1.0, max(rates)), lambda v: f"{v:.1f}")
    dets = [median(p["detect"]) for p in pts if p["detect"]] or [1000]
    panel(top + 20 + ph + gap, "Detection of a blackhole of rail A, ms (median over connections; no bar: traffic had moved)",
          lambda p: median(p["detect"]) if p["detect"] else None, max(dets) * 1.1, lambda v: f"{v:.0f}")
    per_row = 4
    for ii, imp in enumerate(impairs):
        x = left + (ii % per_row) * (pw / per_row)
        ly = H - 58 + (ii // per_row) * 20
        s.append(f'<rect x="{x}" y="{ly - 10}" width="12" height="12" fill="{COLORS[ii % len(COLORS)]}"/>')
        s.append(f'<text x="{x + 16}" y="{ly}">{label_impair(imp)}</text>')
    s.append("</svg>")
    return "\n".join(s)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    pts = parse(sys.argv[1], sys.argv[3] if len(sys.argv) == 4 else None)
    impairs, settings = [], []
    for p in pts:
        if p["impair"] not in impairs:
            impairs.append(p["impair"])
        if (p["rto"], p["qpt"]) not in settings:
            settings.append((p["rto"], p["qpt"]))
    print(tables(pts, impairs, settings))
    with open(sys.argv[2], "w") as f:
        f.write(svg(pts, impairs, settings))


if __name__ == "__main__":
    main()
