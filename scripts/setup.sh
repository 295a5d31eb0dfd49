#!/usr/bin/env bash
# Install what building and testing nccl-net-ha needs on Debian 12 / Ubuntu 24.04 (root or sudo).
# Idempotent: installs only what is missing.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"
  else SUDO="needs-root"; fi
fi

# fonts-dejavu-core: the text of `ha-harness timeline`'s PNG pictures.
pkgs=(build-essential pkg-config iproute2 ca-certificates
      cmake python3 libclang-dev libnl-3-dev libnl-route-3-dev libibverbs-dev fonts-dejavu-core)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done

# A Rust toolchain >= 1.82 (the workspace's rust-version).
rust_ok() { command -v cargo >/dev/null 2>&1 &&
  [ "$(printf '%s\n1.82.0\n' "$(cargo --version | awk '{print $2}')" | sort -V | head -1)" = "1.82.0" ]; }
versioned_rust=""
if ! rust_ok; then
  if apt-cache show cargo-web >/dev/null 2>&1; then
    # Debian 12 ships a current toolchain as rustc-web/cargo-web.
    missing+=(cargo-web rustc-web)
  else
    # Ubuntu: plain `cargo` may be older than 1.82; the archive also has versioned
    # toolchains (cargo-1.NN, rustc-1.NN): take the newest one that is new enough.
    versioned_rust=$(apt-cache pkgnames cargo-1. 2>/dev/null | sed -n 's/^cargo-1\.\([0-9][0-9]*\)$/\1/p' |
      sort -n | awk '$1 >= 82' | tail -1)
    if [ -n "$versioned_rust" ]; then missing+=("cargo-1.$versioned_rust" "rustc-1.$versioned_rust")
    else missing+=(cargo rustc); fi
  fi
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
if [ -n "$versioned_rust" ] && ! rust_ok; then
  # Ubuntu's versioned toolchain lives in /usr/lib/rust-1.NN/bin: put cargo/rustc on PATH.
  for t in cargo rustc rustdoc; do
    [ -x "/usr/lib/rust-1.$versioned_rust/bin/$t" ] &&
      $SUDO ln -sf "/usr/lib/rust-1.$versioned_rust/bin/$t" "/usr/local/bin/$t"
  done
fi
if ! rust_ok; then
  echo "setup: no Rust toolchain >= 1.82 (found: $(cargo --version 2>/dev/null || echo none))." >&2
  echo "setup: install one with rustup (https://rustup.rs), then run this again." >&2
  exit 1
fi
cargo --version
