"""One markdown table from several nccl-tests runs per column.

    compare_table.py NAME=LOG[,LOG...] NAME=LOG[,LOG...] ...

Per size and column: the median out-of-place time over the column's logs (rounds) with its
[min..max]; then, for every column that is not Socket, its speed against the better Socket column
(`socket` or `tuned`, median time; > 1 means faster). #wrong is summed over every log.
When the logs hold NCCL's TUNING lines (NCCL_DEBUG_SUBSYS=...,TUNING), a second table gives
NCCL's choice per size and column: algorithm, protocol and channels (first log of the column):
a column that NCCL splits over more channels pays more per-message costs at mid sizes.
"""
import statistics
import re
import sys


# NCCL's own log lines (NCCL_DEBUG=INFO, e.g. TUNING's one per collective) can land in the middle
# of a result row: both go to stdout. Cut them out before parsing.
NCCL_LINE = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL INFO [^\n]*\n")
TUNING = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")


def choices(path):
    """size -> "ALGO/PROTO/Nch" from the first TUNING line of each size in `path`."""
    out = {}
    for m in TUNING.finditer(open(path, errors="replace").read()):
        size = int(m.group(1))
        if size not in out:
            out[size] = f"{m.group(2)}/{m.group(3)}/{int(m.group(5)) - int(m.group(4)) + 1}ch"
    return out


def rows(path):
    out, wrong = {}, 0
    text = NCCL_LINE.sub("", open(path, errors="replace").read())
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 13 and f[0].isdigit() and f[2] in ("float", "half", "bfloat16", "double", "int32", "int8", "uint8"):
            out[int(f[0])] = (float(f[5]), float(f[7]))
            wrong += sum(int(w) for w in (f[8], f[12]) if w.isdigit())
    return out, wrong


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


cols = []
picked = {}
for arg in sys.argv[1:]:
    name, logs = arg.split("=", 1)
    paths = [p for p in logs.split(",") if p]
    runs = [rows(p) for p in paths]
    cols.append((name, [r for r, _ in runs], sum(w for _, w in runs)))
    if paths:
        picked[name] = choices(paths[0])
sizes = sorted({s for _, runs, _ in cols for r in runs for s in r})
med = {}
for name, runs, _ in cols:
    for s in sizes:
        ts = [r[s][0] for r in runs if s in r]
        med[name, s] = (statistics.median(ts), min(ts), max(ts)) if ts else None
refs = [n for n, _, _ in cols if n in ("socket", "tuned")]
others = [n for n, _, _ in cols if n not in refs]
head = ["size"] + [f"{n} us" for n, _, _ in cols] + [f"{n} / best Socket" for n in others if refs]
print("| " + " | ".join(head) + " |")
print("|" + "---:|" * len(head))
for s in sizes:
    cells = [human(s)]
    for n, _, _ in cols:
        m = med[n, s]
        cells.append("-" if m is None else f"{m[0]:.1f} [{m[1]:.1f}..{m[2]:.1f}]")
    best = [med[n, s][0] for n in refs if med[n, s]]
    for n in others:
        if refs:
            cells.append(f"{min(best) / med[n, s][0]:.2f}" if best and med[n, s] else "-")
    print("| " + " | ".join(cells) + " |")
print()
print("rounds: " + ", ".join(f"{n} {len(runs)}" for n, runs, _ in cols)
      + "; #wrong: " + ", ".join(f"{n} {w}" for n, _, w in cols))
print("busbw at the largest size (GB/s, median): " + ", ".join(
    f"{n} {statistics.median([r[sizes[-1]][1] for r in runs if sizes[-1] in r]):.2f}"
    for n, runs, _ in cols if any(sizes[-1] in r for r in runs)))
if any(picked.values()):
    named = [n for n, _, _ in cols if picked.get(n)]
    print()
    print("| size | " + " | ".join(f"{n}: NCCL's choice" for n in named) + " |")
    print("|---:|" + "---|" * len(named))
    for s in sizes:
        print(f"| {human(s)} | " + " | ".join(picked[n].get(s, "-") for n in named) + " |")
