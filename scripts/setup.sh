#!/usr/bin/env bash
# Installs what tierswap needs on a fresh Debian machine: a C compiler (zstd-sys builds
# zstd from source), pkg-config, the swap tools the lab uses, and a Rust toolchain.
# Idempotent: does nothing when everything is there.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v mkswap >/dev/null 2>&1 || need_apt+=(util-linux)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)   # the lab's plots
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)   # the remote tier's tests and lab
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need_apt[*]}; run as root or install them: apt-get install ${need_apt[*]}" >&2
    exit 2
  fi
  echo "setup: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: no Rust toolchain; installing Debian's cargo" >&2
    apt-get install -y -qq cargo rustc >/dev/null
  fi
fi
