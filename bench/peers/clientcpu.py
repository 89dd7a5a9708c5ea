"""The Python client's own CPU per uncontended lock+unlock pair (see
clientcpu.js): WORKERS threads, each on its own key, do PAIRS pairs in
all; the process's user+system CPU time (resource.getrusage) over them
divided by PAIRS. One JSON line on stdout.

    python3 clientcpu.py --client=PATH/leased.py --sock=PATH
        [--workers=50] [--pairs=50000] [--pool=N] [--label=TEXT]
    python3 clientcpu.py --peer=redispy --redis=PORT ...

Without --pool each thread has its own Leased (as in bench-peers); with
--pool=N the threads share one Pool of N connections; with --asyncio=1
the workers are tasks sharing one AsyncLeased.
"""

import asyncio
import importlib.util
import json
import resource
import sys
import threading
import time


def parse(argv):
    opt = {}
    for a in argv:
        if not a.startswith("--") or "=" not in a:
            raise SystemExit("bad argument %s" % a)
        k, _, v = a[2:].partition("=")
        opt[k] = v
    return opt


def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def sys_cpu():
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def switches():
    """The process's voluntary context switches (all threads): a thread
    that waits for a reply or for the interpreter lock is one."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def load(path):
    spec = importlib.util.spec_from_file_location("leased_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


async def run_async(opt, workers, pairs, warm):
    ld = await load(opt["client"]).AsyncLeased.connect(opt["sock"])

    async def worker(w, n, tag):
        key = "clientcpu:aio:%s:%d:%d" % (tag, id(ld), w)
        for _ in range(n):
            r = await ld.try_lock(key)
            if not r["acquired"]:
                raise RuntimeError("%s not acquired" % key)
            u = await ld.unlock(key, token=r["token"])
            if not u["released"]:
                raise RuntimeError("%s not released" % key)

    async def run(n, tag):
        await asyncio.gather(*[worker(w, n // workers + (w < n % workers),
                                      tag) for w in range(workers)])

    await run(warm, "warm")
    c0 = cpu()
    t0 = time.monotonic()
    await run(pairs, "m")
    t1 = time.monotonic()
    c1 = cpu()
    await ld.close()
    return c1 - c0, t1 - t0


def main():
    opt = parse(sys.argv[1:])
    workers = int(opt.get("workers", 50))
    pairs = int(opt.get("pairs", 50000))
    warm = min(pairs, int(opt.get("warm", 1000)))
    if opt.get("asyncio"):
        c, t = asyncio.run(run_async(opt, workers, pairs, warm))
        print(json.dumps({
            "lang": "python", "label": opt.get("label", "leased"),
            "workers": workers, "pairs": pairs, "conns": "1 (asyncio)",
            "cpu_us_per_pair": c * 1e6 / pairs, "pairs_per_s": pairs / t}))
        return
    if opt.get("peer") == "redispy":
        import redis
        conns = [redis.Redis(host="127.0.0.1", port=int(opt["redis"]))
                 for _ in range(workers)]

        def pair(r, key):
            lk = r.lock(key, timeout=10)
            if not lk.acquire(blocking=False):
                raise RuntimeError("%s not acquired" % key)
            lk.release()
    else:
        mod = load(opt["client"])
        if opt.get("pool"):
            pool = mod.Pool(opt["sock"], size=int(opt["pool"]))
            conns = [pool] * workers
        else:
            conns = [mod.Leased(opt["sock"]) for _ in range(workers)]

        def pair(c, key):
            r = c.try_lock(key)
            if not r["acquired"]:
                raise RuntimeError("%s not acquired" % key)
            if not c.unlock(key, token=r["token"])["released"]:
                # A lock that stayed held would be taken again reentrantly.
                raise RuntimeError("%s not released" % key)

    errors = []

    def worker(w, n, tag):
        # A share of its own: no lock shared by the workers in the way.
        key = "clientcpu:%s:%d:%d" % (tag, id(errors), w)
        c = conns[w]
        try:
            for _ in range(n):
                pair(c, key)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def run(n, tag):
        ts = [threading.Thread(target=worker,
                               args=(w, n // workers + (w < n % workers), tag))
              for w in range(workers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]

    run(warm, "warm")
    s0, k0 = switches(), sys_cpu()
    c0 = cpu()
    t0 = time.monotonic()
    run(pairs, "m")
    t1 = time.monotonic()
    c1 = cpu()
    s1, k1 = switches(), sys_cpu()
    for c in {id(c): c for c in conns}.values():
        c.close()
    print(json.dumps({
        "lang": "python", "label": opt.get("label", opt.get("peer", "leased")),
        "workers": workers, "pairs": pairs,
        "conns": "pool %s" % opt["pool"] if opt.get("pool") else workers,
        "cpu_us_per_pair": (c1 - c0) * 1e6 / pairs,
        "sys_us_per_pair": (k1 - k0) * 1e6 / pairs,
        "switches_per_pair": (s1 - s0) / pairs,
        "pairs_per_s": pairs / (t1 - t0)}))


if __name__ == "__main__":
    main()
