#!/bin/bash
# The verbs fabric's tests on real kernel verbs: builds tests/verbs_rxe.rs on the host, runs
# it in one Soft-RoCE guest (run-in-vm.sh), prints the test output and a closing
#   verbs (Soft-RoCE): N passed, M failed
# line; exits non-zero when a test failed or the suite did not finish. Installs the build
# dependencies of ibverbs-sys (cmake, clang, libibverbs-dev, ...) with apt-get if missing.
# Extra arguments go to the test binary (a test-name filter, for example).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
t0=$SECONDS
export DEBIAN_FRONTEND=noninteractive
DEPS=(cmake pkg-config python3 libclang-dev libnl-3-dev libnl-route-3-dev libibverbs-dev)
missing=()
for p in "${DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-verbs: installing ${missing[*]}" >&2
  { apt-get install -y --no-install-recommends "${missing[@]}" ||
    { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }; } >/dev/null ||
    { echo "test-verbs: apt-get failed"; exit 2; }
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! cargo test --no-run --test verbs_rxe --message-format=json >"$log" 2>"$log.err"; then
  cat "$log.err"; rm -f "$log.err"
  echo "verbs (Soft-RoCE): 0 passed, 1 failed (the tests did not build)"
  exit 1
fi
rm -f "$log.err"
bin=$(grep -o '"executable":"[^"]*"' "$log" | tail -1 | cut -d'"' -f4)
[ -x "$bin" ] || { echo "test-verbs: no test executable found"; exit 1; }
echo "test-verbs: built $bin in $((SECONDS - t0)) s; running it in the guest" >&2
t1=$SECONDS
"$ROOT/scripts/softroce/run-in-vm.sh" "$bin" --test-threads=1 --show-output "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(sed -n 's/^test result: .* \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed.*/\1/p' "$log" | tail -1)
failed=$(sed -n 's/^test result: .* \([0-9][0-9]*\) passed; \([0-9][0-9]*\) failed.*/\2/p' "$log" | tail -1)
if [ -z "$passed" ]; then
  passed=$(grep -c '^test .* \.\.\. ok$' "$log")
  failed=$(( $(grep -c '^test .* \.\.\. FAILED$' "$log") + 1 ))
  echo "test-verbs: the suite did not finish (run-in-vm rc=$rc): one more failure counted"
fi
skipped=$(grep -c ': skipped: ' "$log")
echo "test-verbs: guest run $((SECONDS - t1)) s, total $((SECONDS - t0)) s"
[ "$skipped" -gt 0 ] && echo "test-verbs: WARNING: $skipped test(s) skipped inside the guest"
echo "verbs (Soft-RoCE): $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ] && [ "$skipped" -eq 0 ]
