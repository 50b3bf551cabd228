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
#   (d) prefork-own: a prefork server whose OWN_WORKERS workers each fill OWN_MIB of memory
#       of their own after the fork; OWN_REQUESTS requests (CONCURRENCY at a time) each make
#       a worker hash OWN_REQUEST_MIB of it; every reply is compared with the digest the
#       client computes itself.
# The budget covers the whole process tree, as a memory cgroup's limit does: the program,
# its forked children and what they exec share it. So each part also runs managed with
# tiny data, the baseline (the tree's own memory: interpreters, libraries, redis itself):
# (a) the parent and each worker with 1 MiB, the same worker count, each worker waiting
# 0.5 s before it returns (so the sampling sees them all); (b) 1000 keys; (c) 1 MiB of
# server data, requests of 1 MiB; (d) 1 MiB per worker, requests of 1 MiB.
# The summed RSS and the summed PSS (smaps_rollup) of each run's process tree are sampled
# every 20 ms from /proc; a part is within its budget when the managed run's peak is at
# most 1.05 × BUDGET + the baseline's peak, for RSS and for PSS each. Pages a parent has
# resident at a fork stay shared copy-on-write with the child: they count in every
# process's RSS but once in the PSS sum (as a memory cgroup charges them), so the RSS
# bound is the stricter one.
#
# Prints one table at the end: every run, then each part's bounds. Exit 0 only when every
# run of every part gave right answers (and, with --enforce-budget, every part was within
# both bounds).
#
# Usage: scripts/accept-fork.sh [--budget 256M] [--parts a,b,c,d] [--smoke] [--flags "…"]
#          [--enforce-budget]
#          [--workers 4] [--worker-mib 200] [--parent-mib 300]
#          [--keys 1000000] [--value-bytes 1024] [--overwrite-pct 10]
#          [--data-mib 1024] [--requests 200] [--request-mib 50] [--concurrency 4]
#          [--own-workers 8] [--own-mib 100] [--own-requests 400] [--own-request-mib 20]
#   --smoke: sizes for a run of seconds (2 workers × 16 MiB, parent 24 MiB; 20000 keys;
#            64 MiB of server data, 20 requests of 8 MiB; 3 workers × 16 MiB of their own,
#            24 requests of 4 MiB; budget 16M); flags after it win.
#   --flags: more `tierswap run` flags, e.g. --flags "--fault-mode signal --compressor lz4"
#            (--flags --per-process: a budget for every process of its own, not the tree's).
#   TIERSWAP_BIN: the tierswap binary (default target/release/tierswap; build it with
#   cargo build --release -p tierswap-cli -p tierswap-preload).
set -euo pipefail

budget=256M
parts=a,b,c,d
flags=""
enforce=0
workers=4 worker_mib=200 parent_mib=300
keys=1000000 value_bytes=1024 overwrite_pct=10
data_mib=1024 requests=200 request_mib=50 concurrency=4
own_workers=8 own_mib=100 own_requests=400 own_request_mib=20
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke)
            budget=16M workers=2 worker_mib=16 parent_mib=24 keys=20000 data_mib=64 requests=20 request_mib=8
            own_workers=3 own_mib=16 own_requests=24 own_request_mib=4
            shift ;;
        --budget) budget="$2"; shift 2 ;;
        --parts) parts="$2"; shift 2 ;;
        --flags) flags="$2"; shift 2 ;;
        --enforce-budget) enforce=1; shift ;;
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
        --own-workers) own_workers="$2"; shift 2 ;;
        --own-mib) own_mib="$2"; shift 2 ;;
        --own-requests) own_requests="$2"; shift 2 ;;
        --own-request-mib) own_request_mib="$2"; shift 2 ;;
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
    echo "accept-fork: redis-server is missing: run scripts/setup.sh (or apt-get install redis-server), or leave out part b (--parts a,c,d)" >&2
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

# Each part: natively, managed, and the managed baseline with tiny data.
for part in ${parts//,/ }; do
    case "$part" in
        a)
            drv="$here/accept_fork_mp.py"
            run a native "$drv" --workers "$workers" --worker-mib "$worker_mib" --parent-mib "$parent_mib"
            run a tierswap "$drv" --workers "$workers" --worker-mib "$worker_mib" --parent-mib "$parent_mib" \
                --prefix "$prefix" --expect "$work/a-native.json"
            run a baseline "$drv" --workers "$workers" --worker-mib 1 --parent-mib 1 --hold-s 0.5 --prefix "$prefix" ;;
        b)
            drv="$here/accept_fork_redis.py"
            more=(--value-bytes "$value_bytes" --overwrite-pct "$overwrite_pct")
            run b native "$drv" --keys "$keys" "${more[@]}"
            run b tierswap "$drv" --keys "$keys" "${more[@]}" --prefix "$prefix"
            run b baseline "$drv" --keys 1000 "${more[@]}" --prefix "$prefix" ;;
        c)
            drv="$here/accept_fork_prefork.py"
            more=(--requests "$requests" --concurrency "$concurrency")
            run c native "$drv" --data-mib "$data_mib" --request-mib "$request_mib" "${more[@]}"
            run c tierswap "$drv" --data-mib "$data_mib" --request-mib "$request_mib" "${more[@]}" --prefix "$prefix"
            run c baseline "$drv" --data-mib 1 --request-mib 1 "${more[@]}" --prefix "$prefix" ;;
        d)
            drv="$here/accept_fork_own.py"
            more=(--workers "$own_workers" --requests "$own_requests" --concurrency "$concurrency")
            run d native "$drv" --worker-mib "$own_mib" --request-mib "$own_request_mib" "${more[@]}"
            run d tierswap "$drv" --worker-mib "$own_mib" --request-mib "$own_request_mib" "${more[@]}" --prefix "$prefix"
            run d baseline "$drv" --worker-mib 1 --request-mib 1 "${more[@]}" --prefix "$prefix" ;;
        *) echo "accept-fork: unknown part '$part' (a, b, c or d)" >&2; exit 2 ;;
    esac
done

# The table; exits 3 when a part went over a bound (1 or 2: it failed itself).
over=0
"$python" - "$results" "$budget" "$flags" <<'EOF' || over=$?
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["part"], r["label"]): r for r in rows}
names = {"a": "multiprocessing", "b": "redis BGSAVE", "c": "forking server", "d": "prefork-own"}


def mib(size):
    """A `tierswap run` size (suffix K, M, G or T: powers of 1024; then maybe B or iB) in
    MiB, None when it is not one."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?)(?:i?b)?\s*", size, re.I)
    return float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " ") / 2**20 if m else None


print("\nfork acceptance: tierswap run --budget %s %s" % (sys.argv[2], sys.argv[3]))
print("%-16s %-9s %-4s %8s %7s %10s %10s %5s  %s" % ("part", "run", "ok", "wall s", "÷native", "tree RSS",
                                                    "tree PSS", "procs", "detail"))
for r in rows:
    n = by.get((r["part"], "native"))
    ratio = ("%.2f" % (r["wall_s"] / n["wall_s"]) if r["label"] == "tierswap" and n and n.get("wall_s")
             and r.get("wall_s") else "-")
    extra = []
    for k in ("load_s", "save_s", "passes_during_save", "build_s", "serve_s"):
        if k in r:
            extra.append("%s %s" % (k, r[k]))
    print("%-16s %-9s %-4s %8s %7s %6s MiB %6s MiB %5s  %s%s" % (
        names.get(r["part"], r["part"]), r["label"], "yes" if r["ok"] else "NO", r.get("wall_s", "-"), ratio,
        r.get("peak_tree_rss_mib", "-"), r.get("peak_tree_pss_mib", "-"), r.get("peak_procs", "-"),
        r.get("detail", ""), (" [" + ", ".join(extra) + "]") if extra else ""))
print("tree RSS, tree PSS: peaks of the summed RSS and of the summed PSS of the run's process tree, sampled\n"
      "every 20 ms (a page shared copy-on-write counts in the RSS of every process sharing it, once in the PSS sum).")

budget = mib(sys.argv[2])
print("\nthe tree's budget (MiB): the managed run's peak ≤ 1.05 × %s + the baseline's peak" % sys.argv[2])
print("%-16s %8s %8s %8s %-5s %8s %8s %8s %-5s" % ("part", "base RSS", "RSS", "limit", "", "base PSS", "PSS",
                                                  "limit", ""))
over = []
for part in dict.fromkeys(r["part"] for r in rows):
    man, base = by.get((part, "tierswap")), by.get((part, "baseline"))
    cells, verdicts = [], []
    for key in ("peak_tree_rss_mib", "peak_tree_pss_mib"):
        b = base.get(key) if base and base["ok"] else None
        m = man.get(key) if man else None
        if b is None or m is None or budget is None:
            cells += ["-" if b is None else b, "-" if m is None else m, "-", "-"]
            continue
        limit = 1.05 * budget + b
        verdicts.append(m <= limit)
        cells += [b, m, "%.0f" % limit, "pass" if m <= limit else "OVER"]
    print("%-16s %8s %8s %8s %-5s %8s %8s %8s %-5s" % (names.get(part, part), *cells))
    if False in verdicts:
        over.append(part)
        if man.get("at_pss_peak"):
            print("    at the PSS peak (MiB; footprint, target: the process's row of the tree's ledger, budget %s):"
                  % man.get("ledger_budget_mib", "-"))
            for p in sorted(man["at_pss_peak"], key=lambda p: (p["parent"], p["pid"])):
                print("    pid %7d  parent %7d  RSS %6d  PSS %6d  footprint %6s  target %6s" % (
                    p["pid"], p["parent"], p["rss_mib"], p["pss_mib"], p.get("footprint_mib", "-"),
                    p.get("target_mib", "-")))
print("base: the baseline's peak (managed, tiny data); - : no peak, or the baseline failed.")
sys.exit(3 if over else 0)
EOF
if [ "$over" != 0 ] && [ "$over" != 3 ]; then
    echo "accept-fork: the table failed" >&2
    failed=1
elif [ "$over" = 3 ] && [ "$enforce" = 1 ]; then
    echo "accept-fork: a tree went over its budget (--enforce-budget)" >&2
    failed=1
fi
exit "$failed"
