#!/bin/sh
# The packages of src/ include each other in one direction (lock, sem,
# cache -> lease -> front -> redis -> core) and the modules without a
# cycle, so a lower package can be tested, and read, without the ones
# above it. Output is TAP.
srcdir=${LD_SRCDIR:-.}
echo "1..1"
if out=$(python3 "$srcdir/scripts/include-graph.py" "$srcdir/src" 2>&1); then
    echo "ok 1 - src/ includes follow the package order, without a cycle"
else
    echo "not ok 1 - src/ has an include against the package order or a cycle"
    printf '%s\n' "$out" | sed 's/^/# /'
    exit 1
fi
