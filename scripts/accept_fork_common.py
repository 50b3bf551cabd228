"""What the fork acceptance drivers share (scripts/accept-fork.sh runs them): starting the
program under test with a command prefix (empty: natively; `tierswap run --budget 256M --`:
managed), sampling the summed RSS and PSS of its process tree every 20 ms from /proc (and,
at the PSS peak, each process's RSS, PSS and its row of the tree's budget ledger), and the
one JSON line each driver prints. Python 3.11 standard library only.
"""

import argparse
import atexit
import json
import os
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def children_of(pid):
    """The pids of `pid`'s children, whichever of its threads forked them."""
    kids = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(p) for p in f.read().split())
        except OSError:
            pass
    return kids


def rss_bytes(pid):
    """Resident bytes of `pid` (statm), 0 once it is gone. Pages shared copy-on-write with
    a parent count in each process, as `ps` shows them."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def pss_bytes(pid):
    """Proportional resident bytes of `pid` (the "Pss:" line of smaps_rollup, kB): a page
    shared copy-on-write by n processes counts 1/n in each, so the sum over a tree counts
    it once, as a memory cgroup charges it. 0 when unreadable or gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) << 10
    except (OSError, IndexError, ValueError):
        pass
    return 0


def tree_usage(root):
    """[(pid, parent, RSS bytes, PSS bytes)] of `root` and all its descendants."""
    rows, todo = [], [(root, 0)]
    while todo:
        pid, parent = todo.pop()
        rows.append((pid, parent, rss_bytes(pid), pss_bytes(pid)))
        todo.extend((kid, pid) for kid in children_of(pid))
    return rows


# The tree's budget ledger `tierswap run` makes (crates/tierswap/src/tree.rs): a 64-byte
# header, then 64-byte rows; row pid 0 is a free row.
LEDGER_HEADER = struct.Struct("<QIIQI")  # magic, version, rows, budget, root pid
LEDGER_ROW = struct.Struct("<IIQQQ")  # pid, parent, footprint, target, start time
LEDGER_MAGIC = int.from_bytes(b"TSTREE01", "little")


def ledger_path(root):
    return f"/dev/shm/tierswap-tree.{root}"


def read_ledger(root):
    """(budget bytes, {pid: (parent, footprint bytes, target bytes)}) of the tree under
    `root`, or None when it has no ledger (natively, --per-process, or gone)."""
    try:
        with open(ledger_path(root), "rb") as f:
            data = f.read()
        magic, _version, n, budget, _root = LEDGER_HEADER.unpack_from(data, 0)
        if magic != LEDGER_MAGIC:
            return None
        members = {}
        for i in range(n):
            pid, parent, footprint, target, _start = LEDGER_ROW.unpack_from(data, 64 + 64 * i)
            if pid:
                members[pid] = (parent, footprint, target)
        return budget, members
    except (OSError, struct.error):
        return None


class TreeSampler:
    """Samples the summed RSS and PSS of the tree under `root` every `period_s` in a
    thread: `peak` and `peak_procs` hold the largest RSS sum and the process count then,
    `peak_pss` the largest PSS sum (another moment, maybe) and `at_pss_peak` each process
    then: {pid, parent, rss_mib, pss_mib} and, when the tree has a budget ledger, its row's
    footprint_mib and target_mib (`ledger_budget_mib`: the ledger's budget)."""

    def __init__(self, root, period_s=0.02):
        self.root, self.period_s = root, period_s
        self.peak, self.peak_procs, self.peak_pss, self.samples = 0, 0, 0, 0
        self.at_pss_peak, self.ledger_budget_mib = [], None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            rows = tree_usage(self.root)
            rss = sum(r[2] for r in rows)
            pss = sum(r[3] for r in rows)
            self.samples += 1
            if rss > self.peak:
                self.peak, self.peak_procs = rss, len(rows)
            if pss > self.peak_pss:
                self.peak_pss = pss
                self._note(rows)
            self._stop.wait(self.period_s)

    def _note(self, rows):
        ledger = read_ledger(self.root)
        members = ledger[1] if ledger else {}
        if ledger:
            self.ledger_budget_mib = ledger[0] >> 20
        self.at_pss_peak = []
        for pid, parent, rss, pss in rows:
            p = {"pid": pid, "parent": parent, "rss_mib": rss >> 20, "pss_mib": pss >> 20}
            if pid in members:
                p["footprint_mib"], p["target_mib"] = members[pid][1] >> 20, members[pid][2] >> 20
            self.at_pss_peak.append(p)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.peak

    def record(self, rec):
        """Puts the peaks in a driver's line (call after stop)."""
        rec["peak_tree_rss_mib"] = self.peak >> 20
        rec["peak_tree_pss_mib"] = self.peak_pss >> 20
        rec["peak_procs"] = self.peak_procs
        rec["at_pss_peak"] = self.at_pss_peak
        if self.ledger_budget_mib is not None:
            rec["ledger_budget_mib"] = self.ledger_budget_mib


def command(prefix, argv):
    """`prefix` (a shell-quoted string, maybe empty) followed by `argv`."""
    return shlex.split(prefix) + list(argv)


def python():
    """The interpreter running this script (a pyenv shim is a bash script: under tierswap
    run it would get a pager of its own for nothing)."""
    return sys.executable


def run_sampled(argv, timeout_s, env=None, period_s=0.02):
    """Runs `argv` to the end, sampling its tree every `period_s`. Returns (returncode, stdout, stderr,
    wall seconds, the stopped TreeSampler: its peak tree RSS and PSS and processes); a run
    past `timeout_s` is killed and returns code None."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         process_group=0)
    sampler = TreeSampler(p.pid, period_s)
    try:
        out, err = p.communicate(timeout=timeout_s)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        code = None
    wall = time.monotonic() - t0
    sampler.stop()
    return code, out, err, wall, sampler


def emit(record):
    """The driver's one line of results."""
    print(json.dumps(record, sort_keys=True), flush=True)


def fail(msg):
    print(f"accept-fork: {msg}", file=sys.stderr, flush=True)


def run_part(part, label, body, detail_if_ok):
    """Runs a part: `body(rec)` does its steps and appends to rec["problems"] what went
    wrong; an exception is one more problem. Prints the part's line; returns the exit
    status: 0 when all went right, 1 for problems, 2 when a step failed."""
    rec = {"part": part, "label": label, "ok": False, "problems": []}
    code = 0
    try:
        body(rec)
    except Exception as e:  # a step that failed: report it in the line, exit 2
        rec["problems"].append("%s: %s" % (type(e).__name__, e))
        code = 2
    rec["ok"] = not rec["problems"]
    rec["detail"] = "; ".join(rec.pop("problems")) or detail_if_ok(rec)
    emit(rec)
    return 0 if rec["ok"] else (code or 1)


# The forking servers' drivers (parts c and d): the server, started under the prefix,
# publishes its port(s) and build time in a file once it serves; the client asks ranges of
# its data and checks each reply.

def publish(path, text):
    """Writes `text` to `path` whole: a reader polling for the file never sees half of it."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


# The directories publish_path made, removed when the script ends.
_published = []


def publish_path(tag):
    """A fresh private path for a server to publish at, in a directory removed at exit (not
    named tierswap-*: `tierswap stat` searches $TMPDIR/tierswap-* for control sockets)."""
    d = tempfile.mkdtemp(prefix="accept-fork-%s." % tag)
    _published.append(d)
    return os.path.join(d, "port")


@atexit.register
def _remove_published():
    for d in _published:
        shutil.rmtree(d, ignore_errors=True)


def start_server(argv):
    """Starts a server in a process group of its own (so its whole tree can be killed), its
    stderr kept for the report."""
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            process_group=0)


def wait_published(server, path, t_start, timeout_s):
    """What `server` published at `path`, once it has; raises when it exits first or takes
    longer than `timeout_s` from `t_start`."""
    while not os.path.exists(path):
        if server.poll() is not None:
            raise RuntimeError("the server exited with %d before serving: %s"
                               % (server.returncode, server.stderr.read().strip()[-300:]))
        if time.monotonic() - t_start > timeout_s:
            raise RuntimeError("the server did not start serving in %ds" % timeout_s)
        time.sleep(0.05)
    with open(path) as f:
        return f.read()


def server_args(p, requests, request_mib):
    """The arguments every forking server's driver takes (its server's own included)."""
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port-file", help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="", help="command prefix, e.g. 'tierswap run --budget 256M --'")
    p.add_argument("--requests", type=int, default=requests)
    p.add_argument("--request-mib", type=int, default=request_mib)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--label", default="native")


def stop_server(server, rec, t_start, sampler, path, gentle):
    """Ends `server`'s whole process group (with `gentle`, SIGTERM first and up to 30 s for
    it to end its workers its own way), then records the wall time from `t_start`, what
    `sampler` saw and, when something went wrong, the end of the server's stderr, and
    removes what it published at `path`."""
    if gentle and server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.pid, 9)  # whatever is left of the tree
    except ProcessLookupError:
        pass
    server.wait()
    rec["wall_s"] = round(time.monotonic() - t_start, 1)
    sampler.stop()
    sampler.record(rec)
    err = server.stderr.read().strip()
    if err and rec["problems"]:
        rec["server_stderr"] = err[-400:]
    unpublish(path)


def unpublish(path):
    """Removes the published file and its directory."""
    try:
        os.remove(path)
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def ask(port, first, count):
    """One request to a server on this machine: `count` chunks from `first`; its reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=3600) as s:
        s.sendall(b"%d %d\n" % (first, count))
        return s.makefile("rb").readline().strip().decode(errors="replace")
