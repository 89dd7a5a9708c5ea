/* The Java client (clients/java) against its own redis-server and leased:
 * builds it with javac and jar (no Maven: nothing is fetched) into a temp
 * dir, then runs its test main, io.leased.TestLeased, with the daemon's
 * socket in LEASED_SOCKET, and asserts that it exits 0 with every test
 * passed, printing its output when it does not.
 *
 * A JDK (javac, jar, java) is required: a missing one fails the test
 * (exit 127 from exec), it is not skipped. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUILD_MS 180000
#define RUN_MS 240000

static struct h_redis R;
static struct h_daemon D;

/* The restart tests start a leased of their own on the same Redis. */
static void
export_redis(void)
{
    char addr[64];

    snprintf(addr, sizeof addr, "127.0.0.1:%d", R.port);
    setenv("LEASED_TEST_REDIS", addr, 1);
    setenv("LEASED_SOCKET", D.sock, 1);
}

static const struct h_fixture fx = {
    .suite = "client_java",
    .redis = {&R},
    .daemons = {&D},
    .start_yaml = "log:\n  level: info\nlock:\n  watchdog_ms: 1500\n",
    .setup = export_redis,
};
static char out[65536], err[65536];

static void
show(const char *what, int rc)
{
    if (rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- %s: exit %d ----\n%s\n---- stderr ----\n%s\n"
                "---- end ----\n",
                what, rc, out, err);
    }
}

START_TEST(test_java)
{
    char dir[256], script[1024], cp[1024];
    const char *build[] = {"sh", script, dir, NULL};
    const char *run[] = {"java", "-cp", cp, "io.leased.TestLeased", NULL};
    int rc;

    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(script, sizeof script, "%s/clients/java/build.sh", h_srcdir());
    rc = h_run(build, out, sizeof out, err, sizeof err, BUILD_MS);
    show("clients/java/build.sh", rc);
    ck_assert_msg(rc == 0, "build.sh exited %d%s", rc,
                  strstr(err, "not found") ? " (is a JDK installed?)" : "");

    export_redis();
    snprintf(cp, sizeof cp, "%s/leased-client.jar:%s/test-classes", dir, dir);
    rc = h_run(run, out, sizeof out, err, sizeof err, RUN_MS);
    show("java io.leased.TestLeased", rc);
    ck_assert_msg(rc == 0, "java exited %d%s", rc,
                  rc == 127 ? " (is it installed?)" : "");
    ck_assert_msg(strstr(out, " 0 failed") && !strstr(out, "not ok"),
                  "output: %s", out);
    h_rmdir(dir);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        /* Every timeout is above BUILD_MS + RUN_MS, so a hung build or
         * test is killed by h_run and its output printed. */
        H_CASE(java, 450),
    };

    return H_MAIN(fx, cases);
}
