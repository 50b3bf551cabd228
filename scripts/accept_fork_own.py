"""Fork acceptance, part (d): a prefork server whose workers hold memory of their own.

The server (under --prefix; empty: natively) listens on WORKERS sockets, then forks WORKERS
workers; each, after the fork, fills a bytearray of WORKER_MIB MiB of its own from its
seed (1 MiB chunks: incompressible on odd chunks, text on even ones) and then serves the
connections of its socket one at a time: each request names a range of REQUEST_MIB chunks,
and the worker replies with its index and the SHA-256 of the SHA-256s of those chunks,
read in place from its bytearray. The parent holds nothing but the sockets; it says where
to connect once every worker has filled its memory, then waits (a worker that dies ends
the server; SIGTERM stops the workers and then the parent).

The client sends REQUESTS requests, CONCURRENCY at a time, request r to worker r mod
WORKERS over ranges spread across its memory, and compares every reply with the digest it
computes itself from the same seeds. The summed RSS and PSS of the server's process tree
are sampled every 20 ms. Prints one JSON line; exit 1 on any mismatch, 2 when a step fails.

    accept_fork_own.py [--prefix "tierswap run --budget 256M --"] [--workers 8]
                       [--worker-mib 100] [--requests 400] [--request-mib 20]
                       [--concurrency 4] [--label L]
"""

import argparse
import concurrent.futures
import hashlib
import os
import random
import select
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accept_fork_common as common  # noqa: E402

CHUNK = 1 << 20


def chunk_of(worker, i):
    """Chunk i of worker `worker`'s memory."""
    if i % 2:
        return random.Random(worker * 1_000_003 + i).randbytes(CHUNK)
    line = b"worker %03d, chunk %08d: its own memory, filled after the fork\n" % (worker, i)
    return (line * (CHUNK // len(line) + 1))[:CHUNK]


def digest_of(chunk_digests):
    """The reply's digest: SHA-256 of the chunks' SHA-256s, in order."""
    return hashlib.sha256(b"".join(chunk_digests)).hexdigest()


def worker_main(w, sock, mib, ready_w):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    mem = bytearray(mib * CHUNK)
    for i in range(mib):
        mem[i * CHUNK:(i + 1) * CHUNK] = chunk_of(w, i)
    view = memoryview(mem)
    os.write(ready_w, b".")
    os.close(ready_w)
    while True:
        conn, _ = sock.accept()
        with conn, conn.makefile("rwb") as f:
            try:
                first, count = (int(x) for x in f.readline().split())
            except ValueError:
                f.write(b"error: bad request\n")
                continue
            if first < 0 or count < 1 or first + count > mib:
                f.write(b"error: range %d+%d outside %d chunks\n" % (first, count, mib))
                continue
            got = [hashlib.sha256(view[i * CHUNK:(i + 1) * CHUNK]).digest() for i in range(first, first + count)]
            f.write(b"%d %s\n" % (w, digest_of(got).encode()))


def serve(a):
    """The server's parent: forks the workers, says where they listen, waits."""
    t0 = time.monotonic()
    socks = []
    for _ in range(a.workers):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        socks.append(s)
    ready_r, ready_w = os.pipe()
    pids = []
    for w, s in enumerate(socks):
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            code = 0
            try:
                worker_main(w, s, a.worker_mib, ready_w)
            except SystemExit as e:
                code = e.code or 0
            except BaseException as e:  # a worker that fails says why and ends the server
                print("accept-fork: worker %d: %s: %s" % (w, type(e).__name__, e), file=sys.stderr, flush=True)
                code = 1
            sys.stdout.flush()
            os._exit(code) if code else sys.exit(0)
        pids.append(pid)
    os.close(ready_w)

    def stop(code=0):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        sys.exit(code)

    signal.signal(signal.SIGTERM, lambda *_: stop())

    def dead_worker():
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            pids.remove(pid)
            print("accept-fork: worker pid %d ended (status %#x)" % (pid, status), file=sys.stderr, flush=True)
            stop(1)

    ready = 0
    while ready < a.workers:
        if select.select([ready_r], [], [], 0.2)[0]:
            got = os.read(ready_r, a.workers)
            if not got:
                break
            ready += len(got)
        dead_worker()
    os.close(ready_r)
    built = time.monotonic() - t0
    common.publish(a.port_file, "%s %.2f\n" % (",".join(str(s.getsockname()[1]) for s in socks), built))
    while True:
        time.sleep(0.2)
        dead_worker()


def client(a, rec):
    port_file = common.publish_path("own")
    argv = common.command(a.prefix, [common.python(), os.path.abspath(__file__), "--serve", "--workers",
                                     str(a.workers), "--worker-mib", str(a.worker_mib), "--port-file", port_file])
    t_start = time.monotonic()
    server = common.start_server(argv)
    sampler = common.TreeSampler(server.pid)
    try:
        ports, built = common.wait_published(server, port_file, t_start, a.timeout).split()
        ports = [int(p) for p in ports.split(",")]
        rec["build_s"] = float(built)
        span = a.worker_mib - a.request_mib
        asks = [(r % a.workers, (r * 7919) % (span + 1)) for r in range(a.requests)]
        # The client's own digests (it runs without tierswap), of each chunk a request names.
        t_gen = time.monotonic()
        chunk_digest = {}
        for w, first in asks:
            for i in range(first, first + a.request_mib):
                if (w, i) not in chunk_digest:
                    chunk_digest[w, i] = hashlib.sha256(chunk_of(w, i)).digest()
        expected = {(w, first): "%d %s" % (w, digest_of([chunk_digest[w, i] for i in range(first, first + a.request_mib)]))
                    for w, first in set(asks)}
        rec["client_expect_s"] = round(time.monotonic() - t_gen, 1)
        t = time.monotonic()
        wrong = []
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            replies = pool.map(lambda q: (q, common.ask(ports[q[0]], q[1], a.request_mib)), asks)
            for q, got in replies:
                if got != expected[q]:
                    wrong.append((q, got[:24]))
        rec["serve_s"] = round(time.monotonic() - t, 1)
        rec["wrong_replies"] = len(wrong)
        if wrong:
            (w, first), got = wrong[0]
            rec["problems"].append("%d of %d replies wrong (first: worker %d, chunks %d.., got %r)"
                                   % (len(wrong), a.requests, w, first, got))
        if server.poll() is not None:
            rec["problems"].append("the server exited with %d while serving" % server.returncode)
    finally:
        common.stop_server(server, rec, t_start, sampler, port_file, gentle=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.server_args(p, requests=400, request_mib=20)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--worker-mib", type=int, default=100)
    a = p.parse_args()
    if a.serve:
        serve(a)
        return 0
    if a.workers < 1 or not 1 <= a.request_mib <= a.worker_mib or a.requests < 1 or a.concurrency < 1:
        common.fail("give at least one worker, --request-mib from 1 to --worker-mib, and at least one "
                    "request and one connection")
        return 2
    return common.run_part("d", a.label, lambda rec: client(a, rec), lambda rec: (
        "%d replies from %d workers, each the digest of %d MiB, all right" % (a.requests, a.workers, a.request_mib)))


if __name__ == "__main__":
    sys.exit(main())
