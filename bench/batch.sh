#!/bin/sh
# Batched scripts (redis.batch_max) on and off, in one run, at 50
# connections:
#  * instructions per op (callgrind, which does not depend on machine
#    noise) of redis-server and of leased, each measured while the other
#    runs natively: lock+unlock and cache miss+fill (a cache.get of a new
#    key and the cache.fill of its lease); with the batch calls and the
#    scripts they carried in the same window;
#  * throughput of lock+unlock against direct EVALSHA of the same scripts,
#    and of miss+fill, alternating on, off and direct (noisy on a shared
#    machine: indicative).
# Writes key=value lines to --raw FILE (default stdout); quick.sh and
# run-bench.sh print them. Runs alone as well:
#   sh bench/batch.sh --builddir BUILD --redis-server redis-server [--quick]
#   sh bench/batch.sh --table RAW   prints the markdown table of RAW.
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
    }
    f["mode"] == "batch_instructions" {
        k = f["proc"] " " f["op"]
        ir[k, f["batch_max"]] = f["ir_per_op"]
        if (f["batch_max"] != 0 && f["batches"] > 0)
            per[f["op"], f["proc"]] = f["items"] / f["batches"]
        next
    }
    f["ops_s"] != "" && f["batch_max"] != "" {
        ops[f["mode"], f["batch_max"]] = ops[f["mode"], f["batch_max"]] \
            " " f["ops_s"]
    }
    END {
        print "| batched scripts, 50 conns | batch_max 32 | batch_max 0 | " \
            "on ÷ off |"
        print "|---|---|---|---|"
        n = split("redis lock,leased lock,redis miss,leased miss", rows, ",")
        for (i = 1; i <= n; i++) {
            split(rows[i], w, " ")
            on = ir[rows[i], 32]; off = ir[rows[i], 0]
            if (on == "" || off == "") continue
            printf "| instructions per %s, %s (callgrind; %.1f scripts " \
                "per batch call) | %d | %d | %.2f× |\n",
                (w[2] == "lock" ? "lock+unlock" : "miss+fill"),
                (w[1] == "redis" ? "redis-server" : "leased"),
                per[w[2], w[1]], on, off, (off > 0 ? on / off : 0)
        }
        lon = median(ops["lock", 32]); loff = median(ops["lock", 0])
        ldir = median(ops["lock", "direct"])
        mon = median(ops["miss", 32]); moff = median(ops["miss", 0])
        if (ldir > 0)
            printf "| lock+unlock ops/s (÷ direct EVALSHA %.0f; noisy) | " \
                "%.0f (%.2f×) | %.0f (%.2f×) | %.2f× |\n", ldir, lon,
                lon / ldir, loff, loff / ldir, (loff > 0 ? lon / loff : 0)
        if (moff > 0)
            printf "| cache miss+fill ops/s (noisy) | %.0f | %.0f | " \
                "%.2f× |\n", mon, moff, mon / moff
    }' "$2"
    exit 0
fi

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$connections" ] || connections=2
[ -n "$raw" ] || raw=/dev/stdout

cg_ops=3000
reps=3
if [ "$quick" = 1 ]; then
    cg_ops=1000
    reps=1
fi

# stat_of NAME: a figure of the running daemon's stats.
stat_of() {
    python3 - "$sock" "$1" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"op":"stats"}\n')
buf = b''
while not buf.endswith(b'\n'):
    buf += s.recv(65536)
print(json.loads(buf)['stats'].get(sys.argv[2], 0))
EOF
}

# cg_ir PID OUT ARGS...: zero PID's counters, run ARGS (the bench), dump
# (OUT.1, OUT.2, ...); prints the instructions of the window. Run in a
# subshell ($(...)): the dump's number is counted from the files.
cg_ir() {
    _pid=$1
    _out=$2
    shift 2
    cg_n=$(($(ls "$_out".[0-9]* 2>/dev/null | wc -l) + 1))
    callgrind_control -z "$_pid" >/dev/null 2>&1
    "$@" >/dev/null
    callgrind_control -d "$_pid" >/dev/null 2>&1
    _w=0
    while ! grep -q '^totals:' "$_out.$cg_n" 2>/dev/null && [ $_w -lt 600 ]
    do
        sleep 0.1
        _w=$((_w + 1))
    done
    sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$_out.$cg_n"
}

bm() {
    run_bench -t leased -c 50 -w 0 "$@"
}

# measure_batch PROC PID OUT: instructions of PROC (the process PID runs
# under callgrind into OUT) per lock+unlock and per miss+fill, with the
# batch calls and scripts sent in the same window, as lines of $raw.
measure_batch() {
    bm -m lock --ops 300 >/dev/null
    bm -m miss --ops 300 >/dev/null
    for m in lock miss; do
        b0=$(stat_of redis_batches)
        i0=$(stat_of redis_batched_items)
        ir=$(cg_ir "$2" "$3" bm -m "$m" --ops "$cg_ops")
        b1=$(stat_of redis_batches)
        i1=$(stat_of redis_batched_items)
        echo "mode=batch_instructions proc=$1 op=$m batch_max=$max" \
            "ops=$cg_ops ir=$ir batches=$((b1 - b0))" \
            "items=$((i1 - i0))" |
            awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^ir=/) {
                    split($i, a, "="); ir = a[2] }
                   for (i = 1; i <= NF; i++) if ($i ~ /^ops=/) {
                    split($i, b, "="); ops = b[2] }
                   printf "%s ir_per_op=%.0f\n", $0, ir / ops }' >>"$raw"
    done
}

if command -v valgrind >/dev/null && command -v callgrind_control >/dev/null
then
    for max in 32 0; do
        leased_redis_extra="  batch_max: $max"
        # redis-server under callgrind, leased native.
        start_redis
        stop_pid "$redis_pid"
        valgrind --tool=callgrind --callgrind-out-file="$tmp/cgr$max.out" \
            --dump-instr=no "$redis_server" --port "$port" \
            --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
            --maxclients 20000 >/dev/null 2>&1 &
        redis_pid=$!
        _w=0
        until redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; do
            sleep 0.2
            _w=$((_w + 1))
            [ $_w -lt 300 ] || { say "redis under callgrind did not start"; exit 1; }
        done
        start_leased "$connections"
        measure_batch redis "$redis_pid" "$tmp/cgr$max.out"
        stop_leased
        stop_pid "$redis_pid"
        redis_pid=

        # leased under callgrind, redis-server native.
        start_redis
        start_leased "$connections" valgrind --tool=callgrind \
            --callgrind-out-file="$tmp/cgl$max.out" --dump-instr=no
        measure_batch leased "$leased_pid" "$tmp/cgl$max.out"
        stop_leased
        stop_pid "$redis_pid"
        redis_pid=
    done
fi

# Throughput, one redis-server, the daemons one after the other per
# repetition so that on, off and direct share the machine's moods.
start_redis
for rep in $(seq 1 "$reps"); do
    for max in 32 0; do
        leased_redis_extra="  batch_max: $max"
        start_leased "$connections"
        run_bench -m lock -c 50 -d 2 -w 0.5 -t leased |
            sed "s/^/batch_max=$max rep=$rep /" >>"$raw"
        run_bench -m miss -c 50 -d 2 -w 0.5 -t leased |
            sed "s/^/batch_max=$max rep=$rep /" >>"$raw"
        stop_leased
    done
    leased_redis_extra=
    start_leased "$connections"
    run_bench -m lock -c 50 -d 2 -w 0.5 -t direct |
        sed "s/^/batch_max=direct rep=$rep /" >>"$raw"
    stop_leased
done
