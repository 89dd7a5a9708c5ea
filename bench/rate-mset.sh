#!/bin/sh
# rate.acquire and cache.mset, through leased and the way an app sends the
# same work straight to Redis:
#  * rate: a granted rate.acquire (a limit far above the load) against
#    its script by EVALSHA (src/lua/rate_acquire.lua, the text compiled
#    into leased), at 1 and 50 connections;
#  * mset: one cache.mset of N entries of 100 B, against N cache.set
#    requests pipelined to leased and N SET PX pipelined to Redis, for N
#    10 and 100, at 1 and 50 connections. An op is the whole batch.
# Each cell alternates leased and direct (or runs leased alone for the
# pipelined cache.set) --repeat times; the table gives medians. Writes
# key=value lines to --raw FILE (default stdout); run-bench.sh prints the
# table. Runs alone as well:
#   sh bench/rate-mset.sh --builddir BUILD --redis-server PATH [--quick]
#   sh bench/rate-mset.sh --table RAW   prints the markdown tables of RAW.
set -eu

if [ "${1:-}" = --table ]; then
    awk '
    function median(list,   n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++)
            for (j = i + 1; j <= n; j++)
                if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n ? a[int((n + 1) / 2)] : 0
    }
    {
        delete f
        for (i = 1; i <= NF; i++) {
            k = $i; sub(/=.*/, "", k); v = $i; sub(/^[^=]*=/, "", v)
            f[k] = v
        }
        if (f["target"] == "" || f["target"] == "both" || f["ops_s"] == "")
            next
        k = f["mode"] SUBSEP f["target"] SUBSEP f["conns"] SUBSEP \
            f["entries"]
        ops[k] = ops[k] " " f["ops_s"]
        p50[k] = p50[k] " " f["p50_us"]
        p99[k] = p99[k] " " f["p99_us"]
        err[k] += f["errors"] + f["timeouts"]
        cpu[k] = cpu[k] " " (f["target"] == "leased" ? f["leased_cpu_pct"] \
            : f["redis_cpu_pct"])
        seen[f["mode"] SUBSEP f["conns"] SUBSEP f["entries"]] = 1
    }
    function cell(k) {
        return sprintf("%.0f | %.1f | %.1f", median(ops[k]),
            median(p50[k]), median(p99[k]))
    }
    END {
        print "| rate.acquire, granted | conns | leased ops/s | leased " \
            "p50 us | leased p99 us | direct EVALSHA ops/s | direct " \
            "p50 us | direct p99 us | ratio | leased CPU | errors |"
        print "|---|---|---|---|---|---|---|---|---|---|---|"
        for (c = 1; c <= 1000; c++) {
            if (!(("rate" SUBSEP c SUBSEP 10) in seen)) continue
            l = "rate" SUBSEP "leased" SUBSEP c SUBSEP 10
            d = "rate" SUBSEP "direct" SUBSEP c SUBSEP 10
            printf "| one decision | %d | %s | %s | %.2f | %.0f%% | %d |\n",
                c, cell(l), cell(d),
                (median(ops[d]) > 0 ? median(ops[l]) / median(ops[d]) : 0),
                median(cpu[l]), err[l] + err[d]
        }
        print ""
        print "| entries of 100 B per op | conns | cache.mset ops/s | " \
            "p50 us | p99 us | N cache.set pipelined ops/s | p50 us | " \
            "p99 us | N SET PX pipelined (direct) ops/s | p50 us | " \
            "p99 us | mset ÷ cache.set | mset ÷ SET PX | mset entries/s | " \
            "errors |"
        print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        for (n = 1; n <= 1000; n++)
            for (c = 1; c <= 1000; c++) {
                if (!(("mset" SUBSEP c SUBSEP n) in seen)) continue
                m = "mset" SUBSEP "leased" SUBSEP c SUBSEP n
                s = "set-pipelined" SUBSEP "leased" SUBSEP c SUBSEP n
                d = "mset" SUBSEP "direct" SUBSEP c SUBSEP n
                mo = median(ops[m]); so = median(ops[s]); dop = median(ops[d])
                printf "| %d | %d | %s | %s | %s | %.2f | %.2f | %.0f | " \
                    "%d |\n", n, c, cell(m), cell(s), cell(d),
                    (so > 0 ? mo / so : 0), (dop > 0 ? mo / dop : 0), mo * n,
                    err[m] + err[s] + err[d]
            }
    }' "$2"
    exit 0
fi

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$connections" ] || connections=2
[ -n "$raw" ] || raw=/dev/stdout
rep=5
dur=2
warm=0.5
if [ "$quick" = 1 ]; then
    rep=1
    dur=0.3
    warm=0.1
fi

start_redis
start_leased "$connections"
for c in 1 50; do
    say "rate.acquire at $c connections"
    run_bench -m rate -c "$c" -n "$rep" -d "$dur" -w "$warm" |
        sed 's/^/entries=10 /' >>"$raw"
done
for n in 10 100; do
    for c in 1 50; do
        say "cache.mset of $n entries at $c connections"
        run_bench -m mset --entries "$n" -c "$c" -n "$rep" -d "$dur" \
            -w "$warm" | sed "s/^/entries=$n /" >>"$raw"
        run_bench -t leased -m set-pipelined --entries "$n" -c "$c" \
            -n "$rep" -d "$dur" -w "$warm" | sed "s/^/entries=$n /" >>"$raw"
    done
done
