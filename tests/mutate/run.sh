#!/bin/sh
# Mutation run: does a small, plausible bug in the safety code turn a test
# red? Each entry of the list (tests/mutate/mutations.txt, its format at
# its top) changes one line of one file. The tree is copied once (make
# distdir, configure, build); then, for each mutation: the line is
# changed in the copy, make rebuilds what depends on it (a .lua file
# too: src/lua/ld_lua.c is made from the scripts), the test programs the
# entry names run one after the other until one fails, and the file is
# put back. Each mutation is CAUGHT (by the first program that failed)
# or MISSED; the end prints the score and the survivors.
#
# usage: tests/mutate/run.sh [--check] [ID...]
#   run from a configured build tree (make mutate does). IDs (or
#   MUTATE_IDS) choose entries; none means all. --check only validates
#   the list. Environment: MUTATE_LIST (the list), MUTATE_DIR (the work
#   directory; a copy already built there is reused; default: a new
#   temporary one, removed at the end unless MUTATE_KEEP=1),
#   MUTATE_CONFIGURE (configure flags of the copy), MUTATE_TIMEOUT (per
#   test program, default 30m), MAKE.
# Exit status: 0 every mutation caught (or equivalent), 1 survivors,
# 2 a list that does not apply (a find text not found: the list rotted),
# a mutation that does not build, or a copy that does not build.

set -eu

srcdir=$(cd "$(dirname "$0")/../.." && pwd)
builddir=$(pwd)
list=${MUTATE_LIST:-$srcdir/tests/mutate/mutations.txt}
make_cmd=${MAKE:-make}
timeout_s=${MUTATE_TIMEOUT:-30m}
check_only=no
want=${MUTATE_IDS:-}
for a in "$@"; do
    case $a in
    --check) check_only=yes ;;
    -*)
        echo "usage: $0 [--check] [ID...]" >&2
        exit 2
        ;;
    *) want="$want $a" ;;
    esac
done

US=$(printf '\037')
tmp=$(mktemp -d "${TMPDIR:-/tmp}/leased-mutate-list.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The list as one record a line: id, file, find, replace, nth, tests,
# equivalent, separated by \037. Blocks are "key: value" lines separated
# by blank lines; "#" starts a comment line.
awk -v US="$US" '
    function flush() {
        if (n == 0) {
            return
        }
        printf "%s%s%s%s%s%s%s%s%s%s%s%s%s%s%d\n", f["id"], US, f["file"], \
            US, f["find"], US, f["replace"], US, f["nth"], US, f["tests"], \
            US, f["equivalent"], US, start
        delete f
        n = 0
    }
    /^[ \t]*#/ { next }
    /^[ \t]*$/ { flush(); next }
    {
        i = index($0, ":")
        if (i == 0) {
            printf "%s:%d: not a \"key: value\" line\n", FILENAME, NR \
                > "/dev/stderr"
            bad = 1
            next
        }
        k = substr($0, 1, i - 1)
        v = substr($0, i + 1)
        sub(/^ /, "", v)
        if (k !~ /^(id|file|find|replace|nth|tests|equivalent)$/) {
            printf "%s:%d: unknown key \"%s\"\n", FILENAME, NR, k \
                > "/dev/stderr"
            bad = 1
            next
        }
        if (n == 0) {
            start = NR
        }
        f[k] = v
        n++
    }
    END { flush(); exit bad }' "$list" > "$tmp/list" || exit 2

# Lines of FILE whose text, without leading and trailing blanks, is
# MUT_FIND: how many (no REPLACE), or FILE with the MUT_NTH-th of them
# replaced by MUT_REPLACE (its indentation kept). Through ENVIRON, so
# that backslashes in the texts stay as they are.
mut_awk() {
    awk -v mode="$1" '
        BEGIN { find = ENVIRON["MUT_FIND"]; nth = ENVIRON["MUT_NTH"] + 0 }
        {
            t = $0
            sub(/^[ \t]+/, "", t)
            sub(/[ \t]+$/, "", t)
            if (t == find) {
                seen++
                if (mode == "apply" && seen == nth) {
                    match($0, /^[ \t]*/)
                    print substr($0, 1, RLENGTH) ENVIRON["MUT_REPLACE"]
                    next
                }
            }
            if (mode == "apply") {
                print
            }
        }
        END { if (mode == "count") print seen + 0 }' "$2"
}

# The program of test NAME (check_locks, or a path as in TESTS).
# Is the test program P (from the top of the tree) another program's
# source built again (check_sem_layout2), named only in a Makefile part?
built_again() {
    grep -qx "check_PROGRAMS += $1" "$srcdir"/tests/*/*.am
}

test_path() {
    case $1 in
    */*) echo "$1" ;;
    *)
        if [ -f "$srcdir/tests/integration/$1.c" ] ||
            built_again "tests/integration/$1"; then
            echo "tests/integration/$1"
        elif [ -f "$srcdir/tests/unit/$1.c" ]; then
            echo "tests/unit/$1"
        else
            echo "tests/unit/$1.sh"
        fi
        ;;
    esac
}

# Validate the whole list, whatever is chosen: a find text that is gone
# or ambiguous is an error, so that the list cannot rot unnoticed.
errors=0
ids_seen=" "
while IFS="$US" read -r id file find replace nth tests equiv line; do
    where="$list:$line"
    if [ -z "$id" ] || [ -z "$file" ] || [ -z "$find" ] || [ -z "$tests" ]; then
        echo "$where: an entry needs id, file, find, replace and tests" >&2
        errors=$((errors + 1))
        continue
    fi
    case $ids_seen in
    *" $id "*)
        echo "$where: id $id is used twice" >&2
        errors=$((errors + 1))
        ;;
    esac
    ids_seen="$ids_seen$id "
    if [ ! -f "$srcdir/$file" ]; then
        echo "$where: $id: no file $file" >&2
        errors=$((errors + 1))
        continue
    fi
    if [ "$find" = "$replace" ]; then
        echo "$where: $id: the replacement is the find text" >&2
        errors=$((errors + 1))
    fi
    count=$(MUT_FIND=$find mut_awk count "$srcdir/$file")
    if [ "$count" -eq 0 ]; then
        echo "$where: $id: find text not in $file: $find" >&2
        errors=$((errors + 1))
    elif [ -z "$nth" ] && [ "$count" -gt 1 ]; then
        echo "$where: $id: find text is on $count lines of $file;" \
            "say which (nth:)" >&2
        errors=$((errors + 1))
    elif [ -n "$nth" ] && [ "$nth" -gt "$count" ]; then
        echo "$where: $id: nth $nth, but the text is on $count lines" >&2
        errors=$((errors + 1))
    fi
    for t in $tests; do
        p=$(test_path "$t")
        if [ ! -f "$srcdir/$p.c" ] && [ ! -f "$srcdir/$p" ] &&
            ! built_again "$p"; then
            echo "$where: $id: no test program $t" >&2
            errors=$((errors + 1))
        fi
    done
done < "$tmp/list"
for w in $want; do
    case $ids_seen in
    *" $w "*) ;;
    *)
        echo "mutate: no mutation $w in $list" >&2
        errors=$((errors + 1))
        ;;
    esac
done
total=$(wc -l < "$tmp/list")
if [ "$errors" -gt 0 ]; then
    echo "mutate: $errors error(s) in $list" >&2
    exit 2
fi
if [ "$check_only" = yes ]; then
    echo "mutate: $total mutations, all apply"
    exit 0
fi

# One copy of the tree, built once: the mutations change it one line at
# a time and make rebuilds only what depends on that line.
if [ -n "${MUTATE_DIR:-}" ]; then
    work=$MUTATE_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/leased-mutate.XXXXXX")
    if [ "${MUTATE_KEEP:-0}" != 1 ]; then
        trap 'rm -rf "$tmp" "$work"' EXIT
    fi
fi
tree=$work/tree
# The copy, configured and built with its test programs (MUTATE_CONFIGURE
# is split into words on purpose: it holds flags).
build_copy() {
    (cd "$builddir" && "$make_cmd" -s distdir distdir="$tree") || return 1
    cd "$tree" || return 1
    # shellcheck disable=SC2086
    ./configure -q ${MUTATE_CONFIGURE:-} || return 1
    "$make_cmd" -s -j2 && "$make_cmd" -s -j2 check TESTS=
}
if [ ! -f "$work/built" ]; then
    echo "mutate: copying and building the tree in $tree"
    rm -rf "$tree"
    if ! (build_copy) < /dev/null > "$work/build.log" 2>&1; then
        tail -n 40 "$work/build.log" >&2
        echo "mutate: the unchanged copy does not build" >&2
        exit 2
    fi
    : > "$work/built"
fi

caught=0
missed=0
equivalent=0
broken=0
survivors=
equivalents=
i=0
: > "$work/results"
while IFS="$US" read -r id file find replace nth tests equiv line; do
    if [ -n "$want" ]; then
        case " $want " in
        *" $id "*) ;;
        *) continue ;;
        esac
    fi
    i=$((i + 1))
    t0=$(date +%s)
    cp "$tree/$file" "$work/orig"
    MUT_FIND=$find MUT_REPLACE=$replace MUT_NTH=${nth:-1} \
        mut_awk apply "$work/orig" > "$tree/$file"
    result=MISSED
    by=
    if ! (cd "$tree" && "$make_cmd" -s -j2 &&
        "$make_cmd" -s -j2 check TESTS=) \
        < /dev/null > "$work/$id.build.log" 2>&1; then
        result=BROKEN
    else
        for t in $tests; do
            p=$(test_path "$t")
            if ! (cd "$tree" && timeout "$timeout_s" "$make_cmd" -s check \
                TESTS="$p") < /dev/null > "$work/$id.$t.log" 2>&1; then
                result=CAUGHT
                by=$t
                c=$(sed -n 's/^not ok [0-9]* - [^:]*:\([^:]*\):.*/\1/p' \
                    "$tree/$p.log" 2> /dev/null | head -n 1)
                if [ -n "$c" ]; then
                    by="$t ($c)"
                fi
                break
            fi
        done
    fi
    # Put the file back with a new time, so that the next build
    # rebuilds what the mutation changed.
    cp "$work/orig" "$tree/$file"
    touch "$tree/$file"
    took=$(($(date +%s) - t0))
    case $result in
    CAUGHT)
        caught=$((caught + 1))
        echo "$id: CAUGHT by $by (${took}s)"
        ;;
    BROKEN)
        broken=$((broken + 1))
        echo "$id: BROKEN: does not build (see $work/$id.build.log)"
        ;;
    MISSED)
        if [ -n "$equiv" ]; then
            equivalent=$((equivalent + 1))
            equivalents="$equivalents $id"
            echo "$id: MISSED, equivalent: $equiv (${took}s)"
        else
            missed=$((missed + 1))
            survivors="$survivors $id"
            echo "$id: MISSED by $tests (${took}s)"
        fi
        ;;
    esac
    echo "$id $result $by" >> "$work/results"
done < "$tmp/list"

counted=$((caught + missed))
if [ "$counted" -gt 0 ]; then
    pct=$((caught * 100 / counted))
else
    pct=100
fi
echo "mutate: score $caught/$counted caught ($pct%) of $i run;" \
    "$equivalent equivalent, $broken broken"
echo "mutate: survivors:${survivors:- none}"
if [ -n "$equivalents" ]; then
    echo "mutate: equivalent:$equivalents"
fi
if [ "$broken" -gt 0 ]; then
    exit 2
fi
if [ "$missed" -gt 0 ]; then
    exit 1
fi
exit 0
