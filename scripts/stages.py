#!/usr/bin/env python3
"""Latency breakdown from HA_NCCL_STAGES records.

usage: stages.py FILE.<pid> [FILE.<pid> ...] [--skip N]

Merges the records of every process (they share CLOCK_MONOTONIC on one host) into one
timeline and prints, for each transition between two consecutive records ("proc:thread:stage
-> proc:thread:stage"), how often it happened, its median and 90th percentile gap, and its
share of the whole time: the stages a small message spends its time between. Processes are
named p0, p1, ... in order of their first record; a thread by its name. --skip drops the first
N records of the merged timeline (set-up).
"""
import statistics
import sys
from collections import defaultdict


def load(paths):
    recs = []
    firsts = []
    for p in paths:
        rows = []
        with open(p) as f:
            for line in f:
                if line.startswith('#'):
                    continue
                ns, stage, value, _tid, name = line.split()[:5]
                rows.append((int(ns), stage, int(value), name))
        if rows:
            firsts.append((rows[0][0], p, rows))
    firsts.sort()
    for i, (_, _p, rows) in enumerate(firsts):
        for ns, stage, value, name in rows:
            recs.append((ns, f"p{i}:{name}:{stage}", value))
    recs.sort()
    return recs


def main():
    args = sys.argv[1:]
    skip = 0
    if '--skip' in args:
        i = args.index('--skip')
        skip = int(args[i + 1])
        del args[i:i + 2]
    if not args:
        print(__doc__)
        return 2
    recs = load(args)[skip:]
    if len(recs) < 2:
        print('stages: fewer than two records')
        return 1
    gaps = defaultdict(list)
    for a, b in zip(recs, recs[1:]):
        gaps[(a[1], b[1])].append(b[0] - a[0])
    total = recs[-1][0] - recs[0][0]
    rows = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))
    print(f"{len(recs)} records over {total / 1e6:.1f} ms")
    print(f"{'share':>6} {'count':>7} {'median us':>10} {'p90 us':>9}  transition")
    for (a, b), g in rows[:25]:
        g.sort()
        p90 = g[min(len(g) - 1, int(len(g) * 0.9))]
        print(f"{100 * sum(g) / total:5.1f}% {len(g):7d} {statistics.median(g) / 1e3:10.1f} "
              f"{p90 / 1e3:9.1f}  {a} -> {b}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
