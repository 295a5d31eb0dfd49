#!/usr/bin/env python3
"""Per-thread CPU use of running processes over a window (a benchmark aid, reads /proc only).

    scripts/thread_cpu.py [--match all_reduce_perf] [--delay 3] [--window 2] [--top 12]

Waits --delay seconds, samples every thread of every process whose command line contains
--match, samples again --window seconds later, and prints: the whole host's CPU split (user,
system, softirq, idle, in cores), then per process the threads grouped by name with digits
dropped (e.g. every `sock-tx-N` together) and the busiest single threads, in cores (1.00 = one
core all the time) with their voluntary context switches per second (each is a sleep, so a
wake-up follows). A thread at ~1.00 is the limit of whatever it alone carries.

--wchan: during the window, keep reading each thread's /proc/.../wchan (the kernel function it
sleeps in, "0" while running) and print, for the threads that sleep, where they were found
asleep (share of the samples): e.g. a socket wait (`wait_woken`, `sk_wait_data`) vs a lock or
condition variable (`futex_wait_queue`) tells which wait a wake-up ends.
"""
import argparse
import os
import re
import time

TICK = os.sysconf("SC_CLK_TCK")


def host_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return {"user": v[0] + v[1], "system": v[2] + v[5], "softirq": v[6], "idle": v[3] + v[4]}


def pids(match):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if match in cmd and "thread_cpu.py" not in cmd and not cmd.startswith(("mpirun", "/bin/sh", "sh ")):
            out.append(int(p))
    return out


def threads(pid):
    d = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return d
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        rest = s[s.rindex(")") + 2 :].split()
        ticks = int(rest[11]) + int(rest[12])  # utime + stime
        sw = 0
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        sw = int(line.split()[1])
        except OSError:
            pass
        d[int(t)] = (name, ticks, sw)
    return d


def sample_wchan(ps, until):
    """tid -> {wait channel: samples}, reading every thread's wchan until `until`."""
    paths = []
    for p in ps:
        try:
            paths += [(int(t), f"/proc/{p}/task/{t}/wchan") for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            pass
    out = {}
    while time.monotonic() < until:
        for tid, path in paths:
            try:
                with open(path) as f:
                    w = f.read().strip() or "0"
            except OSError:
                continue
            h = out.setdefault(tid, {})
            h[w] = h.get(w, 0) + 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="all_reduce_perf")
    ap.add_argument("--delay", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--wchan", action="store_true", help="sample where each thread sleeps")
    a = ap.parse_args()
    time.sleep(a.delay)
    ps = pids(a.match)
    h0, t0 = host_cpu(), time.monotonic()
    s0 = {p: threads(p) for p in ps}
    chans = sample_wchan(ps, t0 + a.window) if a.wchan else {}
    time.sleep(max(0.0, t0 + a.window - time.monotonic()))
    h1, t1 = host_cpu(), time.monotonic()
    s1 = {p: threads(p) for p in ps}
    span = (t1 - t0) * TICK
    print("host cores: " + "  ".join(f"{k} {(h1[k] - h0[k]) / span:.2f}" for k in h0))
    for p in ps:
        rows = []
        for tid, (name, ticks, sw) in s1[p].items():
            _, t_before, sw_before = s0[p].get(tid, (name, ticks, sw))
            rows.append((name, tid, (ticks - t_before) / span, (sw - sw_before) / (t1 - t0)))
        groups = {}
        for name, _, c, w in rows:
            key = re.sub(r"\d+", "N", name)
            n, tot, mx, wk = groups.get(key, (0, 0.0, 0.0, 0.0))
            groups[key] = (n + 1, tot + c, max(mx, c), wk + w)
        total = sum(r[2] for r in rows)
        wakes = sum(r[3] for r in rows)
        print(f"pid {p}: {len(rows)} threads, {total:.2f} cores, {wakes:.0f} sleeps/s")
        for key, (n, tot, mx, wk) in sorted(groups.items(), key=lambda kv: -kv[1][1] - kv[1][3] / 1e6):
            if tot >= 0.01 or wk >= 1:
                print(f"  {key:<20} x{n:<4} {tot:6.2f} cores (busiest {mx:.2f}) {wk:9.0f} sleeps/s")
        for name, tid, c, w in sorted(rows, key=lambda r: -r[2])[: a.top]:
            if c >= 0.01:
                print(f"    {name:<18} {tid:>8} {c:.2f} {w:9.0f} sleeps/s")
        if a.wchan:
            print("  where the threads that sleep were found asleep (share of samples):")
            for name, tid, c, w in sorted(rows, key=lambda r: -r[3])[: a.top]:
                h = chans.get(tid, {})
                n = sum(h.values())
                if w < 1 or not n:
                    continue
                top = sorted(h.items(), key=lambda kv: -kv[1])[:3]
                where = ", ".join(f"{k} {v / n:.0%}" for k, v in top)
                print(f"    {name:<18} {tid:>8} {w:9.0f} sleeps/s  {where}")


if __name__ == "__main__":
    main()
