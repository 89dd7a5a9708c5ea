#!/bin/bash
# What this machine can show of the OCI image (`make image`): it builds,
# its root file system passes `leased -t` in a chroot as the image's user,
# the daemon runs from it with the root mounted read-only and the socket
# and journal on volumes (bind mounts in a mount namespace, as a container
# runtime would set them up) and answers ping through the shared socket,
# and, when crun can run containers here, the container itself answers
# ping. Needs root (chroot, mount), umoci, redis-server and python3 (a
# free port). Output is TAP; exit 0 when nothing failed.
#   scripts/check-image.sh BUILDDIR
set -uo pipefail

TOP=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$TOP}
WORK=$(mktemp -d)
USERSPEC=65532:65532
n=0
failed=0
pids=()

cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    command -v crun >/dev/null 2>&1 &&
        crun delete -f "leased-check-$$" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); failed=1; echo "not ok $n - $*"; }
skip() { n=$((n + 1)); echo "ok $n - $* # SKIP"; }
show() { sed 's/^/# /' "$1"; }

# Up to 10 s for the socket to answer ping.
ping_until() {
    local i
    for i in $(seq 100); do
        "$BUILD/tools/leasectl" -s "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

echo "1..5"
if "$TOP/scripts/build-image.sh" "$BUILD" "$WORK/img" > "$WORK/build.log" 2>&1; then
    ok "the image builds (umoci)"
else
    not_ok "the image builds (umoci)"
    show "$WORK/build.log"
    exit 1
fi
TAG=$(sed -n 's/^PACKAGE_VERSION = //p' "$BUILD/Makefile")
umoci unpack --image "$WORK/img/oci:$TAG" "$WORK/bundle" > /dev/null
R=$WORK/bundle/rootfs

if chroot --userspec=$USERSPEC "$R" /usr/local/sbin/leased -t \
    -c /etc/leased/leased.yml > "$WORK/t.log" 2>&1; then
    ok "leased -t in a chroot of the image's root, as user 65532"
else
    not_ok "leased -t in a chroot of the image's root, as user 65532"
    show "$WORK/t.log"
fi

# A Redis for the daemon, on a free loopback port.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    > "$WORK/redis.log" 2>&1 &
pids+=($!)
mkdir -p "$WORK/run" "$WORK/lib" "$WORK/etc"
chown $USERSPEC "$WORK/run" "$WORK/lib"
# The ConfigMap's configuration, with this Redis and no metrics port.
sed -e "s/address: redis:6379/address: 127.0.0.1:$port/" \
    -e 's/listen: 0.0.0.0:9379/listen: ""/' \
    -e 's/unix_mode: "0660"/unix_mode: "0666"/' \
    "$TOP/contrib/kubernetes/leased.yml" > "$WORK/etc/leased.yml"

unshare -m --propagation private sh -c "
    mount --bind '$R' '$R' &&
    mount --bind '$WORK/run' '$R/run/leased' &&
    mount --bind '$WORK/lib' '$R/var/lib/leased' &&
    mount --bind -o ro '$WORK/etc' '$R/etc/leased' &&
    mount -o remount,bind,ro '$R' &&
    exec chroot --userspec=$USERSPEC '$R' /usr/local/sbin/leased -f \
        -c /etc/leased/leased.yml" > "$WORK/leased.log" 2>&1 &
pids+=($!)
if ping_until "$WORK/run/leased.sock"; then
    ok "the daemon runs from the image's read-only root and answers ping on the shared socket"
else
    not_ok "the daemon runs from the image's read-only root and answers ping on the shared socket"
    show "$WORK/leased.log"
fi
if [ -s "$WORK/lib/invalidations.journal" ]; then
    ok "the journal is written on its volume"
else
    not_ok "the journal is written on its volume"
fi
kill "${pids[1]}" 2>/dev/null
wait "${pids[1]}" 2>/dev/null
rm -f "$WORK/run/leased.sock"

# The container itself, when a runtime can run one here.
if ! command -v crun >/dev/null 2>&1; then
    skip "crun is not installed: the container itself was not run"
else
    # The runtime bundle umoci made, with a read-only root, the host's
    # network (the test's Redis is on its loopback) and the volumes bound
    # to this test's directories.
    python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
path = w + "/bundle/config.json"
c = json.load(open(path))
c["root"]["readonly"] = True
c["process"]["terminal"] = False
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"]
                            if n["type"] != "network"]
vols = {"/run/leased": (w + "/run", "rw"), "/var/lib/leased": (w + "/lib", "rw"),
        "/etc/leased": (w + "/etc", "ro")}
c["mounts"] = [m for m in c["mounts"] if m["destination"] not in vols]
c["mounts"] += [{"destination": d, "type": "bind", "source": s,
                 "options": ["rbind", o]} for d, (s, o) in vols.items()]
json.dump(c, open(path, "w"))
PY
    if timeout 20 crun run -d --bundle "$WORK/bundle" "leased-check-$$" \
        > "$WORK/crun.log" 2>&1; then
        if ping_until "$WORK/run/leased.sock"; then
            ok "the container (crun) answers ping"
        else
            not_ok "the container (crun) answers ping"
        fi
        crun kill "leased-check-$$" TERM >/dev/null 2>&1
    else
        skip "crun cannot run containers here: $(head -c 200 "$WORK/crun.log" | tr '\n' ' ')"
    fi
fi
exit $failed
