#!/bin/sh
# Redis Cluster rows: lock+unlock and cache.get (100 B) through leased
# with redis.mode cluster over a cluster of three masters (no replicas),
# against a cluster-aware app on the same cluster: each direct connection
# talks to one master (connection i to master i mod 3) with keys whose
# slots that master owns, so it never meets a redirection
# (leased-bench --cluster). For comparison, the same pairs with leased
# and the app on one standalone Redis, in the same invocation. At 50 and
# 1 connections, each pair -n times, alternating.
#
# The machine runs four redis-servers (three masters, one standalone),
# leased and the bench. Writes key=value lines (tagged
# backend=standalone|cluster) to --raw FILE and a markdown table to
# --out FILE (default stdout). Run by make bench through run-bench.sh;
# runs alone as well:
#   sh bench/cluster.sh --builddir BUILD --redis-server redis-server [--quick]
set -eu

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$connections" ] || connections=2
[ -n "$raw" ] || raw=$tmp/cluster.raw
md=${out:-/dev/stdout}

dur=2
warm=0.5
rep=5
if [ "$quick" = 1 ]; then
    dur=1
    warm=0.3
    rep=3
fi

# The standalone Redis first; $port/$redis_pid are switched per backend.
start_redis
s_port=$port
s_pid=$redis_pid

# Three cluster nodes; their bus ports (port + 10000) must exist too.
redis_port_span=35000
c_ports=
c_pids=
c_addrs=
for _i in 1 2 3; do
    redis_pid=
    start_redis --cluster-enabled yes \
        --cluster-config-file "$tmp/nodes-$_i.conf"
    extra_pids="$extra_pids $redis_pid"
    c_ports="$c_ports $port"
    c_pids="$c_pids${c_pids:+,}$redis_pid"
    c_addrs="$c_addrs${c_addrs:+, }\"127.0.0.1:$port\""
done
redis_pid=$s_pid
port=$s_port

# shellcheck disable=SC2046,SC2086 # a list of ports
redis-cli --cluster create $(printf '127.0.0.1:%s ' $c_ports) \
    --cluster-yes >"$tmp/cluster-create.log" 2>&1 || {
    say "redis-cli --cluster create failed:"
    cat "$tmp/cluster-create.log" >&2
    exit 1
}

# Until every node sees all 16384 slots served.
_n=0
for _p in $c_ports; do
    while ! redis-cli -p "$_p" cluster info 2>/dev/null |
        grep -q '^cluster_state:ok'; do
        _n=$((_n + 1))
        if [ $_n -gt 300 ]; then
            say "the cluster did not reach cluster_state:ok"
            redis-cli -p "$_p" cluster info >&2 || true
            exit 1
        fi
        sleep 0.1
    done
done

# Until leased has the three masters in its slot map (start_leased only
# waits for its socket).
wait_masters() {
    _wm_ctl=$builddir/tools/leasectl
    [ -x "$_wm_ctl" ] || return 0
    _wm_n=0
    while [ $_wm_n -lt 100 ]; do
        if "$_wm_ctl" -s "$sock" stats --json 2>/dev/null |
            grep -q '"redis_cluster_nodes": *3[,}]'; then
            return 0
        fi
        sleep 0.1
        _wm_n=$((_wm_n + 1))
    done
    say "leased did not reach the three masters; its log:"
    cat "$tmp/leased.log" >&2
    exit 1
}

: >"$raw"
for backend in standalone cluster; do
    if [ "$backend" = cluster ]; then
        port=${c_ports# }
        port=${port%% *}
        leased_redis_extra="  mode: cluster
  addresses: [$c_addrs]"
        bench_redis_pids=$c_pids
        cflag=--cluster
    else
        port=$s_port
        leased_redis_extra=
        bench_redis_pids=
        cflag=
    fi
    start_leased "$connections"
    [ "$backend" = cluster ] && wait_masters
    for m in lock get; do
        for c in 50 1; do
            say "$backend: $m at $c connections, $rep pairs"
            run_bench $cflag -m "$m" -z 100 -c "$c" -n "$rep" -d "$dur" \
                -w "$warm" | sed "s/^/backend=$backend /" >>"$raw"
        done
    done
    stop_leased
done
leased_redis_extra=
bench_redis_pids=
port=$s_port

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
    k = F["backend"] SUBSEP F["mode"] SUBSEP F["conns"]
    if (F["target"] == "both") {
        both[k] = $0
        if (!(k in seen)) { seen[k] = 1; order[++n] = k }
    } else if (F["target"] == "leased") {
        lc[k] += F["leased_cpu_pct"]; rc[k] += F["redis_cpu_pct"]
        lb[k] += F["bench_cpu_pct"]; nl[k]++
        le[k] += F["errors"]
    } else if (F["target"] == "direct") {
        dc[k] += F["redis_cpu_pct"]; db[k] += F["bench_cpu_pct"]; nd[k]++
        de[k] += F["errors"]
    }
}
END {
    print "| Redis | op | conns | leased ops/s | direct ops/s | ratio | leased p50 | direct p50 | leased p99 | direct p99 | leased CPU | Redis CPU (leased run) | Redis CPU (direct run) | bench CPU (leased / direct run) | errors (leased / direct) |"
    print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= n; i++) {
        k = order[i]
        parse(both[k])
        b = F["backend"] == "cluster" ? "cluster, 3 masters" : "1 standalone"
        op = F["mode"] == "lock" ? "lock+unlock" : "cache.get 100 B"
        printf "| %s | %s | %s | %.0f | %.0f | %.2f | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.0f%% | %.0f%% / %.0f%% | %d / %d |\n", \
            b, op, F["conns"], F["leased_ops_s"], F["direct_ops_s"], \
            F["ratio"], F["leased_p50_us"], F["direct_p50_us"], \
            F["leased_p99_us"], F["direct_p99_us"], \
            nl[k] ? lc[k] / nl[k] : 0, nl[k] ? rc[k] / nl[k] : 0, \
            nd[k] ? dc[k] / nd[k] : 0, nl[k] ? lb[k] / nl[k] : 0, \
            nd[k] ? db[k] / nd[k] : 0, le[k], de[k]
    }
    print ""
    print "Direct on the cluster: connection i talks to master i mod 3 only,"
    print "with key names chosen so that their slots are that master'"'"'s (a"
    print "cluster-aware client after its slot map, never redirected); lock"
    print "scripts are the daemon'"'"'s, with SPUBLISH as leased runs them on a"
    print "cluster. Direct get: a plain GET. Redis CPU: the three masters"
    print "summed (the cluster rows) or the one standalone, in % of one core;"
    print "means over the runs. Medians of " rep " pairs of " dur " s each;"
    print "leased redis.connections " conns " (per master)."
}' "$raw" >"$md"
