#!/bin/bash
# Benchmark (not a test): the plugin's verbs fabric against perftest on Soft-RoCE rail A, in
# one guest. Builds the release plugin and ha-harness on the host, then in the guest
# (guest/bench.sh) runs `ha-harness bench --mode procs` through the plugin between rxe0a and
# rxe0b, and ib_write_lat / ib_write_bw between the same two ports (-x the RoCE v2 GID),
# same sizes, same iteration counts, same writes in flight. Prints the ratio table and saves
# it, with the command and the machine, to bench/results/<date>-softroce-verbs-vs-perftest.md
# (BENCH_OUT overrides the file; BENCH_OUT=- saves nothing).
#
# BENCH_COUNTS=1 adds a counted table: system calls, context switches and CPU time per round
# trip of each plugin run (ours, ours with the standby, the peer), from `perf stat` over runs
# of BENCH_COUNT_ITERS (300) and four times as many round trips (the guest has no PMU: no
# instruction counts).
#
# BENCH_STANDBY=1 adds the standby columns: the plugin again with its standby on (rail B's
# ports as the standby devices), right after the single-path run, per size.
#
# PEER_PLUGIN=/path/libnccl-net.so adds a peer column: another ext-net plugin, driven by the
# same ha-harness command on the same ports right after ours, per size (for #15: NCCL's IB
# transport as nccl-rdma-sharp-plugins ships it, built by hand; nothing here builds it).
#
#   scripts/softroce/bench-verbs.sh
#   BENCH_FACTOR=4 BENCH_BW_BYTES=16M scripts/softroce/bench-verbs.sh   # a quicker sweep
#
# Knobs (sizes take K/M suffixes): BENCH_MIN (8), BENCH_MAX (8M), BENCH_FACTOR (4),
# BENCH_ITERS (latency iterations, 500), BENCH_LAT_BYTES (cap on latency volume per size,
# 16M), BENCH_BW_BYTES (bandwidth volume per size, 32M), BENCH_BW_MAX_MSGS (2000),
# BENCH_WINDOW (32), BENCH_ROUNDS (3: the sweep runs this often, each tool keeps its best
# latency and its best bandwidth per size). HA_NCCL_* knobs in the environment reach the plugin
# (HA_NCCL_PROGRESS_SPIN_US, for example). The guest runs with the TSC as clocksource
# (SR_KARGS, default "tsc=reliable clocksource=tsc"): with QEMU's default HPET every
# clock_gettime is a trapped MMIO read, and the plugin reads the clock far more often than
# perftest (which uses rdtsc).
# Under TCG everything is ~15x slower than on the host, and the guest's two vCPUs are host
# threads: a loaded host shows up as multi-millisecond stalls for both tools. The load
# average before and after is saved with the table.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
t0=$SECONDS
bytes() { numfmt --from=iec "${1%B}"; }
min=$(bytes "${BENCH_MIN:-8}") max=$(bytes "${BENCH_MAX:-8M}") factor=${BENCH_FACTOR:-4}
iters=${BENCH_ITERS:-500} lat_bytes=$(bytes "${BENCH_LAT_BYTES:-16M}")
bw_bytes=$(bytes "${BENCH_BW_BYTES:-32M}") bw_max=${BENCH_BW_MAX_MSGS:-2000}
window=${BENCH_WINDOW:-32} rounds=${BENCH_ROUNDS:-3}
export SR_KARGS=${SR_KARGS-tsc=reliable clocksource=tsc}
out=${BENCH_OUT:-bench/results/$(date +%F)-softroce-verbs-vs-perftest.md}

bash scripts/softroce/build.sh >&2 || { echo "bench-verbs: rig build failed"; exit 2; }
cargo build --release -p nccl-net-ha -p ha-harness --message-format=json-render-diagnostics \
  > /tmp/bench-verbs.$$.json || { echo "bench-verbs: build failed"; exit 1; }
harness=$(grep -o '"executable":"[^"]*ha-harness"' /tmp/bench-verbs.$$.json | cut -d'"' -f4 | tail -1)
rm -f /tmp/bench-verbs.$$.json
so=$(dirname "$harness")/libnccl_net_ha.so
[ -x "$harness" ] && [ -f "$so" ] || { echo "bench-verbs: no $harness / $so"; exit 1; }
stage=
trap '[ -n "$stage" ] && rm -rf "$stage"' EXIT
peer=${PEER_PLUGIN:-}
if [ -n "$peer" ] && [ ! -f "$peer" ]; then echo "bench-verbs: PEER_PLUGIN $peer: no such file"; exit 2; fi
if [[ $harness == /tmp/* ]] || [ -n "$peer" ]; then # the guest has its own /tmp: stage on the rig's share
  mkdir -p "${SR_WORK:-/tmp/softroce}/share"
  stage=$(mktemp -d "${SR_WORK:-/tmp/softroce}/share/bench.XXXXXX")
  cp "$harness" "$so" "$stage/" && harness=$stage/ha-harness so=$stage/libnccl_net_ha.so
  if [ -n "$peer" ]; then cp -L "$peer" "$stage/peer.so" && peer=$stage/peer.so; fi
fi
echo "bench-verbs: built in $((SECONDS - t0)) s; running in the guest" >&2
t1=$SECONDS
log=$(mktemp)
args=("$harness" "$so" "$min" "$max" "$factor" "$iters" "$lat_bytes" "$bw_bytes" "$bw_max"
  "$window" "$rounds" ${peer:+"$peer"})
load0=$(cut -d' ' -f1-3 /proc/loadavg)
SR_PASSENV="${SR_PASSENV:-} BENCH_STANDBY BENCH_COUNTS BENCH_COUNT_ITERS" SR_TIMEOUT=${SR_TIMEOUT:-3000} scripts/softroce/run-in-vm.sh \
  bash "$ROOT/scripts/softroce/guest/bench.sh" "${args[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
guest_s=$((SECONDS - t1))
load1=$(cut -d' ' -f1-3 /proc/loadavg)

# One row per size: plugin and perftest side by side, each tool's best of the rounds (lowest
# latency, highest bandwidth), ratios plugin/perftest. Bandwidth in MB/s of 1e6 bytes
# (perftest reports MiB/s).
table=$(awk '
  function lo(a, k, v) { if (!(k in a) || v < a[k]) a[k] = v }
  function hi(a, k, v) { if (!(k in a) || v > a[k]) a[k] = v }
  $1 == "RESULT" && $2 == "plugin" { s[$3] = 1; lo(pl, $3, $4); hi(pb, $3, $5 * 1000) }
  $1 == "RESULT" && $2 == "ib_write_lat" { s[$3] = 1; lo(ql, $3, $4) }
  $1 == "RESULT" && $2 == "ib_write_bw" { s[$3] = 1; hi(qb, $3, $4 * 1.048576) }
  $1 == "RESULT" && $2 == "peer" { s[$3] = 1; havepeer = 1; lo(el, $3, $4); hi(eb, $3, $5 * 1000) }
  $1 == "RESULT" && $2 == "standby" { s[$3] = 1; havesb = 1; lo(sl, $3, $4); hi(sb, $3, $5 * 1000) }
  $1 == "RESULT" { all[$2 " " $3] = all[$2 " " $3] " " $4 }
  # median (min-max) of the rounds latencies of TOOL at SIZE
  function mid(tool, k,   n, v, i, j, t) {
    n = split(all[tool " " k], v, " "); if (n == 0) return "-"
    for (i = 1; i <= n; i++) { v[i] += 0; for (j = 1; j < i; j++) if (v[j] > v[i]) { t = v[i]; v[i] = v[j]; v[j] = t } }
    return sprintf("%.1f (%.1f-%.1f)", (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2, v[1], v[n])
  }
  function r(a, b) { return (a != "" && b > 0) ? sprintf("%.2f", a / b) : "-" }
  function f(v, fmt) { return v == "" ? "-" : sprintf(fmt, v) }
  function human(n) {
    if (n >= 1048576 && n % 1048576 == 0) return n / 1048576 " MiB"
    if (n >= 1024 && n % 1024 == 0) return n / 1024 " KiB"
    return n " B"
  }
  END {
    print "| size | plugin lat (us) | ib_write_lat (us) | lat ratio | plugin BW (MB/s) | ib_write_bw (MB/s) | BW ratio |" (havepeer ? " peer lat (us) | plugin/peer lat | peer BW (MB/s) | plugin/peer BW | plugin lat, median (min-max) | peer lat, median (min-max) |" : "") (havesb ? " standby on: lat (us) | on/off lat | BW (MB/s) | on/off BW | off lat, median (min-max) | on lat, median (min-max) |" : "")
    print "|---:|---:|---:|---:|---:|---:|---:|" (havepeer ? "---:|---:|---:|---:|---:|---:|" : "") (havesb ? "---:|---:|---:|---:|---:|---:|" : "")
    n = 0; for (k in s) sizes[++n] = k + 0
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sizes[j] < sizes[i]) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    for (i = 1; i <= n; i++) {
      k = sizes[i]
      printf "| %s | %s | %s | %s | %s | %s | %s |", human(k), f(pl[k], "%.1f"), f(ql[k], "%.1f"),
        r(pl[k], ql[k]), f(pb[k], "%.3g"), f(qb[k], "%.3g"), r(pb[k], qb[k])
      if (havepeer) printf " %s | %s | %s | %s | %s | %s |", f(el[k], "%.1f"), r(pl[k], el[k]), f(eb[k], "%.3g"), r(pb[k], eb[k]), mid("plugin", k), mid("peer", k)
      if (havesb) printf " %s | %s | %s | %s | %s | %s |", f(sl[k], "%.1f"), r(sl[k], pl[k]), f(sb[k], "%.3g"), r(sb[k], pb[k]), mid("plugin", k), mid("standby", k)
      printf "\n"
      if (k == 8 && pl[k] != "" && ql[k] > 0)
        goal = goal sprintf("* latency at 8 B: %.2fx ib_write_lat (goal <= 1.20x): %s\n", pl[k] / ql[k], pl[k] / ql[k] <= 1.20 ? "met" : "MISSED")
      if (havesb && pl[k] != "" && sl[k] != "") {
        q = sl[k] / pl[k]; if (sbn++ == 0 || q < sblo) sblo = q; if (sbn == 1 || q > sbhi) sbhi = q
      }
      if (k >= 65536 && pb[k] != "" && qb[k] > 0) {
        big++; ratio = pb[k] / qb[k]
        if (ratio < 0.95) { bad++; low = low sprintf(" %s (%.2fx)", human(k), ratio) }
      }
    }
    if (big) goal = goal sprintf("* bandwidth at >= 64 KiB: %d of %d sizes >= 0.95x ib_write_bw: %s%s\n", big - bad, big, bad ? "MISSED at" : "met", low)
    if (sbn) goal = goal sprintf("* standby on vs off, latency (best rounds): %.2f-%.2fx (goal within 2 %%): %s\n", sblo, sbhi, (sblo >= 0.98 && sbhi <= 1.02) ? "met" : "MISSED")
    printf "\n%s", goal
  }' "$log")
# BENCH_COUNTS=1: per round trip, both processes (guest/bench.sh's count pass).
counts=$(awk '
  $1 == "COUNT" { if (!n++) { print "| size | run | system calls per round trip (not yields) | sched_yield per round trip | context switches per round trip |"; print "|---:|---|---:|---:|---:|" }
    printf "| %s | %s | %s | %s | %s |\n", $3, $2, $4, $5, $6 }' "$log")
echo
echo "$table"
[ -z "$counts" ] || { echo; echo "$counts"; }
echo "bench-verbs: guest run ${guest_s} s (rc=$rc), total $((SECONDS - t0)) s"
[ "$rc" -eq 0 ] || { echo "bench-verbs: the guest run failed; nothing saved"; exit 1; }
[ "$out" = - ] && exit 0
mkdir -p "$(dirname "$out")"
knobs=$(compgen -e | grep '^HA_NCCL_\|^BENCH_' | while read -r v; do printf '%s=%s ' "$v" "${!v}"; done)
{
  echo "# Soft-RoCE: the plugin (verbs fabric) vs perftest on rail A"
  echo
  echo "$(date -u '+%F %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' + uncommitted changes in crates/')."
  echo
  echo '```'
  echo "${knobs}scripts/softroce/bench-verbs.sh"
  echo '```'
  echo
  echo "* Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, shared with other work; $(. /etc/os-release && echo "$PRETTY_NAME")."
  echo "* Guest: QEMU $(qemu-system-x86_64 --version | sed -n 's/.*version \([^ ]*\).*/\1/p') TCG (no KVM), ${SR_SMP:-2} vCPUs, ${SR_MEM:-1024} MiB, kernel $(ls "${SR_WORK:-/tmp/softroce}/kernel/lib/modules" 2>/dev/null | head -1); rdma_rxe on veth pairs (MTU 1500, RoCE v2, active MTU 1024)."
  echo "* Rail A: rxe0a (10.10.0.1) <-> rxe0b (10.10.0.2). perftest $(dpkg-query -W -f='${Version}' perftest), libibverbs $(dpkg-query -W -f='${Version}' libibverbs1)."
  echo "* plugin, per size: \`ha-harness bench --mode procs --dev 0 --peer-dev 1 --min SIZE --max SIZE --iters $iters --lat-bytes $lat_bytes --bw-bytes $bw_bytes --bw-max-msgs $bw_max --window $window\` with HA_NCCL_FABRIC=verbs, NCCL_IB_HCA exactly rail A's two ports, HA_NCCL_ENABLE_BACKUP=0 (single path), HA_NCCL_QP_RETRY_CNT=6; latency = median half round trip of an isend/irecv ping-pong; bandwidth = $window sends in flight, timed until the receiver's acknowledgement."
  echo "* perftest, per size right after the plugin: \`ib_write_lat\` / \`ib_write_bw -t $window\`, \`-d <port> -x <RoCE v2 GID index> -s SIZE -n ITERS -F\`, server on the receiver's port; latency = t_typical (median one-way), bandwidth = BW average. Same iteration counts as the plugin (perftest at least 5)."
  [ "${BENCH_STANDBY:-0}" = 1 ] && echo "* standby on, per size right after the single-path plugin run: the same ha-harness command with HA_NCCL_ENABLE_BACKUP=1, NCCL_IB_HCA all four ports (rails A and B) and HA_NCCL_STANDBY_MAP giving each side rail B's port on its own side as the standby; the traffic stays on rail A."
  [ -n "${PEER_PLUGIN:-}" ] && echo "* peer, per size right after the plugin: the same ha-harness command through \`$PEER_PLUGIN\` ($(strings "$PEER_PLUGIN" 2>/dev/null | grep -m1 -o 'NCCL RDMA Plugin v[0-9]*' || echo 'another ext-net plugin')), NCCL_IB_HCA the same two ports, NCCL_IB_TIMEOUT=16 NCCL_IB_RETRY_CNT=6 (as the plugin's QP settings)."
  echo "* The sweep ran $rounds times, interleaved per size (plugin, ib_write_lat, ib_write_bw); each cell is that tool's best round (lowest latency, highest bandwidth)."
  echo "* Both tools: sender pinned to vCPU 0, receiver to vCPU 1 (taskset); guest kernel arguments \`${SR_KARGS}\`."
  echo "* Guest run ${guest_s} s; host load average (1/5/15 min) $load0 before, $load1 after."
  echo
  echo "$table"
  if [ -n "$counts" ]; then
    echo
    echo "Counted, not timed (BENCH_COUNTS=1): both processes of a run under \`perf stat -e raw_syscalls:sys_enter,syscalls:sys_enter_sched_yield,context-switches\`, runs of ${BENCH_COUNT_ITERS:-300} and $((4 * ${BENCH_COUNT_ITERS:-300})) round trips, the difference per round trip (start-up and tear-down cancel):"
    echo
    echo "$counts"
  fi
  echo
  echo "<details><summary>Every round (RESULT tool size latency_us [bandwidth]: plugin GB/s, ib_write_bw MiB/s)</summary>"
  echo
  echo '```'
  grep '^RESULT ' "$log"
  echo '```'
  echo "</details>"
} > "$out"
echo "bench-verbs: saved $out"
