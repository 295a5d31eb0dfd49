#!/usr/bin/env bash
# Run every fuzz target (fuzz/fuzz_targets/*.rs) with cargo-fuzz for SECONDS each
# (default 30) and print the executions per target.
#
#   scripts/fuzz.sh [SECONDS]
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 0     # a fixed number of executions instead of time
#   FUZZ_TARGETS="sock_stream recv_side" scripts/fuzz.sh 60
#   FUZZ_SANITIZER=address scripts/fuzz.sh 30    # default none: the targets are safe Rust
#
# Needs a nightly toolchain (rustup) and cargo-fuzz, which it installs when missing.
# Corpora grow in fuzz/corpus/<target>/ (ignored by git), seeded from fuzz/seeds/<target>/;
# crashes land in fuzz/artifacts/<target>/. The stable, short variant of the same targets
# is `cargo test -p ha-fuzz --test fuzz_targets`.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-30}
runs=${FUZZ_RUNS:--1}
san=${FUZZ_SANITIZER:-none}
nice_cmd=(nice -n "${FUZZ_NICE:-10}")

die() { echo "fuzz.sh: $*" >&2; exit 2; }

command -v rustup >/dev/null || die "rustup not found: cannot get a nightly toolchain; cargo-fuzz needs nightly. The stable variant: cargo test -p ha-fuzz --test fuzz_targets"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing the nightly toolchain" >&2
    rustup toolchain install nightly --profile minimal \
        || die "cannot install a nightly toolchain (offline?); cargo-fuzz needs nightly"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked \
        || die "cannot install cargo-fuzz (offline?); alternatives: cargo-afl or Debian's afl++"
fi

targets=${FUZZ_TARGETS:-$(cd fuzz/fuzz_targets && ls *.rs | sed 's/\.rs$//')}
cd fuzz
"${nice_cmd[@]}" cargo +nightly fuzz build -O -s "$san" --fuzz-dir . >&2

declare -A execs
for t in $targets; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="artifacts/$t/last-run.log"
    args=(-runs="$runs" -print_final_stats=1)
    if [ "$secs" != 0 ]; then args+=(-max_total_time="$secs"); fi
    echo "== $t: ${secs}s, runs=$runs" >&2
    if ! "${nice_cmd[@]}" cargo +nightly fuzz run -O -s "$san" --fuzz-dir . "$t" "corpus/$t" "seeds/$t" \
        -- "${args[@]}" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "$t: crash or error (input in fuzz/artifacts/$t/, log $log)"
    fi
    execs[$t]=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    echo "$t: ${execs[$t]} executions (${rate}/s)"
done
