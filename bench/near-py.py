"""A shared near cache hit read from Python, against a direct GET round
trip to Redis from Python, in one run (bench/results.md).

    python3 bench/near-py.py --leased src/leased --redis-server redis-server

starts a redis-server on a free loopback port and a leased with the near
cache and its shared segment on, fills one key of 100 bytes through the
daemon, and times, on one thread, alternately:
  near    Leased.cached(key) answered from the segment (no round trip);
  direct  GET key on a raw RESP socket to the same Redis (one round trip).
Each round runs SECONDS per side; the figures are medians over the rounds
of ops/s (ops / wall time of the round) and of the per-op p50 (taken from
a timed pass of its own, so the clock reads do not slow the ops/s pass).
Prints one Markdown table row per side and the ratio. With --go, the
same for the Go client (clients/go/cmd/leased-nearbench, built offline
into the run's temporary directory), against the same daemon and Redis.
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients", "python"))

from leased import Leased  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for " + what)
        time.sleep(0.02)


def can_connect(addr):
    try:
        if isinstance(addr, str):
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(addr)
        else:
            socket.create_connection(addr, 1).close()
        return True
    except OSError:
        return False


class Resp:
    """GET over a raw RESP socket: the direct round trip."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self.s.recv(65536)

    def get_fn(self, key):
        line = b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key)
        send, recv = self.s.sendall, self.s.recv

        def get():
            send(line)
            return recv(65536)
        return get


def rate(fn, seconds):
    """ops/s of FN called back to back for SECONDS (checked every 256)."""
    n = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(256):
            fn()
        n += 256
        now = time.perf_counter()
        if now >= end:
            return n / (now - start)


def p50_us(fn, count):
    clock = time.perf_counter_ns
    lat = []
    for _ in range(count):
        t0 = clock()
        fn()
        lat.append(clock() - t0)
    lat.sort()
    return lat[len(lat) // 2] / 1000.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--leased", required=True)
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--go", action="store_true",
                    help="also time the Go client")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="near-py-")
    port = free_port()
    procs = []
    try:
        log = open(os.path.join(tmp, "redis.log"), "w")
        procs.append(subprocess.Popen(
            [args.redis_server, "--port", str(port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"], stdout=log, stderr=log))
        wait_until(lambda: can_connect(("127.0.0.1", port)), "redis-server")
        sock = os.path.join(tmp, "leased.sock")
        conf = os.path.join(tmp, "leased.yml")
        with open(conf, "w") as f:
            f.write('listen:\n  unix: "%s"\nmetrics:\n  listen: ""\n'
                    'redis:\n  address: "127.0.0.1:%d"\n'
                    'journal:\n  path: "%s"\nlog:\n  level: warn\n'
                    'cache:\n  near: { enabled: true }\n'
                    % (sock, port, os.path.join(tmp, "journal")))
        log = open(os.path.join(tmp, "leased.log"), "w")
        procs.append(subprocess.Popen([args.leased, "-f", "-c", conf],
                                      stdout=log, stderr=log))
        wait_until(lambda: can_connect(sock), "leased")

        key = "bench:near:py"
        value = "v" * args.value_bytes
        ld = Leased(sock, client="near-py", serializer=None)
        if "shared_near" not in ld.features:
            raise SystemExit("this leased has no shared_near feature")
        ld.call("cache.set", key=key, value=value)
        # Read until the daemon keeps it near and the segment has it.
        wait_until(lambda: ld.cached(key, None) == value and
                   ld._near is not None and
                   ld._near.get(key.encode()) == value.encode(),
                   "the key in the segment")
        redis = Resp(port)
        redis.cmd(b"SET", b"bench:direct", value.encode())
        direct = redis.get_fn(b"bench:direct")
        assert direct().endswith(value.encode() + b"\r\n")

        def near():
            return ld.cached(key, None)

        # Lookups the socket answered instead: what near.hits reports,
        # added up here before each report zeroes the connection's count.
        falls = [0]
        report = ld._near_report

        def counted(with_next):
            falls[0] += ld._near_falls
            report(with_next)
        ld._near_report = counted

        res = {"near": [], "direct": []}
        before = falls[0] + ld._near_falls
        for _ in range(args.rounds):
            for name, fn in (("near", near), ("direct", direct)):
                ops = rate(fn, args.seconds)
                p50 = p50_us(fn, 20000)
                res[name].append((ops, p50))
        fallbacks = falls[0] + ld._near_falls - before
        med = {k: (statistics.median(o for o, _ in v),
                   statistics.median(p for _, p in v))
               for k, v in res.items()}
        ratio = med["near"][0] / med["direct"][0]
        print("| side | ops/s (median of %d rounds of %.1f s) | p50 us |"
              % (args.rounds, args.seconds))
        print("|---|---|---|")
        print("| Python `cached()` hit from the shared segment | %.0f | %.2f |"
              % med["near"])
        print("| Python direct GET, raw RESP socket | %.0f | %.2f |"
              % med["direct"])
        print()
        print("ratio: %.1fx ops/s, p50 %.2f vs %.2f us (%.1fx); per round: "
              "%s; "
              "fallbacks to the socket while timing near: %d"
              % (ratio, med["near"][1], med["direct"][1],
                 med["direct"][1] / med["near"][1],
                 ", ".join("%.1fx" % (a[0] / b[0]) for a, b in
                           zip(res["near"], res["direct"])), fallbacks))
        ld.close()
        if args.go:
            go_rows(tmp, sock, port, key, args)
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def go_rows(tmp, sock, port, key, args):
    src = os.path.join(HERE, "..", "clients", "go")
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off",
               GOCACHE=os.environ.get("GOCACHE",
                                      os.path.join(tmp, "gocache")))
    binary = os.path.join(tmp, "leased-nearbench")
    subprocess.run(["go", "build", "-o", binary, "./cmd/leased-nearbench"],
                   cwd=src, env=env, check=True)
    out = subprocess.run(
        [binary, "-socket", sock, "-redis", "127.0.0.1:%d" % port,
         "-key", key, "-direct-key", "bench:direct",
         "-seconds", str(args.seconds), "-rounds", str(args.rounds)],
        check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        name, ops, p50 = line.split()
        got[name] = (float(ops), float(p50))
    print()
    print("| side | ops/s | p50 us |")
    print("|---|---|---|")
    print("| Go `Cached` hit from the shared segment | %.0f | %.3f |"
          % got["near"])
    print("| Go direct GET, raw RESP connection | %.0f | %.3f |"
          % got["direct"])
    print()
    print("Go ratio: %.1fx ops/s" % (got["near"][0] / got["direct"][0]))


if __name__ == "__main__":
    main()
