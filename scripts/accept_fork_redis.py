"""Fork acceptance, part (b): redis-server's BGSAVE child while the parent keeps writing.

KEYS keys of VALUE_BYTES each, every value naming its key and a version (version 0 at
load), under --prefix (empty: natively). Then, with the client waiting for every reply:
one pass over the overwrite set (OVERWRITE_PCT % of the keys, every k-th) writes version 1;
BGSAVE (redis forks before it answers, so everything written so far is in the snapshot and
nothing after); while the save runs, the client keeps overwriting the set, whole passes of
versions 2, 3, …, until a pass ends with the save done. Checks:
  - the save succeeded (rdb_last_bgsave_status ok);
  - the live dataset: the set at the last pass's version, every other key at version 0;
  - the RDB, loaded into a fresh unmanaged redis-server: exactly KEYS keys, the set at
    version 1, every other key at version 0.
The summed RSS and PSS of the server's process tree (the BGSAVE child included) are sampled
every 20 ms. Prints one JSON line; exit 1 on any mismatch, 2 when a step fails.

    accept_fork_redis.py [--prefix "tierswap run --budget 256M --"] [--keys 1000000]
                         [--value-bytes 1024] [--overwrite-pct 10] [--label L]
"""

import argparse
import base64
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accept_fork_common as common  # noqa: E402

BATCH = 1000
POOL = base64.b64encode(random.Random(7).randbytes(3 << 16))  # 256 KiB of base64 text


def key_of(idx):
    return b"key:%012d" % idx


def value_of(idx, version, nbytes):
    """`nbytes` naming the key and the version, the rest base64 text picked by both."""
    head = b"%012d:%08d:" % (idx, version)
    off = (idx * 2654435761 + version * 40503) % (len(POOL) - nbytes)
    return head + POOL[off:off + nbytes - len(head)]


class Redis:
    """A pipelining RESP client: enough for SET, GET, INFO and admin commands."""

    def __init__(self, port, wait_s=30):
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=600)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.r = self.sock.makefile("rb", buffering=1 << 20)

    @staticmethod
    def encode(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def reply(self):
        line = self.r.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.r.read(n + 2)
            return data[:-2]
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise ConnectionError("unexpected reply %r" % line[:40])

    def call(self, *args):
        self.sock.sendall(self.encode(*args))
        return self.reply()

    def pipeline(self, commands):
        self.sock.sendall(b"".join(self.encode(*c) for c in commands))
        return [self.reply() for _ in commands]

    def info(self, section, field):
        text = self.call(b"INFO", section.encode())
        for line in text.decode().splitlines():
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
        return None


def set_all(c, keys, version, nbytes):
    """SETs every key of `keys` to `version`, waiting for each batch's replies."""
    for lo in range(0, len(keys), BATCH):
        batch = keys[lo:lo + BATCH]
        for r in c.pipeline([(b"SET", key_of(i), value_of(i, version, nbytes)) for i in batch]):
            if r != b"OK":
                raise RuntimeError("SET answered %r" % (r,))


def count_wrong(c, n_keys, want_version, nbytes):
    """GETs every key; returns (wrong values, missing keys, the first few wrong keys)."""
    wrong = missing = 0
    first = []
    for lo in range(0, n_keys, BATCH):
        idxs = range(lo, min(lo + BATCH, n_keys))
        for i, v in zip(idxs, c.pipeline([(b"GET", key_of(i)) for i in idxs])):
            if v is None:
                missing += 1
            elif v != value_of(i, want_version(i), nbytes):
                wrong += 1
            else:
                continue
            if len(first) < 5:
                first.append((i, None if v is None else v[:22].decode(errors="replace")))
    return wrong, missing, first


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_argv(port, work):
    return ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", work,
            "--dbfilename", "dump.rdb", "--daemonize", "no", "--protected-mode", "no", "--logfile", ""]


def run(a, rec, work):
    every = max(1, round(100 / a.overwrite_pct))
    overwrite = list(range(0, a.keys, every))
    in_set = lambda i: i % every == 0  # noqa: E731
    port = free_port()
    t_start = time.monotonic()
    server = subprocess.Popen(common.command(a.prefix, server_argv(port, work)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    sampler = common.TreeSampler(server.pid)
    try:
        c = Redis(port)
        t = time.monotonic()
        set_all(c, list(range(a.keys)), 0, a.value_bytes)
        set_all(c, overwrite, 1, a.value_bytes)
        rec["load_s"] = round(time.monotonic() - t, 1)
        rec["used_memory_mib"] = int(c.info("memory", "used_memory")) >> 20
        t = time.monotonic()
        r = c.call(b"BGSAVE")
        if isinstance(r, Exception):
            raise RuntimeError("BGSAVE answered %s" % r)
        # Every pass starts while the save runs: the first right after the fork, each later
        # one after INFO said it still runs.
        version, passes = 1, 0
        while True:
            version += 1
            set_all(c, overwrite, version, a.value_bytes)
            passes += 1
            if c.info("persistence", "rdb_bgsave_in_progress") != "1":
                break
            if time.monotonic() - t > a.timeout:
                raise RuntimeError("BGSAVE still running after %ds" % a.timeout)
        rec["save_s"] = round(time.monotonic() - t, 1)
        rec["passes_during_save"] = passes
        rec["overwrites_during_save"] = passes * len(overwrite)
        status = c.info("persistence", "rdb_last_bgsave_status")
        if status != "ok":
            rec["problems"].append("BGSAVE failed: rdb_last_bgsave_status %s" % status)
        final = version
        wrong, missing, first = count_wrong(c, a.keys, lambda i: final if in_set(i) else 0, a.value_bytes)
        rec["live_wrong"], rec["live_missing"] = wrong, missing
        if wrong or missing:
            rec["problems"].append("live dataset: %d wrong, %d missing values (first: %s)" % (wrong, missing, first))
        try:
            c.call(b"SHUTDOWN", b"NOSAVE")  # answers by closing the connection
        except ConnectionError:
            pass
    finally:
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        rec["wall_s"] = round(time.monotonic() - t_start, 1)
        sampler.stop()
        sampler.record(rec)
    err = server.stderr.read()
    if server.returncode not in (0, None):
        rec["problems"].append("redis-server exited with %s: %s" % (server.returncode, err.strip()[-300:]))

    # The RDB in a fresh server without tierswap: what was saved is what it serves.
    port = free_port()
    check = subprocess.Popen(server_argv(port, work), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = Redis(port)
        deadline = time.monotonic() + 600
        while True:
            n = c.call(b"DBSIZE")
            if isinstance(n, int):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the RDB check server did not load the RDB in 600 s: %s" % n)
            time.sleep(0.1)
        rec["rdb_keys"] = n
        if n != a.keys:
            rec["problems"].append("the RDB holds %d keys, not %d" % (n, a.keys))
        wrong, missing, first = count_wrong(c, a.keys, lambda i: 1 if in_set(i) else 0, a.value_bytes)
        rec["rdb_wrong"], rec["rdb_missing"] = wrong, missing
        if wrong or missing:
            rec["problems"].append("RDB: %d wrong, %d missing values as of the fork (first: %s)" % (wrong, missing, first))
    finally:
        check.kill()
        check.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prefix", default="", help="command prefix, e.g. 'tierswap run --budget 256M --'")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--overwrite-pct", type=float, default=10)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--label", default="native")
    a = p.parse_args()
    if shutil.which("redis-server") is None:
        common.fail("redis-server is missing: scripts/setup.sh installs it (apt-get install redis-server)")
        return 2
    if a.value_bytes < 64 or not 0 < a.overwrite_pct <= 100 or a.keys < 1:
        common.fail("give --value-bytes of at least 64, --overwrite-pct in (0, 100] and at least one key")
        return 2
    def body(rec):
        work = tempfile.mkdtemp(prefix="tierswap-accept-fork-redis.")
        try:
            run(a, rec, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return common.run_part("b", a.label, body, lambda rec: (
        "RDB = the %d keys as of the fork; live = the final writes (%d overwrites during the save)"
        % (a.keys, rec.get("overwrites_during_save", 0))))


if __name__ == "__main__":
    sys.exit(main())
