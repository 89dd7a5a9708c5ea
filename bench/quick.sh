#!/bin/sh
# make bench-quick: only the rows of the performance targets, in a few
# minutes on a 2-core machine. Each cell runs leased and direct Redis
# side by side, in alternating order, 3 times; the table gives medians
# and the ratio leased / direct of the medians. Instruction counts come
# from resources.sh (--quick); batched scripts on and off from batch.sh
# (--quick). Prints markdown to stdout (or --out FILE); --raw FILE keeps
# the bench's lines the table is made of.
#
# The lock cell at 50 connections runs a second time against Redisson's
# RLock scripts sent straight to Redis (leased-bench -t leased,redisson,
# bench/redisson): through leased ÷ what a Redisson app makes Redis do.
#
# Two controls say what a missed row is made of. Where nutcracker is
# installed, the 50-connection rows also run through it (a proxy that only
# forwards commands, in leased's place between the bench and Redis): what
# the third process costs on this machine whatever it does. The storm runs
# again under journal.fsync everysec, where no fdatasync is waited for.
set -eu

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$connections" ] || connections=2
target=${out:-/dev/stdout}
rawf=$tmp/quick.raw

start_redis
start_leased "$connections"
say "pairs: lock (against direct and Redisson's RLock), rwlock read and" \
    "write, and get at 50 connections, lock at 1"
for cell in "lock 50 100" "lock 50 100 redisson" "rwlock-read 50 100" \
    "rwlock-write 50 100" "get 50 100" "get 50 10000" "lock 1 100" \
    "ping 1 100"; do
    set -- $cell
    if [ $# -eq 4 ]; then
        # Its own mode name keeps its leased runs apart from the cell
        # against direct.
        run_bench -t "leased,$4" --redisson-dir "$here/redisson" \
            -m "$1" -c "$2" -z "$3" -n 3 -d 2 -w 0.5 |
            sed "s/^mode=$1 /mode=$1-vs-$4 /" >>"$rawf"
    else
        run_bench -m "$1" -c "$2" -z "$3" -n 3 -d 2 -w 0.5 >>"$rawf"
    fi
done
say "storm: cache.get p99 while 20 sessions invalidate (fsync always)"
run_bench -t leased -m storm -c 10 -z 100 --waiters 20 -d 2 -w 0.5 \
    >>"$rawf"
stop_leased
if start_proxy; then
    say "control: the 50-connection rows through nutcracker (forwarding only)"
    for cell in "lock 50 100" "get 50 100" "get 50 10000"; do
        set -- $cell
        run_bench -t direct --via "$proxy_sock" --pid "$proxy_pid" \
            -m "$1" -c "$2" -z "$3" -n 3 -d 2 -w 0.5 >>"$rawf"
    done
    stop_proxy
else
    say "nutcracker is not installed: no proxy control"
fi
say "control: the storm under journal.fsync everysec"
leased_journal_extra="  fsync: everysec"
start_leased "$connections"
run_bench -t leased -m storm -c 10 -z 100 --waiters 20 -d 2 -w 0.5 |
    sed 's/^mode=storm /mode=storm-everysec /' >>"$rawf"
stop_leased
leased_journal_extra=
if command -v valgrind >/dev/null; then
    say "callgrind: instructions per op (resources.sh --quick)"
    sh "$here/resources.sh" --builddir "$builddir" \
        --redis-server "$redis_server" --quick --raw "$tmp/res.raw" \
        >/dev/null 2>&1 || say "resources.sh failed"
    grep 'mode=instructions' "$tmp/res.raw" >>"$rawf" 2>/dev/null || true
fi
say "batched scripts: redis.batch_max 32 against 0 (batch.sh --quick)"
sh "$here/batch.sh" --builddir "$builddir" --redis-server "$redis_server" \
    --quick --raw "$tmp/batch.raw" >/dev/null 2>&1 || say "batch.sh failed"

{
    echo "## Quick run of the performance targets ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    echo
    echo "$(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo |
        head -1)), load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
    echo
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
    }
    f["mode"] ~ /^storm/ && f["phase"] == "summary" {
        line = sprintf("| cache.get p99 during an invalidation storm ÷ " \
            "alone%s | %.2f× (%.0f µs / %.0f µs; %.0f invalidations/s) |",
            f["mode"] == "storm" ? "" : \
                ", journal.fsync everysec (control)",
            f["p99_ratio"], f["p99_storm_us"], f["p99_alone_us"],
            f["invalidations_s"])
        storm = storm line "\n"
        next
    }
    f["mode"] == "instructions" {
        ins = ins sprintf("| instructions per op, %s (callgrind) | %s |\n",
            f["op"], f["ir_per_op"])
        next
    }
    f["target"] != "" && f["ops_s"] != "" {
        cell = f["mode"] " " f["conns"] " " f["size"]
        if (!(cell in seen)) { seen[cell] = 1; order[++n] = cell }
        # Against the Redisson scripts, their runs fill the direct column.
        if (f["target"] == "redisson") vs[cell] = 1
        ops[cell, f["target"]] = ops[cell, f["target"]] " " f["ops_s"]
        p50[cell, f["target"]] = p50[cell, f["target"]] " " f["p50_us"]
        # CPU per op in microseconds of one core, and the cores the
        # three processes kept busy (the middle one is leased, or the
        # proxy: its pid is passed as --pid).
        if (f["ops_s"] > 0) {
            k = cell SUBSEP f["target"]
            cb[k] += f["bench_cpu_pct"] * 1e4 / f["ops_s"]
            cm[k] += f["leased_cpu_pct"] * 1e4 / f["ops_s"]
            cr[k] += f["redis_cpu_pct"] * 1e4 / f["ops_s"]
            busy[k] += (f["bench_cpu_pct"] + f["leased_cpu_pct"] + \
                f["redis_cpu_pct"]) / 100
            runs[k]++
        }
    }
    END {
        print "| figure | leased | direct | ratio | forwarding proxy " \
            "÷ direct |"
        print "|---|---|---|---|---|"
        for (i = 1; i <= n; i++) {
            c = order[i]; split(c, w, " ")
            d = c in vs ? "redisson" : "direct"
            lo = median(ops[c, "leased"]); dop = median(ops[c, d])
            lp = median(p50[c, "leased"]); dp = median(p50[c, d])
            px = ops[c, "proxy"] == "" ? "-" : sprintf("%.2f× (%.0f)",
                (dop > 0 ? median(ops[c, "proxy"]) / dop : 0),
                median(ops[c, "proxy"]))
            what = w[1]
            if (c in vs) {
                sub(/-vs-redisson$/, "", what)
                fig = sprintf("%s, %s conns: through leased ÷ Redisson " \
                    "RLock direct, ops/s (p50 µs)", what, w[2])
            } else
                fig = sprintf("%s, %s conns, %s B: ops/s (p50 µs)", what,
                    w[2], w[3])
            printf "| %s | %.0f (%.0f) | %.0f (%.0f) | %.2f× (p50 %+.0f " \
                "µs) | %s |\n", fig, lo, lp, dop, dp,
                (dop > 0 ? lo / dop : 0), lp - dp, px
        }
        print ""
        print "| CPU per op, µs of one core (mean of the runs) | bench | " \
            "leased or proxy | Redis | all three | cores busy |"
        print "|---|---|---|---|---|---|"
        for (i = 1; i <= n; i++) {
            c = order[i]; split(c, w, " ")
            if (ops[c, "proxy"] == "") continue
            for (t = 1; t <= 3; t++) {
                side = t == 1 ? "leased" : t == 2 ? "direct" : "proxy"
                k = c SUBSEP side
                if (!runs[k]) continue
                m = runs[k]
                printf "| %s, %s conns, %s B: %s | %.1f | %s | %.1f | " \
                    "%.1f | %.2f |\n", w[1], w[2], w[3], side, cb[k] / m,
                    side == "direct" ? "-" : sprintf("%.1f", cm[k] / m),
                    cr[k] / m, (cb[k] + cm[k] + cr[k]) / m, busy[k] / m
            }
        }
        print ""
        print "| other figure | value |"
        print "|---|---|"
        printf "%s", storm
        printf "%s", ins
    }' "$rawf"
    if [ -s "$tmp/batch.raw" ]; then
        echo
        sh "$here/batch.sh" --table "$tmp/batch.raw"
    fi
} >"$target"
[ -z "$raw" ] || cp "$rawf" "$raw"
