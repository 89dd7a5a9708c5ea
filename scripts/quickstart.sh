#!/usr/bin/env bash
# From a fresh Debian/Ubuntu checkout to a running leased in one command:
# install the build and test dependencies, build in the source tree, make
# sure a Redis answers on 127.0.0.1:6379, start the freshly built daemon
# on its built-in defaults and prove it answers on its socket.
#
# Run as root or through sudo. Under sudo the build runs as the calling
# user (so a later plain `make check` can write to the tree) and so does
# the daemon (so that user can talk to its socket). Safe to run again: what
# is already installed is left as it is, the tree is rebuilt, and the
# daemon this script started is restarted when the rebuilt src/leased is
# newer than it (a daemon it did not start is left alone).
#
# The daemon's pid goes to ./leased.pid and its output to ./leased.log; a
# redis-server it starts has its pid in ./redis.pid.
#
#   scripts/quickstart.sh stop    stops the leased and the redis-server
#                                 whose pids those files hold, nothing else

set -euo pipefail

cd "$(dirname "$0")/.."
TOP=$(pwd)
SOCK=/run/leased/leased.sock
PIDFILE=$TOP/leased.pid
LOGFILE=$TOP/leased.log
REDIS_PIDFILE=$TOP/redis.pid
PACKAGES="build-essential autoconf automake pkg-config libhiredis-dev
libevent-dev libssl-dev openssl libjansson-dev libyaml-dev check
redis-server redis-tools socat python3 python3-venv python3-yaml nodejs tmux
spin golang-go openjdk-17-jdk-headless cargo"

say() { printf 'quickstart: %s\n' "$*"; }
die() { printf 'quickstart: error: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
"" | stop) ;;
*) die "usage: $0 [stop]" ;;
esac

if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 ||
        die "run as root (sudo is not installed)"
    exec sudo "$0" "$@"
fi

# The pid in FILE if it is alive and its command line holds NAME (a pid
# file left from a reboot may name a recycled pid), else nothing.
live_pid() {
    local file=$1 name=$2 pid
    [ -f "$file" ] || return 0
    pid=$(cat "$file")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$name"; then
        echo "$pid"
    fi
}

# SIGTERM the process in FILE (see live_pid), wait up to 10 s for it to
# go, then SIGKILL; remove FILE.
stop_pidfile() {
    local file=$1 name=$2 pid
    pid=$(live_pid "$file" "$name")
    if [ -n "$pid" ]; then
        say "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

if [ "${1:-}" = stop ]; then
    stop_pidfile "$PIDFILE" leased
    stop_pidfile "$REDIS_PIDFILE" redis-server
    exit 0
fi

# Who builds and runs the daemon: the user behind sudo, else root.
RUN_UID=0
RUN_GID=0
if [ -n "${SUDO_UID:-}" ] && [ "${SUDO_UID}" != 0 ]; then
    RUN_UID=$SUDO_UID
    RUN_GID=${SUDO_GID:-$SUDO_UID}
fi
as_user() {
    if [ "$RUN_UID" = 0 ]; then
        "$@"
    else
        setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --init-groups -- "$@"
    fi
}

answers_ping() {
    local out
    out=$(printf '{"op":"ping"}\n' |
        timeout 5 socat -t 2 - "UNIX-CONNECT:$SOCK" 2>/dev/null) || true
    [[ $out == *'"ok":true'* ]]
}

# --- packages ------------------------------------------------------------
missing=""
for p in $PACKAGES; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || true
    if [ "$status" != "install ok installed" ]; then
        missing="$missing $p"
    fi
done
# promtool, which make check runs on the daemon's /metrics, comes only in
# the full Prometheus server package (Debian 12 has no package with
# promtool alone: apt-cache search promtool finds nothing else). The
# server itself is not wanted: it is installed without recommends, its
# service is kept from starting (policy-rc.d covers both sysvinit
# scripts, as in CI where root runs without systemd, and
# deb-systemd-invoke), then disabled so that it does not start at boot
# either, and stopped in case a policy-rc.d of the host let it start.
PROMETHEUS_PACKAGE=prometheus
prometheus_missing=no
status=$(dpkg-query -W -f='${Status}' "$PROMETHEUS_PACKAGE" 2>/dev/null) ||
    true
if [ "$status" != "install ok installed" ]; then
    prometheus_missing=yes
fi

if [ -n "$missing" ] || [ "$prometheus_missing" = yes ]; then
    if [ "$prometheus_missing" = yes ]; then
        say "installing:$missing $PROMETHEUS_PACKAGE (for promtool)"
    else
        say "installing:$missing"
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
fi
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    apt-get install -y $PACKAGES
fi
if [ "$prometheus_missing" = yes ]; then
    policy=/usr/sbin/policy-rc.d
    own_policy=no
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# quickstart: no services while installing\n%s\n' \
            'exit 101' >"$policy"
        chmod 755 "$policy"
        own_policy=yes
    fi
    rc=0
    apt-get install -y --no-install-recommends "$PROMETHEUS_PACKAGE" || rc=$?
    [ "$own_policy" = no ] || rm -f "$policy"
    [ "$rc" -eq 0 ] || die "apt-get install $PROMETHEUS_PACKAGE failed"
    if [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    else
        update-rc.d prometheus disable >/dev/null 2>&1 || true
        if [ -x /etc/init.d/prometheus ]; then
            /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        fi
    fi
fi
if [ -z "$missing" ] && [ "$prometheus_missing" = no ]; then
    say "all packages are installed"
fi

# --- build ----------------------------------------------------------------
say "building"
as_user autoreconf -fi
as_user ./configure -q
as_user make -j2

# --- redis ----------------------------------------------------------------
if [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null || true)" = PONG ]
then
    say "redis is already answering on 127.0.0.1:6379"
else
    say "starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 \
        --save "" --appendonly no --dir /tmp \
        --logfile /tmp/leased-quickstart-redis.log \
        --pidfile "$REDIS_PIDFILE"
    for _ in $(seq 100); do
        [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null || true)" = PONG ] &&
            break
        sleep 0.1
    done
    [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null || true)" = PONG ] ||
        die "redis-server did not answer PING (see /tmp/leased-quickstart-redis.log)"
fi

# --- leased ---------------------------------------------------------------
# Seconds since the epoch when process PID started.
started_at() {
    local ticks boot
    ticks=$(awk '{print $22}' "/proc/$1/stat")
    boot=$(awk '/^btime/ {print $2}' /proc/stat)
    echo $((boot + ticks / $(getconf CLK_TCK)))
}

start_leased() {
    # The built-in defaults put the socket and the journal here; the
    # journal may be left from a run as another user.
    mkdir -p /run/leased /var/lib/leased
    chown -R "$RUN_UID:$RUN_GID" /run/leased /var/lib/leased
    touch "$LOGFILE" "$PIDFILE"
    chown "$RUN_UID:$RUN_GID" "$LOGFILE" "$PIDFILE"
    say "starting src/leased (log: $LOGFILE)"
    # setpriv execs in place, so $! is the daemon itself.
    (unset RUNTIME_DIRECTORY STATE_DIRECTORY NOTIFY_SOCKET LISTEN_FDS \
         LISTEN_PID
     exec </dev/null >>"$LOGFILE" 2>&1
     if [ "$RUN_UID" = 0 ]; then
         exec "$TOP/src/leased" -f
     else
         exec setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --init-groups \
             -- "$TOP/src/leased" -f
     fi) &
    echo $! >"$PIDFILE"
    for _ in $(seq 100); do
        answers_ping && break
        kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
        sleep 0.1
    done
    if ! answers_ping; then
        tail -n 40 "$LOGFILE" >&2 || true
        rm -f "$PIDFILE"
        die "leased did not answer on $SOCK"
    fi
    say "leased is running, pid $(cat "$PIDFILE")"
}

ours=$(live_pid "$PIDFILE" leased)
if [ -n "$ours" ] &&
    [ "$(stat -c %Y "$TOP/src/leased")" -gt "$(started_at "$ours")" ]; then
    say "src/leased was rebuilt after the running one (pid $ours) started"
    stop_pidfile "$PIDFILE" leased
elif [ -n "$ours" ] && ! answers_ping; then
    say "the earlier leased (pid $ours) does not answer"
    stop_pidfile "$PIDFILE" leased
fi
if answers_ping; then
    if [ -n "$(live_pid "$PIDFILE" leased)" ]; then
        say "leased (pid $(cat "$PIDFILE")) is already running this build"
    else
        say "a leased this script did not start is answering on $SOCK;" \
            "not starting another (it may be an older build: stop it first)"
    fi
else
    rm -f "$PIDFILE"
    start_leased
fi

say "echo '{\"op\":\"ping\"}' | socat - UNIX-CONNECT:$SOCK"
echo '{"op":"ping"}' | socat - "UNIX-CONNECT:$SOCK"
