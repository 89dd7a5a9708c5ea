/* The Rust client (clients/rust) against its own redis-server and leased:
 * its unit tests and its tests against the daemon (tests/live.rs), run
 * with cargo test with the daemon's socket in LEASED_SOCKET.
 *
 * cargo is looked for in $CARGO, then ~/.cargo/bin (where rustup puts
 * it, often not on PATH), then PATH. A missing toolchain fails the test
 * (exit 127 from exec), it is not skipped. Build outputs go to a
 * temporary CARGO_TARGET_DIR, never into the source tree. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A first build compiles the crate and its tests; on a busy machine that
 * takes a while. */
#define RUN_MS 280000

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "client_rust",
    .redis = {&R},
    .daemons = {&D},
    .start_yaml = "log:\n  level: info\nlock:\n  watchdog_ms: 1500\n",
};
static char out[65536], err[65536];

/* The cargo to run: $CARGO, ~/.cargo/bin/cargo (rustup's), Debian's
 * /usr/bin/cargo, else "cargo" from PATH. Not rustup's proxy under another
 * HOME: a package build sets its own, where rustup finds no toolchain. */
static const char *
cargo(void)
{
    static char path[1024];
    const char *env = getenv("CARGO");
    const char *home = getenv("HOME");

    if (env && *env) {
        return env;
    }
    if (home && *home) {
        snprintf(path, sizeof path, "%s/.cargo/bin/cargo", home);
        if (access(path, X_OK) == 0) {
            return path;
        }
    }
    if (access("/usr/bin/cargo", X_OK) == 0) {
        /* With its own compiler, not rustup's proxies from PATH. */
        setenv("RUSTC", "/usr/bin/rustc", 0);
        setenv("RUSTDOC", "/usr/bin/rustdoc", 0);
        return "/usr/bin/cargo";
    }
    return "cargo";
}

START_TEST(test_cargo_test)
{
    char manifest[1024], target[512];
    const char *argv[] = {cargo(),           "test",   "--offline",
                          "--manifest-path", manifest, NULL};
    int rc;

    snprintf(manifest, sizeof manifest, "%s/clients/rust/Cargo.toml",
             h_srcdir());
    ck_assert_int_eq(h_tmpdir(target, sizeof target), 0);
    setenv("CARGO_TARGET_DIR", target, 1);
    setenv("LEASED_SOCKET", D.sock, 1);
    rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    if (rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- %s test: exit %d ----\n%s\n---- stderr ----\n%s\n"
                "---- end ----\n",
                argv[0], rc, out, err);
    }
    ck_assert_msg(rc == 0, "%s test exited %d%s", argv[0], rc,
                  rc == 127 ? " (is cargo installed?)" : "");
    /* The tests against the daemon ran, not only the unit tests. */
    ck_assert_msg(strstr(out, "cached_loads_once_for_many_threads ... ok"),
                  "output: %s", out);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(cargo_test, 300),
    };

    return H_MAIN(fx, cases);
}
