"""The history checker of tests/jepsen/jepsen.py.

(a) fenced register: every accepted write was based on the value it
    replaced (no lost update), fences never go down in the order Redis
    accepted the writes, every write a client saw acknowledged is in the
    log and none it saw refused is;
(b) unfenced counter: read-modify-writes of different holds that overlap
    in time, and increments lost, counted (expected above 0 under faults);
(c) every lock_lost arrived no later than the lease end as the daemon knew
    it, bounded from above, for a watchdog hold that a fault cut from Redis,
    by max(fault start, grant completion) + lease_ms, plus SLACK for
    scheduling on a shared machine; a holder still writing past that bound
    without lock_lost counts too; a hold whose daemon or client was stopped
    (SIGSTOP) then is excused and counted apart, as no process can send or
    read while it is stopped; so is a lock_lost the daemon's own log shows
    was due in time but sent late, while no process of the test ran (the
    host did not schedule them: "late stalled");
(d) after an acknowledged (not queued) cache.invalidate of version V, no
    cache hit invoked later than the acknowledgement plus the double-delete
    delay plus SLACK returns a version below V.
"""

import bisect
import json
import statistics

SLACK = 0.25


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def time_of(e):
    return e.get("t", e.get("cpl", 0))


def daemon_log(path, d):
    """Daemon D's lost timers that ran late, from its log ("lock lost
    late" lines, src/lock/ld_lock_watch.c): when the lease it could vouch
    for ended (due) and when it sent lock_lost (t), CLOCK_MONOTONIC as the
    history's times."""
    out = []
    with open(path) as f:
        for line in f:
            if 'msg="lock lost late' not in line:
                continue
            kv = dict(x.split("=", 1) for x in line.split()
                      if "=" in x and not x.startswith("msg="))
            out.append({"p": "leased%d" % d, "f": "lost_timer_late",
                        "type": "daemon", "d": d,
                        "due": int(kv["due_ms"]) / 1000.0,
                        "t": int(kv["now_ms"]) / 1000.0})
    return out


def lost_writes(e):
    """A nemesis event after which Redis may have lost acknowledged
    writes: a restart without its data, or a promotion (the Sentinels
    failed over, by the failover nemesis or because a pause of the master
    outlasted down-after-milliseconds; what the old master had not
    replicated is gone)."""
    return e.get("type") == "nemesis" and (
        e.get("kind") == "data-loss" or e.get("f") == "promoted")


def documented(prev, cur, hist, daemon_of):
    """A lost update between two writes under the same fence from two
    daemons after Redis lost writes: leased-protocol(7) says fences are
    kept across daemons only as far as Redis keeps them."""
    if prev is None or prev[0] != cur[0]:
        return False
    d1, d2 = (daemon_of(int(x[4].split(".")[0])) for x in (prev, cur))
    inv = {e["tag"]: e["inv"] for e in hist if e.get("f") == "fwrite"}
    t = inv.get(cur[4], 0)
    return d1 != d2 and any(lost_writes(e) and e["t"] <= t for e in hist)


def check_register(hist, final, daemon_of):
    found, bad, doc = {}, [], []
    last_fence, prev = 0, None
    for line in final["log"] or []:
        cur = line.split()
        fence, read, old, new, tag = cur
        fence = int(fence)
        found[tag] = line
        if old != read:
            what = ("lost update", "write %s read %s but replaced %s"
                    % (tag, read, old), line)
            (doc if documented(prev, cur, hist, daemon_of)
             else bad).append(what)
        if fence < last_fence:
            bad.append(("fence order", "write %s under fence %d after %d"
                        % (tag, fence, last_fence), line))
        last_fence = max(last_fence, fence)
        prev = cur
    for e in hist:
        if e.get("f") != "fwrite":
            continue
        if e["type"] == "ok" and e["tag"] not in found:
            bad.append(("acked write missing", e["tag"], e))
        if e["type"] == "fail" and e["tag"] in found:
            bad.append(("refused write applied", e["tag"], e))
    if final["log"]:
        tail = final["log"][-1].split()[3]
        if tail != (final["reg"] or "0"):
            bad.append(("register", "final %s but log ends at %s"
                        % (final["reg"], tail), None))
    return bad, doc


def fence_stats(hist):
    grants = [e for e in hist if e.get("f") == "lock" and e["type"] == "ok"]
    by_fence = {}
    regress, last = 0, 0
    for e in sorted(grants, key=lambda e: e["cpl"]):
        by_fence.setdefault(e["fence"], set()).add(e["token"])
        if e["fence"] <= last:
            regress += 1
        last = max(last, e["fence"])
    reused = sum(1 for t in by_fence.values() if len(t) > 1)
    refused = sum(1 for e in hist
                  if e.get("f") in ("fread", "fwrite") and e["type"] == "fail")
    return {"grants": len(grants), "max_fence": last,
            "fence_not_increasing": regress, "fence_reused": reused,
            "fenced_refused": refused}


def check_counter(hist, final):
    incs = sorted((e for e in hist if e.get("f") == "incr"),
                  key=lambda e: e["inv"])
    overlaps = 0
    for i, a in enumerate(incs):
        for b in incs[i + 1:]:
            if b["inv"] >= a["cpl"]:
                break
            if b["token"] != a["token"]:
                overlaps += 1
    lost = len(incs) - int(final["counter"] or 0)
    return {"incr": len(incs), "overlaps": overlaps, "lost_incr": lost}


def windows(hist):
    """The nemesis' faults in order: dicts with start, end, daemons (those
    cut from Redis or stopped) and target (the process stopped)."""
    out, cur = [], None
    for e in hist:
        if e.get("type") != "nemesis":
            continue
        if e["f"] == "start":
            cur = {"start": e["t"], "end": None,
                   "daemons": e.get("daemons", []), "target": e.get("target")}
            out.append(cur)
        elif e["f"] == "end" and cur is not None:
            cur["end"] = e["t"]
            cur = None
    for w in out:
        if w["end"] is None:
            w["end"] = float("inf")
    return out


def holds(hist, daemon_of):
    h = {}
    for e in hist:
        if e.get("f") == "lock" and e["type"] == "ok":
            h[e["token"]] = {"p": e["p"], "d": daemon_of(e["p"]),
                             "g": e["cpl"], "lease": e["lease"] / 1000.0,
                             "lost": None, "writes": []}
    for e in hist:
        t = h.get(e.get("token"))
        if t is None:
            continue
        if e.get("f") == "lock_lost":
            t["lost"] = e["t"]
        elif e.get("f") in ("fwrite", "incr"):
            t["writes"].append(e["inv"])
    return h


def excused(h, w, ws, lo, hi):
    """Whether a stopped process explains a late event: the holder's
    daemon stopped in W, or its client stopped between LO and HI."""
    if w["target"] == "leased%d" % h["d"]:
        return True
    me = "client%d" % h["p"]
    return any(x["target"] == me and x["start"] <= hi and x["end"] >= lo
               for x in ws)


def activity(hist):
    """Every moment a process of the test was seen running: invocations,
    completions, events received, nemesis notes (not the daemons' logs)."""
    out = []
    for e in hist:
        if e.get("type") == "daemon":
            continue
        for k in ("inv", "cpl", "t"):
            if k in e:
                out.append(e[k])
    return sorted(out)


def silence(times, lo, hi):
    """The longest stretch of [LO, HI] in which no process ran."""
    i = bisect.bisect_left(times, lo)
    prev, best = lo, 0.0
    for x in times[i:]:
        if x >= hi:
            break
        best = max(best, x - prev)
        prev = x
    return max(best, hi - prev)


def stalled(h, t, bound, timers, times):
    """Whether the daemon's own log proves a late lock_lost (at T) was due
    in time: its lost timer was due by BOUND (+ SLACK), it sent lock_lost
    just before T, and between the two no process of the test ran for
    all but SLACK of the wait (the host did not schedule them; a daemon
    whose own code blocked would leave the others running)."""
    for r in timers:
        if r["d"] != h["d"] or not t - SLACK <= r["t"] <= t + 0.002:
            continue
        if r["due"] <= bound + SLACK and \
                silence(times, r["due"], r["t"]) >= r["t"] - r["due"] - SLACK:
            return r
    return None


def check_lost(hist, daemon_of):
    """While a fault cuts a daemon from Redis (or stops it, or Redis) no
    confirmation reaches it, so the lease end it knows for a hold granted
    before the fault is at most max(fault start, grant) + lease: lock_lost
    must arrive by then (+ SLACK), and a holder must not still be writing
    past it without one."""
    ws = windows(hist)
    timers = [e for e in hist if e.get("f") == "lost_timer_late"]
    times = activity(hist) if timers else []
    margins, bad, exc, outside, stall = [], [], 0, 0, []
    for tok, h in holds(hist, daemon_of).items():
        for w in ws:
            if h["d"] not in w["daemons"] or h["g"] >= w["end"]:
                continue
            bound = max(w["start"], h["g"]) + h["lease"]
            if bound + SLACK >= w["end"]:
                continue  # the fault ended before the lease could
            t = h["lost"]
            if t is not None and w["start"] <= t:
                margins.append(t - bound)
            late = [x for x in h["writes"] if bound + SLACK < x <= w["end"]
                    and (t is None or x < t)]
            if t is not None and w["start"] <= t and t > bound + SLACK:
                late.insert(0, t)
            if not late:
                continue
            if excused(h, w, ws, bound, late[0]):
                exc += 1
                continue
            r = stalled(h, t, bound, timers, times) if late[0] == t else None
            if r is not None:
                stall.append(("late lock_lost, stalled",
                              "%.3fs after the lease end; timer due %+.3fs, "
                              "sent %.3fs late" % (t - bound, r["due"] - bound,
                                                   r["t"] - r["due"]),
                              dict(h, token=tok, bound=bound)))
                continue
            what = "late lock_lost" if late[0] == t else \
                "write without lock_lost"
            bad.append((what, "%.3fs after the lease end (fault %.3f-%.3f)"
                        % (late[0] - bound, w["start"], w["end"]),
                        dict(h, token=tok, bound=bound)))
    for tok, h in holds(hist, daemon_of).items():
        if h["lost"] is not None and not any(
                h["d"] in w["daemons"] and w["start"] <= h["lost"] for w in ws):
            outside += 1
    st = {"lock_lost": sum(1 for e in hist if e.get("f") == "lock_lost"),
          "lost_late_excused": exc, "lost_late_stalled": len(stall),
          "lost_outside_faults": outside, "c_stalled": stall}
    if margins:
        st.update(lost_margin_min=min(margins),
                  lost_margin_median=statistics.median(margins),
                  lost_margin_max=max(margins))
    return bad, st


def check_cache(hist, dd_ms):
    acks = sorted((e["cpl"], int(e["version"])) for e in hist
                  if e.get("f") == "invalidate" and e["type"] == "ok" and
                  not e.get("queued"))
    queued = sum(1 for e in hist
                 if e.get("f") == "invalidate" and e.get("queued"))
    times = [a[0] + dd_ms / 1000.0 + SLACK for a in acks]
    best, top = [], 0
    for _, v in acks:
        top = max(top, v)
        best.append(top)
    windows = promotion_windows(hist)
    bad, doc, reads = [], [], 0
    for e in hist:
        if e.get("f") != "cache_get" or e["type"] != "ok" or \
                e.get("loaded") or e.get("value") is None:
            continue
        reads += 1
        i = bisect.bisect_left(times, e["inv"])
        if i and int(e["value"]) < best[i - 1]:
            what = ("stale read", "version %s read, %d invalidated"
                    % (e["value"], best[i - 1]), e)
            missed = [t for t, v in acks[:i] if v > int(e["value"])]
            (doc if lost_in_failover(missed, e["inv"], windows)
             else bad).append(what)
    return bad, doc, {"invalidations": len(acks), "queued": queued,
                      "cache_hits": reads}


# How long after the Sentinels name the new master a daemon may still
# write to the old one: until +switch-master reaches it or the old master,
# turned replica, answers READONLY.
SWITCH_S = 2.0


def promotion_windows(hist):
    """(start, promotion) per promotion: the start of the fault before
    it (a paused master acknowledges nothing until it resumes) and the
    moment the Sentinels named the new master."""
    out, start = [], None
    for e in sorted((e for e in hist if e.get("type") == "nemesis"),
                    key=lambda e: e["t"]):
        if e["f"] == "start":
            start = e["t"]
        elif e["f"] == "promoted" and start is not None:
            out.append((start, e["t"]))
    return out


def lost_in_failover(missed, read_at, windows):
    """True when every invalidation the read missed was acknowledged by a
    master that a promotion then replaced, before the read: its deletes,
    not yet replicated, were lost with the old master (Redis replicates
    asynchronously; leased-protocol(7), GUARANTEES)."""
    for start, promoted in windows:
        if promoted <= read_at and all(start <= t <= promoted + SWITCH_S
                                       for t in missed):
            return True
    return False


def check(hist, final, dd_ms, daemon_of=lambda p: p // 4 + 1):
    a, doc = check_register(hist, final, daemon_of)
    lost, st = check_lost(hist, daemon_of)
    stall = st.pop("c_stalled")
    d, d_doc, cst = check_cache(hist, dd_ms)
    st.update(cst)
    st.update(fence_stats(hist))
    st.update(check_counter(hist, final))
    st["a_documented"] = len(doc)
    st["d_documented"] = len(d_doc)
    st["ops"] = sum(1 for e in hist if e.get("type") in
                    ("ok", "fail", "info"))
    st["unknown"] = sum(1 for e in hist if e.get("type") == "info")
    st["faults"] = sum(1 for e in hist if e.get("type") == "nemesis" and
                       e["f"] == "start")
    return {"a": a, "c": lost, "d": d, "stats": st, "a_doc": doc,
            "d_doc": d_doc, "c_stalled": stall,
            "anomalies": len(a) + len(lost) + len(d)}


def summary(r):
    s = r["stats"]
    return ("jepsen: %-12s ops %d, faults %d, anomalies a=%d c=%d d=%d, "
            "(a) documented %d, (d) documented %d, overlaps %d, "
            "lost incr %d, lock_lost %d (late stalled %d)"
            % (r["nemesis"], s["ops"], s["faults"], len(r["a"]),
               len(r["c"]), len(r["d"]), s["a_documented"],
               s["d_documented"], s["overlaps"],
               s["lost_incr"], s["lock_lost"], s["lost_late_stalled"]))


def excerpt(r):
    out = ["%s: %d anomalies" % (r["nemesis"], r["anomalies"])]
    for kind in ("a", "c", "d", "a_doc", "d_doc", "c_stalled"):
        for what, why, e in r.get(kind, [])[:5]:
            out.append("  (%s) %s: %s\n      %s" % (kind, what, why,
                                                   json.dumps(e)))
    return "\n".join(out)


def ms(x):
    return "-" if x is None else "%+.0f" % (x * 1000)


def table(results, label):
    out = ["# make jepsen: results", "", label, "",
           "Anomalies (a) fenced register, (c) lock_lost after the lease "
           "end, (d) stale read after an acknowledged invalidation, and "
           "(b) overlapping holds on the unfenced counter. lock_lost "
           "margin: arrival minus the lease end the client saw confirmed "
           "(negative: early), in ms. (a) documented: lost updates between two "
           "daemons that handed out the same fence after Redis lost its data "
           "(leased-protocol(7): across daemons fences are kept only as far "
           "as Redis keeps them); reported, not failed. (d) documented: "
           "stale reads that missed only invalidations a master acknowledged "
           "and a failover then replaced (Redis replicates asynchronously: "
           "the old master's unreplicated deletes are lost); reported, not "
           "failed. Both count only after a failover or a restart without "
           "data, noted in the history as it happens. Late stalled: late "
           "lock_lost the daemon's log shows due in time and sent late "
           "while no process of the test ran (the host did not schedule "
           "them); reported, not failed. "
           "See tests/jepsen/checker.py.", "",
           "| nemesis | s | faults | ops | unknown | grants | max fence "
           "| fenced refused | (a) | (a) documented | (b) overlaps | lost incr | lock_lost "
           "| margin min/med/max ms | late excused | late stalled | (c) "
           "| invalidations (queued) | hits | (d) | (d) documented |",
           "|" + "---|" * 21]
    for r in results:
        s = r["stats"]
        out.append("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d "
                   "| %d | %s/%s/%s | %d | %d | %d | %d (%d) | %d | %d | %d |" % (
                       r["nemesis"], r["seconds"], s["faults"], s["ops"],
                       s["unknown"], s["grants"], s["max_fence"],
                       s["fenced_refused"], len(r["a"]),
                       s["a_documented"], s["overlaps"],
                       s["lost_incr"], s["lock_lost"],
                       ms(s.get("lost_margin_min")),
                       ms(s.get("lost_margin_median")),
                       ms(s.get("lost_margin_max")),
                       s["lost_late_excused"], s["lost_late_stalled"],
                       len(r["c"]),
                       s["invalidations"], s["queued"], s["cache_hits"],
                       len(r["d"]), s["d_documented"]))
    bad = [excerpt(r) for r in results
           if r["anomalies"] or r["a_doc"] or r["d_doc"] or
           r.get("c_stalled")]
    if bad:
        out += ["", "## Anomalies (first of each kind)", "", "```"] + bad + \
            ["```"]
    return "\n".join(out) + "\n"
