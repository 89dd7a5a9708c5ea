#!/bin/sh
# leased against the libraries an app would use instead (make bench-peers).
#
# Installs the pinned npm peers into bench/peers/node_modules (npm ci, only
# when package-lock.json changed), checks for Debian's python3-redis,
# starts a redis-server under test and a second one (the referee: the
# bench's loader-call counter across processes; the lock cells of either
# language run all their workers in one process and count overlaps there,
# exactly and without round trips that would cost the contenders as much
# as the lock) on free ports and
# the built leased (Unix socket in a temp dir, redis.connections 2 as
# shipped), then
# runs, REPEATS times with the order of the contenders reversed on every
# other repeat:
#   1. uncontended lock+unlock: 50 workers, one key each;
#   2. contended: 50 workers on one key, 1 ms hold, every peer at its
#      default retry settings and at a tuned interval;
#   3. miss storm: P processes (4, 8) x 25 readers, one key, 50 ms loader;
# and writes bench/peers/results.md (report.py). Everything is stopped by
# pid at the end.
#
# Uncontended Node runs two ways, each the same for leased and the peers:
# a connection per worker (leased, redlock, semaphore), and one client
# object per process shared by the 50 workers (leased-pool: one Pool of
# POOL connections; redlock-shared, semaphore-shared: one ioredis client),
# which is how an app with many async callers uses any of them and the
# comparison the targets are read from.
# Environment: REPEATS (3), DURATION (seconds per cell, 5), TUNED_MS (10),
# PYTHON (a python3 that can import redis), NODE, NPM. --note TEXT goes
# into the header of results.md (--quick says there that it was one).
# --cells REGEX runs only the lock cells whose line below matches it (an
# extended regular expression) and no miss storm, e.g. --cells
# 'node.*uncontended' --out /tmp/r.md for the Node uncontended rows alone.
# Text below the marker line of an existing results.md is kept.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

peers_usage() {
    cat <<EOF
usage: $0 [--builddir DIR] [--redis-server PATH] [--out FILE] [--quick]
          [--repeats N] [--duration S] [--note TEXT] [--cells REGEX]
EOF
}

repeats=${REPEATS:-3}
duration=${DURATION:-5}
tuned_ms=${TUNED_MS:-10}
note=
cells=
while [ $# -gt 0 ]; do
    case $1 in
    --builddir) builddir=$2; shift 2 ;;
    --srcdir) shift 2 ;;
    --redis-server) redis_server=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --note) note=$2; shift 2 ;;
    --cells) cells=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) peers_usage; exit 0 ;;
    *) peers_usage >&2; exit 2 ;;
    esac
done
[ -n "$out" ] || out=$here/results.md
warm=0.5
lead_ms=300
readers=25
if [ "$quick" = 1 ]; then
    repeats=2
    duration=1
    warm=0.2
fi
node=${NODE:-node}
npm=${NPM:-npm}

# ------------------------------------------------------------ prerequisites
if ! command -v "$node" >/dev/null 2>&1 ||
    ! command -v "$npm" >/dev/null 2>&1; then
    say "node and npm are needed (Debian: apt-get install nodejs npm)"
    exit 1
fi
python=
for p in ${PYTHON:-python3 /usr/bin/python3}; do
    if command -v "$p" >/dev/null 2>&1 &&
        "$p" -c 'import redis' >/dev/null 2>&1; then
        python=$p
        break
    fi
done
if [ -z "$python" ]; then
    say "no python3 with the redis module; on Debian:"
    say "    apt-get install python3-redis"
    say "then run again (or set PYTHON to a python3 that can import redis)"
    exit 1
fi

# The peers come from the committed lock file only; a tree installed from
# another lock file is installed again.
stamp=$here/node_modules/.peers-lock-cksum
want=$(cksum <"$here/package-lock.json")
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "npm ci in $here"
    (cd "$here" && "$npm" ci --no-audit --no-fund --loglevel=error) >&2
    printf '%s\n' "$want" >"$stamp"
fi

bench_init
ref_pid=
kids=
# The cells run in the background so that a signal reaches this trap at
# once; their timeout(1) passes the TERM on.
peers_cleanup() {
    for _k in $kids; do
        stop_pid "$_k"
    done
    stop_pid "$ref_pid"
    bench_cleanup
}
trap peers_cleanup EXIT
raw=$tmp/raw.txt
: >"$raw"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$(date +%s)

# The referee first, then the Redis under test ($port, $redis_pid).
start_redis
ref_port=$port
ref_pid=$redis_pid
redis_pid=
start_redis
start_leased 2


# cell REP LANG ARGS...: one lock cell, its JSON line tagged with the
# repeat; a cell that fails or overruns is recorded as failed.
cell() {
    _rep=$1
    _lang=$2
    shift 2
    say "rep $_rep: $_lang $*"
    if [ "$_lang" = node ]; then
        set -- "$node" "$here/peers.js" lock "$@"
    else
        set -- "$python" "$here/peers.py" lock "$@"
    fi
    timeout $((${duration%.*} + 60)) "$@" --sock="$sock" --redis="$port" \
        --referee="$ref_port" --dur="$duration" \
        --warm="$warm" --tag="r$_rep.$$" >"$tmp/cell.txt" \
        2>"$tmp/cell.err" &
    kids=$!
    _rc=0
    wait "$kids" || _rc=$?
    kids=
    if [ "$_rc" = 0 ]; then
        sed "s/^/rep=$_rep /" "$tmp/cell.txt" >>"$raw"
    else
        printf 'rep=%s failed %s\n' "$_rep" "$*" >>"$raw"
        cat "$tmp/cell.err" >&2
    fi
}

# storm REP P LANG CONTENDER: P processes of READERS readers on one fresh
# key. Each one connects and says so on the referee (ready:KEY); once all
# are, they get a start time a little ahead (go:KEY), so neither starting
# node or python nor connecting is part of the storm.
storm() {
    _rep=$1
    _p=$2
    _lang=$3
    _who=$4
    _key=storm:$_lang:$_who:$_p:$_rep.$$
    say "rep $_rep: storm $_lang $_who x$_p"
    if [ "$_lang" = node ]; then
        set -- "$node" "$here/peers.js"
    else
        set -- "$python" "$here/peers.py"
    fi
    _pids=
    _i=0
    while [ $_i -lt "$_p" ]; do
        timeout 90 "$@" storm --contender="$_who" --readers="$readers" \
            --key="$_key" --loader-ms=50 --sock="$sock" \
            --redis="$port" --referee="$ref_port" \
            >"$tmp/storm.$_i" 2>>"$tmp/storm.err" &
        _pids="$_pids $!"
        kids=$_pids
        _i=$((_i + 1))
    done
    _n=0
    while [ "$(redis-cli -p "$ref_port" get "ready:$_key")" != "$_p" ]; do
        _n=$((_n + 1))
        if [ $_n -gt 600 ]; then
            say "storm processes not ready after 60 s"
            break
        fi
        sleep 0.1
    done
    _at=$(($(date +%s%N) / 1000000 + lead_ms))
    # One RPUSH with a start for each process.
    set --
    _i=0
    while [ $_i -lt "$_p" ]; do
        set -- "$@" "$_at"
        _i=$((_i + 1))
    done
    redis-cli -p "$ref_port" rpush "go:$_key" "$@" >/dev/null
    _bad=0
    for _pid in $_pids; do
        wait "$_pid" || _bad=1
    done
    kids=
    _loads=$(redis-cli -p "$ref_port" get "loads:$_key")
    if [ "$_bad" = 0 ]; then
        printf 'rep=%s storm lang=%s contender=%s p=%s loads=%s\n' \
            "$_rep" "$_lang" "$_who" "$_p" "${_loads:-0}" >>"$raw"
        _i=0
        while [ $_i -lt "$_p" ]; do
            sed "s/^/rep=$_rep p=$_p /" "$tmp/storm.$_i" >>"$raw"
            _i=$((_i + 1))
        done
    else
        printf 'rep=%s failed storm %s %s x%s\n' "$_rep" "$_lang" "$_who" \
            "$_p" >>"$raw"
        cat "$tmp/storm.err" >&2
    fi
}

sem_tuned=1
pool_size=${POOL:-2}
lock_cells() {
    cat <<EOF
node --contender=leased --shape=uncontended
node --contender=leased-pool --shape=uncontended --pool=$pool_size
node --contender=redlock --shape=uncontended
node --contender=semaphore --shape=uncontended
node --contender=redlock-shared --shape=uncontended
node --contender=semaphore-shared --shape=uncontended
python --contender=leased --shape=uncontended
python --contender=redispy --shape=uncontended
node --contender=leased --shape=contended
node --contender=redlock --shape=contended --retry=default
node --contender=redlock --shape=contended --retry=tuned --tuned-ms=$tuned_ms
node --contender=semaphore --shape=contended --retry=default
node --contender=semaphore --shape=contended --retry=tuned \
    --tuned-ms=$sem_tuned
python --contender=leased --shape=contended
python --contender=redispy --shape=contended --retry=default
python --contender=redispy --shape=contended --retry=tuned --tuned-ms=$tuned_ms
EOF
}
storm_cells() {
    cat <<EOF
node leased
node cachemgr
python leased
python naive
EOF
}

rep=1
while [ $rep -le "$repeats" ]; do
    # Odd repeats in the listed order, even ones reversed, so no
    # contender always runs first or right after another one.
    if [ $((rep % 2)) = 1 ]; then
        order="cat"
    else
        order=tac
    fi
    lock_cells | grep -E -e "${cells:-.}" | $order >"$tmp/cells" || true
    while read -r line; do
        # shellcheck disable=SC2086
        cell "$rep" $line </dev/null
    done <"$tmp/cells"
    [ -z "$cells" ] || storm_ps=
    for p in ${storm_ps-4 8}; do
        storm_cells | $order >"$tmp/cells"
        while read -r lang who; do
            storm "$rep" "$p" "$lang" "$who" </dev/null
        done <"$tmp/cells"
    done
    rep=$((rep + 1))
done

t_end=$(date +%s)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
stop_leased
stop_pid "$redis_pid"
redis_pid=
stop_pid "$ref_pid"
ref_pid=

lver=$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)
if [ -z "$note" ] && [ "$quick" = 1 ]; then
    note="Harness check on a loaded machine (--quick: $repeats repeats of"
    note="$note $duration s): the figures only show that the harness works,"
    note="$note they are not a result."
fi
"$python" "$here/report.py" --raw "$raw" --out "$out" \
    --note "$note" --node "$node" --python "$python" \
    --redis-server "$redis_server" --peers-dir "$here" \
    --leased-rev "$lver" --load-start "$load_start" \
    --load-end "$load_end" --seconds $((t_end - t_start)) \
    --repeats "$repeats" --duration "$duration" --warm "$warm" \
    --tuned-ms "$tuned_ms" --sem-tuned-ms "$sem_tuned" --pool "$pool_size" \
    --lead-ms "$lead_ms" --readers "$readers"
if [ -n "${PEERS_RAW:-}" ]; then
    cp "$raw" "$PEERS_RAW"
fi
say "wrote $out"
