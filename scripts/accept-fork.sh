#!/usr/bin/env bash
# Acceptance for fork under `tierswap run` (long runs; not part of the test suite). Each part
# runs natively, then under `tierswap run --budget BUDGET`, and must give the same answers:
#   (a) Python multiprocessing, fork start method: WORKERS workers each build WORKER_MIB of
#       their own objects and return a SHA-256 of them (and of the parent's objects they
#       inherited); the parent holds PARENT_MIB of its own. Every digest must equal the
#       unmanaged run's.
#   (b) redis-server with KEYS keys of VALUE_BYTES: BGSAVE while a client keeps overwriting
#       OVERWRITE_PCT % of the keys; the RDB, loaded into a fresh unmanaged server, holds
#       exactly the keys as of the fork, and the live dataset exactly the final writes.
#   (c) socketserver.ForkingTCPServer: the parent builds DATA_MIB of data; REQUESTS requests
#       each make a forked child read and hash REQUEST_MIB of it; every reply is compared
#       with the digest the client computes itself.
# The summed RSS of each run's process tree is sampled every 20 ms from /proc (peak shown:
# the budget covers the managed parent's memory only, not its children's, for now).
#
# Prints one table at the end. Exit 0 only when every run of every part gave right answers.
#
# Usage: scripts/accept-fork.sh [--budget 256M] [--parts a,b,c] [--smoke] [--flags "…"]
#          [--workers 4] [--worker-mib 200] [--parent-mib 300]
#          [--keys 1000000] [--value-bytes 1024] [--overwrite-pct 10]
#          [--data-mib 1024] [--requests 200] [--request-mib 50] [--concurrency 4]
#   --smoke: sizes for a run of seconds (2 workers × 16 MiB, parent 24 MiB; 20000 keys;
#            64 MiB of server data, 20 requests of 8 MiB; budget 16M); flags after it win.
#   --flags: more `tierswap run` flags, e.g. --flags "--fault-mode signal --compressor lz4".
#   TIERSWAP_BIN: the tierswap binary (default target/release/tierswap; build it with
#   cargo build --release -p tierswap-cli -p tierswap-preload).
set -euo pipefail

budget=256M
parts=a,b,c
flags=""
workers=4 worker_mib=200 parent_mib=300
keys=1000000 value_bytes=1024 overwrite_pct=10
data_mib=1024 requests=200 request_mib=50 concurrency=4
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke)
            budget=16M workers=2 worker_mib=16 parent_mib=24 keys=20000 data_mib=64 requests=20 request_mib=8
            shift ;;
        --budget) budget="$2"; shift 2 ;;
        --parts) parts="$2"; shift 2 ;;
        --flags) flags="$2"; shift 2 ;;
        --workers) workers="$2"; shift 2 ;;
        --worker-mib) worker_mib="$2"; shift 2 ;;
        --parent-mib) parent_mib="$2"; shift 2 ;;
        --keys) keys="$2"; shift 2 ;;
        --value-bytes) value_bytes="$2"; shift 2 ;;
        --overwrite-pct) overwrite_pct="$2"; shift 2 ;;
        --data-mib) data_mib="$2"; shift 2 ;;
        --requests) requests="$2"; shift 2 ;;
        --request-mib) request_mib="$2"; shift 2 ;;
        --concurrency) concurrency="$2"; shift 2 ;;
        *) echo "accept-fork: unknown argument '$1' (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="${TIERSWAP_BIN:-$root/target/release/tierswap}"
if [ ! -x "$bin" ] || [ ! -f "$(dirname "$bin")/libtierswap_preload.so" ]; then
    echo "accept-fork: $bin or libtierswap_preload.so beside it is missing: cargo build --release -p tierswap-cli -p tierswap-preload" >&2
    exit 2
fi
# The real interpreter behind `python3` (a pyenv shim is a bash script that execs it).
python="$(python3 -c 'import sys; print(sys.executable)')"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "accept-fork: $python is older than Python 3.11" >&2
    exit 2
fi
case ",$parts," in *,b,*) command -v redis-server >/dev/null || {
    echo "accept-fork: redis-server is missing: run scripts/setup.sh (or apt-get install redis-server), or leave out part b (--parts a,c)" >&2
    exit 2
}; esac

work="$(mktemp -d "${TMPDIR:-/tmp}/tierswap-accept-fork.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$bin run --budget $budget $flags --"
results="$work/results.jsonl"
: > "$results"
failed=0

# run PART LABEL DRIVER ARGS…: one driver run, its JSON line kept in $work/PART-LABEL.json.
run() {
    local part="$1" label="$2"
    shift 2
    echo "accept-fork: part $part, $label …" >&2
    if "$python" "$@" --label "$label" > "$work/$part-$label.json"; then :; else failed=1; fi
    cat "$work/$part-$label.json" >> "$results"
}

for part in ${parts//,/ }; do
    case "$part" in
        a)
            args=("$here/accept_fork_mp.py" --workers "$workers" --worker-mib "$worker_mib" --parent-mib "$parent_mib")
            run a native "${args[@]}"
            run a tierswap "${args[@]}" --prefix "$prefix" --expect "$work/a-native.json" ;;
        b)
            args=("$here/accept_fork_redis.py" --keys "$keys" --value-bytes "$value_bytes" --overwrite-pct "$overwrite_pct")
            run b native "${args[@]}"
            run b tierswap "${args[@]}" --prefix "$prefix" ;;
        c)
            args=("$here/accept_fork_prefork.py" --data-mib "$data_mib" --requests "$requests" --request-mib "$request_mib" --concurrency "$concurrency")
            run c native "${args[@]}"
            run c tierswap "${args[@]}" --prefix "$prefix" ;;
        *) echo "accept-fork: unknown part '$part' (a, b or c)" >&2; exit 2 ;;
    esac
done

"$python" - "$results" "$budget" "$flags" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
native = {r["part"]: r for r in rows if r["label"] == "native"}
names = {"a": "multiprocessing", "b": "redis BGSAVE", "c": "forking server"}
print("\nfork acceptance: tierswap run --budget %s %s" % (sys.argv[2], sys.argv[3]))
print("%-16s %-9s %-4s %8s %7s %10s %5s  %s" % ("part", "run", "ok", "wall s", "÷native", "tree RSS", "procs", "detail"))
for r in rows:
    n = native.get(r["part"])
    ratio = "%.2f" % (r["wall_s"] / n["wall_s"]) if n and n.get("wall_s") and r.get("wall_s") else "-"
    extra = []
    for k in ("load_s", "save_s", "passes_during_save", "build_s", "serve_s"):
        if k in r:
            extra.append("%s %s" % (k, r[k]))
    print("%-16s %-9s %-4s %8s %7s %7s MiB %5s  %s%s" % (
        names.get(r["part"], r["part"]), r["label"], "yes" if r["ok"] else "NO", r.get("wall_s", "-"), ratio,
        r.get("peak_tree_rss_mib", "-"), r.get("peak_procs", "-"), r.get("detail", ""),
        (" [" + ", ".join(extra) + "]") if extra else ""))
print("tree RSS: peak of the summed RSS of the run's process tree, sampled every 20 ms (pages shared "
      "copy-on-write count in each process; the budget covers the managed parent only).")
EOF
exit "$failed"
