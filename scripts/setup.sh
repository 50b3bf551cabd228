#!/usr/bin/env bash
# Installs what tierswap needs on a fresh Debian machine: a C compiler (zstd-sys builds
# zstd from source), pkg-config, the swap tools the lab uses, and the programs `bench programs`
# runs (redis-server, memcached, python3), the runtimes the tests run (a JDK, Node.js, Go);
# checks the Rust toolchain.
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
command -v memcached >/dev/null 2>&1 || need_apt+=(memcached)   # bench programs
[ -x /usr/bin/python3 ] || need_apt+=(python3)   # bench programs runs Debian's interpreter (sqlite3 is in its stdlib)
# The runtimes' tests (crates/tierswap-cli/tests/runtimes.rs): a JDK, Node.js, Go.
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || need_apt+=(golang-go)
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
# The lab starts its own servers: the packages' services (where systemd runs them) stay off.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  for svc in redis-server memcached; do
    systemctl is-enabled --quiet "$svc" 2>/dev/null && systemctl disable --now "$svc" >/dev/null 2>&1 || true
  done
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
# The workspace's rust-version (Cargo.toml); a dependency of the tests (proptest) wants it.
min_rust=1.88
have_rust=$(rustc --version 2>/dev/null | awk '{print $2}')
if [ -z "$have_rust" ] || [ "$(printf '%s\n%s\n' "$min_rust" "$have_rust" | sort -V | head -n 1)" != "$min_rust" ]; then
  echo "setup: tierswap needs Rust >= $min_rust (found: ${have_rust:-none}); install it with rustup (https://rustup.rs) and run this again (Debian's rustc is older)" >&2
  exit 2
fi
