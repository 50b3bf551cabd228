"""What the fork acceptance drivers share (scripts/accept-fork.sh runs them): starting the
program under test with a command prefix (empty: natively; `tierswap run --budget 256M --`:
managed), sampling the summed RSS of its process tree every 20 ms from /proc, and the one
JSON line each driver prints. Python 3.11 standard library only.
"""

import json
import os
import shlex
import subprocess
import sys
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


def tree_rss_bytes(root):
    """(summed RSS of `root` and all its descendants, how many processes)."""
    total, seen, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        total += rss_bytes(pid)
        seen += 1
        todo.extend(children_of(pid))
    return total, seen


class TreeSampler:
    """Samples the summed RSS of the tree under `root` every `period_s` in a thread; `peak`
    and `peak_procs` hold the largest sample and the process count then."""

    def __init__(self, root, period_s=0.02):
        self.root, self.period_s = root, period_s
        self.peak, self.peak_procs, self.samples = 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            total, procs = tree_rss_bytes(self.root)
            self.samples += 1
            if total > self.peak:
                self.peak, self.peak_procs = total, procs
            self._stop.wait(self.period_s)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.peak


def command(prefix, argv):
    """`prefix` (a shell-quoted string, maybe empty) followed by `argv`."""
    return shlex.split(prefix) + list(argv)


def python():
    """The interpreter running this script (a pyenv shim is a bash script: under tierswap
    run it would get a pager of its own for nothing)."""
    return sys.executable


def run_sampled(argv, timeout_s, env=None, period_s=0.02):
    """Runs `argv` to the end, sampling its tree every `period_s`. Returns (returncode, stdout, stderr,
    wall seconds, peak tree RSS bytes, processes at the peak); a run past `timeout_s` is
    killed and returns code None."""
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
    return code, out, err, wall, sampler.peak, sampler.peak_procs


def emit(record):
    """The driver's one line of results."""
    print(json.dumps(record, sort_keys=True), flush=True)


def fail(msg):
    print(f"accept-fork: {msg}", file=sys.stderr, flush=True)
