#!/bin/sh
# The clients' own CPU per uncontended lock+unlock pair: this tree's
# clients against those of another revision (--base REV, default HEAD)
# and against the peers (make bench-clientcpu; BENCH_CLIENTCPU_FLAGS are
# passed here).
#
# Starts a redis-server and the built leased (as bench-peers does), then
# runs clientcpu.js and clientcpu.py REPEATS times each, alternating the
# order, for: the clients of REV (git show into a temp dir), the clients
# of this tree (the Node ones also with a Pool of 2 connections shared by
# the workers, the Python ones also with a Pool of 50, as 50 asyncio
# tasks on one AsyncLeased, and with a single thread: the per-call cost
# without the threads' hand-offs; the Go one as 50 goroutines sharing a
# Client of 4 and of 1 connections, built offline into LEASED_GO_CACHE;
# the Rust one, clients/rust's example clientcpu built with cargo, with
# the threads sharing one Leased and with one Leased each), and
# redis-semaphore and redis-py's Lock against the same Redis. Prints the
# raw JSON lines, then a Markdown table of the medians (min-max) of the
# client's CPU microseconds per pair. CPU time is what the client costs
# whatever else runs on the machine; the pairs/s column is indicative
# only on a shared machine.
#
# The Java client of this tree (built with clients/java/build.sh into the
# temp dir; ClientCpu.java in the JDK's source-file mode) is measured with
# a connection per worker and with a LeasedPool of 2; it has no base rows.
#
# Environment: REPEATS (3), PAIRS (node 100000, python 30000, java
# 30000), WORKERS (50), PYTHON, NODE, JAVA, CARGO (else
# ~/.cargo/bin/cargo, else cargo).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

base=HEAD
while [ $# -gt 0 ]; do
    case $1 in
    --builddir) builddir=$2; shift 2 ;;
    --redis-server) redis_server=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    *) echo "usage: $0 [--builddir DIR] [--redis-server P] [--base REV]" >&2
       exit 2 ;;
    esac
done
repeats=${REPEATS:-3}
workers=${WORKERS:-50}
node=${NODE:-node}
java=${JAVA:-java}
python=
for p in ${PYTHON:-python3 /usr/bin/python3}; do
    if "$p" -c 'import redis' >/dev/null 2>&1; then
        python=$p
        break
    fi
done
[ -n "$python" ] || { say "needs a python3 with redis (python3-redis)"; exit 1; }
[ -d "$here/node_modules/redis-semaphore" ] ||
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) >&2

bench_init
start_redis
start_leased 2
src=$(cd "$here/../.." && pwd)
mkdir -p "$tmp/base"
git -C "$src" show "$base:clients/node/leased.js" >"$tmp/base/leased.js"
git -C "$src" show "$base:clients/python/leased.py" >"$tmp/base/leased.py"
sh "$src/clients/java/build.sh" "$tmp/java" >&2
raw=$tmp/raw
: >"$raw"
gocache=${LEASED_GO_CACHE:-${TMPDIR:-/tmp}/leased-go-$(id -u)}
(cd "$src/clients/go" && GOCACHE=${GOCACHE:-$gocache/build} \
    GOPATH=${GOPATH:-$gocache/path} GOFLAGS=-mod=mod GOPROXY=off \
    go build -o "$tmp/clientcpu-go" ./cmd/leased-clientcpu) ||
    { say "needs go (golang-go) to build clients/go"; exit 1; }
cargo=${CARGO:-$HOME/.cargo/bin/cargo}
[ -x "$cargo" ] || cargo=cargo
CARGO_TARGET_DIR=$tmp/rust "$cargo" build -q --offline --release \
    --manifest-path "$src/clients/rust/Cargo.toml" --example clientcpu >&2
rustcpu=$tmp/rust/release/examples/clientcpu

runs() {
    np=${PAIRS:-100000}
    pp=${PAIRS:-30000}
    cat <<EOF
node base --client=$tmp/base/leased.js --pairs=$np
node now --client=$src/clients/node/leased.js --pairs=$np
node base --client=$tmp/base/leased.js --pairs=$np --pool=2
node now --client=$src/clients/node/leased.js --pairs=$np --pool=2
node redis-semaphore --peer=semaphore --pairs=$np
py base --client=$tmp/base/leased.py --pairs=$pp
py now --client=$src/clients/python/leased.py --pairs=$pp
py base --client=$tmp/base/leased.py --pairs=$pp --pool=50
py now --client=$src/clients/python/leased.py --pairs=$pp --pool=50
py base --client=$tmp/base/leased.py --pairs=$pp --asyncio=1
py now --client=$src/clients/python/leased.py --pairs=$pp --asyncio=1
py base --client=$tmp/base/leased.py --pairs=$pp --workers=1
py now --client=$src/clients/python/leased.py --pairs=$pp --workers=1
py redis-py --peer=redispy --pairs=$pp
go now --pairs=$np --pool=4
go now --pairs=$np --pool=1
java now --pairs=${PAIRS:-30000}
java now --pairs=${PAIRS:-30000} --pool=2
rust now --pairs=$pp
rust now --pairs=$pp --conns=$workers
EOF
}

rep=1
while [ "$rep" -le "$repeats" ]; do
    if [ $((rep % 2)) = 1 ]; then order=cat; else order=tac; fi
    runs | $order >"$tmp/runs"
    while read -r lang label args; do
        say "rep $rep: $lang $label"
        # shellcheck disable=SC2086
        if [ "$lang" = node ]; then
            "$node" "$here/clientcpu.js" --sock="$sock" --redis="$port" \
                --workers="$workers" --label="$label" $args </dev/null
        elif [ "$lang" = go ]; then
            "$tmp/clientcpu-go" --sock="$sock" --workers="$workers" \
                --label="$label" $args </dev/null
        elif [ "$lang" = java ]; then
            "$java" -cp "$tmp/java/leased-client.jar" "$here/ClientCpu.java" \
                --sock="$sock" --workers="$workers" --label="$label" \
                $args </dev/null
        elif [ "$lang" = rust ]; then
            "$rustcpu" --sock="$sock" --workers="$workers" \
                --label="$label" $args </dev/null
        else
            "$python" "$here/clientcpu.py" --sock="$sock" --redis="$port" \
                --workers="$workers" --label="$label" $args </dev/null
        fi >>"$raw"
    done <"$tmp/runs"
    rep=$((rep + 1))
done
cat "$raw"
"$python" - "$raw" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["lang"], r["label"], str(r["workers"]),
                     str(r["conns"])), []).append(r)
print()
print("| client | workers | connections | client CPU µs per pair "
      "| pairs/s (indicative) |")
print("|---|---|---|---|---|")
for (lang, label, workers, conns), rs in rows.items():
    c = [r["cpu_us_per_pair"] for r in rs]
    p = [r["pairs_per_s"] for r in rs]
    print("| %s %s | %s | %s | %.1f (%.1f–%.1f) | %s (%s–%s) |" % (
        lang, label, workers, conns, statistics.median(c), min(c), max(c),
        format(round(statistics.median(p)), ","), format(round(min(p)), ","),
        format(round(max(p)), ",")))
EOF
