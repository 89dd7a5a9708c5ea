#!/bin/sh
# Two builds of leased against the same Redis in one run (make
# bench-compare): did a change move the figures, or is it noise?
#
#   compare.sh (--before DIR | --before-rev REV) --after DIR [--out FILE]
#              [--rounds N] [--duration S] [--redis-server PATH]
#              [--label TEXT] [--after-config YAML] [--cells CELLS]
#
# DIR is a build tree holding src/leased (the benchmark client comes from
# the --after tree); --before-rev REV builds the daemon of a git revision
# of the source tree (git archive, configure, make) in a temporary
# directory first. One redis-server of its own and both daemons run at
# once on the same configuration; each cell is measured in rounds, and in
# every round both builds run, in alternating order, each against direct
# Redis right beside it (leased-bench -t both). What is compared is the
# ratio leased / direct of each build, so that the drift of a noisy
# machine between rounds cancels out. Medians with min-max go to FILE
# (markdown), or to stdout. --after-config adds YAML (whole sections) to
# the "after" daemon's configuration: one build against itself under
# another setting (--before and --after the same tree). --cells lists
# the cells, MODE:CONNS:SIZE separated by spaces.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
before=
before_rev=
after=
rounds=5
dur=3
outfile=
label=
redis_server=redis-server
after_config=
cells="lock:50:100 lock:1:100 get:50:100 get:50:10000"
while [ $# -gt 0 ]; do
    case $1 in
    --before) before=$2; shift 2 ;;
    --before-rev) before_rev=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) dur=$2; shift 2 ;;
    --out) outfile=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --redis-server) redis_server=$2; shift 2 ;;
    --after-config) after_config=$2; shift 2 ;;
    --cells) cells=$2; shift 2 ;;
    *) echo "usage: $0 --before DIR --after DIR [--out FILE]" \
            "[--rounds N] [--duration S] [--label TEXT]" \
            "[--after-config YAML] [--cells CELLS]" >&2
       exit 2 ;;
    esac
done
if [ -n "$before_rev" ]; then
    srcdir=$(cd "$here/.." && pwd)
    build=$(mktemp -d "${TMPDIR:-/tmp}/leased-before.XXXXXX")
    trap 'rm -rf "$build"' EXIT
    echo "compare.sh: building $before_rev in $build" >&2
    git -C "$srcdir" archive "$before_rev" | tar -x -C "$build"
    (cd "$build" && autoreconf -fi >/dev/null 2>&1 && ./configure -q &&
        make -j2 src/leased >/dev/null)
    before=$build
    label=${label:-"$(git -C "$srcdir" rev-parse --short "$before_rev") against this tree"}
fi
if [ -z "$before" ] || [ -z "$after" ]; then
    echo "$0: need --before (or --before-rev) and --after" >&2
    exit 2
fi

# lib.sh gives start_redis, start_leased (one daemon at $sock), stop_pid.
builddir=$after
. "$here/lib.sh"
bench_init

start_redis
sock_b=$tmp/before.sock
sock_a=$tmp/after.sock
leased=$before/src/leased
sock=$sock_b
start_leased 2
pid_b=$leased_pid
mv "$tmp/leased.yml" "$tmp/before.yml"
leased=$after/src/leased
sock=$sock_a
leased_extra=$after_config
start_leased 2
leased_extra=
pid_a=$leased_pid
leased_pid=
trap 'stop_pid "$pid_b"; stop_pid "$pid_a"; bench_cleanup; [ -z "$before_rev" ] || rm -rf "$before"' EXIT

raw=$tmp/raw.txt
: >"$raw"
# one BUILD CELL MODE CONNS SIZE: one pair, its "both" line kept.
one() {
    if [ "$1" = before ]; then _s=$sock_b; _p=$pid_b; else _s=$sock_a; _p=$pid_a; fi
    "$bench" -s "$_s" -r "127.0.0.1:$port" --pid "$_p" --redis-pid \
        "$redis_pid" --json -t both -m "$3" -c "$4" -z "$5" -d "$dur" -w 0.5 |
        grep '"target":"both"' | sed "s|^|$1 $2 |" >>"$raw"
}

r=1
while [ "$r" -le "$rounds" ]; do
    for c in $cells; do
        IFS=: read -r m n z <<EOF
$c
EOF
        name="$m c=$n size=$z"
        say "round $r/$rounds: $name"
        if [ $((r % 2)) = 1 ]; then
            one before "$m/$n/$z" "$m" "$n" "$z"
            one after "$m/$n/$z" "$m" "$n" "$z"
        else
            one after "$m/$n/$z" "$m" "$n" "$z"
            one before "$m/$n/$z" "$m" "$n" "$z"
        fi
    done
    r=$((r + 1))
done

report() {
    echo "### Before and after in one run${label:+: $label}"
    echo
    echo "$(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')),"
    echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg); $rounds rounds of"
    echo "${dur} s per side, order alternating. Ratio = leased ops/s ÷ direct Redis ops/s"
    echo "measured right beside it; median (min–max)."
    echo
    echo "| cell | before | after | after ÷ before | p50 µs before / after |"
    echo "|---|---|---|---|---|"
    awk '
        function med(a, n,   i, j, t) {
            for (i = 2; i <= n; i++) {
                t = a[i]
                for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]
                a[j + 1] = t
            }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        function field(line, k,   re, s) {
            re = "\"" k "\":[-0-9.e+]+"
            if (match(line, re)) {
                s = substr(line, RSTART, RLENGTH)
                sub(/^[^:]*:/, "", s)
                return s + 0
            }
            return -1
        }
        {
            b = $1; c = $2
            line = $0
            key = b SUBSEP c
            n[key]++
            ratio[key, n[key]] = field(line, "ratio")
            p50[key, n[key]] = field(line, "leased_p50_us")
            if (!(c in seen)) { seen[c] = 1; order[++nc] = c }
        }
        END {
            for (i = 1; i <= nc; i++) {
                c = order[i]
                for (side = 0; side < 2; side++) {
                    b = side ? "after" : "before"
                    k = b SUBSEP c
                    m = n[k]
                    lo = 1e9; hi = 0
                    for (j = 1; j <= m; j++) {
                        r[j] = ratio[k, j]; q[j] = p50[k, j]
                        if (r[j] < lo) lo = r[j]
                        if (r[j] > hi) hi = r[j]
                    }
                    mr[side] = med(r, m); mp[side] = med(q, m)
                    txt[side] = sprintf("%.2f× (%.2f–%.2f)", mr[side], lo, hi)
                }
                split(c, p, "/")
                printf "| %s, %s conns, %s B | %s | %s | %.2f | %.0f / %.0f |\n",
                    p[1], p[2], p[3], txt[0], txt[1],
                    (mr[0] > 0 ? mr[1] / mr[0] : 0), mp[0], mp[1]
            }
        }' "$raw"
}

if [ -n "$outfile" ]; then
    report >"$outfile"
    say "wrote $outfile"
else
    report
fi
