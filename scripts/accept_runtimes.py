#!/usr/bin/env python3
"""Acceptance for managed runtimes under `tierswap run` (long runs; not part of the test
suite; scripts/accept-runtimes.sh runs it). Each runtime's program (the ones the tests use,
crates/tierswap-cli/tests/runtimes) fills FILL_MIB MiB and verifies every byte it wrote,
then a variant keeps a live set of a third of that while it churns short-lived objects for
CHURN_S seconds. Each runs natively, then under `tierswap run --budget BUDGET`; the runtime
running nothing (fill 0) natively gives its own resident memory. The summed RSS of each
run's process tree is sampled every 50 ms (and the program's own VmHWM, which it prints,
counts too: a run of a few ms falls between samples); a managed run is within its budget when its
peak is at most 1.05 × BUDGET + the runtime's own.

Rows: the JVM with G1, ParallelGC and SerialGC; ZGC (a shared-memory heap: told apart at
exit, not held to the budget); Node.js; Go built with cgo; a static Go binary (named before
it starts, runs unmanaged). Prints one table; exit 0 only when every run's data was right
and every managed run of a managed runtime was within its budget.

Usage: scripts/accept-runtimes.sh [--budget 256M] [--fill-mib 768] [--churn-s 60]
         [--rows jvm-g1,jvm-parallel,jvm-serial,jvm-zgc,node,go-cgo,go-static] [--smoke]
         [--flags "…"]
  --smoke: --budget 64M --fill-mib 192 --churn-s 5 (a run of a minute or two).
  TIERSWAP_BIN: the tierswap binary (default target/release/tierswap).
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accept_fork_common import run_sampled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = os.path.join(ROOT, "crates/tierswap-cli/tests/runtimes")
ROWS = ["jvm-g1", "jvm-parallel", "jvm-serial", "jvm-zgc", "node", "go-cgo", "go-static"]


def size_bytes(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        sys.exit(f"accept-runtimes: --budget '{text}': give a size like 256M")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def tool(name, also=()):
    found = shutil.which(name) or next((p for p in also if os.access(p, os.X_OK)), None)
    if not found:
        sys.exit(f"accept-runtimes: {name} is missing (scripts/setup.sh installs it)")
    return found


def build(work):
    """Compiles the programs into `work`; returns {row: argv builder(fill args)}."""
    javac = tool("javac")
    subprocess.run([javac, "-d", work, os.path.join(SOURCES, "Fill.java")], check=True)
    go = tool("go", ["/usr/local/go/bin/go", "/usr/lib/go/bin/go"])
    env = dict(os.environ, GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="", GO111MODULE="on",
               GOCACHE=os.path.join(work, "go-build"), GOPATH=os.path.join(work, "gopath"))
    for name, cgo in (("cgo", "1"), ("static", "0")):
        subprocess.run([go, "build", "-o", os.path.join(work, "go-" + name),
                        os.path.join(SOURCES, name, "main.go")],
                       check=True, cwd=work, env=dict(env, CGO_ENABLED=cgo))
    java, node = tool("java"), tool("node")

    def jvm(gc):
        return lambda rest: [java, "-Xmx4g", gc, "-cp", work, "Fill"] + rest

    return {
        "jvm-g1": jvm("-XX:+UseG1GC"),
        "jvm-parallel": jvm("-XX:+UseParallelGC"),
        "jvm-serial": jvm("-XX:+UseSerialGC"),
        "jvm-zgc": jvm("-XX:+UseZGC"),
        # V8 sizes its heap by the memory cgroup's limit, which reads as the budget under run.
        "node": lambda rest: [node, "--max-old-space-size=4096", os.path.join(SOURCES, "fill.js")] + rest,
        "go-cgo": lambda rest: [os.path.join(work, "go-cgo")] + rest,
        "go-static": lambda rest: [os.path.join(work, "go-static")] + rest,
    }


def run(argv, ok_word, timeout_s):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    code, out, err, wall, tree = run_sampled(argv, timeout_s, env=env, period_s=0.05)
    peak, procs = tree.peak, tree.peak_procs
    ok = code == 0 and ok_word in out
    # A run shorter than a sampling period is seen by its own peak (VmHWM) only.
    hwm = re.search(r"^vmhwm_kib (\d+)$", out, re.M)
    peak = max(peak, int(hwm.group(1)) << 10 if hwm else 0)
    return {"ok": ok, "wall_s": wall, "peak_mib": peak / 2**20, "procs": procs, "code": code,
            "stderr": err.strip().splitlines()[-1] if err.strip() else ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", default="256M")
    ap.add_argument("--fill-mib", type=int, default=768)
    ap.add_argument("--churn-s", type=float, default=60)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--flags", default="")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.budget, a.fill_mib, a.churn_s = "64M", 192, 5
    rows = [r for r in a.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            sys.exit(f"accept-runtimes: unknown row '{r}' (rows: {', '.join(ROWS)})")
    budget = size_bytes(a.budget)
    tierswap = os.environ.get("TIERSWAP_BIN", os.path.join(ROOT, "target/release/tierswap"))
    if not os.access(tierswap, os.X_OK):
        sys.exit(f"accept-runtimes: {tierswap} is missing: cargo build --release --workspace")
    prefix = [tierswap, "run", "--budget", a.budget] + shlex.split(a.flags) + ["--"]
    timeout_s = 600 + 4 * a.churn_s
    work = tempfile.mkdtemp(prefix="tierswap-accept-runtimes.")
    failed = False
    table = []
    try:
        programs = build(work)
        for row in rows:
            prog = programs[row]
            static = row == "go-static"
            word = {"node": "node ok", "go-static": "go static ok"}.get(row, "jvm ok" if row.startswith("jvm") else "go ok")
            trivial = None if static else run(prog(["0"]), word, timeout_s)
            variants = [("fill", [] if static else [str(a.fill_mib)])]
            if not static:
                variants.append(("churn", [str(a.fill_mib // 3), "churn", str(a.churn_s)]))
            for variant, args in variants:
                print(f"accept-runtimes: {row} {variant} …", file=sys.stderr, flush=True)
                nat = run(prog(args), word, timeout_s)
                man = run(prefix + prog(args), word, timeout_s)
                limit = None if trivial is None else 1.05 * budget / 2**20 + trivial["peak_mib"]
                held = row not in ("jvm-zgc", "go-static")
                within = limit is not None and man["peak_mib"] <= limit
                failed |= not nat["ok"] or not man["ok"] or (held and not within)
                table.append((row, variant, nat, man, trivial, limit, held, within))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nruntimes acceptance: tierswap run --budget {a.budget} {a.flags}".rstrip()
          + f"; fill {a.fill_mib} MiB, churn {a.fill_mib // 3} MiB live for {a.churn_s:g} s")
    print("%-13s %-6s %-4s %9s %9s %7s %10s %10s %10s %10s  %s" % (
        "runtime", "run", "ok", "native s", "run s", "÷native", "native RSS", "run RSS", "alone RSS", "limit",
        "within / what it said"))
    for row, variant, nat, man, trivial, limit, held, within in table:
        said = man["stderr"][:110]
        verdict = ("yes" if within else "NO") if held else "not held"
        print("%-13s %-6s %-4s %9.2f %9.2f %7.2f %6.0f MiB %6.0f MiB %10s %10s  %s%s" % (
            row, variant, "yes" if nat["ok"] and man["ok"] else "NO", nat["wall_s"], man["wall_s"],
            man["wall_s"] / nat["wall_s"] if nat["wall_s"] else 0, nat["peak_mib"], man["peak_mib"],
            "-" if trivial is None else "%.0f MiB" % trivial["peak_mib"],
            "-" if limit is None else "%.0f MiB" % limit, verdict, (": " + said) if said else ""))
    print("RSS: peak of the summed RSS of the run's process tree, sampled every 50 ms; alone: the runtime "
          "running nothing, natively; limit: 1.05 × budget + alone. ZGC's heap is shared memory and a "
          "static binary never loads the shim: neither is held to the budget, both are named.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
