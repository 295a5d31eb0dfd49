#!/usr/bin/env python3
"""Instructions per call of the plugin's hot entry points, from callgrind output files.

usage: callgrind_cost.py NAME=FILE[,FILE...] ...

Each FILE is a callgrind.out of one `ha-harness bench` ping-pong (scripts/bench/call-cost.sh
makes them). Per NAME it prints the calls and the instructions per call (inclusive) of
isend, irecv and test, the instructions the plugin's own library executed per round trip
(every thread: NCCL's calls, the progress thread, the sock fabric's threads), and the round
trips (irecv calls / 2, which counts the bench's bandwidth phase too: 100 messages with
call-cost.sh's settings). Instructions are counted, not timed: isend and irecv per call repeat
within about 1 % from run to run and machine to machine; test() and the per-round-trip total
vary more (about 7 %), as the number of empty polls and the timer duties follow the clock
(valgrind runs the code ~50x slower, so the duties run far more often per call than natively).
Needs a library with symbols: one where an entry point is not found is an error."""
import re
import sys
from collections import Counter

ENTRIES = {
    "isend": "ha_core::api::ops::isend_bytes",
    "irecv": "ha_core::api::ops::irecv_hinted",
    "test": "ha_core::api::ops::test",
}
def parse(path, calls, incl, own):
    names, obs = {}, {}
    fn = ob = cfn = None
    pending = None
    by_ob = Counter()
    plugin_ob = None

    def name(table, s):
        m = re.match(r"\((\d+)\)(?: (.*))?", s)
        if not m:
            return s
        if m.group(2):
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1), m.group(1))

    ncols = 1  # position columns before the cost on a cost line (`positions: line`)
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("positions:"):
            ncols = len(line.split()) - 1
        elif line.startswith("ob="):
            ob = name(obs, line[3:])
        elif line.startswith("fn="):
            fn = name(names, line[3:])
            pending = None
            if fn == ENTRIES["test"]:
                plugin_ob = ob
        elif line.startswith("cfn="):
            cfn = name(names, line[4:])
        elif line.startswith("cob="):
            name(obs, line[4:])
        elif line.startswith("calls="):
            pending = int(line[6:].split()[0])
        elif line and (line[0].isdigit() or line[0] in "+-*"):
            parts = line.split()
            cost = int(parts[ncols]) if len(parts) > ncols else 0
            if pending is not None:
                calls[cfn] += pending
                incl[cfn] += cost
                pending = None
            else:
                by_ob[ob] += cost
    # The plugin's library is the object that holds its `test`.
    own[0] += by_ob[plugin_ob] if plugin_ob else 0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = []
    for arg in sys.argv[1:]:
        label, files = arg.split("=", 1)
        calls, incl, own = Counter(), Counter(), [0]
        for f in files.split(","):
            parse(f, calls, incl, own)
        missing = [k for k, fn in ENTRIES.items() if calls[fn] == 0]
        if missing or own[0] == 0:
            sys.exit(f"callgrind_cost: {label}: no calls of {', '.join(missing) or 'the plugin'} "
                     "found: is the library built with symbols (target/release, not dist/)?")
        rts = calls[ENTRIES["irecv"]] / 2
        row = {"name": label, "round trips": rts}
        for k, fn in ENTRIES.items():
            row[f"{k} calls"] = calls[fn]
            row[f"{k} Ir/call"] = incl[fn] / max(calls[fn], 1)
        row["plugin Ir/round trip"] = own[0] / max(rts, 1)
        rows.append(row)
    cols = ["name", "round trips", "isend Ir/call", "irecv Ir/call", "test Ir/call",
            "test calls", "plugin Ir/round trip"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [r["name"]] + [f"{r[c]:.0f}" for c in cols[1:]]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
