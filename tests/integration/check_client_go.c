/* The Go client (clients/go) against its own redis-server and leased:
 * its package tests run with the race detector, with LEASED_SOCKET set
 * to the daemon's socket (near cache and shared segment on).
 *
 * The go toolchain is required: a missing one fails the test (exit 127
 * from exec), it is not skipped. Go's build cache lives under the build
 * directory (tests/integration/go-cache), so the test runs offline, as
 * root on CI too, and writes nothing into the source tree. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_MS 540000

static struct h_redis R;
static struct h_daemon D;

/* TestNearStoppedDaemon starts a leased of its own (LEASED_BIN) on this
 * Redis, to stop it with SIGSTOP. */
static void
export_redis(void)
{
    char addr[64];

    snprintf(addr, sizeof addr, "127.0.0.1:%d", R.port);
    setenv("LEASED_TEST_REDIS", addr, 1);
}

static const struct h_fixture fx = {
    .suite = "client_go",
    .redis = {&R},
    .daemons = {&D},
    /* The near cache and its shared segment on: Cached reads through the
     * segment, and TestNearRealDaemon checks it against the socket. */
    .start_yaml = "log:\n  level: info\nlock:\n  watchdog_ms: 1500\n"
                  "cache:\n  near: { enabled: true }\n",
    .setup = export_redis,
};
static char out[262144], err[65536];

/* Go's caches under the build directory; no network, no module proxy. */
static void
go_env(void)
{
    char cwd[PATH_MAX], dir[PATH_MAX + 64];

    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    snprintf(dir, sizeof dir, "%s/tests/integration/go-cache/build", cwd);
    setenv("GOCACHE", dir, 1);
    snprintf(dir, sizeof dir, "%s/tests/integration/go-cache/path", cwd);
    setenv("GOPATH", dir, 1);
    setenv("GOFLAGS", "-mod=mod", 1);
    setenv("GOPROXY", "off", 1);
    setenv("GOENV", "off", 1);
    setenv("LEASED_SOCKET", D.sock, 1);
}

START_TEST(test_go_test_race)
{
    char dir[1024];
    /* go 1.19 has no -C: the shell changes into the module first. */
    const char *argv[] = {"sh", "-c",
                          "cd \"$0\" && exec go test -race -count=1 ./...",
                          dir, NULL};
    int rc;

    snprintf(dir, sizeof dir, "%s/clients/go", h_srcdir());
    go_env();
    rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    if (rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- go test -race: exit %d ----\n%s\n---- stderr ----\n"
                "%s\n---- end ----\n",
                rc, out, err);
    }
    ck_assert_msg(rc == 0, "go test -race exited %d%s", rc,
                  rc == 127 ? " (is go installed?)" : "");
    ck_assert_msg(strstr(out, "ok  \tleased.dev/leased"), "output: %s", out);
    ck_assert_msg(!strstr(out, "WARNING: DATA RACE"), "output: %s", out);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        /* The first run builds the standard library with -race. */
        H_CASE(go_test_race, 600),
    };

    return H_MAIN(fx, cases);
}
