#!/bin/sh
# Instructions redis-server executes per op pair (callgrind: does not
# depend on machine noise), through leased and for what an app would send
# without it: Redisson's RLock, RFencedLock, RReadWriteLock, RSemaphore,
# RPermitExpirableSemaphore and RRateLimiter scripts and its watchdog
# renewal by EVALSHA (bench/redisson/), plain GET and MGET, a pipelined
# batch of SET PX against cache.mset, and a GET of an absent key against
# cache.get of it with a Bloom filter, without one (miss and release) and
# cached null.
# One redis-server under callgrind, leased native (lock.watchdog_ms 6000:
# a pass of renewals every two seconds); the cases in bench/cost.py, then
# the semaphore's and the cache's again through a daemon under
# lock.sem_layout 2 and cache.layout 2.
# Writes key=value lines to --raw FILE (default stdout). Runs alone too:
#   sh bench/cost.sh --builddir BUILD --srcdir SRC --redis-server PATH [--quick]
#   sh bench/cost.sh --table RAW   prints the markdown table of RAW.
# COST_CASES=REGEX runs only the cases whose name matches it;
# COST_KEEP=DIR keeps callgrind's dumps there, one per case in the order
# run, for callgrind_annotate.
set -eu

if [ "${1:-}" = --table ]; then
    awk '
    /mode=cost/ {
        match($0, /case="[^"]*"/)
        c = substr($0, RSTART + 6, RLENGTH - 7)
        match($0, /ir_per_op=[0-9]+/)
        ir[c] = substr($0, RSTART + 10, RLENGTH - 10) + 0
    }
    function row(op, mine, theirs, label) {
        if ((mine in ir) && theirs == "") {
            printf "| %s | %d | - | - |\n", op, ir[mine]
            return
        }
        if (!(mine in ir) || !(theirs in ir)) return
        printf "| %s | %d | %s: %d | %.2f× |\n", op, ir[mine], label,
            ir[theirs], ir[mine] / ir[theirs]
    }
    END {
        print "| Redis instructions per op | through leased | " \
            "without leased | ratio |"
        print "|---|---|---|---|"
        row("lock + unlock", "leased lock+unlock", "redisson RLock",
            "Redisson RLock scripts")
        row("lock + unlock, against Redisson\047s RFencedLock (a fence " \
            "per grant, as leased gives)", "leased lock+unlock",
            "redisson RFencedLock", "Redisson RFencedLock scripts")
        row("read lock + unlock", "leased rw read",
            "redisson RReadWriteLock read", "Redisson RReadLock scripts")
        row("write lock + unlock", "leased rw write",
            "redisson RReadWriteLock write", "Redisson RWriteLock scripts")
        row("semaphore acquire + release", "leased sem",
            "redisson RSemaphore", "Redisson RSemaphore scripts")
        row("semaphore acquire + release, against Redisson\047s " \
            "RPermitExpirableSemaphore (permits with a lease)", "leased sem",
            "redisson RPermitExpirableSemaphore",
            "Redisson RPermitExpirableSemaphore scripts")
        row("semaphore acquire + release, 20 grants held by others, " \
            "against RPermitExpirableSemaphore", "leased sem 20 held",
            "redisson RPermitExpirableSemaphore 20 held",
            "Redisson RPermitExpirableSemaphore scripts")
        row("semaphore acquire + release, lock.sem_layout 2, against " \
            "RPermitExpirableSemaphore", "leased sem (layout 2)",
            "redisson RPermitExpirableSemaphore",
            "Redisson RPermitExpirableSemaphore scripts")
        row("semaphore acquire + release, lock.sem_layout 2, 20 grants " \
            "held by others, against RPermitExpirableSemaphore",
            "leased sem 20 held (layout 2)",
            "redisson RPermitExpirableSemaphore 20 held",
            "Redisson RPermitExpirableSemaphore scripts")
        row("watchdog renewal", "leased watchdog renewal",
            "redisson renewal", "Redisson renewExpiration")
        row("cache.get hit, 100 B", "leased cache.get hit 100 B",
            "GET 100 B", "GET")
        row("cache.get hit, 100 B, cache.layout 2 (the entry a string)",
            "leased cache.get hit 100 B (layout 2)", "GET 100 B", "GET")
        row("the least a hit on the entry\047s hash can cost: HGET of its " \
            "value", "HGET v of the entry", "GET 100 B", "GET")
        row("the same, every field (HGETALL)", "HGETALL of the entry",
            "GET 100 B", "GET")
        row("the least a hit on the entry\047s string can cost " \
            "(cache.layout 2): GET of it", "GET of the entry (layout 2)",
            "GET 100 B", "GET")
        row("cache.mget, 10 hits of 100 B", "leased cache.mget 10 hits",
            "MGET 10", "MGET of 10 keys")
        row("cache.mget, 10 hits of 100 B, cache.layout 2",
            "leased cache.mget 10 hits (layout 2)", "MGET 10",
            "MGET of 10 keys")
        row("rate.acquire, granted", "leased rate.acquire granted",
            "redisson RRateLimiter", "Redisson RRateLimiter tryAcquire")
        row("cache.mset of 10 entries of 100 B",
            "leased cache.mset 10", "SET PX x10 pipelined",
            "10 SET PX pipelined")
        row("10 cache.set of 100 B, pipelined",
            "leased cache.set x10 pipelined", "SET PX x10 pipelined",
            "10 SET PX pipelined")
        row("cache.mset of 10 entries of 100 B, cache.layout 2",
            "leased cache.mset 10 (layout 2)", "SET PX x10 pipelined",
            "10 SET PX pipelined")
        row("10 cache.set of 100 B, pipelined, cache.layout 2",
            "leased cache.set x10 pipelined (layout 2)",
            "SET PX x10 pipelined", "10 SET PX pipelined")
        row("cache.get of an absent key, ruled out by \"bloom\"",
            "leased cache.get bloom ruled out", "GET absent",
            "GET of the absent key")
        row("cache.get of an absent key: miss + cache.release",
            "leased cache.get miss + cache.release", "GET absent",
            "GET of the absent key")
        row("cache.get miss + cache.fill of 100 B (cache-aside\047s miss)",
            "leased cache.get miss + cache.fill", "GET miss + SET PX",
            "GET, then SET PX")
        row("cache.get of a cached null", "leased cache.get cached null",
            "GET absent", "GET of the absent key")
        row("cache.get miss + cache.release, cache.layout 2",
            "leased cache.get miss + cache.release (layout 2)", "GET absent",
            "GET of the absent key")
        row("cache.get miss + cache.fill of 100 B, cache.layout 2",
            "leased cache.get miss + cache.fill (layout 2)",
            "GET miss + SET PX", "GET, then SET PX")
        row("cache.get of a cached null, cache.layout 2",
            "leased cache.get cached null (layout 2)", "GET absent",
            "GET of the absent key")
        row("bloom.check of 1 key", "leased bloom.check 1", "", "")
        row("bloom.check of 100 keys", "leased bloom.check 100", "", "")
    }' "$2"
    exit 0
fi

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$raw" ] || raw=/dev/stdout
ops=3000
[ "$quick" = 0 ] || ops=1000

if ! command -v valgrind >/dev/null ||
    ! command -v callgrind_control >/dev/null; then
    say "valgrind (callgrind) is not installed: no instruction counts"
    exit 0
fi

start_redis
stop_pid "$redis_pid"
valgrind --tool=callgrind --callgrind-out-file="$tmp/cost.out" \
    --dump-instr=no "$redis_server" --port "$port" --bind 127.0.0.1 \
    --save '' --appendonly no --dir "$tmp" >/dev/null 2>&1 &
redis_pid=$!
_w=0
until redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; do
    sleep 0.2
    _w=$((_w + 1))
    [ $_w -lt 300 ] || { say "redis under callgrind did not start"; exit 1; }
done
leased_watchdog_ms=6000
start_leased 2
python3 "$here/cost.py" --port "$port" --sock "$sock" --pid "$redis_pid" \
    --cg-out "$tmp/cost.out" --srcdir "$srcdir" --ops "$ops" \
    --cases "${COST_CASES:-}" >>"$raw"
# The semaphore and the cache again through a daemon under
# lock.sem_layout 2 and cache.layout 2 (the first is stopped: its
# background work stays out of the windows).
stop_leased
leased_lock_extra="  sem_layout: 2"
leased_extra="cache:
  layout: 2"
start_leased 2
python3 "$here/cost.py" --port "$port" --sock "$sock" --pid "$redis_pid" \
    --cg-out "$tmp/cost.out" --srcdir "$srcdir" --ops "$ops" \
    --cases "${COST_CASES:-}" --tag " (layout 2)" >>"$raw"
if [ -n "${COST_KEEP:-}" ]; then
    mkdir -p "$COST_KEEP"
    cp "$tmp"/cost.out.* "$COST_KEEP"/
fi
