"""Fork acceptance, part (c): a forking server (socketserver.ForkingTCPServer) whose children
read the data their parent built.

The server (under --prefix; empty: natively) builds DATA_MIB of data in 1 MiB bytes objects
from seeds, then serves: each request names a range of REQUEST_MIB chunks, and the child
forked for it reads and hashes them (SHA-256) and replies with the digest. The client sends
REQUESTS requests, CONCURRENCY at a time, over ranges spread across the data, and compares
every reply with the digest of the same chunks it generates itself. The summed RSS and PSS
of the server's process tree are sampled every 20 ms. Prints one JSON line; exit 1 on any
mismatch, 2 when a step fails.

    accept_fork_prefork.py [--prefix "tierswap run --budget 256M --"] [--data-mib 1024]
                           [--requests 200] [--request-mib 50] [--concurrency 4] [--label L]
"""

import argparse
import concurrent.futures
import hashlib
import os
import random
import socketserver
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accept_fork_common as common  # noqa: E402

CHUNK = 1 << 20


def chunk_of(i):
    """Chunk i: incompressible on odd i, text on even i (the pool and the file both hold some)."""
    if i % 2:
        return random.Random(i).randbytes(CHUNK)
    line = b"chunk %08d of the parent's data, built before any fork\n" % i
    return (line * (CHUNK // len(line) + 1))[:CHUNK]


def digest_of(chunks):
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


DATA = []


class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        first, count = (int(x) for x in self.rfile.readline().split())
        if first < 0 or count < 1 or first + count > len(DATA):
            self.wfile.write(b"error: range %d+%d outside %d chunks\n" % (first, count, len(DATA)))
            return
        self.wfile.write(digest_of(DATA[first:first + count]).encode() + b"\n")


class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    request_queue_size = 64
    max_children = 64


def serve(a):
    t0 = time.monotonic()
    DATA.extend(chunk_of(i) for i in range(a.data_mib))
    built = time.monotonic() - t0
    with Server(("127.0.0.1", 0), Handler) as srv:
        common.publish(a.port_file, "%d %.2f\n" % (srv.server_address[1], built))
        srv.serve_forever()


def client(a, rec):
    port_file = common.publish_path("prefork")
    argv = common.command(a.prefix, [common.python(), os.path.abspath(__file__), "--serve", "--data-mib",
                                     str(a.data_mib), "--port-file", port_file])
    t_start = time.monotonic()
    server = common.start_server(argv)
    sampler = common.TreeSampler(server.pid)
    try:
        port, built = common.wait_published(server, port_file, t_start, a.timeout).split()
        rec["build_s"] = float(built)
        span = a.data_mib - a.request_mib
        ranges = [((r * 7919) % (span + 1), a.request_mib) for r in range(a.requests)]
        # The client's own copy of the data (it runs without tierswap), hashed per range.
        t_gen = time.monotonic()
        mine = [chunk_of(i) for i in range(a.data_mib)]
        expected = {first: digest_of(mine[first:first + count]) for first, count in set(ranges)}
        del mine
        rec["client_expect_s"] = round(time.monotonic() - t_gen, 1)
        t = time.monotonic()
        wrong = []
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            replies = pool.map(lambda r: (r, common.ask(int(port), *r)), ranges)
            for (first, count), got in replies:
                if got != expected[first]:
                    wrong.append((first, got[:16]))
        rec["serve_s"] = round(time.monotonic() - t, 1)
        rec["wrong_replies"] = len(wrong)
        if wrong:
            rec["problems"].append("%d of %d replies wrong (first: chunks %d.., got %s)"
                                   % (len(wrong), a.requests, wrong[0][0], wrong[0][1]))
    finally:
        common.stop_server(server, rec, t_start, sampler, port_file, gentle=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.server_args(p, requests=200, request_mib=50)
    p.add_argument("--data-mib", type=int, default=1024)
    a = p.parse_args()
    if a.serve:
        serve(a)
        return 0
    if not 1 <= a.request_mib <= a.data_mib or a.requests < 1 or a.concurrency < 1:
        common.fail("give --request-mib from 1 to --data-mib, and at least one request and one connection")
        return 2
    return common.run_part("c", a.label, lambda rec: client(a, rec), lambda rec: (
        "%d replies, each the digest of %d MiB, all right" % (a.requests, a.request_mib)))


if __name__ == "__main__":
    sys.exit(main())
