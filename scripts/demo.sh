#!/usr/bin/env bash
# Sets up a fresh machine and runs the main job: 1 GiB of data kept under a 256 MiB
# budget by tierswap, every page forced out and read back and verified; prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p tierswap-cli 2>&1 | tail -n 1
exec ./target/release/tierswap bench --workload usama_1g --size 1G --budget 256M --runs 1 "$@"
