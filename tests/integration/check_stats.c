/* The Prometheus endpoint of a real leased, after real lock and cache
 * traffic against a real redis-server, as Prometheus' own linter sees it:
 * `promtool check metrics` (Debian package prometheus) must find nothing
 * to say. Without promtool the whole program is skipped, saying so. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define T_MS 5000    /* how long a reply may take */
#define RUN_MS 60000 /* promtool on a loaded machine */

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "stats",
    .redis = {&R},
    .daemons = {&D},
};
static char promtool[4096];

/* promtool from $PROMTOOL or $PATH into `promtool`; false if none. */
static bool
find_promtool(void)
{
    const char *env = getenv("PROMTOOL");
    const char *path = getenv("PATH");

    if (env != NULL && env[0] != '\0') {
        snprintf(promtool, sizeof promtool, "%s", env);
        return access(promtool, X_OK) == 0;
    }
    while (path != NULL && *path != '\0') {
        size_t n = strcspn(path, ":");
        snprintf(promtool, sizeof promtool, "%.*s/promtool", (int)n, path);
        if (n > 0 && access(promtool, X_OK) == 0) {
            return true;
        }
        path += n + (path[n] == ':');
    }
    return false;
}

static void
call_ok(json_t *reply)
{
    ck_assert_msg(h_ok(reply), "request failed");
    json_decref(reply);
}

START_TEST(test_promtool_accepts_metrics)
{
    char yaml[128], path[512], out[8192], err[8192];
    int port = h_free_port();
    struct h_conn *c;
    FILE *f;

    snprintf(yaml, sizeof yaml, "metrics:\n  listen: 127.0.0.1:%d\n", port);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);

    /* Traffic, so that counters, per-op and per-code series and every
     * histogram have samples to show. */
    c = h_connect(&D);
    ck_assert_ptr_nonnull(c);
    call_ok(h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "m"));
    call_ok(h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", "m"));
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "m");
    ck_assert_ptr_nonnull(r);
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "no.such.op");
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_nonnull(h_errcode(r));
    json_decref(r);
    h_close(c);

    char *body = h_get_metrics(port);
    ck_assert_msg(strstr(body, "\nleased_redis_rtt_seconds_count ") != NULL,
                  "no Redis round-trip histogram in:\n%s", body);
    snprintf(path, sizeof path, "%s/metrics.txt", D.dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(body, f), 0);
    ck_assert_int_eq(fclose(f), 0);
    free(body);

    /* promtool reads the exposition on its standard input. */
    char script[sizeof promtool + sizeof path + 64];
    snprintf(script, sizeof script, "exec '%s' check metrics < '%s'", promtool,
             path);
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    int status = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    ck_assert_msg(status == 0, "promtool check metrics exited %d:\n%s%s",
                  status, out, err);
}
END_TEST

/* The ages an alert needs, which no counter gives: how long the oldest
 * lock request has waited, and how late the oldest pending delete is. */
START_TEST(test_oldest_wait_and_overdue_delete)
{
    char yaml[128];
    int port = h_free_port();

    snprintf(yaml, sizeof yaml, "metrics:\n  listen: 127.0.0.1:%d\n", port);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    struct h_conn *holder = h_connect_ok(&D);
    struct h_conn *waiter = h_connect_ok(&D);
    struct h_conn *c = h_connect_ok(&D);

    call_ok(h_callf(holder, T_MS, "{s:s,s:s}", "op", "lock", "key", "w"));
    ck_assert_int_eq(h_stat(c, "lock_wait_oldest_ms"), 0);
    ck_assert_int_ge(h_send(waiter, "{s:s,s:s,s:i}", "op", "lock", "key", "w",
                            "wait_ms", 20000),
                     0);
    ck_assert(h_wait_stat(c, "lock_waiters", 1, T_MS));
    ck_assert(h_wait_stat_min(c, "lock_wait_oldest_ms", 300, T_MS));
    call_ok(h_callf(holder, T_MS, "{s:s,s:s}", "op", "unlock", "key", "w"));
    json_t *granted = h_recv(waiter, T_MS);
    ck_assert_msg(h_ok(granted), "the waiter was not granted the lock");
    json_decref(granted);
    h_assert_stat(c, "lock_wait_oldest_ms", 0, T_MS);

    /* With Redis gone the delete stays in the journal past its due time. */
    ck_assert_int_eq(h_stat(c, "cache_invalidations_overdue_ms"), 0);
    h_redis_kill(&R);
    call_ok(h_callf(c, T_MS, "{s:s,s:[s]}", "op", "cache.invalidate", "keys",
                    "gone"));
    ck_assert(h_wait_stat_min(c, "cache_invalidations_overdue_ms", 300, T_MS));
    char *body = h_get_metrics(port);
    ck_assert_ptr_nonnull(
        strstr(body, "\nleased_lock_wait_oldest_seconds 0\n"));
    ck_assert_ptr_nonnull(
        strstr(body, "\nleased_cache_invalidations_overdue_seconds 0."));
    free(body);
    h_close(holder);
    h_close(waiter);
    h_close(c);
}
END_TEST

int
main(void)
{
    if (!find_promtool()) {
        /* The TAP way to skip a whole program. */
        printf("1..0 # SKIP promtool not found (Debian package prometheus; "
               "or set PROMTOOL)\n");
        return 0;
    }
    const struct h_case cases[] = {
        H_CASE(promtool_accepts_metrics, 120),
        H_CASE(oldest_wait_and_overdue_delete, 60),
    };

    return H_MAIN(fx, cases);
}
