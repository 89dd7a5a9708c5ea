/* leasectl against a real leased and redis-server: the output and exit
 * status of every subcommand, and `lock -- CMD` holding a renewed lock
 * while CMD runs, refusing when the lock is taken, stopping CMD when the
 * lock is lost, and passing signals on. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define T_MS 5000
#define RUN_MS 20000 /* deadline of one leasectl run */

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "leasectl",
    .redis = {&R},
    .daemons = {&D},
};

static const char *
ctl_bin(void)
{
    const char *p = getenv("LEASECTL_BIN");

    return p && *p ? p : "tools/leasectl";
}

/* One leasectl run: argv[0] is filled in. */
struct run {
    const char *argv[24];
    char out[8192];
    char err[8192];
    int rc;
    long long took_ms;
    pthread_t th;
};

static void
run_argv(struct run *r, const char *const *args)
{
    int n = 0;
    long long t0 = h_now_ms();

    r->argv[n++] = ctl_bin();
    for (; args[n - 1] && n < 23; n++) {
        r->argv[n] = args[n - 1];
    }
    r->argv[n] = NULL;
    r->rc = h_run(r->argv, r->out, sizeof r->out, r->err, sizeof r->err,
                  RUN_MS);
    r->took_ms = h_now_ms() - t0;
}

#define CTL(r, ...)                                                           \
    do {                                                                      \
        const char *const a_[] = {__VA_ARGS__, NULL};                         \
        run_argv((r), a_);                                                    \
    } while (0)

/* Assert the exit status; on mismatch show what leasectl said. */
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

/* Start leasectl in the background (a thread waits on it). */
#define CTL_BG(r, ...)                                                        \
    do {                                                                      \
        const char *const a_[] = {__VA_ARGS__, NULL};                         \
        int n_ = 0;                                                           \
        (r)->argv[n_++] = ctl_bin();                                          \
        for (; a_[n_ - 1]; n_++) {                                            \
            (r)->argv[n_] = a_[n_ - 1];                                       \
        }                                                                     \
        (r)->argv[n_] = NULL;                                                 \
        (r)->took_ms = h_now_ms();                                            \
        ck_assert_int_eq(pthread_create(&(r)->th, NULL, run_thread, (r)), 0); \
    } while (0)

static void
bg_join(struct run *r)
{
    pthread_join(r->th, NULL);
    r->took_ms = h_now_ms() - r->took_ms;
}

struct locked_want {
    struct h_conn *c;
    const char *key;
    bool locked;
};

static bool
is_locked(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", key);
    bool locked;

    ck_assert_msg(h_ok(r), "lock.info %s: %s", key, h_errcode(r));
    locked = json_is_true(json_object_get(r, "locked"));
    json_decref(r);
    return locked;
}

static bool
locked_is(void *arg)
{
    struct locked_want *w = arg;

    return is_locked(w->c, w->key) == w->locked;
}

static bool
file_exists(void *arg)
{
    return access((const char *)arg, F_OK) == 0;
}

static void
write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

static void
read_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n;

    buf[0] = '\0';
    if (!f) {
        return;
    }
    n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* A CMD that records its parent (leasectl), traps TERM into a marker, and
 * otherwise runs for 30 s. The sleep runs in the background so the trap
 * fires at once, and has its output elsewhere so it does not keep
 * leasectl's pipes open. */
static const char TRAP_SCRIPT[] =
    "trap 'echo TERM > \"$1/term\"; kill $pid 2>/dev/null; exit 0' TERM\n"
    "sleep 30 > /dev/null 2>&1 &\n"
    "pid=$!\n"
    "echo $PPID > \"$1/ppid.tmp\" && mv \"$1/ppid.tmp\" \"$1/ppid\"\n"
    "wait $pid\n"
    "echo done > \"$1/end\"\n";

struct script {
    char dir[256];
    char path[300];
    char ppid[300];
    char term[300];
};

static void
make_script(struct script *s)
{
    ck_assert_int_eq(h_tmpdir(s->dir, sizeof s->dir), 0);
    snprintf(s->path, sizeof s->path, "%s/cmd.sh", s->dir);
    snprintf(s->ppid, sizeof s->ppid, "%s/ppid", s->dir);
    snprintf(s->term, sizeof s->term, "%s/term", s->dir);
    write_file(s->path, TRAP_SCRIPT);
}

static pid_t
script_parent(const struct script *s)
{
    char buf[64];

    ck_assert_msg(h_wait_until(file_exists, (void *)s->ppid, T_MS),
                  "the command did not start");
    read_file(s->ppid, buf, sizeof buf);
    return (pid_t)atol(buf);
}

/* --- ping, stats, usage ------------------------------------------------- */

START_TEST(test_ping_stats_usage)
{
    struct run r;
    char tcp[64], missing[400];
    json_t *st;

    h_start(NULL);

    CTL(&r, "-s", D.sock, "ping");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "pong\n");
    ck_assert_str_eq(r.err, "");

    snprintf(tcp, sizeof tcp, "127.0.0.1:%d", D.tcp_port);
    CTL(&r, "-H", tcp, "ping");
    CK_RC(&r, 0);
    CTL(&r, "ping", "--host", tcp);
    CK_RC(&r, 0);
    CTL(&r, "-s", D.sock, "--timeout", "5s", "ping");
    CK_RC(&r, 0);
    CTL(&r, "-s", D.sock, "-t", "soon", "ping");
    CK_RC(&r, 64);

    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "ping");
    CK_RC(&r, 0);

    CTL(&r, "stats");
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "sessions ") && strstr(r.out, "uptime_s ") &&
                      strstr(r.out, "requests_by_op.ping "),
                  "stats table: %s", r.out);
    CTL(&r, "stats", "--json");
    CK_RC(&r, 0);
    st = json_loads(r.out, 0, NULL);
    ck_assert_msg(json_is_object(st), "stats --json: %s", r.out);
    ck_assert(json_is_integer(json_object_get(st, "sessions")));
    json_decref(st);
    unsetenv("LEASED_SOCKET");

    /* Nothing listening. */
    snprintf(missing, sizeof missing, "%s/none.sock", D.dir);
    CTL(&r, "-s", missing, "ping");
    CK_RC(&r, 69);
    ck_assert_msg(!strncmp(r.err, "leasectl: ping: connect: ", 25) &&
                      strstr(r.err, missing),
                  "stderr: %s", r.err);
    ck_assert_str_eq(r.out, "");

    /* Usage errors: 64 and a message. */
    CTL(&r, "-s", D.sock);
    CK_RC(&r, 64);
    ck_assert_msg(strstr(r.err, "no command"), "stderr: %s", r.err);
    CTL(&r, "-s", D.sock, "frobnicate");
    CK_RC(&r, 64);
    ck_assert_msg(strstr(r.err, "unknown command 'frobnicate'"), "stderr: %s",
                  r.err);
    CTL(&r, "-s", D.sock, "ping", "--bogus");
    CK_RC(&r, 64);
    CTL(&r, "-s", D.sock, "get");
    CK_RC(&r, 64);
    CTL(&r, "-s", D.sock, "lock");
    CK_RC(&r, 64);
    CTL(&r, "-s", D.sock, "lock", "k");
    CK_RC(&r, 64);
    ck_assert_msg(strstr(r.err, "no command to run"), "stderr: %s", r.err);
    CTL(&r, "-s", D.sock, "lock", "k", "--ttl", "soon", "--", "true");
    CK_RC(&r, 64);
    ck_assert_msg(strstr(r.err, "--ttl"), "stderr: %s", r.err);
    CTL(&r, "-s", D.sock, "lock", "k", "--lost-exit", "300", "--", "true");
    CK_RC(&r, 64);
    CTL(&r, "-s", D.sock, "-H", tcp, "ping");
    CK_RC(&r, 64);

    CTL(&r, "--help");
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "usage: leasectl"), "help: %s", r.out);
    CTL(&r, "-V");
    CK_RC(&r, 0);
    ck_assert_msg(!strncmp(r.out, "leasectl ", 9), "version: %s", r.out);
    CTL(&r, "--version");
    CK_RC(&r, 0);
    ck_assert_msg(!strncmp(r.out, "leasectl ", 9), "version: %s", r.out);
    CTL(&r, "-h");
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "usage: leasectl"), "help: %s", r.out);
}
END_TEST

/* --- get, set, invalidate ----------------------------------------------- */

START_TEST(test_cache_cmds)
{
    struct run r;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);

    CTL(&r, "get", "k");
    CK_RC(&r, 1);
    ck_assert_str_eq(r.out, "");
    ck_assert_str_eq(r.err, "");

    CTL(&r, "set", "k", "hello world");
    CK_RC(&r, 0);
    CTL(&r, "get", "k");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "hello world\n");
    CTL(&r, "get", "--json", "k");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "\"hello world\"\n");

    /* A value that looks like an option, after "--". */
    CTL(&r, "set", "dash", "--ttl", "60000", "--", "-5");
    CK_RC(&r, 0);
    CTL(&r, "get", "dash");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "-5\n");

    /* A cached "not found" is a hit with no value. */
    CTL(&r, "set", "gone", "--null");
    CK_RC(&r, 0);
    CTL(&r, "get", "gone");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "");
    CTL(&r, "get", "gone", "--json");
    CK_RC(&r, 0);
    ck_assert_str_eq(r.out, "null\n");

    CTL(&r, "invalidate", "k", "gone", "--delay", "0");
    CK_RC(&r, 0);
    ck_assert_msg(!strncmp(r.out, "deleted=2 pending=", 18), "out: %s", r.out);
    CTL(&r, "get", "k");
    CK_RC(&r, 1);
    CTL(&r, "invalidate", "dash");
    CK_RC(&r, 0);
    ck_assert_msg(!strncmp(r.out, "deleted=1 pending=1", 19), "out: %s",
                  r.out);

    CTL(&r, "set", "k");
    CK_RC(&r, 64);
    CTL(&r, "set", "k", "v", "--ttl", "0");
    CK_RC(&r, 64);
    CTL(&r, "invalidate");
    CK_RC(&r, 64);

    /* An error from the daemon: the code and message on stderr. */
    CTL(&r, "get", "");
    CK_RC(&r, 65);
    ck_assert_msg(!strncmp(r.err, "leasectl: get: bad_request: ", 28),
                  "stderr: %s", r.err);
    unsetenv("LEASED_SOCKET");
}
END_TEST

START_TEST(test_info)
{
    struct h_conn *c;
    struct run r;
    json_t *rep;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "info", "job");
    CK_RC(&r, 1);
    ck_assert_str_eq(r.out, "locked no\n");

    c = h_connect_ok(&D);
    rep = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "job",
                  "owner", "w1");
    ck_assert_msg(h_ok(rep) && json_is_true(json_object_get(rep, "acquired")),
                  "lock: %s", h_errcode(rep));
    json_decref(rep);
    CTL(&r, "info", "job");
    CK_RC(&r, 0);
    ck_assert_msg(!strncmp(r.out, "locked yes\nttl_ms ", 18), "out: %s",
                  r.out);
    /* Another session's owner of the same name is not the holder. */
    CTL(&r, "info", "job", "--owner", "w1");
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "mine no\n"), "out: %s", r.out);
    h_close(c);
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* --- lock -- CMD -------------------------------------------------------- */

struct renewed_want {
    struct h_conn *c;
    long long renewals; /* lock_renewals_ok at least this */
    long long since_ms; /* and at least AFTER_MS after this */
    long long after_ms;
};

static bool
renewed(void *arg)
{
    struct renewed_want *w = arg;

    return h_now_ms() - w->since_ms >= w->after_ms &&
           h_stat(w->c, "lock_renewals_ok") >= w->renewals;
}

START_TEST(test_lock_runs_cmd)
{
    struct locked_want w;
    struct renewed_want rw;
    struct h_conn *c;
    struct run r, bg;
    char dir[256], stop[300], cmd[600];

    h_start("lock:\n  watchdog_ms: 600\n");
    setenv("LEASED_SOCKET", D.sock, 1);
    c = h_connect_ok(&D);
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(stop, sizeof stop, "%s/stop", dir);
    /* The command runs until the test has seen what it is looking for. */
    snprintf(cmd, sizeof cmd,
             "echo running; while [ ! -e '%s' ]; do sleep 0.05; done; "
             "echo finished; exit 3",
             stop);

    CTL_BG(&bg, "lock", "nightly", "--", "sh", "-c", cmd);
    w = (struct locked_want){c, "nightly", true};
    ck_assert_msg(h_wait_until(locked_is, &w, T_MS), "never locked");
    /* The lock outlives two of its 600 ms leases only by being renewed
     * while the command runs: wait for that, then look. */
    rw = (struct renewed_want){c, h_stat(c, "lock_renewals_ok") + 3,
                               h_now_ms(), 1200};
    ck_assert_msg(h_wait_until(renewed, &rw, 30000),
                  "fewer than 3 renewals: %lld",
                  h_stat(c, "lock_renewals_ok"));
    ck_assert_msg(is_locked(c, "nightly"),
                  "the lock expired while the command ran");
    write_file(stop, "");
    bg_join(&bg);
    CK_RC(&bg, 3);
    ck_assert_str_eq(bg.out, "running\nfinished\n");
    ck_assert_msg(!is_locked(c, "nightly"), "still locked after the end");

    /* Status of a command killed by a signal: 128 + signal. */
    CTL(&r, "lock", "nightly", "--", "sh", "-c", "kill -KILL $$");
    CK_RC(&r, 137);
    /* A command that cannot be run. */
    CTL(&r, "lock", "nightly", "--", "/nonexistent/cmd");
    CK_RC(&r, 127);
    ck_assert_msg(strstr(r.err, "/nonexistent/cmd"), "stderr: %s", r.err);
    /* Without "--", the first word after KEY starts the command. */
    CTL(&r, "lock", "nightly", "--ttl", "5000", "true");
    CK_RC(&r, 0);
    ck_assert_msg(!is_locked(c, "nightly"), "--ttl lock left behind");
    h_close(c);
    unsetenv("LEASED_SOCKET");
}
END_TEST

START_TEST(test_lock_contended)
{
    char dir[256], marker[300], cmd[400];
    struct h_conn *c;
    struct run r;
    json_t *rep;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(marker, sizeof marker, "%s/ran", dir);
    snprintf(cmd, sizeof cmd, "touch '%s'", marker);

    c = h_connect_ok(&D);
    rep = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "report");
    ck_assert_msg(h_ok(rep) && json_is_true(json_object_get(rep, "acquired")),
                  "lock: %s", h_errcode(rep));
    json_decref(rep);

    CTL(&r, "lock", "report", "--", "sh", "-c", cmd);
    CK_RC(&r, 75);
    ck_assert_int_ne(access(marker, F_OK), 0);
    ck_assert_msg(strstr(r.err, "leasectl: lock: report: held by another") &&
                      strstr(r.err, "not running sh"),
                  "stderr: %s", r.err);

    CTL(&r, "lock", "report", "--wait", "400", "--", "sh", "-c", cmd);
    CK_RC(&r, 75);
    ck_assert_int_ge(r.took_ms, 380);
    ck_assert_int_ne(access(marker, F_OK), 0);

    CTL(&r, "-q", "lock", "report", "--", "sh", "-c", cmd);
    CK_RC(&r, 75);
    ck_assert_str_eq(r.err, "");

    /* Durations with a unit; a bare number stays milliseconds. */
    CTL(&r, "lock", "report", "--wait", "1s", "--", "sh", "-c", cmd);
    CK_RC(&r, 75);
    ck_assert_int_ge(r.took_ms, 950);
    CTL(&r, "lock", "report", "--wait=300ms", "--", "sh", "-c", cmd);
    CK_RC(&r, 75);
    ck_assert_int_ge(r.took_ms, 280);
    CTL(&r, "lock", "report", "--wait", "2x", "--", "sh", "-c", cmd);
    CK_RC(&r, 64);
    ck_assert_msg(strstr(r.err, "bad --wait '2x'"), "stderr: %s", r.err);
    CTL(&r, "lock", "report", "--wait", "-1s", "--", "sh", "-c", cmd);
    CK_RC(&r, 64);

    /* flock -E: the status of a conflict is the caller's to choose. */
    CTL(&r, "-q", "lock", "report", "--conflict-exit", "3", "--", "sh", "-c",
        cmd);
    CK_RC(&r, 3);
    CTL(&r, "-q", "lock", "report", "-E", "0", "--", "sh", "-c", cmd);
    CK_RC(&r, 0);
    CTL(&r, "lock", "report", "--conflict-exit", "256", "--", "true");
    CK_RC(&r, 64);
    ck_assert_int_ne(access(marker, F_OK), 0);

    rep = h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", "report");
    ck_assert_msg(h_ok(rep), "unlock: %s", h_errcode(rep));
    json_decref(rep);
    CTL(&r, "lock", "report", "--", "sh", "-c", cmd);
    CK_RC(&r, 0);
    ck_assert_int_eq(access(marker, F_OK), 0);
    h_close(c);
    unsetenv("LEASED_SOCKET");
}
END_TEST

START_TEST(test_lock_lost)
{
    struct locked_want w;
    struct script s;
    struct h_conn *c;
    struct run bg;
    char buf[64];

    h_start("lock:\n  watchdog_ms: 300\n");
    setenv("LEASED_SOCKET", D.sock, 1);
    c = h_connect_ok(&D);
    make_script(&s);

    CTL_BG(&bg, "lock", "lost", "--", "sh", s.path, s.dir);
    script_parent(&s);
    w = (struct locked_want){c, "lost", true};
    ck_assert_msg(h_wait_until(locked_is, &w, T_MS), "never locked");
    h_delete_lock_key(&R, "lost");
    bg_join(&bg);
    CK_RC(&bg, 70);
    ck_assert_msg(bg.took_ms < 15000, "took %lld ms", bg.took_ms);
    read_file(s.term, buf, sizeof buf);
    ck_assert_msg(!strcmp(buf, "TERM\n"), "the command got no SIGTERM");
    ck_assert_msg(strstr(bg.err, "leasectl: lock: lost: lock lost"),
                  "stderr: %s", bg.err);

    /* --lost-exit chooses the status. */
    h_rmdir(s.dir);
    make_script(&s);
    CTL_BG(&bg, "lock", "lost", "--lost-exit", "9", "--", "sh", s.path, s.dir);
    script_parent(&s);
    ck_assert_msg(h_wait_until(locked_is, &w, T_MS), "never locked");
    h_delete_lock_key(&R, "lost");
    bg_join(&bg);
    CK_RC(&bg, 9);
    ck_assert_int_eq(access(s.term, F_OK), 0);
    h_close(c);
    unsetenv("LEASED_SOCKET");
}
END_TEST

START_TEST(test_lock_signals)
{
    struct locked_want w;
    struct script s;
    struct h_conn *c;
    struct run bg;
    pid_t ctl;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    c = h_connect_ok(&D);

    /* SIGTERM to leasectl reaches the command, which exits 0; so does
     * leasectl, and the lock is released. */
    make_script(&s);
    CTL_BG(&bg, "lock", "sig", "--", "sh", s.path, s.dir);
    ctl = script_parent(&s);
    ck_assert_int_gt(ctl, 1);
    ck_assert_int_eq(kill(ctl, SIGTERM), 0);
    bg_join(&bg);
    CK_RC(&bg, 0);
    ck_assert_int_eq(access(s.term, F_OK), 0);
    w = (struct locked_want){c, "sig", false};
    ck_assert_msg(h_wait_until(locked_is, &w, T_MS), "still locked");

    /* SIGINT: the shell dies of it, leasectl reports 128 + 2. */
    h_rmdir(s.dir);
    make_script(&s);
    CTL_BG(&bg, "lock", "sig", "--", "sh", s.path, s.dir);
    ctl = script_parent(&s);
    ck_assert_int_eq(kill(ctl, SIGINT), 0);
    bg_join(&bg);
    CK_RC(&bg, 130);
    ck_assert_msg(h_wait_until(locked_is, &w, T_MS), "still locked");
    h_close(c);
    unsetenv("LEASED_SOCKET");
}
END_TEST

START_TEST(test_lock_daemon_stops)
{
    struct script s;
    struct run bg;

    h_start(NULL);
    setenv("LEASED_SOCKET", D.sock, 1);
    make_script(&s);
    CTL_BG(&bg, "lock", "stopping", "--", "sh", s.path, s.dir);
    script_parent(&s);
    h_daemon_signal(&D, SIGTERM);
    bg_join(&bg);
    CK_RC(&bg, 70);
    ck_assert_int_eq(access(s.term, F_OK), 0);
    ck_assert_msg(strstr(bg.err, "shutting down") ||
                      strstr(bg.err, "connection to leased lost"),
                  "stderr: %s", bg.err);
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* --- auth, Redis down --------------------------------------------------- */

START_TEST(test_auth)
{
    struct run r;
    char tcp[64];

    h_start("listen:\n"
            "  unix: \"@DIR@/leased.sock\"\n"
            "  tcp: \"127.0.0.1:0\"\n"
            "  auth_token: \"ctl-T0ken\"\n");
    snprintf(tcp, sizeof tcp, "127.0.0.1:%d", D.tcp_port);
    unsetenv("LEASED_AUTH");

    CTL(&r, "-H", tcp, "ping");
    CK_RC(&r, 77);
    ck_assert_msg(!strncmp(r.err, "leasectl: ping: unauthorized: ", 30),
                  "stderr: %s", r.err);
    CTL(&r, "-H", tcp, "--auth", "ctl-T0ken", "ping");
    CK_RC(&r, 0);
    CTL(&r, "-H", tcp, "--auth=ctl-T0ken", "stats", "--json");
    CK_RC(&r, 0);
    setenv("LEASED_AUTH", "ctl-T0ken", 1);
    CTL(&r, "-H", tcp, "ping");
    CK_RC(&r, 0);
    unsetenv("LEASED_AUTH");
}
END_TEST

static bool
ping_ready(void *arg)
{
    struct run *r = arg;

    CTL(r, "ping");
    return r->rc == 0;
}

/* Redis down is 69 (unavailable), not 75 (held elsewhere), for every
 * command; ping says so until Redis is back. */
START_TEST(test_redis_down)
{
    char yaml[200];
    struct run r;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    setenv("LEASED_SOCKET", D.sock, 1);
    CTL(&r, "ping");
    CK_RC(&r, 0);
    h_redis_kill(&R);

    CTL(&r, "lock", "k", "--", "true");
    CK_RC(&r, 69);
    ck_assert_msg(!strncmp(r.err, "leasectl: lock: redis_unavailable: ", 35),
                  "stderr: %s", r.err);
    CTL(&r, "lock", "k", "--wait", "200", "--", "true");
    CK_RC(&r, 69);
    CTL(&r, "get", "k");
    CK_RC(&r, 69);
    CTL(&r, "invalidate", "k");
    CK_RC(&r, 0);
    ck_assert_msg(strstr(r.out, "queued=true"), "out: %s", r.out);

    CTL(&r, "ping");
    CK_RC(&r, 69);
    ck_assert_str_eq(r.out, "");
    ck_assert_str_eq(r.err, "leasectl: ping: not ready: redis_unavailable\n");
    CTL(&r, "--json", "ping");
    CK_RC(&r, 69);

    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert_msg(h_wait_until(ping_ready, &r, 10000),
                  "ping not ready after Redis came back: %s", r.err);
    ck_assert_str_eq(r.out, "pong\n");
    unsetenv("LEASED_SOCKET");
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(ping_stats_usage, 60),
        H_CASE(cache_cmds, 60),
        H_CASE(info, 60),
        H_CASE(lock_runs_cmd, 60),
        H_CASE(lock_contended, 60),
        H_CASE(lock_lost, 60),
        H_CASE(lock_signals, 60),
        H_CASE(lock_daemon_stops, 60),
        H_CASE(auth, 60),
        H_CASE(redis_down, 60),
    };

    return H_MAIN(fx, cases);
}
