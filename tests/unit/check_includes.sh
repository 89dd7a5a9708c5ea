#!/bin/sh
# The modules of src/ include each other without a cycle: dependencies
# point down (feature modules on top, the Redis backend and sessions in
# the middle, util/log/conf at the bottom), so a lower module can be
# tested, and read, without the ones above it. Output is TAP.
srcdir=${LD_SRCDIR:-.}
echo "1..1"
if out=$(python3 "$srcdir/scripts/include-graph.py" "$srcdir/src" 2>&1); then
    echo "ok 1 - the include graph of src/ has no cycle"
else
    echo "not ok 1 - the include graph of src/ has a cycle"
    printf '%s\n' "$out" | sed 's/^/# /'
    exit 1
fi
