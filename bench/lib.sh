# Shared by run-bench.sh and resources.sh (sourced, POSIX sh): options, a
# private redis-server and leased, and their clean-up by pid.
#
# After bench_init: $tmp (removed at exit), $bench, $leased. start_redis
# sets $port and $redis_pid; start_leased sets $leased_pid and $sock.
# Pids added to $extra_pids (more redis-servers) are stopped at exit too;
# lines in $leased_lock_extra, $leased_redis_extra and
# $leased_journal_extra go into those sections of leased's config;
# $bench_redis_pids (comma-separated) replaces $redis_pid as the
# redis-servers whose CPU the bench sums. start_proxy sets $proxy_pid,
# which is stopped at exit too.
# Shell functions share the caller's variables: locals here start with
# an underscore.

builddir=.
srcdir=.
redis_server=redis-server
out=
raw=
quick=0
resources=1
redlock=1
cluster=1
connections=
rev=

bench_usage() {
    cat <<EOF
usage: $0 [--builddir DIR] [--srcdir DIR] [--redis-server PATH]
          [--out FILE] [--raw FILE] [--connections N] [--quick]
          [--no-resources] [--no-redlock] [--no-cluster] [--rev NAME]
EOF
}

bench_args() {
    while [ $# -gt 0 ]; do
        case $1 in
        --builddir) builddir=$2; shift 2 ;;
        --srcdir) srcdir=$2; shift 2 ;;
        --redis-server) redis_server=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --raw) raw=$2; shift 2 ;;
        --connections) connections=$2; shift 2 ;;
        --rev) rev=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        --no-resources) resources=0; shift ;;
        --no-redlock) redlock=0; shift ;;
        --no-cluster) cluster=0; shift ;;
        -h|--help) bench_usage; exit 0 ;;
        *) bench_usage >&2; exit 2 ;;
        esac
    done
}

say() {
    printf '%s: %s\n' "${0##*/}" "$*" >&2
}

# True while PID runs (a zombie does not: it has exited, only not reaped).
alive() {
    [ -r "/proc/$1/stat" ] || return 1
    _al_state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ -n "$_al_state" ] && [ "$_al_state" != Z ]
}

# SIGTERM, up to 10 s for the exit, then SIGKILL; always by pid.
stop_pid() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || true
    _sp_n=0
    while alive "$1"; do
        _sp_n=$((_sp_n + 1))
        if [ $_sp_n -gt 100 ]; then
            kill -KILL "$1" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    wait "$1" 2>/dev/null || true
}

bench_cleanup() {
    stop_pid "$leased_pid"
    stop_pid "$proxy_pid"
    stop_pid "$redis_pid"
    for _bc_pid in $extra_pids; do
        stop_pid "$_bc_pid"
    done
    [ -n "$tmp" ] && rm -rf "$tmp"
}

bench_init() {
    bench=$builddir/bench/leased-bench
    leased=$builddir/src/leased
    for f in "$bench" "$leased"; do
        if [ ! -x "$f" ]; then
            say "$f is not built (run make first)"
            exit 1
        fi
    done
    redis_pid=
    leased_pid=
    extra_pids=
    leased_lock_extra=
    leased_redis_extra=
    leased_journal_extra=
    proxy_pid=
    bench_redis_pids=
    tmp=
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/leased-bench.XXXXXX")
    sock=$tmp/leased.sock
    # 10,000 sessions are 10,000 descriptors in leased and in the bench.
    ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null ||
        true
}

# A loopback port to try, from 20000 up to 20000 + SPAN (default 40000);
# the caller retries with another when the server it starts finds it busy.
random_port() {
    echo $((20000 + $(od -An -N2 -tu2 /dev/urandom) % ${1:-40000}))
}

# A redis-server of our own on a free loopback port (a busy port makes it
# exit at once; then another port is tried); extra arguments go to it.
# Ports stay below 20000 + $redis_port_span (a cluster node's bus listens
# 10000 higher).
start_redis() {
    for _sr_try in 1 2 3 4 5 6 7 8 9 10; do
        port=$(random_port "${redis_port_span:-40000}")
        "$redis_server" --port "$port" --bind 127.0.0.1 --save '' \
            --appendonly no --dir "$tmp" --logfile "$tmp/redis-$port.log" \
            --maxclients 20000 --daemonize no "$@" &
        redis_pid=$!
        _sr_n=0
        while [ $_sr_n -lt 50 ] && alive "$redis_pid"; do
            if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
                sleep 0.2
                if alive "$redis_pid"; then
                    return 0
                fi
            fi
            sleep 0.1
            _sr_n=$((_sr_n + 1))
        done
        stop_pid "$redis_pid"
        redis_pid=
    done
    say "cannot start $redis_server"
    exit 1
}

# start_leased CONNECTIONS [WRAPPER...]: leased on a fresh config; the
# wrapper (e.g. valgrind) runs it when given.
start_leased() {
    _sl_conns=$1
    shift
    cat >"$tmp/leased.yml" <<EOF
listen:
  unix: "$sock"
  tcp: ""
metrics:
  listen: ""
redis:
  address: "127.0.0.1:$port"
  connections: $_sl_conns
$leased_redis_extra
lock:
  watchdog_ms: ${leased_watchdog_ms:-30000}
$leased_lock_extra
journal:
  path: "$tmp/invalidations.journal"
$leased_journal_extra
limits:
  max_clients: 20000
log:
  level: warn
${leased_extra:-}
EOF
    rm -f "$sock" "$tmp/invalidations.journal"
    "$@" "$leased" -f -c "$tmp/leased.yml" 2>>"$tmp/leased.log" &
    leased_pid=$!
    _sl_n=0
    while [ $_sl_n -lt 600 ]; do
        if [ -S "$sock" ] && "$bench" -m ping -t leased -s "$sock" --ops 1 \
            -w 0 >/dev/null 2>&1; then
            return 0
        fi
        if ! alive "$leased_pid"; then
            break
        fi
        sleep 0.1
        _sl_n=$((_sl_n + 1))
    done
    say "leased did not start; its log:"
    cat "$tmp/leased.log" >&2
    exit 1
}

stop_leased() {
    stop_pid "$leased_pid"
    leased_pid=
}

# The reference for what a third process costs by itself: nutcracker
# (twemproxy, Debian's package of that name), a proxy that only forwards
# Redis commands, pipelining every client onto one connection to Redis,
# on a Unix socket like leased. Sets $proxy_sock and $proxy_pid; returns 1
# when nutcracker is not installed.
start_proxy() {
    command -v nutcracker >/dev/null || return 1
    proxy_sock=$tmp/proxy.sock
    cat >"$tmp/proxy.yml" <<EOF
bench:
  listen: $proxy_sock 0600
  redis: true
  hash: fnv1a_64
  distribution: ketama
  server_connections: 1
  auto_eject_hosts: false
  servers:
   - 127.0.0.1:$port:1
EOF
    # Its statistics port is one more listener: a busy one makes it exit
    # at once, and another is tried.
    for _px_try in 1 2 3 4 5; do
        rm -f "$proxy_sock"
        nutcracker -c "$tmp/proxy.yml" -a 127.0.0.1 -s "$(random_port)" \
            -o "$tmp/proxy.log" &
        proxy_pid=$!
        _px_n=0
        while [ $_px_n -lt 50 ] && alive "$proxy_pid"; do
            if [ -S "$proxy_sock" ]; then
                return 0
            fi
            sleep 0.1
            _px_n=$((_px_n + 1))
        done
        stop_proxy
    done
    say "nutcracker did not start; its log:"
    cat "$tmp/proxy.log" >&2
    exit 1
}

stop_proxy() {
    stop_pid "$proxy_pid"
    proxy_pid=
}

# The bench against the running pair; extra arguments follow.
run_bench() {
    "$bench" -s "$sock" -r "127.0.0.1:$port" --pid "$leased_pid" \
        --redis-pid "${bench_redis_pids:-$redis_pid}" "$@"
}
