#!/bin/bash
# poll.sh NAME OUT: every 0.25 s, the newest managed process named NAME: a line of
# "time workingset_refault workingset_activate faults_swapped pgsteal" from `tierswap stat`.
# Run it beside a lab (e.g. `tierswap bench programs --program redis --engine tierswap
# --runs 1`), then difference consecutive lines (each stat call takes ~0.35 s).
name=$1; out=$2; : > "$out"
T=${TIERSWAP_BIN:-tierswap}
while true; do
  pid=$(pgrep -nx "$name")
  if [ -n "$pid" ]; then
    $T stat "$pid" --format json 2>/dev/null | python3 -c '
import json, sys, time
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
def find(d, k):
    if isinstance(d, dict):
        if k in d:
            return d[k]
        for v in d.values():
            r = find(v, k)
            if r is not None:
                return r
    return None
print(round(time.time(), 2), *(find(d, k) for k in ("workingset_refault", "workingset_activate", "faults_swapped", "pgsteal")))' >> "$out"
  fi
  sleep 0.25
done
