#!/bin/sh
# contrib/monitoring as Prometheus reads it: the rules load (promtool check
# rules) and every alert fires, and only fires, on the series of its unit
# test (promtool test rules). promtool comes with Debian's prometheus
# package; without it this fails, saying so. Output is TAP.
srcdir=${LD_SRCDIR:-.}
dir="$srcdir/contrib/monitoring"
promtool=${PROMTOOL:-promtool}
echo "1..3"
if ! command -v "$promtool" >/dev/null 2>&1; then
    echo "not ok 1 - promtool not found (Debian package prometheus)"
    echo "not ok 2 - promtool test rules # not run"
    echo "not ok 3 - every alert has a unit test # not run"
    exit 1
fi
status=0
if out=$("$promtool" check rules "$dir/leased-rules.yml" 2>&1); then
    echo "ok 1 - promtool check rules leased-rules.yml"
else
    echo "not ok 1 - promtool check rules leased-rules.yml"
    printf '%s\n' "$out" | sed 's/^/# /'
    status=1
fi
# promtool resolves rule_files against the test file's directory.
if out=$(cd "$dir" && "$promtool" test rules leased-rules.test.yml 2>&1); then
    echo "ok 2 - promtool test rules leased-rules.test.yml"
else
    echo "not ok 2 - promtool test rules leased-rules.test.yml"
    printf '%s\n' "$out" | sed 's/^/# /'
    status=1
fi
missing=
for a in $(sed -n 's/^ *- alert: *//p' "$dir/leased-rules.yml"); do
    if ! grep -q "alertname: *$a\$" "$dir/leased-rules.test.yml"; then
        missing="$missing $a"
    fi
done
if [ -z "$missing" ]; then
    echo "ok 3 - every alert has a unit test"
else
    echo "not ok 3 - alerts without a unit test:$missing"
    status=1
fi
exit $status
