#!/usr/bin/env bash
# Acceptance for `tierswap run`: python3 allocates ~1 GiB in Python objects (ints in
# a list, str→str dict entries) and bytes under `tierswap run --budget 128M`, then computes a
# SHA-256 over everything it holds; the same generators hashed in a separate python process
# without the shim (streaming, holding almost nothing) give the expected digest. Meanwhile
# `tierswap stat PID --format json` is sampled every ~0.2 s for the footprint, and
# /proc/PID/status for the process's RSS (reported, not judged: it includes unmanaged memory).
#
# Exit 0 only when the digests match, the program exited 0 and the largest footprint sampled
# is at most 1.05 × the budget. Prints one summary line at the end.
#
# Usage: scripts/accept-python.sh [--budget 128M] [--size-mib 1024] [--python PATH] [--flags "…"]
#   --flags: more `tierswap run` flags, e.g. --flags "--malloc large --tiers zero,pool".
#   TIERSWAP_BIN: the tierswap binary (default target/release/tierswap; build it with
#   cargo build --release -p tierswap-cli -p tierswap-preload).
#   --python: the interpreter. Default: the real interpreter behind `python3` (a pyenv shim is
#   a bash script that execs the interpreter; under tierswap run each exec'd program gets its
#   own pager, so the shim works through it too, but bash's pager is started for nothing).
set -euo pipefail

budget=128M
size_mib=1024
python=""
flags=""
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget="$2"; shift 2 ;;
        --size-mib) size_mib="$2"; shift 2 ;;
        --python) python="$2"; shift 2 ;;
        --flags) flags="$2"; shift 2 ;;
        *) echo "accept-python: unknown argument '$1' (use --budget, --size-mib, --python, --flags)" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TIERSWAP_BIN:-$root/target/release/tierswap}"
if [ ! -x "$bin" ] || [ ! -f "$(dirname "$bin")/libtierswap_preload.so" ]; then
    echo "accept-python: $bin or libtierswap_preload.so beside it is missing: cargo build --release -p tierswap-cli -p tierswap-preload" >&2
    exit 2
fi
if [ -z "$python" ]; then
    python="$(python3 -c 'import sys; print(sys.executable)')"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/tierswap-accept-python.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The workload: build (hold everything) or stream (hash as generated, hold nothing).
cat > "$work/workload.py" <<'EOF'
import array, hashlib, random, sys, time

mode, size_mib = sys.argv[1], int(sys.argv[2])
# Shares of the total: ~3/8 bytes, ~3/8 ints in a list (32 B object + 8 B slot each),
# ~1/4 dict entries (two ~60 B str objects + the table).
n_blobs = size_mib * 3 // 8 * 16          # 64 KiB each
n_ints = size_mib * 3 // 8 * (1 << 20) // 40
n_items = size_mib // 4 * (1 << 20) // 200
INT_CHUNK = 1 << 20

def blobs():
    for i in range(n_blobs):
        if i % 2:
            yield random.Random(i).randbytes(1 << 16)          # incompressible: the file tier
        else:
            yield (b"blob %09d " % i) * (65536 // 15) + b"x" * (65536 % 15)   # compressible

def ints(lo, hi):
    return [(i * 2654435761) % (1 << 62) for i in range(lo, hi)]

def items(lo, hi):
    for i in range(lo, hi):
        yield "key-%012d" % (i * 7), "value-%d-%s" % (i, "x" * (i % 40))

def digest_of(blob_list, int_chunks, item_iter):
    h = hashlib.sha256()
    for b in blob_list:
        h.update(b)
    for chunk in int_chunks:
        h.update(array.array("q", chunk).tobytes())
    for k, v in item_iter:
        h.update(k.encode()); h.update(b"="); h.update(v.encode()); h.update(b"\n")
    return h.hexdigest()

t0 = time.monotonic()
if mode == "stream":
    d = digest_of(blobs(),
                  (ints(lo, min(lo + INT_CHUNK, n_ints)) for lo in range(0, n_ints, INT_CHUNK)),
                  items(0, n_items))
else:
    held_blobs = list(blobs())
    held_ints = ints(0, n_ints)
    held_dict = dict(items(0, n_items))
    t_built = time.monotonic()
    d = digest_of(held_blobs,
                  (held_ints[lo:lo + INT_CHUNK] for lo in range(0, n_ints, INT_CHUNK)),
                  held_dict.items())
    print("built in %.1f s, hashed in %.1f s" % (t_built - t0, time.monotonic() - t_built), file=sys.stderr)
print(d)
EOF

# The expected digest, without the shim.
expected="$(env -u LD_PRELOAD "$python" "$work/workload.py" stream "$size_mib")"

# The managed run, sampled.
start=$(date +%s.%N)
# shellcheck disable=SC2086 # $flags: several words on purpose
"$bin" run --budget "$budget" $flags --stats-on-exit "$work/stats.json" -- "$python" "$work/workload.py" build "$size_mib" \
    > "$work/out" 2> "$work/err" &
pid=$!
max_fp=0
max_rss_kib=0
samples=0
budget_bytes=0
while kill -0 "$pid" 2>/dev/null; do
    if json="$("$bin" stat "$pid" --format json 2>/dev/null)"; then
        fp=$(jq -r '.stats.footprint' <<<"$json")
        budget_bytes=$(jq -r '.stats.budget' <<<"$json")
        samples=$((samples + 1))
        [ "$fp" -gt "$max_fp" ] && max_fp=$fp
    fi
    # The whole process too (managed + unmanaged + the pager's own): what the kernel sees.
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$rss" ] && [ "$rss" -gt "$max_rss_kib" ] && max_rss_kib=$rss
    sleep 0.2
done
status=0
wait "$pid" || status=$?
end=$(date +%s.%N)
got="$(cat "$work/out")"

fail=""
[ "$status" -eq 0 ] || fail="$fail exit status $status;"
[ "$got" = "$expected" ] || fail="$fail digest $got != expected $expected;"
[ "$samples" -gt 0 ] || fail="$fail no footprint sample (tierswap stat never answered);"
if [ -f "$work/stats.json" ]; then
    exit_max=$(jq -r '.counters.footprint_max' "$work/stats.json")
    [ "$budget_bytes" -gt 0 ] || budget_bytes=$(jq -r '.budget' "$work/stats.json")
    swapped=$(jq -r '"pool out \(.counters.zswpout) in \(.counters.zswpin), file out \(.counters.pswpout) in \(.counters.pswpin), zero \(.counters.swpout_zero), faults \(.counters.faults)"' "$work/stats.json")
else
    exit_max=0
    swapped="no stats (the program was not managed)"
    fail="$fail not managed;"
fi
if [ "$budget_bytes" -gt 0 ]; then
    limit=$((budget_bytes * 105 / 100))
    [ "$max_fp" -le "$limit" ] || fail="$fail sampled footprint $max_fp > 1.05 × budget;"
    [ "$exit_max" -le "$limit" ] || fail="$fail footprint_max $exit_max > 1.05 × budget;"
fi
grep -v '^built in' "$work/err" | head -5 >&2 || true
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
printf 'accept-python: %s MiB of Python objects under --budget %s%s: digest %s; footprint max sampled %s MiB (%d samples), max at exit %s MiB, budget %s MiB; process RSS max %s MiB; %s; %s; wall %.1f s; %s\n' \
    "$size_mib" "$budget" "${flags:+ $flags}" "$([ "$got" = "$expected" ] && echo ok || echo WRONG)" "$(mib "$max_fp")" "$samples" \
    "$(mib "$exit_max")" "$(mib "$budget_bytes")" "$(mib $((max_rss_kib * 1024)))" "$swapped" "$(grep '^built in' "$work/err" || true)" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "${fail:-PASS}"
[ -z "$fail" ]
