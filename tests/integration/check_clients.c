/* The client examples under clients/, each against its own redis-server
 * and leased: Python (standard library), Node.js (no npm packages) and
 * POSIX shell with leasectl and socat, with the tests of the Python and
 * Node packages. Each example is a test program of its own; this driver
 * starts the servers, runs it under a deadline and asserts that it exits
 * 0, printing its output when it does not.
 *
 * python3, node and socat (or nc) are required: a missing interpreter
 * fails its test (exit 127 from exec), it is not skipped. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_MS 240000

static struct h_redis R;
static struct h_daemon D;
/* The examples force a lock_lost by deleting a lock's key in Redis
 * (LEASED_TEST_REDIS); a short watchdog finds it gone within a third of
 * watchdog_ms. */
static void
export_redis(void)
{
    char addr[64];

    snprintf(addr, sizeof addr, "127.0.0.1:%d", R.port);
    setenv("LEASED_TEST_REDIS", addr, 1);
}

static const struct h_fixture fx = {
    .suite = "clients",
    .redis = {&R},
    .daemons = {&D},
    /* The near cache and its shared segment on: the Python client's
     * cached() reads through the segment (Node's keeps the socket). */
    .start_yaml = "log:\n  level: info\nlock:\n  watchdog_ms: 1500\n"
                  "cache:\n  near: { enabled: true }\n",
    .setup = export_redis,
};
static char out[65536], err[65536];

/* Run an example: INTERP SRCDIR/SCRIPT SOCKET. */
static void
run_example(const char *interp, const char *script)
{
    char path[1024];
    const char *argv[] = {interp, path, D.sock, NULL};
    int rc;

    snprintf(path, sizeof path, "%s/%s", h_srcdir(), script);
    rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    /* LD_VERBOSE=1 shows what a passing example printed, too. */
    if (rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- %s %s: exit %d ----\n%s\n---- stderr ----\n"
                "%s\n---- end ----\n",
                interp, script, rc, out, err);
    }
    ck_assert_msg(rc == 0, "%s %s exited %d%s", interp, script, rc,
                  rc == 127 ? " (is it installed?)" : "");
}

START_TEST(test_python)
{
    run_example("python3", "clients/python/test_leased.py");
}
END_TEST

/* The shared near cache reader (clients/python/test_near.py): segments
 * written by the test itself, hostile ones, a racing writer, and a leased
 * of its own with the segment on (LEASED_BIN, LEASED_TEST_REDIS). */
START_TEST(test_python_near)
{
    run_example("python3", "clients/python/test_near.py");
}
END_TEST

START_TEST(test_node)
{
    run_example("node", "clients/node/test_leased.js");
    ck_assert_msg(strstr(out, "ok 2 -"), "output: %s", out);
}
END_TEST

/* The Node package's API tests, with node's built-in test runner; the
 * socket comes from the environment (node --test runs the file in a
 * child process of its own). */
START_TEST(test_node_api)
{
    char path[1024];
    const char *argv[] = {"node", "--test", path, NULL};
    int rc;

    snprintf(path, sizeof path, "%s/clients/node/test_api.js", h_srcdir());
    setenv("LEASED_SOCKET", D.sock, 1);
    rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    if (rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- node --test test_api.js: exit %d ----\n%s\n"
                "---- stderr ----\n%s\n---- end ----\n",
                rc, out, err);
    }
    ck_assert_msg(rc == 0, "node --test exited %d%s", rc,
                  rc == 127 ? " (is it installed?)" : "");
    ck_assert_msg(strstr(out, "# fail 0"), "output: %s", out);
}
END_TEST

/* clients/node/test_restart.js, run in a thread while this one restarts
 * the daemon once the script, inside a using() scope, has created its
 * flag file. */
struct restart_run {
    char script[1024];
    char flag[400];
    int rc;
};

static void *
restart_script(void *arg)
{
    struct restart_run *run = arg;
    const char *argv[] = {"node", run->script, D.sock, run->flag, NULL};

    run->rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    return NULL;
}

static bool
flag_exists(void *path)
{
    return access(path, F_OK) == 0;
}

START_TEST(test_node_restart)
{
    struct restart_run run;
    pthread_t th;

    snprintf(run.script, sizeof run.script, "%s/clients/node/test_restart.js",
             h_srcdir());
    snprintf(run.flag, sizeof run.flag, "%s/node-restart.flag", D.dir);
    unlink(run.flag);
    ck_assert_int_eq(pthread_create(&th, NULL, restart_script, &run), 0);
    /* A script that fails before its scope leaves no flag: the restart
     * is skipped and its output tells why. */
    if (h_wait_until(flag_exists, run.flag, RUN_MS / 4)) {
        ck_assert_int_eq(h_daemon_restart(&D), 0);
    }
    pthread_join(th, NULL);
    if (run.rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- node test_restart.js: exit %d ----\n%s\n"
                "---- stderr ----\n%s\n---- end ----\n",
                run.rc, out, err);
    }
    ck_assert_msg(run.rc == 0, "node test_restart.js exited %d", run.rc);
    ck_assert_msg(strstr(out, "ok 3 -"), "output: %s", out);
}
END_TEST

START_TEST(test_shell)
{
    if (!getenv("LEASECTL_BIN")) {
        setenv("LEASECTL_BIN", "tools/leasectl", 1);
    }
    run_example("sh", "clients/shell/test_cron.sh");
    ck_assert_msg(!strstr(out, "not ok"), "output: %s", out);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        /* Python includes a pip install into a fresh venv. Every
         * timeout is above RUN_MS, so a hung example is killed by h_run
         * and its output printed rather than the case being cut short by
         * Check. */
        H_CASE(python, 300),
        H_CASE(python_near, 270),
        H_CASE(node, 270),
        H_CASE(node_api, 270),
        /* The daemon restarted under a using() scope and a Pool. */
        H_CASE(node_restart, 270),
        H_CASE(shell, 270),
    };

    /* Keep the source tree clean (and usable read-only, for distcheck). */
    setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
    return H_MAIN(fx, cases);
}
