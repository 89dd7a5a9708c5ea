#!/bin/sh
# Checks the lock and invalidation models with spin (tests/model/README).
#   check_model.sh          the bounded check of make check: every property
#                           holds, and spin finds each seeded bug
#   check_model.sh deep     make model: larger bounds and every fault at
#                           once, with the state counts
#   check_model.sh limits   make model-limits: the counterexamples to P4
#                           under pauses, data loss and failover
# Output is TAP. pan and its files go to a temporary directory.

srcdir=${LD_SRCDIR:-.}
models=$srcdir/tests/model
mode=${1:-check}
cc=${CC:-cc}
# The bounded check's verifiers are small: compiling them fast matters
# more than running them fast. The deeper ones are the other way round.
opt=-O0
hash=-w24
if [ "$mode" = deep ]; then
    opt=-O2
    hash=-w26
fi

n=0
failed=0
ok() {
    n=$((n + 1))
    echo "ok $n - $1"
}
not_ok() {
    n=$((n + 1))
    echo "not ok $n - $1"
    failed=$((failed + 1))
}

# A missing tool fails the check: it must not pass by not running.
for tool in spin "$cc"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "1..1"
        echo "not ok 1 - $tool is installed (scripts/quickstart.sh)"
        exit 1
    fi
done

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

# run NAME MODEL EXPECT PATTERN [SPIN_DEFINES...]
# EXPECT "holds": spin explores every state and finds nothing.
# EXPECT "fails": spin finds a violated assertion whose text contains
# PATTERN (so that a seeded bug is caught by the property meant to catch
# it); the trail's steps are shown.
run() {
    name=$1 model=$2 expect=$3 pattern=$4
    shift 4
    dir=$tmp/$n
    mkdir -p "$dir"
    cp "$models/$model" "$dir/" || {
        not_ok "$name: $model is there"
        return
    }
    start=$(date +%s)
    # A bug is looked for breadth first: spin then shows the shortest
    # counterexample.
    search=
    if [ "$expect" = fails ]; then
        search=-DBFS
    fi
    if ! (cd "$dir" && spin -a "$@" "$model" >spin.log 2>&1 &&
        $cc $opt -w -DSAFETY -DNOREDUCE $search -o pan pan.c \
            >cc.log 2>&1); then
        not_ok "$name: spin and $cc build the verifier"
        sed 's/^/# /' "$dir/spin.log" "$dir/cc.log" | head -20
        return
    fi
    (cd "$dir" && ./pan -m1000000 $hash >pan.log 2>&1)
    secs=$(($(date +%s) - start))
    errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$dir/pan.log")
    states=$(awk '/states, stored/ { print $1; exit }' "$dir/pan.log")
    info="$states states, ${secs}s"
    if [ "$expect" = holds ]; then
        if [ "$errors" = 0 ] && ! grep -q 'Search not completed' \
            "$dir/pan.log"; then
            ok "$name: holds ($info)"
        else
            not_ok "$name: holds ($info)"
            trail "$dir" "$model" "$@"
        fi
        return
    fi
    if [ -n "$errors" ] && [ "$errors" -gt 0 ] &&
        grep 'assertion violated' "$dir/pan.log" | grep -qF "$pattern"; then
        ok "$name: spin finds it ($info)"
        if [ "$mode" != check ]; then
            trail "$dir" "$model" "$@"
        fi
    else
        not_ok "$name: spin finds it ($info)"
        sed 's/^/# /' "$dir/pan.log" | head -20
    fi
}

# The steps of the counterexample, as the model's printf lines name them.
trail() {
    dir=$1 model=$2
    shift 2
    grep 'assertion violated\|invalid end state' "$dir/pan.log" |
        sed 's/^/# /'
    if [ -f "$dir/$model.trail" ]; then
        (cd "$dir" && spin -t "$@" "$model" 2>&1) |
            grep -E '^ +(s[0-9]|d[0-9]|tick|replicate|redis|failover)' |
            sed 's/^ */#   /'
    fi
}

# Fault budgets: none, or one of each kind named.
none="-DN_LOSS=0 -DN_FAILOVER=0 -DN_CRASH=0 -DN_PAUSE=0"
only() {
    for f in N_LOSS N_FAILOVER N_CRASH N_PAUSE; do
        case " $* " in
        *" $f "*) printf ' -D%s=1' "$f" ;;
        *) printf ' -D%s=0' "$f" ;;
        esac
    done
}

# shellcheck disable=SC2046 # the defines are words
case $mode in
check)
    echo "1..13"
    b="-DMAXG=2 -DMAXT=5"
    run "P1-P4 without faults" lock.pml holds "" $b $none
    run "P1-P4 with a pause" lock.pml holds "" -DMAXG=2 -DMAXT=4 \
        $(only N_PAUSE)
    run "P1-P4 with a daemon crash" lock.pml holds "" $b $(only N_CRASH)
    run "P1-P4 with Redis data loss" lock.pml holds "" $b $(only N_LOSS)
    # A third grant, so that a fence raised by lock_refence is one a
    # lost counter could hand out again.
    run "P1-P4 with Redis data loss, 3 grants" lock.pml holds "" -DMAXG=3 \
        -DMAXT=5 $(only N_LOSS)
    run "P1-P4 with a failover" lock.pml holds "" -DMAXG=2 -DMAXT=3 \
        $(only N_FAILOVER)
    run "P5 across daemon crashes" inval.pml holds ""
    run "seeded NO_FLOOR breaks P2" lock.pml fails "p2_max" \
        -DNO_FLOOR $b $(only N_LOSS)
    run "seeded NO_REFENCE_RAISE breaks P2" lock.pml fails "p2_max" \
        -DNO_REFENCE_RAISE -DMAXG=3 -DMAXT=5 $(only N_LOSS)
    run "seeded LATE_LOST breaks P3" lock.pml fails "s_lend[i]-1" \
        -DLATE_LOST $b $none
    run "seeded REUSE_TOKEN breaks P4" lock.pml fails "c_hold" \
        -DREUSE_TOKEN $b $none
    run "seeded SILENT_LOSS breaks P3" lock.pml fails "s_held[i]" \
        -DSILENT_LOSS $b $(only N_LOSS)
    run "seeded NO_JOURNAL_SECOND breaks P5" inval.pml fails "second_done" \
        -DNO_JOURNAL_SECOND
    ;;
deep)
    echo "1..8"
    d="-DMAXG=3 -DMAXT=6"
    run "P1-P4 without faults, 3 sessions" lock.pml holds "" -DNS=3 \
        -DMAXG=3 -DMAXT=5 $none
    run "P1-P4 with a pause" lock.pml holds "" $d $(only N_PAUSE)
    run "P1-P4 with a daemon crash" lock.pml holds "" $d $(only N_CRASH)
    run "P1-P4 with Redis data loss" lock.pml holds "" $d $(only N_LOSS)
    run "P1-P4 with a failover" lock.pml holds "" -DMAXG=2 -DMAXT=4 \
        $(only N_FAILOVER)
    # Every fault at once is too many states; two at a time.
    run "P1-P4 with a pause and data loss" lock.pml holds "" -DMAXG=2 \
        -DMAXT=4 $(only N_PAUSE N_LOSS)
    run "P1-P4 with a crash and a failover" lock.pml holds "" -DMAXG=2 \
        -DMAXT=4 $(only N_CRASH N_FAILOVER)
    run "P5 across daemon crashes" inval.pml holds "" -DN_CRASH=4 -DN_FAIL=4
    ;;
limits)
    echo "1..3"
    b="-DMAXG=2 -DMAXT=5 -DLIMITS"
    run "P4 under a pause" lock.pml fails "c_hold" $b $(only N_PAUSE)
    run "P4 under Redis data loss" lock.pml fails "c_hold" $b $(only N_LOSS)
    run "P4 under a failover" lock.pml fails "c_hold" $b $(only N_FAILOVER)
    ;;
*)
    echo "usage: $0 [check|deep|limits]" >&2
    exit 2
    ;;
esac
[ "$failed" -eq 0 ]
