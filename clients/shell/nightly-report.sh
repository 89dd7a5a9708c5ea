#!/bin/sh
# nightly-report.sh: a cron job that must never run twice at once, on this
# host or on any other host whose leased shares the same Redis.
#
#   # crontab
#   0 2 * * *  /usr/local/bin/nightly-report.sh
#
# The script takes the lock "nightly-report" with leasectl and runs itself
# again with --run under it. leased renews the lock for as long as
# leasectl's connection lives, however long the report takes.
#   * A second copy started while the first runs exits 75 (EX_TEMPFAIL)
#     without running the job; cron mails nothing if you add -q.
#   * If the lock is lost while the job runs (Redis lost it, leased
#     stopped), the job gets SIGTERM and leasectl exits 70.
#   * Otherwise the exit status is the job's.
#
# Environment: LEASECTL (the leasectl binary), LEASED_SOCKET (the daemon),
# REPORT_DIR (where the report goes), REPORT_SECONDS (how long the stand-in
# work takes), REPORT_LOCK (the lock's name).
set -eu

if [ "${1:-}" != "--run" ]; then
    exec "${LEASECTL:-leasectl}" lock "${REPORT_LOCK:-nightly-report}" \
        -- /bin/sh "$0" --run
fi

# --- the job: runs only while the lock is held ---------------------------
out=${REPORT_DIR:-/var/lib/reports}
trap 'echo "report interrupted" >> "$out/runs.log"; exit 143' TERM
echo "report started pid $$" >> "$out/runs.log"
sleep "${REPORT_SECONDS:-1}"            # the real work goes here
echo "report done pid $$" > "$out/last-report.txt"
