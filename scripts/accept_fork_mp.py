"""Fork acceptance, part (a): Python multiprocessing with the fork start method.

The parent builds PARENT_MIB of Python objects of its own (bytes, ints in lists, str->str
dict entries, all from seeds), then a Pool of WORKERS forked workers each builds
WORKER_MIB of its own and returns their SHA-256; each worker also hashes the parent's
objects it inherited at the fork (reading them touches every object's refcount: writes to
pages shared with the parent), then waits HOLD_S seconds (0 by default; a run with tiny
data lasts less than the sampling takes to see the whole tree). The parent then hashes its
own objects again.

Driver (default): runs the workload under --prefix (empty: natively), samples the summed
RSS and PSS of the process tree every 20 ms, checks every worker's view of the parent's objects
against the parent's digest and, with --expect (the native run's line), every digest
against the native run's. Prints one JSON line; exit 1 on any mismatch, 2 on a failed run.

    accept_fork_mp.py [--prefix "tierswap run --budget 256M --"] [--expect native.json]
                      [--workers 4] [--worker-mib 200] [--parent-mib 300] [--hold-s 0]
                      [--label L]
"""

import argparse
import array
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accept_fork_common as common  # noqa: E402

INT_CHUNK = 1 << 16


def build(seed, mib):
    """About `mib` MiB of objects: 3/8 in 64 KiB bytes (every other one incompressible),
    3/8 in ints in lists (a 32 B object and an 8 B slot each), 1/4 in dict entries (two
    ~60 B strs and the table)."""
    n_blobs = max(1, mib * 3 // 8 * 16)
    n_ints = max(1, mib * 3 // 8 * (1 << 20) // 40)
    n_items = max(1, mib // 4 * (1 << 20) // 200)
    blobs = []
    for i in range(n_blobs):
        if i % 2:
            blobs.append(random.Random(seed * 1_000_003 + i).randbytes(1 << 16))
        else:
            blobs.append((b"blob %d/%09d " % (seed, i)) * (65536 // 20) + b"x" * (65536 % 20))
    ints = [[(seed * 7 + i) * 2654435761 % (1 << 62) for i in range(lo, min(lo + INT_CHUNK, n_ints))]
            for lo in range(0, n_ints, INT_CHUNK)]
    items = {}
    for i in range(n_items):
        items["key-%d-%012d" % (seed, i * 7)] = "value-%d-%s" % (i, "x" * ((i + seed) % 40))
    return blobs, ints, items


def digest(objs):
    blobs, ints, items = objs
    h = hashlib.sha256()
    for b in blobs:
        h.update(b)
    for chunk in ints:
        h.update(array.array("q", chunk).tobytes())
    for k, v in items.items():
        h.update(k.encode())
        h.update(b"\0")
        h.update(v.encode())
        h.update(b"\0")
    return h.hexdigest()


PARENT = None


def work(args):
    seed, mib, hold_s = args
    mine = digest(build(seed, mib))
    theirs = digest(PARENT)
    time.sleep(hold_s)
    return mine, theirs


def workload(a):
    global PARENT
    t0 = time.monotonic()
    PARENT = build(1, a.parent_mib)
    built = time.monotonic() - t0
    ctx = mp.get_context("fork")
    with ctx.Pool(a.workers) as pool:
        got = pool.map(work, [(100 + w, a.worker_mib, a.hold_s) for w in range(a.workers)], chunksize=1)
    print(json.dumps({"parent": digest(PARENT), "workers": [g[0] for g in got],
                      "workers_saw_parent": [g[1] for g in got], "parent_build_s": round(built, 2)}), flush=True)


def driver(a):
    argv = common.command(a.prefix, [common.python(), os.path.abspath(__file__), "--workload",
                                     "--workers", str(a.workers), "--worker-mib", str(a.worker_mib),
                                     "--parent-mib", str(a.parent_mib), "--hold-s", str(a.hold_s)])
    code, out, err, wall, tree = common.run_sampled(argv, a.timeout)
    rec = {"part": "a", "label": a.label, "wall_s": round(wall, 2), "ok": False}
    tree.record(rec)
    problems = []
    result = None
    if code != 0:
        problems.append("the workload " + ("hung (killed after %ds)" % a.timeout if code is None
                                           else "exited with %d" % code) + ": " + err.strip()[-400:])
    else:
        try:
            result = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            problems.append("the workload printed no result: " + out[-400:])
    if result:
        rec["digests"] = result
        bad = [i for i, d in enumerate(result["workers_saw_parent"]) if d != result["parent"]]
        if bad:
            problems.append("workers %s hashed the parent's inherited objects differently from the parent" % bad)
        if a.expect:
            with open(a.expect) as f:
                want = json.loads(f.read().strip().splitlines()[-1])["digests"]
            if result["parent"] != want["parent"]:
                problems.append("the parent's digest differs from the unmanaged run's")
            wrong = [i for i, (g, w) in enumerate(zip(result["workers"], want["workers"])) if g != w]
            if wrong or len(result["workers"]) != len(want["workers"]):
                problems.append("workers %s returned digests that differ from the unmanaged run's" % wrong)
    rec["ok"] = not problems
    rec["detail"] = "; ".join(problems) if problems else "%d worker digests and the parent's match%s" % (
        a.workers, " the unmanaged run" if a.expect else "")
    common.emit(rec)
    return 0 if rec["ok"] else (2 if code != 0 else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="", help="command prefix, e.g. 'tierswap run --budget 256M --'")
    p.add_argument("--expect", help="the unmanaged run's JSON line: digests must match it")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--worker-mib", type=int, default=200)
    p.add_argument("--parent-mib", type=int, default=300)
    p.add_argument("--hold-s", type=float, default=0,
                   help="seconds each worker waits before it returns (a short run's whole tree is sampled)")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--label", default="native")
    a = p.parse_args()
    if a.workload:
        workload(a)
        return 0
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
