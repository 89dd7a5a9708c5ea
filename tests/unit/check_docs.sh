#!/bin/sh
# Every configuration key the daemon knows (the directive table, printed by
# conf_keys) must be set in conf/leased.yml and documented in leased.yml(5),
# where its entry must say truthfully whether SIGHUP reloads it and, for a
# setting of a feature this version does not have, that it is "Not
# available in this version" (and for every other key, that it is not).
# The example of leased.yml(5) must pass "leased -t".
#
# leased.yml(5) documents a key as
#   .TP
#   .B section.key
#   Type, bounds, default; reloaded on SIGHUP.   (or: needs a restart.)
#   What it does...
# Output is TAP, one line per check.

srcdir=${LD_SRCDIR:-.}
builddir=${LD_BUILDDIR:-.}
yml=$srcdir/conf/leased.yml
man=$srcdir/man/leased.yml.5
keys_prog=$builddir/tests/unit/conf_keys
leased=${LEASED_BIN:-$builddir/src/leased}

keys=$("$keys_prog")
if [ $? -ne 0 ] || [ -z "$keys" ]; then
    echo "1..1"
    echo "not ok 1 - $keys_prog lists the configuration keys"
    exit 1
fi

# The dotted names conf/leased.yml sets: block mappings by indentation, plus
# one level of flow mapping ("near: { enabled: false, ... }"). Commented-out
# keys do not count: the file shows every key in force, at its default.
yml_keys=$(awk '
    /^[ \t]*(#|$)/ { next }
    {
        line = $0
        sub(/[ \t]+#.*$/, "", line)
        if (!match(line, /^ *[A-Za-z_][A-Za-z0-9_]*:/)) {
            next
        }
        keyend = RLENGTH
        match(line, /^ */)
        indent = RLENGTH
        key = substr(line, indent + 1, keyend - indent - 1)
        while (depth > 0 && ind[depth] >= indent) {
            depth--
        }
        depth++
        ind[depth] = indent
        name[depth] = key
        path = name[1]
        for (i = 2; i <= depth; i++) {
            path = path "." name[i]
        }
        print path
        rest = substr(line, keyend + 1)
        if (rest ~ /^ *\{/) {
            gsub(/[{}]/, "", rest)
            n = split(rest, parts, ",")
            for (j = 1; j <= n; j++) {
                p = parts[j]
                sub(/^ */, "", p)
                sub(/ *:.*$/, "", p)
                if (p != "") {
                    print path "." p
                }
            }
        }
    }' "$yml")

nkeys=$(printf '%s\n' "$keys" | wc -l)
echo "1..$((nkeys * 2 + 2))"
echo "ok 1 - conf_keys lists $nkeys keys"

n=1
failed=0
# Each line is "KEY reload" or "KEY restart", maybe followed by "unbuilt";
# the loop runs in this shell.
while read -r key when built; do
    n=$((n + 1))
    if printf '%s\n' "$yml_keys" | grep -qxF "$key"; then
        echo "ok $n - $key is set in conf/leased.yml"
    else
        echo "not ok $n - $key is set in conf/leased.yml"
        failed=$((failed + 1))
    fi

    n=$((n + 1))
    # The entry's text: the lines after ".TP" ".B KEY" up to the next
    # entry or section, joined. A key merely mentioned elsewhere does not
    # count as documented.
    summary=$(awk -v want=".B $key" '
        found && /^\.(TP|SS|SH)/ { exit }
        found { printf "%s ", $0 }
        prev == ".TP" && $0 == want { found = 1 }
        { prev = $0 }' "$man")
    problem=""
    if [ -z "$summary" ]; then
        problem="no \".TP\" \".B $key\" entry"
    elif [ "$when" = reload ]; then
        case $summary in
        *"reloaded on SIGHUP"*) ;;
        *) problem="entry does not say \"reloaded on SIGHUP\"" ;;
        esac
    else
        case $summary in
        *"needs a restart"*) ;;
        *) problem="entry does not say \"needs a restart\"" ;;
        esac
    fi
    if [ -z "$problem" ]; then
        case $built:$summary in
        unbuilt:*"Not available in this version"*) ;;
        unbuilt:*)
            problem="entry does not say \"Not available in this version\""
            ;;
        *"Not available in this version"*)
            problem="entry says \"Not available in this version\"; the key is"
            ;;
        esac
    fi
    if [ -z "$problem" ]; then
        echo "ok $n - $key is documented in leased.yml(5)"
    else
        echo "not ok $n - $key is documented in leased.yml(5)"
        echo "# $problem"
        failed=$((failed + 1))
    fi
done <<KEYS
$keys
KEYS

# The example in leased.yml(5), from ".nf" to ".fi" after ".SH EXAMPLE",
# with the man escapes undone, is a file this version accepts.
n=$((n + 1))
example=$(mktemp)
awk '
    /^\.SH/ { in_example = ($0 == ".SH EXAMPLE"); next }
    in_example && $0 == ".nf" { copying = 1; next }
    copying && $0 == ".fi" { exit }
    copying { gsub(/\\-/, "-"); print }' "$man" >"$example"
if [ -s "$example" ] && out=$("$leased" -t -c "$example" 2>&1); then
    echo "ok $n - the example of leased.yml(5) passes leased -t"
else
    echo "not ok $n - the example of leased.yml(5) passes leased -t"
    printf '%s\n' "$out" | sed 's/^/# /'
    failed=$((failed + 1))
fi
rm -f "$example"

[ "$failed" -eq 0 ]
