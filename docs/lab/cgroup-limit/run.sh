#!/usr/bin/env bash
# The JVM and Node.js under `tierswap run`, seeing the budget as their memory cgroup's limit
# (the default) and seeing the machine (--real-cgroup-limit), alternating, then the kernel's
# disk swap in a memcg of the same limit (an 8 GiB swap file in /var/tmp, zswap off).
# Root; prints one line per run. The swap file and the memcg are removed at the end, even
# on failure. Usage: [N_JVM=… N_NODE=…] run.sh [TIERSWAP]   (default: tierswap on PATH)
set -euo pipefail
T=${1:-tierswap}
N_JVM=${N_JVM:-3000000} N_NODE=${N_NODE:-300000}   # smaller for a smoke run
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
cp "$here/../inactive-fill/HashMapGets.java" "$here/node1.js" "$work/" && cd "$work" && javac HashMapGets.java
cg=/sys/fs/cgroup/memory/tierswap-cgroup-limit
swap=/var/tmp/tierswap-cgroup-limit.swap
cleanup() { rmdir "$cg" 2>/dev/null || true; swapoff "$swap" 2>/dev/null || true; rm -f "$swap"; rm -rf "$work"; }
trap cleanup EXIT
# Runs a command with its output in ./out and prints its wall time in seconds.
secs() { local s=$(date +%s.%N); "$@" >out 2>&1 || true; printf "%.1f" "$(echo "$(date +%s.%N) - $s" | bc)"; }
tierswap_run() { # NAME BUDGET FLAGS -- PROG…
  local name=$1 budget=$2 flags=$3; shift 4
  local t=$(secs "$T" run --budget "$budget" $flags --stats-on-exit st.json -- "$@")
  echo "$name ${flags:-(default)}: $t s, $(python3 -c "import json; c=json.load(open('st.json'))['counters']; print('faults', c['faults'])") | $(head -c 100 out)"
}
kernel_run() { # NAME LIMIT -- PROG…
  local name=$1 limit=$2; shift 3
  [ -e "$swap" ] || { fallocate -l 8G "$swap"; chmod 600 "$swap"; mkswap "$swap" >/dev/null; swapon "$swap"; }
  mkdir -p "$cg"; echo "$limit" > "$cg/memory.limit_in_bytes"
  local t=$(secs bash -c "echo \$\$ > $cg/cgroup.procs; exec \"\$@\"" _ "$@")
  echo "$name kernel-disk: $t s, $(grep total_pgmajfault "$cg/memory.stat") | $(head -c 100 out)"
  rmdir "$cg"
}
for r in 1 2; do
  tierswap_run jvm 288M "" -- java -Xmx2g HashMapGets "$N_JVM"
  tierswap_run jvm 288M --real-cgroup-limit -- java -Xmx2g HashMapGets "$N_JVM"
done
kernel_run jvm 288M -- java -Xmx2g HashMapGets "$N_JVM"
for r in 1 2; do
  tierswap_run node 96M "" -- node node1.js "$N_NODE"
  tierswap_run node 96M --real-cgroup-limit -- node node1.js "$N_NODE"
done
kernel_run node 96M -- node node1.js "$N_NODE"
