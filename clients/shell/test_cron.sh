#!/bin/sh
# Proof from the shell: the cron pattern of nightly-report.sh with
# leasectl, and raw protocol sessions with socat (or nc -U).
#
#   LEASECTL_BIN=.../leasectl sh test_cron.sh SOCKET
#
# Prints one "ok"/"not ok" line per check; exits 1 if any failed.
set -u

sock=${1:?usage: test_cron.sh SOCKET}
here=$(cd "$(dirname "$0")" && pwd)
LEASECTL=${LEASECTL_BIN:-leasectl}
LEASED_SOCKET=$sock
export LEASECTL LEASED_SOCKET

work=$(mktemp -d "${TMPDIR:-/tmp}/leased-cron-XXXXXX")
sess_pid=
cleanup() {
    exec 3>&- 2>/dev/null
    [ -n "$sess_pid" ] && kill "$sess_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

failed=0
n=0
check() {   # check DESCRIPTION COMMAND...
    desc=$1
    shift
    n=$((n + 1))
    if "$@"; then
        echo "ok $n - $desc"
    else
        echo "not ok $n - $desc"
        failed=1
    fi
}

# wait_until SECONDS COMMAND...: poll COMMAND every 50 ms.
wait_until() {
    limit=$(($1 * 20))
    shift
    i=0
    until "$@"; do
        i=$((i + 1))
        [ $i -ge $limit ] && return 1
        sleep 0.05
    done
}

lines() { [ -f "$1" ] && wc -l < "$1" | tr -d ' ' || echo 0; }

# --- the cron pattern ------------------------------------------------------

export REPORT_DIR="$work" REPORT_SECONDS=2 REPORT_LOCK="nightly-report-$$"

sh "$here/nightly-report.sh" > "$work/first.out" 2>&1 &
first=$!
check "the first run starts the job" wait_until 10 test -s "$work/runs.log"

sh "$here/nightly-report.sh" > "$work/second.out" 2>&1
rc=$?
check "a concurrent second run exits 75 (got $rc)" test "$rc" -eq 75
check "leasectl says why on stderr" grep -q "not running" "$work/second.out"

wait "$first"
rc=$?
check "the first run exits 0 (got $rc)" test "$rc" -eq 0
check "the job ran exactly once (runs.log: $(lines "$work/runs.log"))" \
    test "$(lines "$work/runs.log")" -eq 1
check "the job finished" test -s "$work/last-report.txt"

REPORT_SECONDS=0 sh "$here/nightly-report.sh" > "$work/third.out" 2>&1
rc=$?
check "after it, the lock is free again (got $rc)" test "$rc" -eq 0
check "so the job ran a second time" test "$(lines "$work/runs.log")" -eq 2
if [ $failed -ne 0 ]; then
    for f in first second third; do
        echo "--- $f run:"
        cat "$work/$f.out"
    done
fi

# --- raw protocol sessions ---------------------------------------------------
# A session is a connection: keep it open with a FIFO on fd 3, so that
# session-bound locks live as long as fd 3 rather than ending with the
# pipeline's input.

if command -v socat > /dev/null 2>&1; then
    tool=socat
elif command -v nc > /dev/null 2>&1; then
    tool=nc
else
    echo "not ok - neither socat nor nc is installed"
    exit 1
fi

id=0
session_open() {
    rm -f "$work/req" "$work/resp"
    mkfifo "$work/req"
    : > "$work/resp"
    # Started directly (not through a function) so that $! is its pid.
    if [ $tool = socat ]; then
        socat - "UNIX-CONNECT:$sock" < "$work/req" > "$work/resp" &
    else
        nc -U "$sock" < "$work/req" > "$work/resp" &
    fi
    sess_pid=$!
    exec 3> "$work/req"
}

session_close() {
    exec 3>&-
    # Some nc builds wait for the server after stdin ends: end it here.
    kill "$sess_pid" 2>/dev/null
    wait "$sess_pid" 2>/dev/null
    sess_pid=
}

# call JSON-FIELDS: send {"id":N,FIELDS}; the reply line lands in $reply.
# (Not a $(...) function: the id counter must live in this shell.)
call() {
    id=$((id + 1))
    reply=
    printf '{"id":%d,%s}\n' "$id" "$1" >&3
    wait_until 10 grep -Eq "\"id\": ?$id[,}]" "$work/resp" || return 1
    reply=$(grep -E "\"id\": ?$id[,}]" "$work/resp")
}

has() {     # has PATTERN: does $reply match the extended regex?
    printf '%s\n' "$reply" | grep -Eq "$1"
}

field() {   # field NAME: a string or scalar field of the line on stdin
    sed -n "s/.*\"$1\": *\"\\{0,1\\}\\([^\",}]*\\).*/\\1/p"
}

key="shell-$$"
session_open
call '"op":"ping"'
check "ping over a raw session: $reply" has '^\{"id": ?1, ?"ok": ?true\}$'

call "\"op\":\"lock\",\"key\":\"$key\",\"detach\":true,\"ttl_ms\":60000"
token=$(printf '%s\n' "$reply" | field token)
check "a detached lock with a token: $reply" test -n "$token"
locked() { "$LEASECTL" info "$key" > /dev/null; }
check "leasectl info sees it locked" locked

call "\"op\":\"unlock\",\"key\":\"$key\",\"token\":\"$token\""
check "unlock by token: $reply" has '"released": ?true'

"$LEASECTL" info "$key" > /dev/null
rc=$?
check "leasectl info sees it free (exit $rc)" test "$rc" -eq 1

call "\"op\":\"lock\",\"key\":\"$key\""
check "a session-bound lock: $reply" has '"acquired": ?true'

session_close
not_locked() {
    "$LEASECTL" info "$key" > /dev/null 2>&1
    [ $? -eq 1 ]
}
check "closing the session releases it" wait_until 10 not_locked

exit $failed
