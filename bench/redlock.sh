#!/bin/sh
# Redlock rows: lock+unlock through leased with lock.redlock over three
# redis-servers, against direct Redis on the first of them (what an app
# would do without Redlock: the same scripts by EVALSHA on one master).
# For comparison, the same pair with leased on that one Redis alone
# (plain redis.address), in the same invocation. At 50 and 1
# connections, each pair -n times, alternating.
#
# Leased's redis.* (the cache) is the first instance, so the machine
# runs three redis-servers, leased and the bench. The wake-ups travel on
# the instances (no PUBLISH on redis.*); with no waiters here, an unlock
# publishes to no subscriber.
# Writes key=value lines (tagged backend=single|redlock) to --raw FILE
# and a markdown table to --out FILE (default stdout). Run by make bench
# through run-bench.sh; runs alone as well:
#   sh bench/redlock.sh --builddir BUILD --redis-server redis-server [--quick]
set -eu

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$connections" ] || connections=2
[ -n "$raw" ] || raw=$tmp/redlock.raw
md=${out:-/dev/stdout}

dur=2
warm=0.5
rep=5
if [ "$quick" = 1 ]; then
    dur=1
    warm=0.3
    rep=3
fi

# Three independent instances; $port/$redis_pid stay on the first (the
# direct side and the bench's redis CPU figure).
start_redis
p1=$port
pid1=$redis_pid
addrs="\"127.0.0.1:$p1\""
for _i in 2 3; do
    redis_pid=
    start_redis
    extra_pids="$extra_pids $redis_pid"
    addrs="$addrs, \"127.0.0.1:$port\""
done
port=$p1
redis_pid=$pid1

# Until leased has all three instances (start_leased only waits for its
# socket): a lock tried before would answer redis_unavailable.
wait_instances() {
    _wi_ctl=$builddir/tools/leasectl
    [ -x "$_wi_ctl" ] || return 0
    _wi_n=0
    while [ $_wi_n -lt 100 ]; do
        if "$_wi_ctl" -s "$sock" stats --json 2>/dev/null |
            grep -q '"redlock_instances_up": *3[,}]'; then
            return 0
        fi
        sleep 0.1
        _wi_n=$((_wi_n + 1))
    done
    say "leased did not reach the three instances; its log:"
    cat "$tmp/leased.log" >&2
    exit 1
}

: >"$raw"
for backend in single redlock; do
    if [ "$backend" = redlock ]; then
        leased_lock_extra="  redlock: [$addrs]"
    else
        leased_lock_extra=
    fi
    start_leased "$connections"
    [ "$backend" = redlock ] && wait_instances
    for c in 50 1; do
        say "$backend: lock+unlock at $c connections, $rep pairs"
        run_bench -m lock -c "$c" -n "$rep" -d "$dur" -w "$warm" |
            sed "s/^/backend=$backend /" >>"$raw"
    done
    stop_leased
done
leased_lock_extra=

awk -v dur="$dur" -v rep="$rep" -v conns="$connections" '
function parse(line,   i, n, f, p) {
    delete F
    n = split(line, f, " ")
    for (i = 1; i <= n; i++) {
        p = index(f[i], "=")
        if (p > 0) F[substr(f[i], 1, p - 1)] = substr(f[i], p + 1)
    }
}
{
    parse($0)
    k = F["backend"] SUBSEP F["conns"]
    if (F["target"] == "both") {
        both[k] = $0
        if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    } else if (F["target"] == "leased") {
        lc[k] += F["leased_cpu_pct"]; rc[k] += F["redis_cpu_pct"]; nl[k]++
    } else if (F["target"] == "direct") {
        dc[k] += F["redis_cpu_pct"]; nd[k]++
    }
}
END {
    print "| leased on | conns | leased ops/s | direct ops/s | ratio | leased p50 | direct p50 | leased p99 | direct p99 | leased CPU | CPU of each instance (leased run) | redis CPU (direct run) |"
    print "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= n; i++) {
        k = order[i]
        parse(both[k])
        b = F["backend"] == "redlock" ? "Redlock, 3 instances" : "1 Redis"
        printf "| %s | %s | %.0f | %.0f | %.2f | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.0f%% |\n", \
            b, F["conns"], F["leased_ops_s"], F["direct_ops_s"], F["ratio"], \
            F["leased_p50_us"], F["direct_p50_us"], F["leased_p99_us"], \
            F["direct_p99_us"], nl[k] ? lc[k] / nl[k] : 0, \
            nl[k] ? rc[k] / nl[k] : 0, nd[k] ? dc[k] / nd[k] : 0
    }
    print ""
    print "Direct: the lock scripts by EVALSHA on the first instance. Medians"
    print "of " rep " pairs of " dur " s each; CPU in % of one core, means over"
    print "the runs (the instances do the same work, so the first one stands"
    print "for each). leased redis.connections " conns " (per instance)."
}' "$raw" >"$md"
