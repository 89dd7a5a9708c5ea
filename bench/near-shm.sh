#!/bin/sh
# make bench-near-shm: a near hit read from the shared near cache segment
# by C (one thread) against a direct GET round trip to Redis (hiredis, one
# connection), same key and value size, in one run: bench/near-shm-bench
# against a private redis-server. Prints its key=value lines and a
# markdown table of the medians (--quick: 3 pairs of 1 s, else 5 of 2 s).
# The targets of issue 33: p50 <= 1 us and >= 50x the ops/s of the GET.
set -eu

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
prog=$builddir/bench/near-shm-bench
if [ ! -x "$prog" ]; then
    say "$prog is not built (make bench/near-shm-bench)"
    exit 1
fi
if [ "$quick" = 1 ]; then
    secs=1 repeat=3
else
    secs=2 repeat=5
fi
start_redis
target=${out:-/dev/stdout}
for size in 100 10000; do
    say "near hit from the segment against GET, $size B, $repeat pairs"
    nice "$prog" --redis-port "$port" --size "$size" --secs "$secs" \
        --repeat "$repeat" >>"$tmp/near.raw"
done
cat "$tmp/near.raw" >&2
awk '
    / summary / {
        delete f
        for (i = 1; i <= NF; i++) {
            k = $i; sub(/=.*/, "", k); v = $i; sub(/^[^=]*=/, "", v)
            f[k] = v
        }
        row[++n] = sprintf("| %s B | %.0f ops/s, p50 %.0f ns | %.0f ops/s, " \
            "p50 %.0f ns | %.0f ops/s, p50 %.1f us | %.1fx / %.1fx | %s |",
            f["size"], f["lookup_ops_s"], f["lookup_p50_ns"],
            f["near_get_ops_s"], f["near_get_p50_ns"], f["redis_ops_s"],
            f["redis_p50_ns"] / 1000, f["lookup_x"], f["near_get_x"],
            (f["near_get_p50_ns"] + 0 <= 1000 && f["near_get_x"] + 0 >= 50) ? \
                "**met**" : "**missed**")
    }
    END {
        print "| value | segment, leased_near_lookup | segment, as " \
            "leased_near_get | direct GET (hiredis) | ops/s segment ÷ GET " \
            "| p50 <= 1 us and >= 50x |"
        print "|---|---|---|---|---|---|"
        for (i = 1; i <= n; i++) print row[i]
    }
' "$tmp/near.raw" >"$target"
