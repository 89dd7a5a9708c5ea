#!/bin/sh
# The Bloom filter in front of the cache, through leased (no direct side:
# the comparison is between leased's own answers to an absent key):
#  * cache.get of a key never stored, with "bloom" naming a filter that
#    rules it out (bloom-get), against the same absent keys without it: a
#    miss that takes a fill lease and gives it back with cache.release
#    (miss-release), and a cached null, what an app that keeps its
#    misses reads instead (null-get);
#  * bloom.check of 1 and of 100 keys never added.
# The filter (capacity 1000000 at 1%, 100000 keys in it) is made and
# filled with leasectl bloom create and bloom add. A key the filter lets
# through costs bloom-get a miss and a release, as it would an app; at a
# tenth of its capacity the filter lets through about one in 10^8 (1% is
# at full capacity). All at 1 and 50 connections; each cell --repeat times, the
# table gives medians. Writes key=value lines to --raw FILE (default
# stdout); run-bench.sh prints the table. Runs alone as well:
#   sh bench/bloom.sh --builddir BUILD --redis-server PATH [--quick]
#   sh bench/bloom.sh --table RAW   prints the markdown table of RAW.
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
        if (f["target"] != "leased" || f["ops_s"] == "")
            next
        k = f["mode"] SUBSEP f["conns"] SUBSEP f["entries"]
        ops[k] = ops[k] " " f["ops_s"]
        p50[k] = p50[k] " " f["p50_us"]
        p99[k] = p99[k] " " f["p99_us"]
        err[k] += f["errors"] + f["timeouts"]
        cpu[k] = cpu[k] " " f["leased_cpu_pct"]
        rcpu[k] = rcpu[k] " " f["redis_cpu_pct"]
        seen[k] = 1
    }
    function line(what, mode, c, n, base,   k, b) {
        k = mode SUBSEP c SUBSEP n
        if (!(k in seen)) return
        b = mode == base ? "1.00" : \
            sprintf("%.2f", median(ops[base SUBSEP c SUBSEP n]) > 0 ? \
                median(ops[k]) / median(ops[base SUBSEP c SUBSEP n]) : 0)
        printf "| %s | %d | %.0f | %.1f | %.1f | %s | %.0f%% | %.0f%% | %d |\n",
            what, c, median(ops[k]), median(p50[k]), median(p99[k]), b,
            median(cpu[k]), median(rcpu[k]), err[k]
    }
    END {
        print "| absent key, per op | conns | ops/s | p50 us | p99 us | " \
            "÷ miss + release | leased CPU | Redis CPU | errors |"
        print "|---|---|---|---|---|---|---|---|---|"
        for (c = 1; c <= 1000; c++) {
            line("cache.get with bloom (ruled out)", "bloom-get", c, 1,
                "miss-release")
            line("cache.get miss + cache.release", "miss-release", c, 1,
                "miss-release")
            line("cache.get of a cached null", "null-get", c, 1,
                "miss-release")
        }
        print ""
        print "| bloom.check | conns | requests/s | p50 us | p99 us | " \
            "keys/s | leased CPU | Redis CPU | errors |"
        print "|---|---|---|---|---|---|---|---|---|"
        for (n = 1; n <= 1000; n++)
            for (c = 1; c <= 1000; c++) {
                k = "bloom-check" SUBSEP c SUBSEP n
                if (!(k in seen)) continue
                printf "| %d keys | %d | %.0f | %.1f | %.1f | %.0f | " \
                    "%.0f%% | %.0f%% | %d |\n", n, c, median(ops[k]),
                    median(p50[k]), median(p99[k]), median(ops[k]) * n,
                    median(cpu[k]), median(rcpu[k]), err[k]
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
ctl=$builddir/tools/leasectl

start_redis
start_leased "$connections"
"$ctl" -q -s "$sock" bloom create bench.bf --capacity 1000000 \
    --error-rate 0.01
seq 1 100000 | sed 's/^/bench:exists:/' |
    "$ctl" -q -s "$sock" bloom add bench.bf -
# The three answers to an absent key take turns, one run each, so that a
# change in the machine's load falls on all three alike.
for c in 1 50; do
    say "cache.get of absent keys at $c connections"
    i=0
    while [ $i -lt $rep ]; do
        for m in bloom-get miss-release null-get; do
            run_bench -t leased -m "$m" -c "$c" -n 1 -d "$dur" \
                -w "$warm" | sed 's/^/entries=1 /' >>"$raw"
        done
        i=$((i + 1))
    done
done
for n in 1 100; do
    for c in 1 50; do
        say "bloom.check of $n keys at $c connections"
        run_bench -t leased -m bloom-check --entries "$n" -c "$c" \
            -n "$rep" -d "$dur" -w "$warm" | sed "s/^/entries=$n /" >>"$raw"
    done
done
