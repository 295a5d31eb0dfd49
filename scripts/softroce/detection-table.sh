#!/usr/bin/env bash
# Detection time per failure kind on real kernel verbs (Soft-RoCE guest), before and after the
# fast check of the active link: for each way rail A can fail (CAL_BREAK of calibrate.sh:
# blackhole-far, blackhole-near, blackhole-both, down-far, down-near), POINTS clean points of
# scripts/softroce/calibrate.sh with HA_NCCL_SILENCE_MS=0 ("before") and with the default
# ("after"), then a table of each side's detection (ms from just before the guest's break
# command, which itself takes a while in the TCG guest) per kind: median and worst. A benchmark,
# not a test. Needs dist/ (scripts/build.sh).
#
# usage: scripts/softroce/detection-table.sh [OUT_DIR]      (POINTS=3 IMPAIR_S=4 AFTER_S=6)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-$(mktemp -d /tmp/verbs-detection.XXXXXX)}
mkdir -p "$out"
points=$(printf 'none %.0s' $(seq "${POINTS:-3}"))
for kind in ${KINDS:-blackhole-far blackhole-near blackhole-both down-far down-near}; do
  for setting in before after; do
    s=; [ $setting = before ] && s=0
    echo "detection-table: $kind, $setting"
    env ${s:+HA_NCCL_SILENCE_MS=$s} CAL_BREAK=$kind CAL_IMPAIR="$points" CAL_SETTINGS="${SETTING:-1000/14}" \
      IMPAIR_S=${IMPAIR_S:-4} AFTER_S=${AFTER_S:-6} CAL_OUT="$out/$kind-$setting" \
      bash scripts/softroce/calibrate.sh > "$out/$kind-$setting.log" 2>&1 ||
      echo "detection-table: $kind $setting: calibrate failed (see $out/$kind-$setting.log)"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, sys, tarfile
out = sys.argv[1]
def sides(stem):
    """Per point: (send ms, recv ms) from the POINT lines (the sender's detection) and the
    points' stats files (the receiver's, relative to the same break moment)."""
    res = []
    try:
        points = [l.split() for l in open(stem + ".tsv") if l.startswith("POINT")]
        tf = tarfile.open(stem + "-points.tgz")
    except OSError:
        return res
    files = {m.name.split("/")[-1]: m for m in tf.getmembers()}
    for k, p in enumerate(points, 1):
        kv = dict(x.split("=", 1) for x in p[4:])
        d = kv.get("detect_ms", "-")
        m = files.get(f"{k}.stats.jsonl")
        if d == "-" or m is None:
            res.append((None, None, kv.get("false", "?")))
            continue
        ev = []
        for l in tf.extractfile(m).read().decode().splitlines():
            try:
                e = json.loads(l)
            except ValueError:
                continue
            if e.get("event") == "failover" and e.get("from") == 0:
                ev.append(e)
        send = [e for e in ev if e["role"] == "send"]
        s_ms = int(d.split(",")[0])
        t1 = send[-1]["detect_unix_ms"] - s_ms if send else None
        recv = [e["detect_unix_ms"] - t1 for e in ev if t1 and e["role"] == "recv" and e["detect_unix_ms"] >= t1 - 5]
        res.append((s_ms, min(recv) if recv else None, kv.get("false", "?")))
    return res
def stat(v):
    v = sorted(x for x in v if x is not None)
    return f"{v[(len(v) - 1) // 2]} / {v[-1]}" if v else "-"
print()
print("| rail A fails by | side | before: median / worst ms | after: median / worst ms | points | false failovers before / after |")
print("|---|---|---:|---:|---:|---:|")
for kind in sorted({os.path.basename(f).rsplit("-", 1)[0] for f in glob.glob(os.path.join(out, "*-before.tsv"))}):
    b, a = sides(os.path.join(out, kind + "-before")), sides(os.path.join(out, kind + "-after"))
    fb = sum(int(x[2]) for x in b if x[2].isdigit()); fa = sum(int(x[2]) for x in a if x[2].isdigit())
    for i, side in ((0, "sender"), (1, "receiver")):
        print(f"| {kind} | {side} | {stat([x[i] for x in b])} | {stat([x[i] for x in a])} | {len(b)}/{len(a)} | {fb} / {fa} |")
PY
