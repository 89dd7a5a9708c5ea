/* leasectl's operator commands and --json against a real leased and
 * redis-server: locks [PREFIX], unlock --force KEY (Unix socket, TCP with
 * and without --admin-token), --json on every command, and lock --read /
 * sem, which run against the daemon when it offers them (hello's
 * features "rwlock", "semaphore") and otherwise must refuse plainly,
 * rate (feature "rate") and bloom (feature "bloom"). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <unistd.h>

#define T_MS 5000
#define RUN_MS 20000 /* deadline of one leasectl run */
#define ADMIN "ctl-adm1n"

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "leasectl_ops",
    .redis = {&R},
    .daemons = {&D},
};

static const char yaml_admin[] = "listen:\n"
                                 "  unix: \"@DIR@/leased.sock\"\n"
                                 "  tcp: \"127.0.0.1:0\"\n"
                                 "  admin_token: \"" ADMIN "\"\n";

static const char *
ctl_bin(void)
{
    const char *p = getenv("LEASECTL_BIN");

    return p && *p ? p : "tools/leasectl";
}

struct run {
    const char *argv[24];
    char out[32768]; /* bloom add --json: 2500 booleans */
    char err[8192];
    int rc;
    pthread_t th;
};

static void
fill_argv(struct run *r, const char *const *args)
{
    int n = 0;

    r->argv[n++] = ctl_bin();
    for (; args[n - 1] && n < 23; n++) {
        r->argv[n] = args[n - 1];
    }
    r->argv[n] = NULL;
}

#define CTL(r, ...)                                                           \
    do {                                                                      \
        const char *const a_[] = {__VA_ARGS__, NULL};                         \
        fill_argv((r), a_);                                                   \
        (r)->rc = h_run((r)->argv, (r)->out, sizeof(r)->out, (r)->err,        \
                        sizeof(r)->err, RUN_MS);                              \
    } while (0)

#define CK_RC(r, want)                                                        \
    ck_assert_msg((r)->rc == (want),                                          \
                  "%s %s: exit %d, want %d\nstdout: %s\nstderr: %s",          \
                  (r)->argv[1], (r)->argv[2] ? (r)->argv[2] : "", (r)->rc,    \
                  (want), (r)->out, (r)->err)

static void *
run_thread(void *arg)
{
    struct run *r = arg;

    r->rc = h_run(r->argv, r->out, sizeof r->out, r->err, sizeof r->err,
                  RUN_MS);
    return NULL;
}

#define CTL_BG(r, ...)                                                        \
    do {                                                                      \
        const char *const a_[] = {__VA_ARGS__, NULL};                         \
        fill_argv((r), a_);                                                   \
        ck_assert_int_eq(pthread_create(&(r)->th, NULL, run_thread, (r)), 0); \
    } while (0)

/* The first line of OUT as JSON (a new reference). */
static json_t *
first_json(const char *out)
{
    json_error_t e;
    json_t *j = json_loadb(out, strcspn(out, "\n"), 0, &e);

    ck_assert_msg(j != NULL, "not JSON: %s", out);
    return j;
}

static bool
has_feature(const char *name)
{
    struct h_conn *c = h_connect_ok(&D);
    json_t *r = h_callf(c, T_MS, "{s:s}", "op", "hello");
    json_t *v;
    size_t i;
    bool found = false;

    ck_assert(h_ok(r));
    json_array_foreach(json_object_get(r, "features"), i, v)
    {
        found |= strcmp(json_string_value(v), name) == 0;
    }
    json_decref(r);
    h_close(c);
    return found;
}

struct locked_arg {
    const char *key;
    bool want;
};

static bool
locked_is(void *arg)
{
    struct locked_arg *a = arg;
    struct h_conn *c = h_connect(&D);
    json_t *r;
    bool locked;

    if (!c) {
        return false;
    }
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", a->key);
    locked = json_is_true(json_object_get(r, "locked"));
    json_decref(r);
    h_close(c);
    return locked == a->want;
}

/* cache load FILE: JSON lines stored with cache.mset in batches; the bad
 * ones reported by line and counted, exit 1 when any failed. */
static json_t *
plain_get(struct h_conn *c, const char *key)
{
    return h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key", key,
                   "lease", 0);
}

START_TEST(test_cache_load)
{
    struct run r;
    char dir[256], path[300], good[300], cmd[1024];
    FILE *f;

    h_start(NULL);
    if (!has_feature("mset")) {
        CTL(&r, "-s", D.sock, "cache", "load", "/dev/null");
        CK_RC(&r, EX_UNAVAILABLE);
        return;
    }
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/warm.jsonl", dir);
    snprintf(good, sizeof good, "%s/good.jsonl", dir);
    h_r_do(&R, "SET leased:cache:{foreign} theirs");

    /* 2500 entries: three batches of up to 1000, keys on every slot. */
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 2500; i++) {
        fprintf(f,
                "{\"key\":\"warm:%d\",\"value\":\"v%d\",\"ttl_ms\":100000}\n",
                i, i);
        if (i == 10) {
            fprintf(f, "not json\n\n");
        }
        if (i == 1500) {
            fprintf(f, "{\"key\":\"badttl\",\"value\":\"x\",\"ttl_ms\":0}\n");
            fprintf(f, "{\"key\":\"foreign\",\"value\":\"x\"}\n");
        }
    }
    fprintf(f, "{\"key\":\"nul\",\"value\":null}\n");
    ck_assert_int_eq(fclose(f), 0);

    CTL(&r, "-s", D.sock, "cache", "load", path);
    CK_RC(&r, 1);
    ck_assert_msg(strstr(r.out, "stored 2501 failed 3") != NULL, "stdout: %s",
                  r.out);
    ck_assert_msg(strstr(r.err, "line 12") != NULL &&
                      strstr(r.err, "badttl") != NULL &&
                      strstr(r.err, "wrong_type") != NULL,
                  "stderr: %s", r.err);

    struct h_conn *c = h_connect_ok(&D);
    const char *keys[] = {"warm:0", "warm:999", "warm:1000", "warm:2499"};
    const char *vals[] = {"v0", "v999", "v1000", "v2499"};
    for (size_t i = 0; i < 4; i++) {
        json_t *g = plain_get(c, keys[i]);
        ck_assert_msg(h_ok(g) && jtrue(g, "hit") &&
                          strcmp(jstr(g, "value"), vals[i]) == 0,
                      "%s: %s", keys[i], h_dump(g));
        json_decref(g);
    }
    json_t *g = plain_get(c, "nul");
    ck_assert_msg(h_ok(g) && jtrue(g, "hit") &&
                      json_is_null(json_object_get(g, "value")),
                  "nul: %s", h_dump(g));
    json_decref(g);
    long long pttl = h_r_int(&R, "PTTL leased:cache:{warm:7}");
    ck_assert_msg(pttl >= 80000 && pttl <= 110000, "pttl %lld", pttl);
    h_close(c);

    /* From stdin, in small batches: all stored, exit 0. */
    f = fopen(good, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 30; i++) {
        fprintf(f, "{\"key\":\"in:%d\",\"value\":\"s%d\"}\n", i, i);
    }
    ck_assert_int_eq(fclose(f), 0);
    snprintf(cmd, sizeof cmd, "exec %s -s %s cache load --batch 7 - < %s",
             ctl_bin(), D.sock, good);
    const char *const sh[] = {"-c", cmd, NULL};
    fill_argv(&r, sh);
    r.argv[0] = "sh";
    r.rc = h_run(r.argv, r.out, sizeof r.out, r.err, sizeof r.err, RUN_MS);
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "stored 30 failed 0") != NULL, "stdout: %s",
                  r.out);
    c = h_connect_ok(&D);
    g = plain_get(c, "in:29");
    ck_assert_msg(h_ok(g) && jtrue(g, "hit") &&
                      strcmp(jstr(g, "value"), "s29") == 0,
                  "in:29: %s", h_dump(g));
    json_decref(g);
    h_close(c);

    /* A file that is not there. */
    CTL(&r, "-s", D.sock, "cache", "load", "/nonexistent/warm.jsonl");
    CK_RC(&r, EX_NOINPUT);
}
END_TEST

START_TEST(test_locks_and_force)
{
    struct run r;
    json_t *j, *ev;

    h_start(yaml_admin);
    struct h_conn *c = h_connect_ok(&D);
    json_decref(
        h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "client", "billing-7"));
    j = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "order:42");
    ck_assert(jtrue(j, "acquired"));
    json_decref(j);
    j = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "job:1");
    json_decref(j);

    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "locks");
    CK_RC(&r, 0);
    ck_assert_msg(strncmp(r.out, "KEY ", 4) == 0, "no header: %s", r.out);
    ck_assert_ptr_nonnull(strstr(r.out, "order:42"));
    ck_assert_ptr_nonnull(strstr(r.out, "billing-7"));
    ck_assert_ptr_nonnull(strstr(r.out, "job:1"));

    CTL(&r, "--json", "locks", "order:");
    CK_RC(&r, 0);
    j = first_json(r.out);
    ck_assert(jtrue(j, "ok"));
    ck_assert_int_eq(json_array_size(json_object_get(j, "locks")), 1);
    ck_assert_str_eq(jstr(json_array_get(json_object_get(j, "locks"), 0),
                          "client"),
                     "billing-7");
    json_decref(j);

    CTL(&r, "locks", "--limit", "1");
    CK_RC(&r, 0);
    ck_assert_ptr_nonnull(strstr(r.err, "more locks"));

    /* Without --force nothing is sent. */
    CTL(&r, "unlock", "order:42");
    CK_RC(&r, EX_USAGE);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{order:42}"), 1);

    CTL(&r, "unlock", "--force", "order:42");
    CK_RC(&r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "released"));
    ev = h_lock_lost(c, "order:42", T_MS);
    ck_assert_msg(ev != NULL, "the holder heard nothing");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    json_decref(ev);
    CTL(&r, "unlock", "--force", "order:42");
    CK_RC(&r, 1);
    ck_assert_ptr_nonnull(strstr(r.out, "was not locked"));
    CTL(&r, "--json", "unlock", "--force", "job:1");
    CK_RC(&r, 0);
    j = first_json(r.out);
    ck_assert(jtrue(j, "released"));
    json_decref(j);
    unsetenv("LEASED_SOCKET");
    h_close(c);
}
END_TEST

START_TEST(test_tcp_admin_token)
{
    struct run r;
    char tcp[64];

    h_start(yaml_admin);
    snprintf(tcp, sizeof tcp, "127.0.0.1:%d", D.tcp_port);
    unsetenv("LEASED_ADMIN_TOKEN");
    CTL(&r, "-H", tcp, "locks");
    CK_RC(&r, EX_NOPERM);
    ck_assert_ptr_nonnull(strstr(r.err, "unauthorized"));
    CTL(&r, "-H", tcp, "unlock", "--force", "k");
    CK_RC(&r, EX_NOPERM);
    CTL(&r, "-H", tcp, "--admin-token", "nope", "locks");
    CK_RC(&r, EX_NOPERM);
    CTL(&r, "-H", tcp, "--admin-token", ADMIN, "locks");
    CK_RC(&r, 0);
    setenv("LEASED_ADMIN_TOKEN", ADMIN, 1);
    CTL(&r, "-H", tcp, "unlock", "--force", "k");
    CK_RC(&r, 1);
    unsetenv("LEASED_ADMIN_TOKEN");
}
END_TEST

START_TEST(test_json_everywhere)
{
    struct run r;
    json_t *j;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "--json", "ping");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "{\"ok\":true}\n");
    CTL(&r, "--json", "stats");
    CK_RC(&r, 0);
    j = first_json(r.out);
    ck_assert(json_is_object(json_object_get(j, "stats")));
    json_decref(j);
    CTL(&r, "--json", "set", "k", "v1");
    CK_RC(&r, 0);
    /* The daemon's answer as it is: stored, with the version it got. */
    j = first_json(r.out);
    ck_assert(jtrue(j, "ok") && jtrue(j, "stored") && jint(j, "version") > 0);
    json_decref(j);
    CTL(&r, "--json", "get", "k");
    CK_RC(&r, 0);
    j = first_json(r.out);
    ck_assert(jtrue(j, "hit"));
    ck_assert_str_eq(jstr(j, "value"), "v1");
    json_decref(j);
    CTL(&r, "--json", "invalidate", "k");
    CK_RC(&r, 0);
    j = first_json(r.out);
    ck_assert_int_eq(jint(j, "deleted"), 1);
    json_decref(j);
    CTL(&r, "--json", "get", "k");
    CK_RC(&r, 1);
    j = first_json(r.out);
    ck_assert(!jtrue(j, "hit"));
    json_decref(j);
    CTL(&r, "--json", "info", "k");
    CK_RC(&r, 1);
    j = first_json(r.out);
    ck_assert(!jtrue(j, "locked"));
    json_decref(j);

    /* lock: the grant, CMD's output, the unlock, in that order. */
    CTL(&r, "--json", "lock", "k", "--", "echo", "under-lock");
    CK_RC(&r, 0);
    j = first_json(r.out);
    ck_assert(jtrue(j, "acquired"));
    ck_assert(h_is_token(jstr(j, "token")));
    json_decref(j);
    const char *mid = strstr(r.out, "\nunder-lock\n");
    ck_assert_msg(mid != NULL, "stdout: %s", r.out);
    j = first_json(mid + strlen("\nunder-lock\n"));
    ck_assert(jtrue(j, "released"));
    json_decref(j);

    /* Taken: the refusal as the daemon said it, and 75. */
    struct h_conn *c = h_connect_ok(&D);
    json_decref(h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "k"));
    CTL(&r, "--json", "lock", "k", "--", "true");
    CK_RC(&r, EX_TEMPFAIL);
    j = first_json(r.out);
    ck_assert(jtrue(j, "ok") && !jtrue(j, "acquired"));
    ck_assert(json_is_integer(json_object_get(j, "ttl_ms")));
    json_decref(j);
    h_close(c);
    /* An error reply is printed too, and the exit status says which. */
    CTL(&r, "--json", "info", "");
    CK_RC(&r, EX_DATAERR);
    j = first_json(r.out);
    ck_assert_str_eq(h_errcode(j), "bad_request");
    json_decref(j);
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* A command holding a lock is stopped when an operator forces it. */
START_TEST(test_lock_command_forced)
{
    struct run bg, r;
    struct locked_arg la = {"batch", true};

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL_BG(&bg, "lock", "batch", "--lost-exit", "3", "--", "sleep", "30");
    ck_assert_msg(h_wait_until(locked_is, &la, T_MS), "never locked");
    CTL(&r, "unlock", "--force", "batch");
    CK_RC(&r, 0);
    pthread_join(bg.th, NULL);
    CK_RC(&bg, 3);
    ck_assert_msg(strstr(bg.err, "lock lost (taken)") != NULL, "stderr: %s",
                  bg.err);
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* lock --read and sem follow "Read-write locks" and "Semaphores" of the
 * protocol; with a daemon that does not offer them they must refuse (69)
 * rather than take a plain lock. */
START_TEST(test_read_lock_and_sem)
{
    struct run r, bg;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "lock", "--read", "--write", "k", "--", "true");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "sem", "k", "--", "true");
    CK_RC(&r, EX_USAGE);

    if (has_feature("rwlock")) {
        struct locked_arg la = {"rw", true};
        /* The reader holds until the test is done with it: its command
         * waits on a FIFO the test writes at the end, so a slow machine
         * cannot end the hold under the checks. */
        char fifo[sizeof(D.sock) + 8];
        snprintf(fifo, sizeof(fifo), "%s.hold", D.sock);
        unlink(fifo);
        ck_assert_int_eq(mkfifo(fifo, 0600), 0);
        CTL_BG(&bg, "lock", "--read", "rw", "--", "sh", "-c",
               "read x < \"$0\"", fifo);
        ck_assert(h_wait_until(locked_is, &la, T_MS));
        CTL(&r, "lock", "--read", "rw", "--", "true");
        CK_RC(&r, 0);
        CTL(&r, "lock", "--write", "rw", "--", "true");
        CK_RC(&r, EX_TEMPFAIL);
        CTL(&r, "lock", "--write", "rw", "--conflict-exit", "9", "--", "true");
        CK_RC(&r, 9);
        int fd = open(fifo, O_WRONLY);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, "\n", 1), 1);
        close(fd);
        pthread_join(bg.th, NULL);
        unlink(fifo);
        CK_RC(&bg, 0);
    } else {
        CTL(&r, "lock", "--read", "rw", "--", "true");
        CK_RC(&r, EX_UNAVAILABLE);
        ck_assert_ptr_nonnull(strstr(r.err, "rwlock"));
        ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{rw}"), 0);
    }

    if (has_feature("semaphore")) {
        /* The one permit of 1 is held by a session of the test, so that
         * leasectl cannot take it first. */
        struct h_conn *holder = h_connect_ok(&D);
        json_t *g = h_callf(holder, T_MS, "{s:s,s:s,s:i}", "op", "sem.acquire",
                            "key", "pool", "limit", 1);
        ck_assert_msg(g != NULL && jtrue(g, "acquired"), "no first permit");
        json_decref(g);
        CTL(&r, "sem", "pool", "--limit", "1", "--", "true");
        CK_RC(&r, EX_TEMPFAIL);
        long long t0 = h_now_ms();
        CTL(&r, "sem", "pool", "--limit", "1", "--wait", "200ms", "-E", "5",
            "--", "true");
        CK_RC(&r, 5);
        ck_assert_int_ge(h_now_ms() - t0, 180);
        CTL(&r, "sem", "pool", "--limit", "2", "--", "sh", "-c", "exit 4");
        CK_RC(&r, 4); /* the command ran, and its status is leasectl's */
        h_close(holder);
    } else {
        CTL(&r, "sem", "pool", "--limit", "2", "--", "true");
        CK_RC(&r, EX_UNAVAILABLE);
        ck_assert_ptr_nonnull(strstr(r.err, "semaphore"));
    }
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* The retry_after_ms of leasectl rate's line "WORD retry_after_ms=N". */
static long long
rate_line(const struct run *r, const char *word)
{
    char want[64];
    long long n = -1;

    snprintf(want, sizeof want, "%s retry_after_ms=%%lld\n", word);
    ck_assert_msg(sscanf(r->out, want, &n) == 1, "not '%s ...': %s", word,
                  r->out);
    return n;
}

/* rate KEY: one rate.acquire; acquired exits 0, refused 75 (or
 * --conflict-exit), each with its retry_after_ms; --wait lets the daemon
 * wait for the permits; bad options are usage errors before any request,
 * the daemon's refusals its usual statuses. */
START_TEST(test_rate)
{
    struct run r;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "rate", "rl", "--per", "1s");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "rate", "rl", "--rate", "2");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "rate", "rl", "--rate", "0", "--per", "1s");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "2d");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "1s", "--burst", "x");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "rate", "--rate", "2", "--per", "1s");
    CK_RC(&r, EX_USAGE);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{rl}:rate"), 0);

    if (!has_feature("rate")) {
        CTL(&r, "rate", "rl", "--rate", "2", "--per", "60s");
        CK_RC(&r, EX_UNAVAILABLE);
        ck_assert_ptr_nonnull(strstr(r.err, "rate"));
        unsetenv("LEASED_SOCKET");
        return;
    }
    /* 2 a minute, burst 2: two now (the second says when a third may
     * be), then refused until then. */
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "60s");
    CK_RC(&r, 0);
    ck_assert_int_eq(rate_line(&r, "acquired"), 0);
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "60000");
    CK_RC(&r, 0);
    long long n = rate_line(&r, "acquired");
    ck_assert_msg(n > 0 && n <= 30000, "next in %lld", n);
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "1m");
    CK_RC(&r, EX_TEMPFAIL);
    n = rate_line(&r, "refused");
    ck_assert_msg(n > 0 && n <= 30000, "retry after %lld", n);
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "1m", "-E", "9");
    CK_RC(&r, 9);
    CTL(&r, "-q", "rate", "rl", "--rate", "2", "--per", "1m");
    CK_RC(&r, EX_TEMPFAIL);
    ck_assert_str_eq(r.out, "");
    /* A wait shorter than the retry is answered at once. */
    long long t0 = h_now_ms();
    CTL(&r, "rate", "rl", "--rate", "2", "--per", "1m", "--wait", "100ms");
    CK_RC(&r, EX_TEMPFAIL);
    ck_assert_int_lt(h_now_ms() - t0, 10000);
    CTL(&r, "--json", "rate", "rl", "--rate", "2", "--per", "1m");
    CK_RC(&r, EX_TEMPFAIL);
    json_t *j = first_json(r.out);
    ck_assert(json_is_false(json_object_get(j, "acquired")));
    ck_assert(json_integer_value(json_object_get(j, "retry_after_ms")) > 0);
    json_decref(j);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{rl}:rate"), 0);

    /* --permits and --burst reach the daemon: 3 of a burst of 2 never
     * can be (bad_request), 2 of 2 on a fresh key can. */
    CTL(&r, "rate", "pb", "--rate", "1", "--per", "1m", "--burst", "2", "-n",
        "3");
    CK_RC(&r, EX_DATAERR);
    ck_assert_ptr_nonnull(strstr(r.err, "bad_request"));
    CTL(&r, "rate", "pb", "--rate", "1", "--per", "1m", "--burst", "2",
        "--permits", "2");
    CK_RC(&r, 0);
    CTL(&r, "rate", "pb", "--rate", "1", "--per", "1m", "--burst", "2");
    CK_RC(&r, EX_TEMPFAIL);

    /* --wait: 1 per 400 ms; the second is granted once the first's
     * interval has passed, not before. */
    CTL(&r, "rate", "wt", "--rate", "1", "--per", "400ms");
    CK_RC(&r, 0);
    t0 = h_now_ms();
    CTL(&r, "rate", "wt", "--rate", "1", "--per", "400ms", "-w", "15s");
    CK_RC(&r, 0);
    rate_line(&r, "acquired");
    ck_assert_int_ge(h_now_ms() - t0, 200);

    /* Foreign data: wrong_type, EX_DATAERR. */
    h_r_do(&R, "HSET leased:lock:{ft}:rate a 1");
    CTL(&r, "rate", "ft", "--rate", "1", "--per", "1s");
    CK_RC(&r, EX_DATAERR);
    ck_assert_ptr_nonnull(strstr(r.err, "wrong_type"));
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* The lines of OUT. */
static int
count_lines(const char *out)
{
    int n = 0;

    for (; *out != '\0'; out++) {
        n += *out == '\n';
    }
    return n;
}

/* bloom.check of KEY in FILTER, straight through the protocol. */
static bool
bloom_maybe(struct h_conn *c, const char *filter, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:[s]}", "op", "bloom.check",
                        "filter", filter, "keys", key);
    bool maybe;

    ck_assert_msg(h_ok(r), "bloom.check %s: %s", key, h_dump(r));
    maybe = json_is_true(json_array_get(json_object_get(r, "maybe"), 0));
    json_decref(r);
    return maybe;
}

/* bloom create, add and check: the options checked before any request,
 * add's batches within bloom.add's limit (one reply a batch with --json),
 * every key of the file in the filter, check's lines and exit status
 * (1: some key certainly absent), and the daemon's refusals. */
START_TEST(test_bloom)
{
    struct run r;
    char dir[256], path[300], small[300], cmd[2048];
    FILE *f;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "bloom");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "make", "f");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "create", "f", "--error-rate", "0.01");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "create", "f", "--capacity", "0", "--error-rate", "0.01");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "create", "f", "--capacity", "10");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "create", "f", "--capacity", "10", "--error-rate", "0.5");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "create", "f", "--capacity", "10", "--error-rate", "1%");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "add", "f");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "add", "f", "/dev/null", "--batch", "1001");
    CK_RC(&r, EX_USAGE);
    CTL(&r, "bloom", "check", "f");
    CK_RC(&r, EX_USAGE);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{f}:bloom:p"), 0);

    if (!has_feature("bloom")) {
        CTL(&r, "bloom", "check", "f", "k");
        CK_RC(&r, EX_UNAVAILABLE);
        ck_assert_ptr_nonnull(strstr(r.err, "bloom"));
        unsetenv("LEASED_SOCKET");
        return;
    }

    CTL(&r, "bloom", "create", "users", "--capacity", "10000", "--error-rate",
        "0.01");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "created users bits=95851 hashes=7 bytes=11982\n");
    CTL(&r, "bloom", "create", "users", "-n", "10000", "-e", "0.01");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "exists users bits=95851 hashes=7 bytes=11982\n");
    CTL(&r, "-q", "bloom", "create", "users", "-n", "10000", "-e", "0.01");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "");
    CTL(&r, "bloom", "create", "users", "--capacity", "20000", "--error-rate",
        "0.01");
    CK_RC(&r, EX_DATAERR);
    ck_assert_ptr_nonnull(strstr(r.err, "bad_request"));

    /* 2500 keys, CRLF and blank lines among them: three batches. */
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/keys.txt", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 2500; i++) {
        fprintf(f, i % 100 == 0 ? "user:%d\r\n\n" : "user:%d\n", i);
    }
    ck_assert_int_eq(fclose(f), 0);
    CTL(&r, "--json", "bloom", "add", "users", path);
    CK_RC(&r, 0);
    ck_assert_msg(count_lines(r.out) == 3, "not three batches: %.300s", r.out);
    json_t *j = first_json(r.out);
    ck_assert_int_eq(json_array_size(json_object_get(j, "added")), 1000);
    json_decref(j);
    struct h_conn *c = h_connect_ok(&D);
    for (int i = 0; i < 2500; i += 37) {
        char key[32];
        snprintf(key, sizeof key, "user:%d", i);
        ck_assert_msg(bloom_maybe(c, "users", key), "%s not added", key);
    }
    ck_assert(bloom_maybe(c, "users", "user:2499"));
    ck_assert(!bloom_maybe(c, "users", "user:2500"));
    ck_assert(!bloom_maybe(c, "users", "user:100\r"));

    /* From stdin in batches of 7; the same keys again add nothing new. */
    snprintf(small, sizeof small, "%s/small.txt", dir);
    f = fopen(small, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 30; i++) {
        fprintf(f, "new:%d\n", i);
    }
    ck_assert_int_eq(fclose(f), 0);
    snprintf(cmd, sizeof cmd,
             "%s -s %s bloom add users --batch 7 - < %s && "
             "%s -s %s bloom add users --batch 7 - < %s",
             ctl_bin(), D.sock, small, ctl_bin(), D.sock, small);
    const char *const sh[] = {"-c", cmd, NULL};
    fill_argv(&r, sh);
    r.argv[0] = "sh";
    r.rc = h_run(r.argv, r.out, sizeof r.out, r.err, sizeof r.err, RUN_MS);
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "added 30 new 30\nadded 30 new 0\n") != NULL,
                  "stdout: %s", r.out);
    ck_assert(bloom_maybe(c, "users", "new:29"));

    /* check: a line per key, in order; exit 1 when one is ruled out. */
    CTL(&r, "bloom", "check", "users", "user:7", "new:3");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "maybe\tuser:7\nmaybe\tnew:3\n");
    CTL(&r, "bloom", "check", "users", "user:7", "user:2500", "new:3");
    CK_RC(&r, 1);
    ck_assert_str_eq(r.out, "maybe\tuser:7\nno\tuser:2500\nmaybe\tnew:3\n");
    CTL(&r, "--json", "bloom", "check", "users", "user:2500");
    CK_RC(&r, 1);
    j = first_json(r.out);
    ck_assert(json_is_false(json_array_get(json_object_get(j, "maybe"), 0)));
    json_decref(j);

    /* The daemon's refusals: a filter never made, foreign data, a file
     * that is not there. */
    CTL(&r, "bloom", "check", "nosuch", "k");
    CK_RC(&r, EX_DATAERR);
    ck_assert_ptr_nonnull(strstr(r.err, "does not exist"));
    CTL(&r, "bloom", "add", "nosuch", small);
    CK_RC(&r, EX_DATAERR);
    ck_assert_msg(strstr(r.err, "lines 1-30 not added") != NULL, "stderr: %s",
                  r.err);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{nosuch}:bloom"), 0);
    CTL(&r, "bloom", "add", "users", "/nonexistent/keys.txt");
    CK_RC(&r, EX_NOINPUT);
    h_r_do(&R, "SET leased:cache:{ft}:bloom:p theirs");
    CTL(&r, "bloom", "check", "ft", "k");
    CK_RC(&r, EX_DATAERR);
    ck_assert_ptr_nonnull(strstr(r.err, "wrong_type"));
    h_close(c);

    if (!h_on_cluster()) {
        h_redis_kill(&R);
        CTL(&r, "bloom", "check", "users", "k");
        CK_RC(&r, EX_UNAVAILABLE);
        ck_assert_ptr_nonnull(strstr(r.err, "redis_unavailable"));
    }
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* A lock held, one request waiting behind it, and a key read often: what
 * top must show. HOLDER and WAITER stay open for the caller to close. */
static void
top_scene(struct h_conn **holder, struct h_conn **waiter)
{
    struct h_conn *c = h_connect_ok(&D);

    *holder = h_connect_ok(&D);
    *waiter = h_connect_ok(&D);
    json_t *r = h_callf(*holder, T_MS, "{s:s,s:s}", "op", "lock", "key",
                        "top:held");
    ck_assert(h_ok(r));
    json_decref(r);
    ck_assert_int_ge(h_send(*waiter, "{s:s,s:s,s:i}", "op", "lock", "key",
                            "top:held", "wait_ms", 60000),
                     0);
    h_assert_stat(c, "lock_waiters", 1, T_MS);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key", "top:hot",
                "value", "v");
    ck_assert(h_ok(r));
    json_decref(r);
    for (int i = 0; i < 20; i++) {
        r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "top:hot");
        ck_assert(h_ok(r));
        json_decref(r);
    }
    h_close(c);
}

START_TEST(test_top_once_and_json)
{
    struct h_conn *holder, *waiter;
    struct run r;
    json_t *j;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    top_scene(&holder, &waiter);

    CTL(&r, "top", "-1");
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "waiters 1") && strstr(r.out, "top:held") &&
                      strstr(r.out, "MOST CONTENDED") &&
                      strstr(r.out, "top:hot") && strstr(r.out, "redis    up"),
                  "top -1 printed:\n%s", r.out);
    ck_assert_ptr_null(strstr(r.out, "q quits"));

    CTL(&r, "top", "-1", "--json");
    CK_RC(&r, 0);
    ck_assert_msg(strchr(r.out, '\n') == r.out + strlen(r.out) - 1,
                  "not one line: %s", r.out);
    j = first_json(r.out);
    ck_assert_int_ge(jint(j, "interval_ms"), 900);
    ck_assert_int_eq(jint(j, "lock_waiters"), 1);
    ck_assert_int_ge(jint(j, "lock_wait_oldest_ms"), 900);
    ck_assert_int_eq(jint(j, "locks_held"), 1);
    ck_assert_str_eq(jstr(json_array_get(json_object_get(j, "locks"), 0),
                          "key"),
                     "top:held");
    ck_assert_str_eq(jstr(json_array_get(json_object_get(j, "hot"), 0), "key"),
                     "top:hot");
    /* The one lock somebody waits for, with its queue. */
    const json_t *most = json_array_get(json_object_get(j, "contended"), 0);
    ck_assert_str_eq(jstr(most, "key"), "top:held");
    ck_assert_int_eq(jint(most, "waiters"), 1);
    ck_assert_int_eq(json_array_size(json_object_get(j, "contended")), 1);
    /* top's own stats request is one of the ops it counts. */
    ck_assert(json_number_value(
                  json_object_get(json_object_get(j, "ops_per_s"), "stats")) >
              0);
    ck_assert_int_ge(jint(json_object_get(j, "redis"), "connected"), 1);
    ck_assert(json_is_object(json_object_get(j, "journal")));
    json_decref(j);
    h_close(holder);
    h_close(waiter);
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* tmux on its own socket in the daemon's dir, so no other server is
 * touched; its output in OUT. */
static int
tmux(const char *sock, char *out, size_t outlen, const char *const *args)
{
    const char *argv[16] = {"tmux", "-S", sock, "-f", "/dev/null"};
    int n = 5;

    for (; *args && n < 15; args++) {
        argv[n++] = *args;
    }
    argv[n] = NULL;
    return h_run(argv, out, outlen, NULL, 0, T_MS);
}

struct pane {
    const char *sock;
    char text[8192];
    const char *want;
    const char *differ; /* NULL, or a capture the pane must no longer be */
};

static bool
pane_shows(void *arg)
{
    struct pane *p = arg;
    const char *const cap[] = {"capture-pane", "-p", "-t", "top", NULL};

    if (tmux(p->sock, p->text, sizeof p->text, cap) != 0) {
        return false;
    }
    return strstr(p->text, p->want) != NULL &&
           (p->differ == NULL || strcmp(p->text, p->differ) != 0);
}

static bool
session_gone(void *arg)
{
    const char *const has[] = {"has-session", "-t", "top", NULL};
    char out[256];

    return tmux(arg, out, sizeof out, has) != 0;
}

START_TEST(test_top_interactive_tmux)
{
    struct h_conn *holder, *waiter;
    char sock[512], cmd[1024], first[8192], out[256];
    struct pane p;

    h_start(NULL);
    top_scene(&holder, &waiter);
    snprintf(sock, sizeof sock, "%s/tmux.sock", D.dir);
    snprintf(cmd, sizeof cmd, "exec '%s' -s '%s' top", ctl_bin(), D.sock);
    const char *const start[] = {"new-session", "-d", "-s", "top", "-x",
                                 "100",         "-y", "40", cmd,   NULL};
    ck_assert_msg(tmux(sock, out, sizeof out, start) == 0,
                  "tmux could not start (Debian package tmux): %s", out);
    /* Killed at exit should the test stop before kill-server. */
    const char *const pid[] = {"display-message", "-p", "-t", "top",
                               "#{pid}",          NULL};
    ck_assert_int_eq(tmux(sock, out, sizeof out, pid), 0);
    h_track_pid((pid_t)atol(out));

    memset(&p, 0, sizeof p);
    p.sock = sock;
    p.want = "(q quits)";
    ck_assert_msg(h_wait_until(pane_shows, &p, T_MS), "no frame:\n%s", p.text);
    ck_assert_ptr_nonnull(strstr(p.text, "top:held"));
    ck_assert_ptr_nonnull(strstr(p.text, "waiters 1"));
    /* A second frame replaces the first: the wait grows. */
    snprintf(first, sizeof first, "%s", p.text);
    p.differ = first;
    ck_assert_msg(h_wait_until(pane_shows, &p, T_MS), "never refreshed:\n%s",
                  p.text);
    ck_assert_ptr_null(strstr(p.text, "oldest wait 0 ms"));

    const char *const quit[] = {"send-keys", "-t", "top", "q", NULL};
    ck_assert_int_eq(tmux(sock, out, sizeof out, quit), 0);
    ck_assert_msg(h_wait_until(session_gone, sock, T_MS),
                  "top did not quit on q");
    const char *const stop[] = {"kill-server", NULL};
    tmux(sock, out, sizeof out, stop);
    h_close(holder);
    h_close(waiter);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(locks_and_force, 90),
        H_CASE(tcp_admin_token, 60),
        H_CASE(json_everywhere, 90),
        H_CASE(lock_command_forced, 90),
        H_CASE(read_lock_and_sem, 90),
        H_CASE(top_once_and_json, 60),
        H_CASE(top_interactive_tmux, 60),
        H_CASE(cache_load, 120),
        H_CASE(rate, 90),
        H_CASE(bloom, 90),
    };
    return H_MAIN(fx, cases);
}
