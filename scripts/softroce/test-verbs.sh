#!/bin/bash
# The verbs suite on real kernel verbs, in ONE Soft-RoCE guest (run-in-vm.sh):
#  * crates/ha-core/tests/verbs_rxe/: the fabric itself, both rails;
#  * the C-ABI suite through the built .so (crates/nccl-net-ha/tests/abi_sock.rs, abi_grouped.rs, abi_peer_failure.rs,
#    abi_lifecycle.rs, abi_gdr.rs) with HA_NCCL_FABRIC=verbs, once on rail A and once on rail B
#    (guest/verbs-suite.sh says how a rail is selected).
# Everything is built on the host first (debug profile). Prints every test's output, one
# summary line per binary and rail, and a closing
#   verbs (Soft-RoCE): N passed, M failed
# line; exits non-zero when a test failed, a binary did not finish, or a test was skipped
# inside the guest. Installs the build dependencies of ibverbs-sys (cmake, clang,
# libibverbs-dev, ...) with apt-get if missing. Extra arguments go to every test binary (a
# test-name filter, for example).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
t0=$SECONDS
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"  # apt-get install/update need root
DEPS=(cmake pkg-config python3 libclang-dev libnl-3-dev libnl-route-3-dev libibverbs-dev)
missing=()
for p in "${DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-verbs: installing ${missing[*]}" >&2
  { $SUDO apt-get install -y --no-install-recommends "${missing[@]}" ||
    { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; }; } >/dev/null ||
    { echo "test-verbs: apt-get failed"; exit 2; }
fi
log=$(mktemp)
trap 'rm -f "$log" "$log.err"; [ -n "${stage:-}" ] && rm -rf "$stage"' EXIT
ABI_TESTS=(abi_sock abi_grouped abi_peer_failure abi_lifecycle abi_gdr)
tests=(--test verbs_rxe)
for t in "${ABI_TESTS[@]}"; do tests+=(--test "$t"); done
# The .so the C-ABI tests load (target/debug/libnccl_net_ha.so, beside their deps/).
if ! cargo build -p nccl-net-ha >"$log.err" 2>&1 ||
   ! cargo test --no-run -p ha-core -p nccl-net-ha "${tests[@]}" --message-format=json >"$log" 2>>"$log.err"; then
  cat "$log.err"
  echo "verbs (Soft-RoCE): 0 passed, 1 failed (the tests did not build)"
  exit 1
fi
# "name executable" of each test binary.
declare -A exe
while read -r name path; do exe[$name]=$path; done < <(
  sed -n 's/.*"target":{[^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p' "$log")
for t in verbs_rxe "${ABI_TESTS[@]}"; do
  [ -x "${exe[$t]:-}" ] || { echo "test-verbs: no executable for $t"; exit 1; }
done
so=$(dirname "$(dirname "${exe[abi_sock]}")")/libnccl_net_ha.so
[ -f "$so" ] || { echo "test-verbs: $so missing"; exit 1; }
# The guest sees the host's root at the same paths, except /tmp: a target dir under /tmp is
# staged (binaries in deps/, the .so beside it) on the rig's share.
if [[ $so == /tmp/* ]]; then
  SR_WORK=${SR_WORK:-/tmp/softroce}
  mkdir -p "$SR_WORK/share"
  stage=$(mktemp -d "$SR_WORK/share/verbs-suite.XXXXXX")
  mkdir "$stage/deps"
  cp "$so" "$stage/"
  for t in verbs_rxe "${ABI_TESTS[@]}"; do
    cp "${exe[$t]}" "$stage/deps/" && exe[$t]=$stage/deps/${exe[$t]##*/}
  done
fi
abi=
for t in "${ABI_TESTS[@]}"; do abi+="${exe[$t]} "; done
echo "test-verbs: built in $((SECONDS - t0)) s; running the suite in the guest" >&2
t1=$SECONDS
"$ROOT/scripts/softroce/run-in-vm.sh" bash "$ROOT/scripts/softroce/guest/verbs-suite.sh" \
  "${exe[verbs_rxe]}" "$abi" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
guest_s=$((SECONDS - t1))
# Add up the `test result:` lines per run; a run without one (crash, hang, dead guest) or
# with a non-zero status counts one failure more; so does every run that never started.
expected=$((1 + 2 * ${#ABI_TESTS[@]}))
read -r passed failed runs < <(awk -v expected="$expected" '
  /^== .* ==$/ { label = substr($0, 4, length($0) - 6); p = 0; f = 0; have = 0; next }
  /^test result: / {
    for (i = 1; i <= NF; i++) {
      if ($(i) ~ /^passed;?$/) p += $(i - 1)
      if ($(i) ~ /^failed;?$/) f += $(i - 1)
    }
    have = 1; next
  }
  /^suite: .* rc=[0-9]+$/ {
    n = split($0, a, "rc="); code = a[n] + 0
    if (!have) { f++; why = " (did not finish)" } else if (code != 0 && f == 0) { f++; why = " (rc=" code ")" } else why = ""
    printf "test-verbs: %s: %d passed, %d failed%s\n", label, p, f, why > "/dev/stderr"
    P += p; F += f; runs++; next
  }
  END {
    if (runs < expected) {
      printf "test-verbs: %d of %d runs never reported\n", expected - runs, expected > "/dev/stderr"
      F += expected - runs
    }
    print P + 0, F + 0, runs + 0
  }' "$log")
skipped=$(grep -c ': skipped: ' "$log")
echo "test-verbs: guest run ${guest_s} s (run-in-vm rc=$rc), total $((SECONDS - t0)) s"
[ "$skipped" -gt 0 ] && echo "test-verbs: WARNING: $skipped test(s) skipped inside the guest"
echo "verbs (Soft-RoCE): $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ] && [ "$skipped" -eq 0 ]
