"""The Python side of make bench-peers: one cell per run, one JSON line on
stdout (the same fields as peers.js).

    python3 peers.py lock --contender=leased|redispy
        --shape=uncontended|contended --workers=50 --dur=5 --warm=0.5
        --retry=default|tuned --tuned-ms=10 --hold-ms=1 --sock=PATH
        --redis=PORT --referee=PORT --tag=RUNID [--overlap=local|redis]
        [--pool=N]
    python3 peers.py storm --contender=leased|naive --readers=25
        --key=K --loader-ms=50 --sock=PATH
        --redis=PORT --referee=PORT

Workers are threads, each with its own connections (the leased client is
one session per object and not thread-safe). All the workers of a lock
cell live in this one process, so the overlap counter is a count of
holders per key under a threading.Lock here: exact, and it costs every
contender next to nothing (--overlap=redis counts on the referee instead,
INCR after the grant and DECR before the release, two round trips per
hold that every contender pays alike). The storm's loader calls span
processes: they are always counted on the referee, the bench's own
redis-server.
"""

import json
import math
import sys
import threading
import time

import redis

import adapters as ld

WAIT_MS = 10000     # leased: one request waits this long at most


def parse(argv):
    opt = {}
    for a in argv:
        if not a.startswith("--") or "=" not in a:
            raise SystemExit("bad argument %s" % a)
        k, _, v = a[2:].partition("=")
        opt[k] = v
    return opt


def rclient(port):
    return redis.Redis(host="127.0.0.1", port=int(port))


def pct(s, p):
    if not s:
        return None
    i = min(len(s) - 1, int(math.ceil(p / 100.0 * len(s))) - 1)
    return s[max(0, i)]


class LeasedContender:
    has_fence = True

    def __init__(self, opt, tuned, tuned_ms):
        self.sock = opt["sock"]

    def setup(self):
        return ld.connect(self.sock)

    def acquire(self, c, key, contended):
        r = ld.lock(c, key, WAIT_MS if contended else 0)
        return r if r["acquired"] else None

    def release(self, c, key, h):
        ld.unlock(c, key)

    def teardown(self, c):
        ld.close(c)


class LeasedPoolContender(LeasedContender):
    """--pool=N: the workers share one thread-safe Pool of N connections
    (each call borrows one; the unlock goes by token)."""

    def __init__(self, opt, tuned, tuned_ms):
        LeasedContender.__init__(self, opt, tuned, tuned_ms)
        self.pool = ld.pool(self.sock, int(opt["pool"]))

    def setup(self):
        return self.pool

    def release(self, c, key, h):
        ld.unlock(c, key, h["token"])

    def teardown(self, c):
        c.close()


class RedisPyContender:
    """redis.lock.Lock: default sleep 0.1 s between tries, blocking with
    no limit; tuned: sleep = the tuned interval."""
    has_fence = False

    def __init__(self, opt, tuned, tuned_ms):
        self.port = opt["redis"]
        self.kw = {"timeout": 10}
        if tuned:
            self.kw["sleep"] = tuned_ms / 1000.0
        # A bound like the others' (leased wait_ms, the peers' timeouts),
        # so a starved worker shows up as a give-up, not a hang.
        self.kw["blocking_timeout"] = WAIT_MS / 1000.0

    def setup(self):
        r = rclient(self.port)
        r.ping()
        return r

    def acquire(self, r, key, contended):
        lk = r.lock(key, **self.kw)
        return lk if lk.acquire() else None

    def release(self, r, key, h):
        h.release()

    def teardown(self, r):
        r.close()


def lock_cell(opt):
    contended = opt.get("shape") == "contended"
    tuned = opt.get("retry") == "tuned"
    tuned_ms = float(opt.get("tuned-ms", 10))
    workers = int(opt.get("workers", 50))
    dur = float(opt.get("dur", 5))
    warm = float(opt.get("warm", 0.5))
    hold = float(opt.get("hold-ms", 1)) / 1000.0
    tag = opt.get("tag", str(time.time()))
    cls = {"leased": LeasedContender, "redispy": RedisPyContender}
    if opt["contender"] == "leased" and opt.get("pool"):
        cls["leased"] = LeasedPoolContender
    c = cls[opt["contender"]](opt, tuned, tuned_ms)
    states = [c.setup() for _ in range(workers)]
    on_redis = opt.get("overlap", "local") == "redis"
    refs = [rclient(opt["referee"]) if on_redis else None
            for _ in range(workers)]
    mu = threading.Lock()
    inside_n = {}       # key -> holders inside now (--overlap=local)
    st = {"done": 0, "gave_up": 0, "overlaps": 0, "backwards": 0,
          "handoffs": 0, "last": -1, "errors": 0, "first_error": None}
    grants = [0] * workers
    last_fence = {}
    lat = []
    t0 = time.monotonic()
    ws = t0 + warm
    we = ws + dur

    def err(e):
        with mu:
            st["errors"] += 1
            st["first_error"] = st["first_error"] or repr(e)

    def worker(w):
        s = states[w]
        ref = refs[w]
        key = "peers:%s:%s" % (tag, "one" if contended else "w%d" % w)
        rkey = "inside:" + key
        while time.monotonic() < we:
            a0 = time.monotonic()
            h = None
            while h is None and time.monotonic() < we + WAIT_MS / 1000.0:
                try:
                    h = c.acquire(s, key, contended)
                except Exception as e:      # counted, then tried again
                    err(e)
                    time.sleep(0.01)
                    continue
                if h is None:
                    with mu:
                        st["gave_up"] += 1
            if h is None:
                break
            a1 = time.monotonic()
            if on_redis:
                inside = ref.incr(rkey)
            counted = ws <= a1 <= we
            with mu:
                if not on_redis:
                    inside = inside_n[key] = inside_n.get(key, 0) + 1
                if inside > 1:
                    st["overlaps"] += 1
                if c.has_fence:
                    f = int(h["fence"])
                    prev = last_fence.get(key)
                    if prev is not None and not f > prev:
                        st["backwards"] += 1
                    last_fence[key] = f
                if contended:
                    if counted and st["last"] not in (-1, w):
                        st["handoffs"] += 1
                    st["last"] = w
            if contended:
                time.sleep(hold)
            if on_redis:
                ref.decr(rkey)
            else:
                with mu:
                    inside_n[key] -= 1
            r0 = time.monotonic()
            try:
                c.release(s, key, h)
            except Exception as e:
                err(e)
            r1 = time.monotonic()
            if (counted if contended else (a0 >= ws and r1 <= we)):
                with mu:
                    st["done"] += 1
                    grants[w] += 1
                    lat.append(((a1 - a0) if contended
                                else (a1 - a0) + (r1 - r0)) * 1000.0)

    threads = [threading.Thread(target=worker, args=(w,))
               for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in states:
        c.teardown(s)
    for r in refs:
        if r is not None:
            r.close()
    lat.sort()
    mean = st["done"] / float(workers)
    out = {
        "lang": "python", "kind": "lock", "contender": opt["contender"],
        "shape": opt.get("shape"), "retry": opt.get("retry", "default"),
        "workers": workers, "dur_s": dur, "count": st["done"],
        "per_s": st["done"] / dur, "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99), "max_ms": lat[-1] if lat else None,
        "handoffs_s": st["handoffs"] / dur if contended else None,
        "grants_min": min(grants), "grants_max": max(grants),
        "grants_mean": mean,
        "grants_dev_pct": (max(abs(g - mean) for g in grants) / mean * 100
                           if mean > 0 else None),
        "overlaps": st["overlaps"],
        "fence_backwards": st["backwards"] if c.has_fence else None,
        "gave_up": st["gave_up"], "errors": st["errors"],
        "first_error": st["first_error"],
        "overlap_counter": "redis" if on_redis else "local",
    }
    sys.stdout.write(json.dumps(out) + "\n")


def storm_cell(opt):
    readers = int(opt.get("readers", 25))
    loader_s = float(opt.get("loader-ms", 50)) / 1000.0
    key = opt["key"]
    want = "value-of-" + key
    ref = rclient(opt["referee"])
    ref.ping()
    mu = threading.Lock()
    st = {"loads": 0, "errors": 0, "wrong": 0, "first_error": None,
          "last": 0.0}

    def loader():
        with mu:
            st["loads"] += 1
        ref.incr("loads:" + key)
        time.sleep(loader_s)
        return want

    if opt["contender"] == "leased":
        conns = [ld.connect(opt["sock"]) for _ in range(readers)]

        def read(i):
            return ld.cached(conns[i], key, loader)

        def teardown():
            for c in conns:
                ld.close(c)
    elif opt["contender"] == "naive":
        # The get-or-load an app writes by hand: no single flight at all.
        r = rclient(opt["redis"])
        r.ping()

        def read(i):
            v = r.get(key)
            if v is not None:
                return v.decode()
            v = loader()
            r.set(key, v, px=600000)
            return v

        def teardown():
            r.close()
    else:
        raise SystemExit("unknown contender %s" % opt["contender"])

    go = threading.Event()

    def reader(i):
        go.wait()
        try:
            v = read(i)
            bad = v != want
            e = None
        except Exception as ex:     # counted in the result
            bad = False
            e = ex
        t = time.time() - start_at
        with mu:
            if e is not None:
                st["errors"] += 1
                st["first_error"] = st["first_error"] or repr(e)
            if bad:
                st["wrong"] += 1
            st["last"] = max(st["last"], t)

    threads = [threading.Thread(target=reader, args=(i,))
               for i in range(readers)]
    for t in threads:
        t.start()
    # Ready, then the start time from run.sh once every process is.
    ref.incr("ready:" + key)
    got = ref.blpop("go:" + key, 120)
    if got is None:
        raise SystemExit("no start from run.sh")
    start_at = float(got[1]) / 1000.0
    late = time.time() - start_at
    if late < 0:
        time.sleep(-late)
    go.set()
    for t in threads:
        t.join()
    teardown()
    ref.close()
    sys.stdout.write(json.dumps({
        "lang": "python", "kind": "storm", "contender": opt["contender"],
        "readers": readers, "late_ms": max(0, late * 1000.0),
        "done_ms": st["last"] * 1000.0, "local_loads": st["loads"],
        "wrong": st["wrong"], "errors": st["errors"],
        "first_error": st["first_error"]}) + "\n")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("lock", "storm"):
        raise SystemExit("usage: peers.py lock|storm --opt=...")
    opt = parse(sys.argv[2:])
    if sys.argv[1] == "lock":
        lock_cell(opt)
    else:
        storm_cell(opt)


if __name__ == "__main__":
    main()
