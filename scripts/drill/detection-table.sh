#!/usr/bin/env bash
# Detection time per failure kind on the `sock` fabric, before and after the fast check of the
# active link: `sock-drill.sh --detect` runs of each kind (down near, down far, blackhole,
# one-way loss near→far and far→near), with HA_NCCL_SILENCE_MS=0 ("before": the retry window
# and the soft timeout alone) and with the default ("after"), interleaved kind by kind, then a
# table of p50/p99 per kind × side (the time from the cut to each side's first failover, from
# the stats files). Needs root, iproute2 and a built plugin + harness (scripts/build.sh).
#
# usage: detection-table.sh [--drills N] [--out DIR] [--before VAR=VALUE] [extra sock-drill.sh options...]
#   --drills N          drills per kind and setting (default 10)
#   --out DIR           keep the per-run detection lines and drill outputs there (default: temporary)
#   --before VAR=VALUE  what "before" sets (default HA_NCCL_SILENCE_MS=0, the check off);
#                       repeatable (every one given is set)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
N=10 OUT="" BEFORE=() EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --drills) N=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --before) BEFORE+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "detection-table: --drills must be >= 1" >&2; exit 2; }
[ ${#BEFORE[@]} -gt 0 ] || BEFORE=(HA_NCCL_SILENCE_MS=0)
if [ -z "$OUT" ]; then OUT=$(mktemp -d /tmp/detection.XXXXXX); fi
mkdir -p "$OUT"
echo "detection-table: $N drills per kind and setting (before: ${BEFORE[*]}), outputs in $OUT"
fails=0
for spec in down/near down/far blackhole/both oneway/near oneway/far; do
  kind=${spec%/*} end=${spec#*/}
  [ "$end" != both ] || end=near   # a blackhole drops both ways: the end does not matter
  for setting in before after; do
    env=()
    if [ "$setting" = before ]; then for b in "${BEFORE[@]}"; do env+=(--env "$b"); done; fi
    tag="$kind-${spec#*/}-$setting"
    if ! bash "$ROOT/scripts/drill/sock-drill.sh" --drills "$N" --kind "$kind" --end "$end" \
        "${env[@]}" "${EXTRA[@]}" --detect "$OUT/$tag.detect" >"$OUT/$tag.out" 2>&1; then
      fails=$((fails + 1))
    fi
    echo "$tag: $(tail -n1 "$OUT/$tag.out")"
  done
done
python3 - "$OUT" <<'PY'
import glob, os, re, sys
out = sys.argv[1]
def pct(v, p):
    if not v:
        return "-"
    v = sorted(v)
    i = max(1, -(-p * len(v) // 100))
    return str(v[i - 1])
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.detect"))):
    tag = os.path.basename(f)[:-len(".detect")]
    kind, end, setting = tag.rsplit("-", 2)
    for line in open(f):
        m = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
        for side in ("send", "recv"):
            v = m.get(side, "-")
            r = rows.setdefault((kind, end, side), {"before": [], "after": [], "missed": {"before": 0, "after": 0}})
            if v == "-":
                r["missed"][setting] += 1
            else:
                r[setting].append(int(v))
        first = [int(m[s]) for s in ("send", "recv") if m.get(s, "-") != "-"]
        r = rows.setdefault((kind, end, "first"), {"before": [], "after": [], "missed": {"before": 0, "after": 0}})
        if first:
            r[setting].append(min(first))
        else:
            r["missed"][setting] += 1
print()
print("| failure | side | before p50 ms | before p99 ms | after p50 ms | after p99 ms | after/before p50 | drills (before/after) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for (kind, end, side), r in sorted(rows.items()):
    b, a = r["before"], r["after"]
    ratio = "-"
    if b and a:
        ratio = f"{float(pct(a, 50)) / float(pct(b, 50)):.2f}"
    name = {"down": "link down", "blackhole": "blackhole (both ways)", "oneway": "one-way loss"}[kind]
    where = {"near": "near end (a)", "far": "far end (b)", "both": "both ends"}[end]
    if kind == "oneway":
        where = {"near": "a→b dropped", "far": "b→a dropped"}[end]
    miss = f" ({r['missed']['before']}/{r['missed']['after']} without failover)" if any(r["missed"].values()) else ""
    print(f"| {name}, {where} | {side} | {pct(b, 50)} | {pct(b, 99)} | {pct(a, 50)} | {pct(a, 99)} | {ratio} | {len(b)}/{len(a)}{miss} |")
PY
[ "$fails" = 0 ] || { echo "detection-table: $fails run(s) had failed drills (see $OUT/*.out)"; exit 1; }
