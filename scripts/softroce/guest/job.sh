#!/bin/bash
# Guest side of run-in-vm.sh (started by the initramfs /init, chrooted into the host root):
# build the two rails unless the job asked for none, load the job's environment, run its
# command in its cwd; stdout/stderr go to files in the job directory on the share.
J=$1
if [ "$(<"$J/rails")" = yes ]; then
  if ! source "$(dirname "${BASH_SOURCE[0]}")/rails.sh" > "$J/rails.log" 2>&1; then
    echo "run-in-vm: rail setup failed (see rails.log)" > "$J/stderr"; exit 98
  fi
  set -a; source /run/softroce.env; set +a
fi
[ -f "$J/env" ] && source "$J/env"
cd "$(<"$J/cwd")" 2>/dev/null || cd /
bash "$J/cmd" > "$J/stdout" 2> "$J/stderr" < /dev/null
