#!/usr/bin/env bash
# Sets up a fresh machine and runs every test. The integration tests drive real
# userfaultfd (and, for the lab's kernel engines, swap/zswap/zram/cgroups): run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace --locked 2>&1 | tail -n 3
# The fuzz targets (crates/tierswap/tests/fuzz.rs) share this many seconds of CPU, about half
# of it in wall time on two test threads; docs/fuzzing.md.
export TIERSWAP_FUZZ_SECS="${TIERSWAP_FUZZ_SECS:-64}"
cargo test --release --workspace --locked -- --test-threads=2
