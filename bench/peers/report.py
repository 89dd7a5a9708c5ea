"""Writes bench/peers/results.md from the raw lines of run.sh.

Raw lines: "rep=N {json}" (a lock cell), "rep=N storm lang=.. contender=..
p=.. loads=.." (loader calls of one storm, counted on the referee),
"rep=N p=P {json}" (one storm process), "rep=N failed ..." (a cell that
failed or overran). Figures are medians over the repeats with min-max.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import time

NAMES = {
    ("node", "leased"): "leased (node client)",
    ("node", "redlock"): "redlock, single instance",
    ("node", "semaphore"): "redis-semaphore Mutex",
    ("node", "redlock-shared"): "redlock, one shared ioredis client",
    ("node", "semaphore-shared"):
        "redis-semaphore Mutex, one shared ioredis client",
    ("python", "leased"): "leased (python client)",
    ("python", "redispy"): "redis-py Lock",
    ("node", "cachemgr"): "cache-manager wrap()",
    ("python", "naive"): "redis-py get-or-load by hand",
}
MARKER = "<!-- run.sh keeps everything below this line. -->"
NODE_PKGS = ["redlock", "ioredis", "redis-semaphore", "cache-manager",
             "@keyv/redis", "keyv", "@redis/client"]


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_raw(path):
    locks, storms, procs, failed = [], [], [], []
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"rep=(\d+) (.*)$", line)
        if not m:
            continue
        rep, rest = int(m.group(1)), m.group(2)
        if rest.startswith("failed"):
            failed.append((rep, rest[len("failed "):]))
        elif rest.startswith("storm "):
            f = dict(kv.split("=", 1) for kv in rest.split()[1:])
            f["rep"] = rep
            storms.append(f)
        elif rest.startswith("p="):
            p, _, js = rest.partition(" ")
            d = json.loads(js)
            d["rep"] = rep
            d["p"] = p[2:]
            procs.append(d)
        else:
            d = json.loads(rest)
            d["rep"] = rep
            locks.append(d)
    return locks, storms, procs, failed


def med(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None, None, None
    return statistics.median(vals), min(vals), max(vals)


def fmt(v, nd=0):
    if v is None:
        return "n/a"
    if nd == 0:
        return "{:,.0f}".format(v)
    return "{:.{}f}".format(v, nd)


def mm(vals, nd=0):
    m, lo, hi = med(vals)
    if m is None:
        return "n/a"
    if len([v for v in vals if v is not None]) == 1 or lo == hi:
        return fmt(m, nd)
    return "%s (%s–%s)" % (fmt(m, nd), fmt(lo, nd), fmt(hi, nd))


def ratio(a, b, nd=2):
    a, b = med(a)[0], med(b)[0]
    if a is None or b is None or b == 0:
        return "n/a"
    return "%.*f×" % (nd, a / b)


def total(vals):
    vals = [v for v in vals if v is not None]
    return "n/a" if not vals else str(sum(vals))


def main():
    ap = argparse.ArgumentParser()
    for o in ("raw", "out", "note", "node", "python", "redis-server",
              "peers-dir", "leased-rev", "load-start", "load-end",
              "seconds", "repeats", "duration", "warm", "tuned-ms",
              "sem-tuned-ms", "lead-ms", "readers"):
        ap.add_argument("--" + o, required=True)
    ap.add_argument("--pool", default="2")
    a = ap.parse_args()
    NAMES[("node", "leased-pool")] = (
        "leased (node client, one pool of %s connections)" % a.pool)
    locks, storms, procs, failed = parse_raw(a.raw)

    def cells(lang, who, shape, retry=None):
        return [d for d in locks if d["lang"] == lang and
                d["contender"] == who and d["shape"] == shape and
                (retry is None or d["retry"] == retry)]

    def col(rows, k):
        return [r.get(k) for r in rows]

    o = []
    w = o.append
    w("# leased against the libraries apps would use instead")
    w("")
    if a.note:
        w("**%s**" % a.note)
        w("")
    w("Written by `make bench-peers` (bench/peers/run.sh) on %s. "
      "Every figure is the median over %s repeats with min–max in "
      "brackets; the order of the contenders is reversed on every other "
      "repeat. Ratios are leased ÷ peer of the medians, each leased "
      "client against the peers of its own language." %
      (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), a.repeats))
    w("")

    ncpu = len(os.sched_getaffinity(0))
    load1 = float(a.load_start.split()[0])
    if load1 > 0.5 * ncpu:
        w("The load average at the start was %.2f on %d CPUs: other work "
          "shared the machine, so the figures are disturbed." %
          (load1, ncpu))
        w("")
    w("## Machine and versions")
    w("")
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    w("| | |")
    w("|---|---|")
    w("| CPUs (nproc) | %d |" % ncpu)
    w("| CPU model | %s |" % cpu)
    w("| kernel | %s |" % platform.release())
    w("| load average (1, 5, 15 min) at start / end | %s / %s |" %
      (a.load_start, a.load_end))
    w("| whole run | %s s |" % a.seconds)
    w("| leased | git %s, redis.connections 2 |" % a.leased_rev)
    rv = run([a.redis_server, "--version"])
    m = re.search(r"v=(\S+)", rv)
    w("| redis-server | %s |" % (m.group(1) if m else rv))
    w("| node | %s |" % run([a.node, "--version"]))
    w("| python | %s |" % platform.python_version())
    try:
        import redis
        w("| redis-py (python3-redis) | %s |" % redis.__version__)
    except ImportError:
        w("| redis-py | not importable |")
    for p in NODE_PKGS:
        pj = os.path.join(a.peers_dir, "node_modules", p, "package.json")
        try:
            v = json.load(open(pj))["version"]
        except (OSError, ValueError, KeyError):
            v = "not installed"
        w("| %s (npm) | %s |" % (p, v))
    w("")

    w("## How it is measured")
    w("")
    # Where each language's lock cells counted holders (peers.py says so
    # in its lines; a line without it counted on the referee).
    where = {lg: {d.get("overlap_counter", "redis") for d in locks
                  if d["lang"] == lg} for lg in ("node", "python")}
    local = [lg.capitalize() for lg in ("node", "python")
             if where[lg] == {"local"}]
    remote = [lg.capitalize() for lg in ("node", "python")
              if where[lg] and where[lg] != {"local"}]
    w("* One redis-server under test, one leased on it (Unix socket), "
      "and a second redis-server, the *referee*, used only by the bench. "
      "Every lock holder counts itself in right after it is granted and "
      "out just before it releases; a count above 1 after counting in "
      "is an **overlap** (two holders inside at once).")
    if remote:
        w("  * %s: INCR and DECR on a referee key. This costs every "
          "contender of the language the same two round trips per hold, "
          "which are not part of the latencies below but are part of "
          "the rates." % " and ".join(remote))
    if local:
        w("  * %s: all the workers of a lock cell live in one process, so "
          "the count is a number per key in that process (under a "
          "threading.Lock in Python; Node's workers share one thread): "
          "exact, and next to free for every contender alike "
          "(`--overlap=redis` counts on the referee instead). The miss "
          "storm spans processes and counts its loader calls on the "
          "referee." % " and ".join(local))
    w("* Each cell runs %s s after a %s s warm-up. Node: 50 async "
      "workers in one process; Python: 50 threads in one process. "
      "Uncontended Node runs two ways, each the same for every "
      "contender: *a connection per worker* (each worker its own leased "
      "connection or its own ioredis client), and *one client per "
      "process* (the 50 workers share one leased Pool of %s connections, "
      "or one ioredis client handed to Redlock or to every Mutex), which "
      "is how an app with many concurrent callers uses any of them. Each "
      "leased row is compared with the peers connected the same way. The "
      "contended and Python cells use a connection per worker." %
      (a.duration, a.warm, a.pool))
    w("* *client CPU* is the Node process's user + system CPU time per "
      "pair (warm-up included): the same bench code around every "
      "contender.")
    w("* leased: session-bound locks (watchdog lease), `wait_ms` %s "
      "when contended (a worker that is not granted in that time asks "
      "again). Fences are checked per key: a fence not above the last one "
      "seen is a **fence backwards**. The peers have no fences (n/a)." %
      10000)
    w("* Peer retry settings. *default*: redlock retryDelay 200 ms, "
      "retryJitter 100 ms, retryCount 10 (then it gives up and the worker "
      "asks again); redis-semaphore retryInterval 10 ms, acquireTimeout "
      "10 s; redis-py Lock sleep 0.1 s. *tuned*: redlock retryDelay %s ms "
      "and retryJitter half of it; redis-semaphore retryInterval %s ms "
      "(its default is already 10 ms); redis-py sleep %s ms. Lock TTL "
      "10 s for every peer; redis-py blocking_timeout 10 s." %
      (a.tuned_ms, a.sem_tuned_ms, a.tuned_ms))
    w("* Uncontended: each worker locks and unlocks its own key in a "
      "loop; latency is the lock call plus the unlock call. Contended: "
      "all workers on one key, held 1 ms; the wait runs from the first "
      "attempt to the grant; a *handoff* is a grant to a different worker "
      "than the previous holder; grants per worker show fairness (the "
      "deviation is the largest distance from the mean, in %).")
    w("* Miss storm: P processes × %s readers ask for one fresh key at the "
      "same moment (once all processes have connected, they get a start "
      "time %s ms ahead, so starting up and connecting are not "
      "measured); the loader takes 50 ms and counts its calls on the "
      "referee. *time* is until the last reader of every process has the "
      "value. leased (node): one client per process, `cached()`; leased "
      "(python): one client per reader thread (the client is not "
      "thread-safe), `cached()`; cache-manager 7 `wrap()` over "
      "@keyv/redis, the Redis store its documentation names for v6 and "
      "later, one cache per process (wrap() coalesces calls within its "
      "process only); redis-py: GET, on a miss load and SET, one client "
      "per process." % (a.readers, a.lead_ms))
    w("")

    # ----------------------------------------------------------- uncontended
    w("## 1. Uncontended lock+unlock (50 workers, one key each)")
    w("")
    w("| contender | pairs/s | p50 ms | p99 ms | client CPU µs per pair "
      "| overlaps | fences backwards | errors | leased ÷ peer pairs/s | "
      "leased ÷ peer p99 |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    # (lang, contender, the leased contender it is compared with)
    groups = (
        (("node", "leased", None), ("node", "redlock", "leased"),
         ("node", "semaphore", "leased")),
        (("node", "leased-pool", None),
         ("node", "redlock-shared", "leased-pool"),
         ("node", "semaphore-shared", "leased-pool")),
        (("python", "leased", None), ("python", "redispy", "leased")),
    )
    for group in groups:
        for lang, who, mine in group:
            rows = cells(lang, who, "uncontended")
            if not rows:
                continue
            ref = cells(lang, mine, "uncontended") if mine else []
            w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                NAMES[(lang, who)], mm(col(rows, "per_s")),
                mm(col(rows, "p50_ms"), 2), mm(col(rows, "p99_ms"), 2),
                mm(col(rows, "client_cpu_us"), 1),
                total(col(rows, "overlaps")),
                total(col(rows, "fence_backwards")),
                total(col(rows, "errors")),
                ratio(col(ref, "per_s"), col(rows, "per_s")) if mine else "",
                ratio(col(ref, "p99_ms"), col(rows, "p99_ms"))
                if mine else ""))
    w("")

    # ------------------------------------------------------------- contended
    w("## 2. Contended: 50 workers, one key, 1 ms hold")
    w("")
    w("| contender | retry | acquisitions/s | handoffs/s | wait p50 ms | "
      "wait p99 ms | wait max ms | grants/worker min / max / mean | max "
      "deviation % | gave up | overlaps | fences backwards | errors | "
      "leased ÷ peer acq/s | leased ÷ peer handoffs/s |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for lang, who, retry in (
            ("node", "leased", None), ("node", "redlock", "default"),
            ("node", "redlock", "tuned"), ("node", "semaphore", "default"),
            ("node", "semaphore", "tuned"), ("python", "leased", None),
            ("python", "redispy", "default"),
            ("python", "redispy", "tuned")):
        rows = cells(lang, who, "contended", retry)
        ref = cells(lang, "leased", "contended")
        peer = who != "leased"
        rname = "wait_ms" if not peer else retry
        w("| %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s | %s | "
          "%s | %s | %s | %s | %s |" % (
              NAMES[(lang, who)], rname, mm(col(rows, "per_s")),
              mm(col(rows, "handoffs_s")), mm(col(rows, "p50_ms"), 2),
              mm(col(rows, "p99_ms"), 1), mm(col(rows, "max_ms"), 1),
              mm(col(rows, "grants_min")), mm(col(rows, "grants_max")),
              mm(col(rows, "grants_mean"), 1),
              mm(col(rows, "grants_dev_pct")),
              mm(col(rows, "gave_up")), total(col(rows, "overlaps")),
              total(col(rows, "fence_backwards")),
              total(col(rows, "errors")),
              ratio(col(ref, "per_s"), col(rows, "per_s")) if peer
              else "",
              ratio(col(ref, "handoffs_s"), col(rows, "handoffs_s"))
              if peer else ""))
    w("")

    # ----------------------------------------------------------------- storm
    w("## 3. Miss storm: P processes × %s readers, one key, 50 ms loader" %
      a.readers)
    w("")
    w("| contender | P | loader calls | time until all readers have the "
      "value, ms | latest process start, ms late | wrong values | errors | "
      "leased ÷ peer loader calls | leased ÷ peer time |")
    w("|---|---|---|---|---|---|---|---|---|")
    for p in ("4", "8"):
        for lang, who in (("node", "leased"), ("node", "cachemgr"),
                          ("python", "leased"), ("python", "naive")):
            ss = [s for s in storms if s["lang"] == lang and
                  s["contender"] == who and s["p"] == p]
            loads = [int(s["loads"]) for s in ss]

            def per_rep(lg, wh, k, f):
                out = []
                for s in storms:
                    if (s["lang"], s["contender"], s["p"]) != (lg, wh, p):
                        continue
                    pr = [d[k] for d in procs if d["rep"] == s["rep"] and
                          d["p"] == p and d["lang"] == lg and
                          d["contender"] == wh]
                    out.append(f(pr) if pr else None)
                return out

            times = per_rep(lang, who, "done_ms", max)
            late = per_rep(lang, who, "late_ms", max)
            wrong = per_rep(lang, who, "wrong", sum)
            errs = per_rep(lang, who, "errors", sum)
            ref = [s for s in storms if s["lang"] == lang and
                   s["contender"] == "leased" and s["p"] == p]
            peer = who != "leased"
            w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                NAMES[(lang, who)], p, mm(loads), mm(times),
                mm(late), total(wrong), total(errs),
                ratio([int(s["loads"]) for s in ref], loads) if peer
                else "",
                ratio(per_rep(lang, "leased", "done_ms", max), times)
                if peer else ""))
    w("")
    if failed:
        w("## Failed cells")
        w("")
        for rep, what in failed:
            w("* repeat %d: `%s`" % (rep, what))
        w("")
    errs = sorted({d.get("first_error") for d in locks + procs
                   if d.get("first_error")})
    if errs:
        w("## First errors seen")
        w("")
        for e in errs:
            w("* `%s`" % e.replace("`", "'"))
        w("")
    # The hand-written reading of the figures survives a new run.
    kept = ["## Analysis", "", "(none yet)", ""]
    try:
        old = open(a.out).read().split("\n")
        if MARKER in old:
            kept = old[old.index(MARKER) + 1:]
    except OSError:
        pass
    with open(a.out, "w") as f:
        f.write("\n".join(o + [MARKER] + kept))


if __name__ == "__main__":
    main()
