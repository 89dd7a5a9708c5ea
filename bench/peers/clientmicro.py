"""The Python client's own code per lock+unlock pair, without the socket:
a stand-in socket answers every request at once with a canned reply, so
what is left is the client's encoding, decoding and bookkeeping (and the
stand-in's few lines). Process CPU time, best and median of ROUNDS,
each client file given in turn, alternating.

    python3 clientmicro.py OLD/leased.py NEW/leased.py [--pairs=30000]
"""

import importlib.util
import json
import re
import statistics
import sys
import time

LOCK = (b'{"id":%d,"ok":true,"acquired":true,"token":"9f2c4d1e8a7b6c5d",'
        b'"count":1,"fence":12345,"lease_ms":30000}\n')
UNLOCK = b'{"id":%d,"ok":true,"released":true,"count":0}\n'
ID = re.compile(rb'"id":(\d+)')


class Answering:
    """Enough of a socket for Leased: each recv answers the last send."""

    def __init__(self):
        self.last = b""

    def sendall(self, data):
        self.last = data

    def recv(self, n):
        rid = int(ID.search(self.last).group(1))
        return (LOCK if b'"lock"' in self.last else UNLOCK) % rid

    def setsockopt(self, *args):
        pass

    def settimeout(self, t):
        pass

    def connect(self, addr):
        pass

    def close(self):
        pass


def load(path, n):
    spec = importlib.util.spec_from_file_location("client%d" % n, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # The client makes its socket with socket.socket(AF_UNIX, ...).
    mod.socket = type("sockmod", (), dict(
        vars(mod.socket), socket=lambda *a: Answering()))
    return mod


def main():
    files = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:]
                if a.startswith("--"))
    pairs = int(opts.get("pairs", 30000))
    rounds = int(opts.get("rounds", 5))
    clients = [load(f, i).Leased("/nowhere") for i, f in enumerate(files)]
    took = {f: [] for f in files}
    for _ in range(rounds):
        for f, ld in zip(files, clients):
            t0 = time.process_time()
            for _ in range(pairs):
                ld.try_lock("order:42")
                ld.unlock("order:42")
            took[f].append((time.process_time() - t0) * 1e6 / pairs)
    for f in files:
        print(json.dumps({"client": f, "pairs": pairs,
                          "cpu_us_per_pair_min": min(took[f]),
                          "cpu_us_per_pair_median":
                              statistics.median(took[f])}))


if __name__ == "__main__":
    main()
