/* The configuration as the programs see it: a setting of a feature this
 * version does not have is refused by `leased -t`, at start-up and on
 * SIGHUP with one and the same file:line:col message, against a real
 * redis-server and the real leased. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_MS 5000    /* how long a reply may take */
#define RUN_MS 30000 /* how long leased -t or a failing start may take */

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "config",
    .redis = {&R},
    .daemons = {&D},
};

/* The first line of TEXT, without its newline, into OUT. */
static void
first_line(const char *text, char *out, size_t outlen)
{
    size_t n = strcspn(text, "\n");
    if (n >= outlen) {
        n = outlen - 1;
    }
    memcpy(out, text, n);
    out[n] = '\0';
}

/* Replace the first OLD in the file at PATH by NEW. */
static void
edit_file(const char *path, const char *old, const char *new)
{
    char buf[8192], *at;
    size_t len;
    FILE *f = fopen(path, "r");

    ck_assert_ptr_nonnull(f);
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    at = strstr(buf, old);
    ck_assert_msg(at != NULL, "no \"%s\" in %s", old, path);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fwrite(buf, 1, (size_t)(at - buf), f);
    fputs(new, f);
    fputs(at + strlen(old), f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Start a daemon with EXTRA, then turn OLD into NEW in its file: -t,
 * SIGHUP and a fresh start must each refuse the file with the message
 * that `leased -t` prints, and a refused reload must leave the daemon
 * running. */
static void
refused_everywhere(const char *extra, const char *old, const char *new,
                   const char *key_says)
{
    char out[4096], err[4096], message[1024], reload_line[1200];
    struct h_conn *c;
    int status;

    if (R.pid == 0) {
        ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    }
    ck_assert_int_eq(h_daemon_start(&D, &R, extra), 0);
    c = h_connect(&D);
    ck_assert_ptr_nonnull(c);
    h_assert_ping(c);
    edit_file(D.conf, old, new);

    /* leased -t */
    const char *test_argv[] = {h_leased_bin(), "-t", "-c", D.conf, NULL};
    status = h_run(test_argv, out, sizeof out, err, sizeof err, RUN_MS);
    ck_assert_msg(status == 1, "leased -t exited %d: %s%s", status, out, err);
    first_line(err, message, sizeof message);
    ck_assert_msg(strncmp(message, D.conf, strlen(D.conf)) == 0 &&
                      message[strlen(D.conf)] == ':',
                  "no file:line:col in \"%s\"", message);
    ck_assert_msg(strstr(message, key_says) != NULL, "\"%s\" not in \"%s\"",
                  key_says, message);

    /* SIGHUP: refused with the same message, the running daemon stays. */
    snprintf(reload_line, sizeof reload_line,
             "msg=\"reload failed, keeping the running configuration\" "
             "error=\"%s\"",
             message);
    h_daemon_signal(&D, SIGHUP);
    ck_assert_msg(h_wait_log(&D, reload_line, 15000), "log has no '%s'",
                  reload_line);
    h_assert_ping(c);
    h_close(c);
    ck_assert_int_eq(h_daemon_stop(&D), 0);

    /* Start-up: exits 1 before listening, printing the same message. */
    const char *start_argv[] = {h_leased_bin(), "-f", "-c", D.conf, NULL};
    status = h_run(start_argv, out, sizeof out, err, sizeof err, RUN_MS);
    ck_assert_msg(status == 1, "leased -f exited %d: %s%s", status, out, err);
    ck_assert_msg(strstr(err, message) != NULL,
                  "start-up did not say \"%s\":\n%s", message, err);
}

START_TEST(test_redlock_refused)
{
    refused_everywhere("lock:\n  redlock: []\n", "redlock: []",
                       "redlock: [\"127.0.0.1:1\", \"127.0.0.1:2\"]",
                       "lock.redlock: Redlock needs at least 3 instances");
}
END_TEST

/* Cluster mode has one database only. */
START_TEST(test_cluster_db_refused)
{
    char extra[256];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(extra, sizeof extra,
             "redis:\n  address: 127.0.0.1:%d\n  db: 1\n"
             "  mode: standalone\n",
             R.port);
    refused_everywhere(extra, "mode: standalone", "mode: cluster",
                       "redis.db: must be 0 in cluster mode");
}
END_TEST

START_TEST(test_defaults_accepted)
{
    char out[4096], err[4096];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R,
                                    "cache:\n  near: { enabled: false, "
                                    "max_bytes: 67108864 }\n"
                                    "lock:\n  redlock: []\n"),
                     0);
    const char *argv[] = {h_leased_bin(), "-t", "-c", D.conf, NULL};
    ck_assert_int_eq(h_run(argv, out, sizeof out, err, sizeof err, RUN_MS), 0);
    ck_assert_msg(strstr(out, "is valid") != NULL, "-t said: %s%s", out, err);
}
END_TEST

/* lock.layout redisson with lock.prefix "": the setting a Java user
 * writes starts, a lock is the bare name Redisson uses, and semaphores
 * (the only keys under the prefix there) work too. */
START_TEST(test_redisson_empty_prefix)
{
    const char *yaml = "lock:\n  layout: redisson\n  prefix: \"\"\n";
    char out[4096], err[4096];
    struct h_conn *c;
    json_t *r;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    const char *argv[] = {h_leased_bin(), "-t", "-c", D.conf, NULL};
    ck_assert_int_eq(h_run(argv, out, sizeof out, err, sizeof err, RUN_MS), 0);
    c = h_connect(&D);
    ck_assert_ptr_nonnull(c);
    r = h_must(h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "orders"));
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "HLEN orders"), 1);
    r = h_must(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "sem.acquire", "key",
                       "pool", "limit", 1));
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "ZCARD {pool}:sem"), 1);
    h_close(c);
}
END_TEST

/* The long options GNU tools teach users to try, beside the short ones. */
START_TEST(test_long_options)
{
    char out[4096], err[4096];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NULL), 0);
    const char *version[] = {h_leased_bin(), "--version", NULL};
    ck_assert_int_eq(h_run(version, out, sizeof out, err, sizeof err, RUN_MS),
                     0);
    ck_assert_msg(!strncmp(out, "leased ", 7), "--version: %s%s", out, err);
    const char *v[] = {h_leased_bin(), "-v", NULL};
    ck_assert_int_eq(h_run(v, out, sizeof out, err, sizeof err, RUN_MS), 0);
    ck_assert_msg(!strncmp(out, "leased ", 7), "-v: %s%s", out, err);
    const char *help[] = {h_leased_bin(), "--help", NULL};
    ck_assert_int_eq(h_run(help, out, sizeof out, err, sizeof err, RUN_MS), 0);
    ck_assert_msg(strstr(out, "--config FILE") && strstr(out, "--test") &&
                      strstr(out, "/leased/leased.yml"),
                  "--help: %s%s", out, err);
    const char *test[] = {h_leased_bin(), "--test", "--config", D.conf, NULL};
    ck_assert_int_eq(h_run(test, out, sizeof out, err, sizeof err, RUN_MS), 0);
    ck_assert_msg(strstr(out, "is valid") != NULL, "--test: %s%s", out, err);
    /* Without -c and without the default file, -t says it checked the
     * built-in defaults (a machine that has the file is not changed). */
    if (access(LD_SYSCONFDIR "/leased/leased.yml", F_OK) != 0) {
        const char *dflt[] = {h_leased_bin(), "-t", NULL};
        ck_assert_int_eq(h_run(dflt, out, sizeof out, err, sizeof err, RUN_MS),
                         0);
        ck_assert_str_eq(out, "no configuration file " LD_SYSCONFDIR
                              "/leased/leased.yml: the built-in defaults "
                              "are valid\n");
    }
    const char *bad[] = {h_leased_bin(), "--frobnicate", NULL};
    ck_assert_int_eq(h_run(bad, out, sizeof out, err, sizeof err, RUN_MS), 2);
    ck_assert_msg(strstr(err, "--frobnicate") != NULL, "stderr: %s", err);
}
END_TEST

/* A start-up error names its cause in words, as the others do, not as a
 * raw errno. */
START_TEST(test_metrics_bind_worded)
{
    char extra[128];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    /* Redis holds this port already. */
    snprintf(extra, sizeof extra, "metrics:\n  listen: \"127.0.0.1:%d\"\n",
             R.port);
    fprintf(stderr, "(a start-up failure is expected below)\n");
    ck_assert_int_ne(h_daemon_start(&D, &R, extra), 0);
    ck_assert_msg(h_log_has(&D, "msg=\"metrics bind failed\"") &&
                      h_log_has(&D, "error=\"Address already in use\""),
                  "the bind failure is not worded");
    ck_assert(!h_log_has(&D, "errno="));
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(redlock_refused, 90),   H_CASE(cluster_db_refused, 90),
        H_CASE(defaults_accepted, 60), H_CASE(redisson_empty_prefix, 60),
        H_CASE(long_options, 60),      H_CASE(metrics_bind_worded, 60),
    };

    return H_MAIN(fx, cases);
}
