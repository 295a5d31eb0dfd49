#!/usr/bin/env bash
# Leak check of the plugin under valgrind (memcheck): runs `ha-harness check` (every byte
# verified, sizes 0 B..--max-size, multi-recv, 32 in flight; both sides in one process) on the
# `sock` fabric with two loopback rails (127.0.0.1, 127.0.0.2: every connection has a
# standby path), then reports valgrind's leak summary. Passes when "definitely lost" and
# "indirectly lost" are 0 bytes and memcheck found no invalid access.
#
# usage: scripts/leakcheck.sh [--max-size SIZE] [--report FILE] [--log FILE]
#   --max-size SIZE  largest message of the check (default 4M; valgrind runs ~30x slower)
#   --report FILE    also write the command and the summary as markdown to FILE
#   --log FILE       keep valgrind's full output here (default: a temporary file, printed)
# Needs valgrind (apt-get install -y valgrind) and a release build (cargo build --release).
# Suppressions: scripts/valgrind.supp (each entry says why it is there).
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_SIZE=4M REPORT="" LOG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --max-size) MAX_SIZE=$2; shift 2 ;;
    --report) REPORT=$2; shift 2 ;;
    --log) LOG=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "leakcheck: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "leakcheck: valgrind not installed (apt-get install -y valgrind)" >&2; exit 2; }
HARNESS=target/release/ha-harness PLUGIN=target/release/libnccl_net_ha.so
[ -x "$HARNESS" ] && [ -f "$PLUGIN" ] || { echo "leakcheck: build first: cargo build --release -p nccl-net-ha -p ha-harness" >&2; exit 2; }
LOG=${LOG:-$(mktemp /tmp/leakcheck.XXXXXX.log)}

# Generous fabric timeouts: under valgrind everything is ~30x slower, and a retry timer firing
# only because the machine is slow would turn the check into a failover drill.
ENV=(HA_NCCL_FABRIC=sock NCCL_SOCKET_IFNAME=lo HA_NCCL_SOCK_RAILS=127.0.0.1,127.0.0.2
  HA_NCCL_SOCK_RETRY_MS=20000 HA_NCCL_RTO_MS=40000 HA_NCCL_KEEPALIVE_MS=5000
  HA_NCCL_HEARTBEAT_MS=5000)
CMD=(valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect,possible
  --errors-for-leak-kinds=definite,indirect --num-callers=40 --error-exitcode=99
  --suppressions=scripts/valgrind.supp --log-file="$LOG"
  "$HARNESS" check --plugin "$PLUGIN" --mode threads --max-size "$MAX_SIZE" --timeout 600)
echo "leakcheck: env ${ENV[*]}"
echo "leakcheck: ${CMD[*]}"
start=$SECONDS
rc=0
env "${ENV[@]}" "${CMD[@]}" >"$LOG.out" 2>&1 || rc=$?
took=$((SECONDS - start))
tail -n 5 "$LOG.out"
summary=$(sed -nE 's/^==[0-9]+== //p' "$LOG" | sed -n '/HEAP SUMMARY/,$p')
echo "$summary"
num() { sed -nE "s/.*$1: *([0-9,]+) bytes.*/\1/p" <<<"$summary" | tr -d , | head -n1; }
definite=$(num "definitely lost") indirect=$(num "indirectly lost")
errors=$(sed -nE 's/.*ERROR SUMMARY: ([0-9,]+) errors.*/\1/p' <<<"$summary" | tr -d , | tail -n1)
definite=${definite:-0} indirect=${indirect:-0} errors=${errors:-?}
verdict=PASS
if [ "$rc" != 0 ] || [ "$definite" != 0 ] || [ "$indirect" != 0 ]; then verdict=FAILED; fi
echo "leakcheck: definitely lost ${definite} bytes, indirectly lost ${indirect} bytes, memcheck errors ${errors}, harness exit $rc, ${took}s: $verdict (log: $LOG)"
if [ -n "$REPORT" ]; then
  {
    echo "Command (from the repository root, after \`cargo build --release -p nccl-net-ha -p ha-harness\`):"
    echo
    echo '```sh'
    echo "bash scripts/leakcheck.sh --max-size $MAX_SIZE"
    echo "# runs: ${ENV[*]} \\"
    echo "#   ${CMD[*]}"
    echo '```'
    echo
    echo "Harness output (last lines):"
    echo
    echo '```'
    tail -n 5 "$LOG.out"
    echo '```'
    echo
    echo "valgrind:"
    echo
    echo '```'
    echo "$summary"
    echo '```'
    echo
    echo "Verdict: definitely lost ${definite} bytes, indirectly lost ${indirect} bytes, memcheck errors ${errors}, harness exit $rc, ${took} s under valgrind: **$verdict**."
  } >"$REPORT"
fi
[ "$verdict" = PASS ]
