#!/bin/sh
# The standard benchmark of leased against direct Redis (make bench).
#
# Starts a redis-server of its own on a free port and the built leased on a
# temporary config (Unix socket in a temp dir, no TCP, no metrics, journal
# in the temp dir, log level warn), then:
#   1. redis.connections 1..4: lock and get at 50 connections, leased only;
#      the best count is used for everything after;
#   2. the matrix: lock, lock-contended, sem, rwlock-read, rwlock-write,
#      get and mix at 1, 10, 50 and 200
#      connections, values of 100 B and 10 KB for get and mix, each run
#      against leased and against Redis directly, one after the other;
#   3. the target cells again, five pairs each, medians;
#   4. isolation: get p99 alone and with 1,000 waiters on a held lock;
#   5. stampede: an invalidation of a hot key under 50 readers, deleted
#      and marked stale: readers blocked and loads; with the near cache
#      on: hot-key hits, and zipf: cache-aside reads of 10k keys drawn
#      from Zipf(0.99) with a write every N reads (near hit ratio,
#      staleness); redlock.sh: lock+unlock
#      with lock.redlock over three instances against direct Redis on one
#      (--no-redlock leaves it out); cluster.sh: lock+unlock and cache.get
#      with redis.mode cluster over three masters against a cluster-aware
#      direct client (--no-cluster leaves it out);
#   6. resources.sh: memory, renewal CPU, instructions per op;
#   7. cost.sh: Redis instructions per op pair against Redisson's scripts;
#   8. rate-mset.sh: rate.acquire against its script by EVALSHA, and
#      cache.mset against pipelined cache.set and pipelined SET PX;
#   9. bloom.sh: cache.get of absent keys with a Bloom filter against a
#      miss and its released lease and against a cached null, and
#      bloom.check of 1 and 100 keys;
#  10. near-shm.sh and near-py.py: a near hit read from the shared
#      segment by C, Python and Go against a direct GET;
# and writes bench/results.md. Text below the marker line of an existing
# results.md (the hand-written analysis) is kept.
set -eu

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$out" ] || out=$srcdir/bench/results.md

dur=2
warm=0.5
rep=5
conns_list="1 10 50 200"
sweep_list="1 2 3 4"
if [ "$quick" = 1 ]; then
    dur=0.3
    warm=0.1
    rep=1
    conns_list="1 10"
    sweep_list="1 2"
fi
rawfile=$tmp/raw.txt
: >"$rawfile"
t_start=$(date +%s)
# The tree as the run starts (make bench has just rebuilt from it); others
# may commit while it runs.
# (--rev names it when the sources are an export, not a checkout.)
lver=$rev
[ -n "$lver" ] ||
    lver=$(git -C "$srcdir" describe --always --dirty 2>/dev/null ||
        echo unknown)
lbuilt=$(date -u -r "$leased" '+%Y-%m-%d %H:%M UTC')
load_before=$(uptime | sed 's/.*load average: *//')

# rec SECTION ARGS...: one bench invocation, its lines tagged.
rec() {
    section=$1
    shift
    say "$section: $*"
    run_bench -d "$dur" -w "$warm" "$@" >"$tmp/one.txt"
    sed "s/^/section=$section /" "$tmp/one.txt" >>"$rawfile"
    cat "$tmp/one.txt" >&2
}

start_redis

if [ -n "$connections" ]; then
    best=$connections
else
    for rc in $sweep_list; do
        start_leased "$rc"
        rec "sweep redis_connections=$rc" -t leased -m lock -c 50
        rec "sweep redis_connections=$rc" -t leased -m get -c 50 -z 100
        stop_leased
    done
    # The count with the best sum of lock and get throughput, each relative
    # to its best.
    best=$(awk '
        $1 == "section=sweep" {
            split($2, a, "="); n = a[2]
            for (i = 3; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == "mode") m = kv[2]
                if (kv[1] == "ops_s") v = kv[2]
            }
            val[n, m] = v; ns[n] = 1
            if (v + 0 > top[m] + 0) top[m] = v
        }
        END {
            for (n in ns) {
                s = val[n, "lock"] / top["lock"] + val[n, "get"] / top["get"]
                if (s > bs + 0) { bs = s; b = n }
            }
            print b
        }' "$rawfile")
fi
say "redis.connections $best for the rest"
start_leased "$best"

for c in $conns_list; do
    rec matrix -m ping -c "$c"
    rec matrix -m lock -c "$c"
    rec matrix -m lock-contended -c "$c"
    rec matrix -m sem -c "$c"
    rec matrix -m rwlock-read -c "$c"
    rec matrix -m rwlock-write -c "$c"
    for z in 100 10000; do
        rec matrix -m get -c "$c" -z "$z"
        rec matrix -m mix -c "$c" -z "$z"
    done
done

rec targets -m lock -c 50 -n "$rep"
rec targets -m lock -c 1 -n "$rep"
rec targets -m get -c 50 -z 100 -n "$rep"

waiters=1000
[ "$quick" = 1 ] && waiters=100
rec isolation -m isolation -c 10 -z 100 --waiters "$waiters" --churn

# get latency over a window that spans a renewal pass of 100,000 locks
# (every 10 s), against the same window without them.
if [ "$quick" = 1 ]; then
    rec renewal -m renewal -c 10 -z 100 --holders 10 --locks 100 --hold 1
else
    rec renewal -m renewal -c 10 -z 100 --holders 100 --locks 1000 --hold 11
fi

# An invalidation of the hottest key under 50 readers, with a delete and
# with stale-while-revalidate.
rec stampede -m stampede -c 50

# The near cache on (cache.near.enabled): the same hot-key reads, now
# served from the daemon's memory, against direct GET.
stop_leased
leased_extra="cache:
  near: { enabled: true }"
start_leased "$best"
rec near -m get -c 50 -z 100 -n "$rep"
rec near -m get -c 1 -z 100 -n "$rep"
# Zipf reads with writes: DEL of the entry in Redis (only tracking tells
# the daemon), a write every 100 and every 1000 reads; then
# cache.invalidate through the daemon itself.
zrep=3
[ "$quick" = 1 ] && zrep=1
rec zipf -m zipf -c 50 -z 100 --keys 10000 --zipf-s 0.99 \
    --write-every 100 -n "$zrep"
rec zipf -m zipf -c 50 -z 100 --keys 10000 --zipf-s 0.99 \
    --write-every 1000 -n "$zrep"
rec zipf -m zipf -c 50 -z 100 --keys 10000 --zipf-s 0.99 \
    --write-every 100 --writer leased -n "$zrep"
leased_extra=

stop_leased
stop_pid "$redis_pid"
redis_pid=

qflag=
[ "$quick" = 1 ] && qflag=--quick
rlmd=$tmp/redlock.md
: >"$rlmd"
if [ "$redlock" = 1 ]; then
    sh "$here/redlock.sh" --builddir "$builddir" \
        --redis-server "$redis_server" --connections "$best" \
        --raw "$tmp/rl.txt" --out "$rlmd" $qflag
    sed 's/^/section=redlock /' "$tmp/rl.txt" >>"$rawfile"
    cat "$rlmd" >&2
fi

clmd=$tmp/cluster.md
: >"$clmd"
if [ "$cluster" = 1 ]; then
    sh "$here/cluster.sh" --builddir "$builddir" \
        --redis-server "$redis_server" --connections "$best" \
        --raw "$tmp/cl.txt" --out "$clmd" $qflag
    sed 's/^/section=cluster /' "$tmp/cl.txt" >>"$rawfile"
    cat "$clmd" >&2
fi

if [ "$resources" = 1 ]; then
    sh "$here/resources.sh" --builddir "$builddir" \
        --redis-server "$redis_server" --connections "$best" \
        --raw "$tmp/res.txt" $qflag
    sed 's/^/section=resources /' "$tmp/res.txt" >>"$rawfile"
    cat "$tmp/res.txt" >&2
fi

# Redis instructions per op pair against Redisson's scripts (cost.sh).
sh "$here/cost.sh" --builddir "$builddir" --srcdir "$srcdir" \
    --redis-server "$redis_server" --raw "$tmp/cost.txt" $qflag ||
    say "cost.sh failed"
[ ! -s "$tmp/cost.txt" ] ||
    sed 's/^/section=cost /' "$tmp/cost.txt" >>"$rawfile"

# rate.acquire and cache.mset against the same work sent straight to Redis.
sh "$here/rate-mset.sh" --builddir "$builddir" \
    --redis-server "$redis_server" --connections "$best" \
    --raw "$tmp/ratemset.txt" $qflag || say "rate-mset.sh failed"
[ ! -s "$tmp/ratemset.txt" ] ||
    sed 's/^/section=rate-mset /' "$tmp/ratemset.txt" >>"$rawfile"

# The Bloom filter against the miss it saves.
sh "$here/bloom.sh" --builddir "$builddir" \
    --redis-server "$redis_server" --connections "$best" \
    --raw "$tmp/bloom.txt" $qflag || say "bloom.sh failed"
[ ! -s "$tmp/bloom.txt" ] ||
    sed 's/^/section=bloom /' "$tmp/bloom.txt" >>"$rawfile"

# A near hit read from the shared segment, by C, Python and Go, against a
# direct GET round trip from the same language.
sh "$here/near-shm.sh" --builddir "$builddir" --redis-server "$redis_server" \
    --out "$tmp/nearshm.md" $qflag || say "near-shm.sh failed"
if [ "$quick" = 1 ]; then
    near_py_args="--rounds 3 --seconds 1"
else
    near_py_args="--rounds 5 --seconds 2"
fi
near_py_go=
! command -v go >/dev/null 2>&1 || near_py_go=--go
# shellcheck disable=SC2086
python3 "$here/near-py.py" --leased "$builddir/src/leased" \
    --redis-server "$redis_server" $near_py_args $near_py_go \
    >"$tmp/nearpy.md" || say "near-py.py failed"

t_end=$(date +%s)
load_after=$(uptime | sed 's/.*load average: *//')

# ------------------------------------------------------------ results.md
marker='<!-- run-bench.sh keeps everything below this line. -->'
notes=$tmp/notes.md
if [ -f "$out" ] && grep -qF "$marker" "$out"; then
    sed -n "/^$marker\$/,\$p" "$out" | sed 1d >"$notes"
else
    printf '\n## Analysis\n\n(none yet)\n' >"$notes"
fi

cpu=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -n 1)
rver=$("$redis_server" --version | sed 's/.* v=\([^ ]*\).*/\1/')
quicknote=
[ "$quick" = 1 ] && quicknote="QUICK RUN (--quick): tiny durations and a reduced matrix; not a result."

{
awk -v date="$(date -u '+%Y-%m-%d %H:%M UTC')" -v nproc="$(nproc)" \
    -v cpu="$cpu" -v kernel="$(uname -r)" -v rver="$rver" -v lver="$lver" \
    -v lbuilt="$lbuilt" \
    -v lb="$load_before" -v la="$load_after" -v secs="$((t_end - t_start))" \
    -v best="$best" -v dur="$dur" -v warm="$warm" -v rep="$rep" \
    -v quicknote="$quicknote" -v rlmd="$rlmd" -v clmd="$clmd" -v mem="$(free -m | awk '/^Mem:/ {print $2}')" '
function parse(line,   i, n, f, kv, p) {
    delete F
    n = split(line, f, " ")
    for (i = 1; i <= n; i++) {
        p = index(f[i], "=")
        if (p == 0) continue
        k = substr(f[i], 1, p - 1)
        if (k == "fn") { F[k] = substr(line, index(line, "fn=") + 3); break }
        F[k] = substr(f[i], p + 1)
    }
}
function fmt(v) { return sprintf("%.0f", v) }
function f1(v) { return sprintf("%.1f", v) }
function yn(ok) { return ok ? "**met**" : "**missed**" }
{
    parse($0)
    s = F["section"]
    if (s == "sweep") {
        sw[F["redis_connections"], F["mode"]] = F["ops_s"]
        swn[F["redis_connections"]] = 1
    } else if ((s == "matrix" || s == "targets" || s == "near") &&
               F["target"] == "both") {
        key = s SUBSEP F["mode"] SUBSEP F["conns"] SUBSEP F["size"]
        both[key] = $0
        if (s == "matrix") order[++nm] = key
    } else if ((s == "matrix" || s == "targets") && F["target"] == "leased") {
        lcpu[s, F["mode"], F["conns"], F["size"]] = F["leased_cpu_pct"]
    } else if ((s == "matrix" || s == "targets") && F["target"] == "direct") {
        dcpu[s, F["mode"], F["conns"], F["size"]] = F["redis_cpu_pct"]
        bcpu[s, F["mode"], F["conns"], F["size"]] = F["bench_cpu_pct"]
    } else if (s == "isolation") {
        iso[++ni] = $0
    } else if (s == "renewal") {
        ren[++nren] = $0
    } else if (s == "stampede") {
        stp[++nstp] = $0
    } else if (s == "zipf" && F["target"] == "both") {
        zipf[++nz] = $0
    } else if (s == "resources" && F["mode"] == "hold") {
        hold[++nh] = $0
    } else if (s == "resources" && F["mode"] == "instructions") {
        ins[++nins] = $0
    } else if (s == "resources" && F["mode"] == "syscalls") {
        sys[++nsys] = $0
    } else if (s == "resources" && F["mode"] == "profile") {
        prof[++np] = $0
    }
    rawl[++nr] = $0
}
END {
    print "# leased benchmark results"
    print ""
    print "Written by `make bench` (bench/run-bench.sh) on " date "."
    if (quicknote != "") { print ""; print quicknote }
    print "The machine is shared with other work while this runs, so the"
    print "absolute figures move from run to run: read the **ratios** (leased"
    print "against direct Redis, measured back to back in the same invocation)."
    print ""
    print "## Machine"
    print ""
    print "| | |"
    print "|---|---|"
    print "| CPUs (nproc) | " nproc " |"
    print "| CPU model | " cpu " |"
    print "| memory | " mem " MB |"
    print "| kernel | " kernel " |"
    print "| redis-server | " rver " |"
    print "| leased (git at the start) | " lver ", src/leased built " lbuilt " |"
    print "| load average before / after | " lb " / " la " |"
    print "| whole run | " secs " s |"
    print "| each measured run | " dur " s after " warm " s warm-up |"
    print "| leased redis.connections | " best " (best of the sweep below) |"
    print ""

    print "## Targets"
    print ""
    print "| target | measured | |"
    print "|---|---|---|"
    k = "targets" SUBSEP "lock" SUBSEP "50" SUBSEP "100"
    if (k in both) {
        parse(both[k])
        print "| lock+unlock, 50 conns: leased >= 1.0x direct ops/s | " \
              sprintf("%.2fx (%s vs %s ops/s, median of %s pairs)", \
                      F["ratio"], fmt(F["leased_ops_s"]), \
                      fmt(F["direct_ops_s"]), F["repeat"]) " | " \
              yn(F["ratio"] + 0 >= 1.0) " |"
    }
    k = "targets" SUBSEP "lock" SUBSEP "1" SUBSEP "100"
    if (k in both) {
        parse(both[k])
        d = F["leased_p50_us"] - F["direct_p50_us"]
        print "| lock+unlock, 1 conn: leased p50 <= direct p50 + 40 us | " \
              sprintf("%s vs %s us (%+.1f us, median of %s pairs)", \
                      f1(F["leased_p50_us"]), f1(F["direct_p50_us"]), d, \
                      F["repeat"]) " | " yn(d <= 40) " |"
    }
    k = "targets" SUBSEP "get" SUBSEP "50" SUBSEP "100"
    if (k in both) {
        parse(both[k])
        print "| cache.get hit 100 B, 50 conns: leased >= 0.9x direct GET | " \
              sprintf("%.2fx (%s vs %s ops/s, median of %s pairs)", \
                      F["ratio"], fmt(F["leased_ops_s"]), \
                      fmt(F["direct_ops_s"]), F["repeat"]) " | " \
              yn(F["ratio"] + 0 >= 0.9) " |"
    }
    k = "near" SUBSEP "get" SUBSEP "50" SUBSEP "100"
    if (k in both) {
        parse(both[k])
        print "| cache.get hit 100 B, near cache on, 50 conns: leased >= 1.5x direct GET | " \
              sprintf("%.2fx (%s vs %s ops/s, median of %s pairs)", \
                      F["ratio"], fmt(F["leased_ops_s"]), \
                      fmt(F["direct_ops_s"]), F["repeat"]) " | " \
              yn(F["ratio"] + 0 >= 1.5) " |"
    }
    k = "near" SUBSEP "get" SUBSEP "1" SUBSEP "100"
    if (k in both) {
        parse(both[k])
        d = F["leased_p50_us"] - F["direct_p50_us"]
        print "| cache.get hit 100 B, near cache on, 1 conn: leased p50 <= direct GET p50 | " \
              sprintf("%s vs %s us (%+.1f us, median of %s pairs)", \
                      f1(F["leased_p50_us"]), f1(F["direct_p50_us"]), d, \
                      F["repeat"]) " | " yn(d <= 0) " |"
    }
    for (i = 1; i <= nstp; i++) {
        parse(stp[i])
        if (F["invalidate"] == "stale")
            print "| hottest key invalidated (stale) under " F["readers"] \
                  " readers: 0 blocked, 1 load | " \
                  sprintf("%s blocked, %s loads", F["blocked"], F["loads"]) \
                  " | " yn(F["blocked"] + 0 == 0 && F["loads"] + 0 == 1) " |"
    }
    for (i = 1; i <= nz; i++) {
        parse(zipf[i])
        if (F["writer"] != "redis" || F["write_every"] != "100") continue
        print "| Zipf(" F["s"] ") over " F["keys"] " keys, a DEL in Redis " \
              "every 100 reads, 50 conns: near staleness p99 / max " \
              "(bounded by the tracking delay) | " \
              sprintf("%s / %s us over %s stale near hits of %s writes; " \
                      "near hit ratio %.1f%%; %.2fx direct ops/s", \
                      F["stale_p99_us"], F["stale_max_us"], \
                      F["stale_near"], F["writes"], F["near_ratio"] * 100, \
                      F["ratio"]) " | reported |"
    }
    for (i = 1; i <= nh; i++) {
        parse(hold[i])
        if (F["locks"] + 0 == F["conns"] + 0) {
            mb = F["rss_end_kb"] / 1024
            print "| " F["conns"] " sessions each holding a lock: RSS <= 64 MB | " \
                  sprintf("%.1f MB (peak %.1f MB, %.1f MB idle before)", \
                          mb, F["rss_hwm_kb"] / 1024, \
                          F["rss_idle_kb"] / 1024) " | " \
                  (F["conns"] + 0 >= 10000 ? yn(mb <= 64) : "n/a (fewer sessions)") " |"
        } else {
            print "| renewing " F["locks"] " locks: <= 10% of one core | " \
                  sprintf("%.1f%% over %.0f s (%s renewals)", \
                          F["leased_cpu_pct"], F["secs"], F["renewals"]) \
                  " | " (F["locks"] + 0 >= 100000 ? yn(F["leased_cpu_pct"] + 0 <= 10) \
                                                : "n/a (fewer locks)") " |"
        }
    }
    for (i = 1; i <= ni; i++) {
        parse(iso[i])
        if (F["phase"] == "summary") {
            print "| waiters on one key: get p99 <= 2x get p99 alone | " \
                  sprintf("%s us alone, %s us with waiters (%.2fx)", \
                          F["p99_alone_us"], F["p99_waiters_us"], \
                          F["p99_ratio"]) " | " yn(F["p99_ratio"] + 0 <= 2) " |"
        }
    }
    print ""

    print "## redis.connections (leased only, 50 connections, 100 B)"
    print ""
    print "| redis.connections | lock+unlock ops/s | cache.get ops/s |"
    print "|---|---|---|"
    for (n = 1; n <= 64; n++)
        if (n in swn)
            print "| " n (n == best ? " (used)" : "") " | " \
                  fmt(sw[n, "lock"]) " | " fmt(sw[n, "get"]) " |"
    print ""

    print "## Matrix"
    print ""
    print "One op: `lock` = lock + unlock of a key of its own per connection;"
    print "`lock-contended` = lock (waiting) + unlock, every connection on"
    print "one key; `sem` = sem.acquire + sem.release of one semaphore of"
    print "as many permits as connections (direct: the same scripts);"
    print "`rwlock-read` / `rwlock-write` = rwlock read / write lock+unlock:"
    print "lock + unlock with a mode, a key of its own per connection"
    print "(direct: the same read-write scripts, src/lua/rw_*.lua);"
    print "`get` = a cache hit (leased `cache.get`, direct `GET`);"
    print "`mix` = 90% get, 10% lock+unlock; `ping` = leased `ping` (no"
    print "Redis behind it) against Redis `PING`: the cost of the extra hop"
    print "alone. Latencies in microseconds."
    print "CPU: % of one core during the measured window (leased daemon in"
    print "the leased run; redis-server and this bench in the direct run)."
    print ""
    print "| mode | conns | size | leased ops/s | direct ops/s | ratio | leased p50 | direct p50 | leased p99 | direct p99 | leased CPU | redis CPU (direct) | bench CPU (direct) |"
    print "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= nm; i++) {
        parse(both[order[i]])
        m = F["mode"]; c = F["conns"]; z = F["size"]
        print "| " m " | " c " | " (m ~ /^(lock|ping)/ ? "-" : z) " | " \
              fmt(F["leased_ops_s"]) " | " fmt(F["direct_ops_s"]) " | " \
              sprintf("%.2f", F["ratio"]) " | " f1(F["leased_p50_us"]) " | " \
              f1(F["direct_p50_us"]) " | " f1(F["leased_p99_us"]) " | " \
              f1(F["direct_p99_us"]) " | " lcpu["matrix", m, c, z] "% | " \
              dcpu["matrix", m, c, z] "% | " bcpu["matrix", m, c, z] "% |"
    }
    print ""

    print "## Isolation: cache.get beside a lock with queued waiters"
    print ""
    print "10 connections read 100 B hits; `waiters`: meanwhile that many"
    print "sessions wait (wait_ms -1) on one key another session holds;"
    print "`churn`: the same waiters take and release the key in turn;"
    print "`alone-after`: alone again, to show the drift of the machine."
    print ""
    print "| phase | waiters | get ops/s | p50 us | p99 us | p99.9 us | leased CPU |"
    print "|---|---|---|---|---|---|---|"
    for (i = 1; i <= ni; i++) {
        parse(iso[i])
        if (F["phase"] == "summary") continue
        print "| " F["phase"] " | " F["waiters"] " | " fmt(F["ops_s"]) " | " \
              F["p50_us"] " | " F["p99_us"] " | " F["p999_us"] " | " \
              F["leased_cpu_pct"] "% |"
    }
    print ""

    if (nren > 0) {
        print "## cache.get while the watchdog renews many locks"
        print ""
        print "10 connections read 100 B hits for the same window length"
        print "alone and while other sessions hold watchdog locks; the window"
        print "is longer than the renewal period, so it spans one pass."
        print ""
        print "| phase | get ops/s | p50 us | p99 us | p99.9 us | max us | leased CPU |"
        print "|---|---|---|---|---|---|---|"
        for (i = 1; i <= nren; i++) {
            parse(ren[i])
            if (F["phase"] == "summary") { rsum = ren[i]; continue }
            print "| " F["phase"] " | " fmt(F["ops_s"]) " | " F["p50_us"] \
                  " | " F["p99_us"] " | " F["p999_us"] " | " F["max_us"] \
                  " | " F["leased_cpu_pct"] "% |"
        }
        if (rsum != "") {
            parse(rsum)
            print ""
            print "Locks held: " F["locks"] "; renewals during the window: " \
                  F["renewals"] "."
        }
        print ""
    }
    if (nstp > 0) {
        print "## A write to the hottest key: delete against stale"
        print ""
        print "50 sessions read one key at once, right after a"
        print "cache.invalidate of it; the reader that gets the lease loads"
        print "for `load_ms`, then fills. `blocked`: readers that waited for"
        print "that fill (cache_waits); `loads`: leases granted."
        print ""
        print "| invalidate | readers | blocked | loads | answer p50 us | answer max us |"
        print "|---|---|---|---|---|---|"
        for (i = 1; i <= nstp; i++) {
            parse(stp[i])
            print "| " F["invalidate"] " | " F["readers"] " | " \
                  F["blocked"] " | " F["loads"] " | " F["p50_answer_us"] \
                  " | " F["max_answer_us"] " |"
        }
        print ""
    }
    if (nz > 0) {
        print "## Zipf reads with writes, near cache on"
        print ""
        print "50 connections read cache-aside (leased: cache.get, and on a"
        print "miss with a lease, cache.fill; direct: GET, and on a miss SET)"
        print "keys drawn from Zipf(s) over `keys` keys, 100 B values that"
        print "carry a version; every `write every` reads a writer bumps the"
        print "version of a key drawn from the same law and invalidates it:"
        print "`redis`: DEL of the entry in Redis (another daemon'"'"'s write, seen"
        print "through client tracking only); `leased`: cache.invalidate"
        print "through this daemon (evicted before its reply). A stale near hit:"
        print "a near hit, sent after an invalidation of its key was answered,"
        print "of an older version; staleness: from that answer to the hit'"'"'s"
        print "reply (p99 and max over the stale hits of every run). `stale Redis-served`:"
        print "the same for hits that came from Redis (a read that joined the"
        print "daemon'"'"'s fetch sent before the DEL), with the worst age;"
        print "`direct stale`: the same on the direct side, whose cache-aside"
        print "has no lease: a SET of a value loaded before a DEL that lands"
        print "after it leaves the old version in Redis until the next write."
        print "Medians of `repeat` pairs for ops/s and ratios."
        print ""
        print "| write every | writer | leased ops/s | direct ops/s | ratio | near hit ratio | leased hit ratio | direct hit ratio | writes (leased) | stale near hits | staleness p99 us | staleness max us | stale Redis-served (max us) | direct stale (max us) |"
        print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        for (i = 1; i <= nz; i++) {
            parse(zipf[i])
            print "| " F["write_every"] " | " F["writer"] " | " \
                  fmt(F["leased_ops_s"]) " | " fmt(F["direct_ops_s"]) " | " \
                  sprintf("%.2f", F["ratio"]) " | " \
                  sprintf("%.1f%%", F["near_ratio"] * 100) " | " \
                  sprintf("%.1f%%", F["leased_hit_ratio"] * 100) " | " \
                  sprintf("%.1f%%", F["direct_hit_ratio"] * 100) " | " \
                  F["writes"] " | " F["stale_near"] " | " \
                  F["stale_p99_us"] " | " F["stale_max_us"] " | " \
                  F["stale_redis"] " (" F["stale_redis_max_us"] ") | " \
                  F["direct_stale"] " (" F["direct_stale_max_us"] ") |"
        }
        print ""
    }
    if ((getline line < rlmd) > 0) {
        print "## Redlock: lock+unlock over three instances"
        print ""
        print "leased with lock.redlock over three redis-servers on this"
        print "machine, against an app running the same lock scripts on the"
        print "first of them alone (the baseline is a single master); the"
        print "same pair with leased on that one Redis, in the same run,"
        print "shows what Redlock adds. Latencies in microseconds."
        print ""
        print line
        while ((getline line < rlmd) > 0) print line
        print ""
    }
    if ((getline line < clmd) > 0) {
        print "## Redis Cluster: three masters"
        print ""
        print "leased with redis.mode cluster over a cluster of three masters"
        print "(no replicas) on this machine, against an app that knows the"
        print "slot map: each of its connections talks to one master with keys"
        print "of that master'"'"'s slots. The same pairs with leased and the app"
        print "on one standalone Redis, in the same run, show what the cluster"
        print "adds. Latencies in microseconds."
        print ""
        print line
        while ((getline line < clmd) > 0) print line
        print ""
    }
    print "## Resources"
    print ""
    print "Sessions hold watchdog locks (lock.watchdog_ms 30000: renewed"
    print "every 10 s). RSS (VmRSS, peak VmHWM) from /proc/PID/status, on a"
    print "fresh daemon per row; CPU from utime+stime in /proc/PID/stat over"
    print "the window that follows the locking, in % of one core."
    print ""
    print "| sessions | locks | setup s | RSS idle MB | RSS after locking MB | RSS at end MB | peak RSS MB | bytes per lock (end) | window s | leased CPU | redis CPU | renewals in window | renewals failed |"
    print "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= nh; i++) {
        parse(hold[i])
        print "| " F["conns"] " | " F["locks"] " | " F["setup_s"] " | " \
              sprintf("%.1f", F["rss_idle_kb"] / 1024) " | " \
              sprintf("%.1f", F["rss_held_kb"] / 1024) " | " \
              sprintf("%.1f", F["rss_end_kb"] / 1024) " | " \
              sprintf("%.1f", F["rss_hwm_kb"] / 1024) " | " \
              fmt(F["bytes_per_lock"]) " | " F["secs"] " | " \
              F["leased_cpu_pct"] "% | " F["redis_cpu_pct"] "% | " \
              F["renewals"] " | " F["renewals_failed"] " |"
    }
    print ""
    if (nsys > 0) {
        print "### System calls per operation (strace -c, leased, 50 connections)"
        print ""
        print "| op | syscalls per op | of which |"
        print "|---|---|---|"
        for (i = 1; i <= nsys; i++) {
            parse(sys[i])
            rest = ""
            n2 = split(sys[i], ff, " ")
            for (j = 1; j <= n2; j++)
                if (ff[j] !~ /^(section|mode|op|conns|ops|per_op)=/)
                    rest = rest (rest == "" ? "" : ", ") ff[j]
            print "| " F["op"] " | " F["per_op"] " | " rest " |"
        }
        print ""
    }
    print "### Instructions per operation (callgrind, leased only)"
    print ""
    print "User-space instructions of the daemon and its libraries (libevent,"
    print "hiredis, jansson, libc; not the kernel), one connection: counters"
    print "zeroed, N ops, dumped; minus the instructions of the same time idle."
    print ""
    print "| op | N | instructions | idle per s | per op |"
    print "|---|---|---|---|---|"
    for (i = 1; i <= nins; i++) {
        parse(ins[i])
        print "| " F["op"] " | " F["ops"] " | " F["ir"] " | " \
              F["ir_idle_per_s"] " | " F["ir_per_op"] " |"
    }
    print ""
    if (np > 0) {
        print "<details><summary>Where they go (inclusive, per op)</summary>"
        print ""
        print "| phase | instructions per op | function |"
        print "|---|---|---|"
        for (i = 1; i <= np; i++) {
            parse(prof[i])
            print "| " F["phase"] " | " F["ir_per_op"] " | `" F["fn"] "` |"
        }
        print ""
        print "</details>"
        print ""
    }
    print "## How it is measured"
    print ""
    print "* `bench/leased-bench` (C, one libevent loop for every connection of"
    print "  both sides). Closed loop: each connection has one operation in"
    print "  flight and sends the next when the previous is answered. Latency"
    print "  per op by CLOCK_MONOTONIC; every sample kept, so p99.9 is exact."
    print "  A run: connect, warm up, measure, then close everything (ops"
    print "  still in flight at the end are not counted). Keys carry the pid"
    print "  and a run number, so runs never share a key."
    print "* leased side: NDJSON over the Unix socket, one request at a time"
    print "  per connection; session-bound watchdog locks (no ttl_ms)."
    print "* direct side: what an app with an in-process library does, one"
    print "  hiredis async context per connection (TCP loopback, as leased"
    print "  uses), one op in flight on each. Locks run the **daemon'"'"'s own"
    print "  scripts** `src/lua/lock_acquire.lua` and `lock_release.lua`, the text"
    print "  compiled into leased, sent by EVALSHA with the same key layout"
    print "  (hash, fence counter, unlock channel) under another prefix, a"
    print "  30000 ms lease and a 32-hex-digit holder field."
    print "* direct `lock-contended` works the Redisson way: try the script;"
    print "  when it is taken, SUBSCRIBE (on a second connection of that"
    print "  client) to the unlock channel and try again on a message or when"
    print "  the returned pttl ends; a message that arrives while a try is on"
    print "  its way is kept (Redisson'"'"'s semaphore). Each connection stands for"
    print "  one process: every unlock wakes every waiter. It stays subscribed"
    print "  for the run (Redisson unsubscribes after each acquisition, which"
    print "  would cost the direct side more)."
    print "* direct `get` is a plain `GET` of a string of the same size, while"
    print "  leased keeps a cache entry as a hash read by a Lua script (fill"
    print "  lease, null marker): the baseline is the cheapest possible read."
    print "* Both sides write a request with one write() as soon as it is"
    print "  ready and read replies from one event loop; the bench classifies"
    print "  leased replies by the deciding field (`\"hit\":true` ...) without"
    print "  building a JSON tree."
    print "* The near cache (cache.near) is off, as by default, except in the"
    print "  target rows that say it is on and in the Zipf rows."
    print ""
    print "## Reproduce"
    print ""
    print "    mkdir build && cd build && ../configure && make"
    print "    make bench            # about 20 minutes; rewrites bench/results.md"
    print "    make bench BENCH_FLAGS=--quick    # a 1-minute smoke run"
    print "    make bench-quick      # the target rows and their controls, 3.5 minutes;"
    print "                          # the proxy control needs nutcracker installed"
    print "    # one cell by hand, against a running leased and Redis:"
    print "    bench/leased-bench -m lock -c 50 -s /run/leased/leased.sock \\"
    print "        -r 127.0.0.1:6379 -n 3 --json"
    print ""
    print "<details><summary>Raw output</summary>"
    print ""
    print "```text"
    for (i = 1; i <= nr; i++) print rawl[i]
    print "```"
    print ""
    print "</details>"
    print ""
}' "$rawfile"
if [ -s "$tmp/cost.txt" ]; then
    echo "## What Redis executes per op, against Redisson's scripts"
    echo
    echo "redis-server under callgrind, leased native; each pair run 3000"
    echo "times in a row on one connection (bench/cost.sh, bench/cost.py);"
    echo "the Redisson side runs bench/redisson/*.lua by EVALSHA."
    echo
    sh "$here/cost.sh" --table "$tmp/cost.txt"
    echo
fi
if [ -s "$tmp/ratemset.txt" ]; then
    echo "## rate.acquire and cache.mset"
    echo
    echo "bench/rate-mset.sh, one leased and one Redis: a granted"
    echo "rate.acquire (limit far above the load) against its script by"
    echo "EVALSHA; an op of the mset table is a whole batch: one cache.mset,"
    echo "N cache.set pipelined, or N SET PX pipelined straight to Redis."
    echo "Medians of $rep runs of ${dur} s each."
    echo
    sh "$here/rate-mset.sh" --table "$tmp/ratemset.txt"
    echo
fi
if [ -s "$tmp/bloom.txt" ]; then
    echo "## Bloom filter"
    echo
    echo "bench/bloom.sh, one leased and one Redis, a filter for 1000000"
    echo "keys at 1% holding 100000: cache.get of keys never stored, with"
    echo "\"bloom\" (ruled out by the filter) and without it (a miss, its"
    echo "fill lease given back by cache.release), a cached null, and"
    echo "bloom.check of keys never added. Medians of $rep runs of ${dur} s"
    echo "each."
    echo
    sh "$here/bloom.sh" --table "$tmp/bloom.txt"
    echo
fi
if [ -s "$tmp/nearshm.md" ] || [ -s "$tmp/nearpy.md" ]; then
    echo "## Shared near cache"
    echo
    echo "A near hit read from the shared segment on one thread against a"
    echo "direct GET round trip to Redis from the same language, in one run."
    echo "C (bench/near-shm.sh): the daemon's writer in the bench process,"
    echo "read through a read-only mapping as libleased reads it; targets"
    echo "p50 <= 1 us and >= 50x. Python and Go (bench/near-py.py): the"
    echo "clients' cache reads against a leased with the segment on; target"
    echo "for Python >= 10x."
    echo
    [ ! -s "$tmp/nearshm.md" ] || cat "$tmp/nearshm.md"
    echo
    [ ! -s "$tmp/nearpy.md" ] || cat "$tmp/nearpy.md"
    echo
fi
echo "$marker"
cat "$notes"
} >"$out.tmp"
mv "$out.tmp" "$out"
say "wrote $out in $((t_end - t_start)) s"
