#!/usr/bin/env bash
# Install what building and testing nccl-net-ha needs on Debian 12 / Ubuntu 24.04 (root or sudo).
# Idempotent: installs only what is missing.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"
  else SUDO="needs-root"; fi
fi

pkgs=(build-essential pkg-config iproute2 ca-certificates
      cmake python3 libclang-dev libnl-3-dev libnl-route-3-dev libibverbs-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done

need_rust=0
if command -v cargo >/dev/null 2>&1; then
  v=$(cargo --version | awk '{print $2}')
  [ "$(printf '%s\n1.82.0\n' "$v" | sort -V | head -1)" = "1.82.0" ] || need_rust=1
else
  need_rust=1
fi
if [ "$need_rust" = 1 ]; then
  # Debian 12 ships a current toolchain as rustc-web/cargo-web; Ubuntu as versioned packages.
  if apt-cache show cargo-web >/dev/null 2>&1; then missing+=(cargo-web rustc-web)
  else missing+=(cargo rustc); fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$SUDO" = needs-root ]; then
    echo "setup: missing packages: ${missing[*]}" >&2
    echo "setup: run this as root, or install sudo, or install them yourself: apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  for i in 1 2 3; do $SUDO apt-get update -qq && break || sleep 5; done
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cargo --version
