#!/bin/sh
# The short make jepsen of CI (root only, else skipped): the checker on
# planted anomalies, then every nemesis for JEPSEN_CI_SECONDS (default 12)
# on Redis with Sentinels, then JEPSEN_CI_CLUSTER_NEMESES for
# JEPSEN_CI_CLUSTER_SECONDS (default 10) on a Redis Cluster: about 3
# minutes in all; fails on any anomaly of (a), (c) or (d).
# jepsen.py removes its namespaces and kills its processes by pid on any
# exit, failure included.
srcdir=${LD_SRCDIR:-$(dirname "$0")/../..}
builddir=${LD_BUILDDIR:-.}
echo "1..3"
if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
    echo "ok 1 # SKIP needs root and ip netns"
    echo "ok 2 # SKIP needs root and ip netns"
    echo "ok 3 # SKIP needs root and ip netns"
    exit 0
fi
failed=0
if python3 "$srcdir/tests/jepsen/checker_selftest.py"; then
    echo "ok 1 - the checker finds planted anomalies"
else
    echo "not ok 1 - the checker finds planted anomalies"
    failed=1
fi
out=$(FPCTL_BIN="$builddir/tests/jepsen/fpctl" nice python3 \
    "$srcdir/tests/jepsen/jepsen.py" run \
    --seconds "${JEPSEN_CI_SECONDS:-12}" 2>&1)
rc=$?
echo "$out" | sed 's/^/# /'
if [ $rc = 0 ]; then
    echo "ok 2 - no anomaly of (a), (c) or (d) under any nemesis"
else
    echo "not ok 2 - no anomaly of (a), (c) or (d) under any nemesis"
    failed=1
fi
# On a cluster the nemeses that differ most from Sentinel: a partition,
# one daemon's links to every node through the fault proxy, the lock's
# master stopped (the cluster promotes its replica when the pause
# outlasts cluster-node-timeout) and killed.
out=$(FPCTL_BIN="$builddir/tests/jepsen/fpctl" nice python3 \
    "$srcdir/tests/jepsen/jepsen.py" run --backend cluster \
    --nemesis "${JEPSEN_CI_CLUSTER_NEMESES:-partition,oneway,pause-redis,failover}" \
    --seconds "${JEPSEN_CI_CLUSTER_SECONDS:-10}" 2>&1)
rc=$?
echo "$out" | sed 's/^/# /'
if [ $rc = 0 ]; then
    echo "ok 3 - no anomaly of (a), (c) or (d) on a Redis Cluster"
else
    echo "not ok 3 - no anomaly of (a), (c) or (d) on a Redis Cluster"
    failed=1
fi
exit $failed
