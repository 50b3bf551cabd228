#!/usr/bin/env bash
# Acceptance for managed runtimes under `tierswap run` (JVM, Node.js, Go with cgo, a static
# Go binary): fills and churns beyond the budget, every byte verified, peak tree RSS against
# 1.05 × budget + the runtime's own. Long runs; not part of the test suite. Usage and what
# it prints: scripts/accept_runtimes.py (--help).
set -euo pipefail
exec python3 "$(dirname "$0")/accept_runtimes.py" "$@"
