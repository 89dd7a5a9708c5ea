#!/bin/sh
# What leased costs at rest and per operation, on its own redis-server:
#  * memory and CPU with 10,000 idle sessions each holding one watchdog
#    lock;
#  * CPU spent keeping 100,000 locks (100 sessions x 1,000 keys) renewed
#    with lock.watchdog_ms 30000 over 30 s of steady state;
#  * system calls per lock+unlock and per cache hit (strace -c);
#  * instructions per lock+unlock and per cache hit, under callgrind:
#    counters zeroed, N operations, dumped, minus the same time idle;
#    then, on a daemon with the near cache on, per ping and per near hit.
# Writes key=value lines to --raw FILE (default stdout). Run by make
# bench through run-bench.sh; runs alone as well:
#   sh bench/resources.sh --builddir BUILD --redis-server redis-server
set -eu

here=$(dirname "$0")
. "$here/lib.sh"
bench_args "$@"
bench_init
[ -n "$connections" ] || connections=2
[ -n "$raw" ] || raw=/dev/stdout

hold_10k_s=20
hold_100k_s=30
sessions=10000
cg_ops=3000
cg_ops_big=600     # 10 KB hits: 1M instructions each under callgrind
st_ops=10000
if [ "$quick" = 1 ]; then
    hold_10k_s=2
    hold_100k_s=2
    sessions=1000
    cg_ops=200
    cg_ops_big=50
    st_ops=1000
fi

start_redis

# Each scenario on a fresh daemon, so the idle RSS is the daemon's own.
say "hold: $sessions sessions x 1 lock, ${hold_10k_s} s"
start_leased "$connections"
run_bench -m hold -c "$sessions" --locks 1 --hold "$hold_10k_s" >>"$raw"
stop_leased

say "hold: 100 sessions x 1000 locks, ${hold_100k_s} s"
start_leased "$connections"
run_bench -m hold -c 100 --locks 1000 --hold "$hold_100k_s" >>"$raw"
stop_leased

# System calls per operation at 50 connections, counted by strace -c
# (which slows the daemon down; the counts are what matter here).
if command -v strace >/dev/null; then
    say "strace: syscalls per op"
    start_leased "$connections"
    for m in lock get; do
        strace -c -f -p "$leased_pid" -o "$tmp/strace.$m" 2>/dev/null &
        st=$!
        sleep 1
        run_bench -t leased -m "$m" -c 50 -w 0 --ops "$st_ops" >/dev/null
        kill -INT "$st"
        wait "$st" || true
        op=$m
        [ "$m" = lock ] && op=lock+unlock
        [ "$m" = get ] && op=cache.get-hit-100B
        awk -v op="$op" -v ops="$st_ops" '
            $NF == "total" { total = $4 + 0 }
            $1 ~ /^[0-9.]+$/ && $NF != "total" {
                # calls is the 4th column; "errors" may be empty.
                calls[$NF] = $4 + 0; names[++n] = $NF }
            END {
                printf "mode=syscalls op=%s conns=50 ops=%d per_op=%.2f", \
                       op, ops, total / ops
                for (i = 1; i <= n; i++)
                    printf " %s=%.2f", names[i], calls[names[i]] / ops
                printf "\n" }' "$tmp/strace.$m" >>"$raw"
    done
    stop_leased
fi

# callgrind: the daemon runs some 50x slower, so one connection and a
# fixed number of operations. callgrind_control zeroes the counters before
# and dumps them after each phase; dumps are numbered from 1.
if command -v valgrind >/dev/null && command -v callgrind_control >/dev/null
then
    say "callgrind: $cg_ops ops per phase"
    start_leased "$connections" valgrind --tool=callgrind \
        --callgrind-out-file="$tmp/cg.out" --dump-instr=no
    dumps=0
    cgout=$tmp/cg.out
    # cg_phase NAME ARGS...: zero, run the bench (or sleep), dump; sets
    # $ir and $el (seconds). Not in a subshell: $dumps must count.
    cg_phase() {
        name=$1
        shift
        callgrind_control -z "$leased_pid" >/dev/null 2>&1
        t0=$(date +%s.%N)
        if [ "$1" = idle ]; then
            sleep "$2"
        else
            "$@" >>"$tmp/cg-bench.txt"
        fi
        t1=$(date +%s.%N)
        callgrind_control -d "$leased_pid" >/dev/null 2>&1
        dumps=$((dumps + 1))
        _w=0
        while ! grep -q '^totals:' "$cgout.$dumps" 2>/dev/null &&
            [ $_w -lt 300 ]; do
            sleep 0.1
            _w=$((_w + 1))
        done
        ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$cgout.$dumps")
        [ -n "$ir" ] || { say "no callgrind dump $dumps"; exit 1; }
        cp "$cgout.$dumps" "$tmp/cg.$name.out"
        el=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    }
    cgb() {
        run_bench -w 0 -c 1 -t leased "$@"
    }
    # Warm up: scripts loaded, buffers grown, the allocator settled.
    run_bench -w 0 --ops 300 -c 1 -t leased -m lock >/dev/null
    run_bench -w 0 --ops 300 -c 1 -t leased -m get >/dev/null
    cg_phase lock cgb -m lock --ops "$cg_ops"
    lock_ir=$ir lock_s=$el
    cg_phase get100 cgb -m get -z 100 --ops "$cg_ops"
    get_ir=$ir get_s=$el
    cg_phase get10k cgb -m get -z 10000 --ops "$cg_ops_big"
    getk_ir=$ir getk_s=$el
    cg_phase idle idle "$lock_s"
    idle_ir=$ir idle_s=$el
    for row in "lock+unlock $lock_ir $lock_s $cg_ops" \
        "cache.get-hit-100B $get_ir $get_s $cg_ops" \
        "cache.get-hit-10KB $getk_ir $getk_s $cg_ops_big"; do
        set -- $row
        echo "$1 $2 $3 $idle_ir $idle_s $4" | awk '{
            idle = $4 / $5 * $3
            printf "mode=instructions op=%s ops=%d secs=%.2f ir=%.0f " \
                   "ir_idle_per_s=%.0f ir_per_op=%.0f\n", \
                   $1, $6, $3, $2, $4 / $5, ($2 - idle) / $6 }' >>"$raw"
    done
    stop_leased
    # The near cache on: a near hit against a leased ping (neither sends
    # Redis anything), on a daemon of its own.
    leased_extra="cache:
  near: { enabled: true }"
    start_leased "$connections" valgrind --tool=callgrind \
        --callgrind-out-file="$tmp/cgn.out" --dump-instr=no
    leased_extra=
    cgout=$tmp/cgn.out
    dumps=0
    run_bench -w 0 --ops 300 -c 1 -t leased -m ping >/dev/null
    run_bench -w 0 --ops 300 -c 1 -t leased -m get >/dev/null
    cg_phase ping cgb -m ping --ops "$cg_ops"
    ping_ir=$ir ping_s=$el
    cg_phase near100 cgb -m get -z 100 --ops "$cg_ops"
    near_ir=$ir near_s=$el
    cg_phase near10k cgb -m get -z 10000 --ops "$cg_ops_big"
    neark_ir=$ir neark_s=$el
    cg_phase nidle idle "$near_s"
    nidle_ir=$ir nidle_s=$el
    for row in "ping $ping_ir $ping_s $cg_ops" \
        "cache.get-near-hit-100B $near_ir $near_s $cg_ops" \
        "cache.get-near-hit-10KB $neark_ir $neark_s $cg_ops_big"; do
        set -- $row
        echo "$1 $2 $3 $nidle_ir $nidle_s $4" | awk '{
            idle = $4 / $5 * $3
            printf "mode=instructions op=%s ops=%d secs=%.2f ir=%.0f " \
                   "ir_idle_per_s=%.0f ir_per_op=%.0f\n", \
                   $1, $6, $3, $2, $4 / $5, ($2 - idle) / $6 }' >>"$raw"
    done
    # The hottest functions of each phase (inclusive), for the analysis;
    # the frames every phase shares (main, the loop) left out.
    for name in lock get100 get10k ping near100; do
        ops=$cg_ops
        [ "$name" = get10k ] && ops=$cg_ops_big
        callgrind_annotate --inclusive=yes "$tmp/cg.$name.out" 2>/dev/null |
            awk -v n="$name" -v ops="$ops" '
                /file:function/ { on = 1; next }
                !on || !/^ *[0-9,]+ / { next }
                /below main|libc_start|ld_server_run|event_base_dispatch/ {
                    next }
                /event_base_loop|leased\.c:main|ld-linux/ { next }
                k < 30 {
                    ir = $1; gsub(",", "", ir)
                    fn = $0; sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "", fn)
                    lib = ""
                    if (match(fn, /\[[^]]*\]$/)) {
                        lib = substr(fn, RSTART + 1, RLENGTH - 2)
                        sub(/.*\//, "", lib)
                        sub(/\.so.*/, "", lib)
                        fn = substr(fn, 1, RSTART - 2)
                    }
                    sub(/^.*\/src\//, "src/", fn)
                    printf "mode=profile phase=%s ir_per_op=%.0f fn=%s (%s)\n", \
                           n, ir / ops, fn, lib
                    k++ }' >>"$raw"
    done
    stop_leased
else
    say "valgrind or callgrind_control missing: no instruction counts"
fi
