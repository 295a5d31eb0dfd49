#!/bin/bash
# Run one command inside a fresh Soft-RoCE guest; exit with its status, print its output.
#
#   scripts/softroce/run-in-vm.sh [--no-rails] CMD [ARGS...]
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/scripts/softroce/run-in-vm.sh cargo test -p ha-core --test verbs_rxe
#
# The guest (QEMU, TCG) runs Debian's kernel and sees the host's root filesystem read-only at
# the same paths, so CMD can be any host-built binary (a cargo test executable under target/).
# Before CMD runs, guest/rails.sh builds two RoCE v2 rails with four rxe devices:
#   rail A: rxe0a 10.10.0.1 (p0a) <== veth ==> rxe0b 10.10.0.2 (p0b)
#   rail B: rxe1a 10.11.0.1 (p1a) <== veth ==> rxe1b 10.11.0.2 (p1b)
# and exports SOFTROCE_A0/A1/B0/B1="<dev> <gid_index> <ip> <netdev>" and SOFTROCE_LINK (the
# link-control script, guest/link.sh). The guest has its own /tmp (a program under the
# host's /tmp is copied in for the run). CMD runs as root with cwd = the caller's cwd and
# these variables passed through: RUST_*, CARGO_*, NCCL_*, HA_NCCL_*, SOFTROCE_*, and the names in $SR_PASSENV.
#
# Exit status: CMD's; 124 when the guest ran past $SR_TIMEOUT (default 900 s), 125 when it
# died without reporting, 2 when the rig could not be built. The guest console is printed on
# 124/125 or when $SR_VERBOSE is set.
# Env: SR_WORK (default /tmp/softroce), SR_SMP (2), SR_MEM (MiB, 1024), SR_ACCEL (tcg,thread=multi),
# SR_KARGS (extra kernel command-line arguments).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SR_WORK=${SR_WORK:-/tmp/softroce}
RAILS=yes; [ "${1:-}" = --no-rails ] && { RAILS=no; shift; }
[ $# -ge 1 ] || { echo "usage: run-in-vm.sh [--no-rails] CMD [ARGS...]" >&2; exit 2; }
bash "$HERE/build.sh" >&2 || exit 2

SHARE=$SR_WORK/share
id=job$$r$RANDOM
J=$SHARE/jobs/$id
mkdir -p "$J"
trap 'rm -rf "$J" "$SR_WORK/$id".*' EXIT
# The guest mounts its own /tmp: a program under the host's /tmp (a CARGO_TARGET_DIR there)
# travels through the job directory instead.
prog=$(realpath -e "$1" 2>/dev/null || true)
if [[ -n $prog && -f $prog && $prog == /tmp/* && $prog != "$SHARE"/* ]]; then
  mkdir -p "$J/bin" && cp "$prog" "$J/bin/" && set -- "$J/bin/${prog##*/}" "${@:2}"
fi
printf '%q ' "$@" > "$J/cmd"; echo >> "$J/cmd"
# A repository checked out under the host's /tmp (CI clones) stays visible in the guest.
REPO=$(cd "$HERE/../.." && pwd)
keep=; [[ $REPO == /tmp/* ]] && keep=" sr.keep=$REPO"
pwd > "$J/cwd"
echo "$RAILS" > "$J/rails"
for v in $(compgen -e); do
  case $v in RUST_*|CARGO_*|NCCL_*|HA_NCCL_*|SOFTROCE_*) declare -p "$v" >> "$J/env" ;; esac
  for w in ${SR_PASSENV:-}; do [ "$v" = "$w" ] && declare -p "$v" >> "$J/env"; done
done

console=$SR_WORK/$id.console
qemu-system-x86_64 -M pc -accel "${SR_ACCEL:-tcg,thread=multi}" -cpu max \
  -smp "${SR_SMP:-2}" -m "${SR_MEM:-1024}" \
  -nodefaults -no-user-config -display none -no-reboot \
  -serial "file:$console" \
  -kernel "$SR_WORK/vmlinux" -initrd "$SR_WORK/initrd.img" \
  -append "console=ttyS0 quiet loglevel=4 panic=-1 sr.cmd=$HERE/guest/job.sh sr.arg=$J sr.out=$SHARE$keep ${SR_KARGS:-}" \
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
  -virtfs "local,path=$SHARE,mount_tag=out,security_model=none,multidevs=remap" \
  </dev/null >"$SR_WORK/$id.qemu.log" 2>&1 &
qpid=$!
t0=$SECONDS
rc=
while kill -0 "$qpid" 2>/dev/null; do
  if (( SECONDS - t0 >= ${SR_TIMEOUT:-900} )); then
    echo "run-in-vm: guest still running after ${SR_TIMEOUT:-900} s, killing it" >&2
    kill "$qpid" 2>/dev/null; rc=124
    break
  fi
  sleep 0.2
done
wait "$qpid" 2>/dev/null
if [ -z "$rc" ]; then
  rc=$(grep -a -o 'SR_EXIT=[0-9]*' "$console" 2>/dev/null | tail -1 | cut -d= -f2)
  rc=${rc:-125}
fi
cat "$J/stdout" 2>/dev/null
cat "$J/stderr" >&2 2>/dev/null
if [ "$rc" -eq 124 ] || [ "$rc" -eq 125 ] || [ -n "${SR_VERBOSE:-}" ]; then
  echo "run-in-vm: rc=$rc after $((SECONDS - t0)) s; rails setup log and guest console:" >&2
  cat "$J/rails.log" >&2 2>/dev/null
  tail -40 "$console" >&2
  cat "$SR_WORK/$id.qemu.log" >&2 2>/dev/null
fi
exit "$rc"
