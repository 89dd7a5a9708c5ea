/* libleased against a real leased and redis-server: every op of the
 * contract through the typed calls, every error code that can be
 * provoked, events (lock_lost, shutdown, lock_at_risk) by queue and by
 * callback, the per-call timeout, out-of-order replies, and what a
 * connection does when the daemon restarts. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"
#include "leased/client.h"

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 5000

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "libleased",
    .redis = {&R},
    .daemons = {&D},
};

#define CK_OK(rc, err, what)                                                  \
    ck_assert_msg((rc) == LEASED_OK, "%s: %s: %s", (what),                    \
                  leased_strerror((err).code), (err).message)

#define CK_CODE(rc, err, want, what)                                          \
    ck_assert_msg((rc) == (want) && (err).code == (want),                     \
                  "%s: want %s, got %s (%s)", (what), leased_strerror(want),  \
                  leased_strerror(rc), (err).message)

static struct leased_conn *
conn_opt(const char *target, const struct leased_options *opt)
{
    struct leased_error err;
    struct leased_conn *c = leased_connect(target, opt, &err);

    ck_assert_msg(c != NULL, "connect %s: %s: %s", target,
                  leased_strerror(err.code), err.message);
    return c;
}

static struct leased_conn *
conn(void)
{
    return conn_opt(D.sock, NULL);
}

static void
tcp_target(char *buf, size_t len)
{
    ck_assert_int_gt(D.tcp_port, 0);
    snprintf(buf, len, "127.0.0.1:%d", D.tcp_port);
}

static long long
stat_of(struct leased_conn *c, const char *name)
{
    struct leased_error err;
    json_t *st = NULL, *v;
    long long out = -1;
    int rc = leased_stats(c, &st, &err);

    CK_OK(rc, err, "stats");
    v = json_object_get(st, name);
    if (json_is_integer(v)) {
        out = json_integer_value(v);
    }
    json_decref(st);
    return out;
}

struct stat_want {
    struct leased_conn *c;
    const char *name;
    long long at_least;
};

static bool
stat_reached(void *arg)
{
    struct stat_want *w = arg;

    return stat_of(w->c, w->name) >= w->at_least;
}

static void
lock_ok(struct leased_conn *c, const char *key,
        const struct leased_lock_args *a, struct leased_lock_result *res)
{
    struct leased_error err;
    int rc = leased_lock(c, key, a, res, &err);

    CK_OK(rc, err, "lock");
    ck_assert_msg(res->acquired, "lock %s not acquired", key);
}

static long long
elapsed_since(long long t0)
{
    return h_now_ms() - t0;
}

/* --- connecting --------------------------------------------------------- */

START_TEST(test_connect)
{
    struct leased_options opt;
    struct leased_hello_info info;
    struct leased_error err;
    struct leased_conn *c;
    char tcp[64];
    int rc;

    h_start(NULL);

    /* Unix socket, no hello. */
    c = conn();
    ck_assert_ptr_null(leased_session(c));
    ck_assert_int_ge(leased_fd(c), 0);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping");
    rc = leased_hello(c, "check_libleased", NULL, &info, &err);
    CK_OK(rc, err, "hello");
    ck_assert_str_eq(info.server, "leased");
    ck_assert_int_eq(info.protocol, LEASED_PROTOCOL_VERSION);
    ck_assert_msg(info.version[0] >= '0' && info.version[0] <= '9',
                  "version '%s'", info.version);
    ck_assert_msg(info.session[0], "no session id");
    ck_assert_str_eq(leased_session(c), info.session);
    leased_close(c);

    /* Hello on connect. */
    leased_options_init(&opt);
    opt.client = "check_libleased";
    c = conn_opt(D.sock, &opt);
    ck_assert_ptr_nonnull(leased_session(c));
    leased_close(c);

    /* TCP. */
    tcp_target(tcp, sizeof tcp);
    c = conn_opt(tcp, NULL);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping over TCP");
    leased_close(c);

    /* NULL: $LEASED_SOCKET. */
    setenv("LEASED_SOCKET", D.sock, 1);
    c = conn_opt(NULL, NULL);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping via $LEASED_SOCKET");
    leased_close(c);
    unsetenv("LEASED_SOCKET");

    /* Nothing there. */
    {
        char path[400];

        snprintf(path, sizeof path, "%s/nope.sock", D.dir);
        c = leased_connect(path, NULL, &err);
        ck_assert_ptr_null(c);
        ck_assert_int_eq(err.code, LEASED_E_CONNECT);
        ck_assert_int_eq(err.sys_errno, ENOENT);
        ck_assert_msg(strstr(err.message, path), "message: %s", err.message);
        /* And what to check. */
        ck_assert_msg(strstr(err.message, "is leased running") &&
                          strstr(err.message, "$LEASED_SOCKET"),
                      "message: %s", err.message);
    }
    snprintf(tcp, sizeof tcp, "127.0.0.1:%d", h_free_port());
    c = leased_connect(tcp, NULL, &err);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(err.code, LEASED_E_CONNECT);
    ck_assert_int_eq(err.sys_errno, ECONNREFUSED);
    ck_assert_msg(strstr(err.message, tcp) &&
                      strstr(err.message, "listen.tcp"),
                  "message: %s", err.message);

    ck_assert_str_eq(leased_strerror(LEASED_E_NOT_HELD), "not_held");
    ck_assert_str_eq(leased_strerror(LEASED_E_REDIS_UNAVAILABLE),
                     "redis_unavailable");
    ck_assert_str_eq(leased_strerror(LEASED_E_TIMEOUT), "timeout");
    leased_close(NULL);
}
END_TEST

/* A socket this user may not open: the message points at the socket's
 * group. Run as nobody in a child when the test runs as root (root
 * passes the permission check). */
START_TEST(test_connect_denied)
{
    char dir[] = "/tmp/libleased-XXXXXX", path[64];
    struct sockaddr_un sa;
    int srv, fds[2], status;
    char msg[512] = "";
    ssize_t n;
    pid_t pid;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/denied.sock", dir);
    srv = socket(AF_UNIX, SOCK_STREAM, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    ck_assert_int_eq(bind(srv, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(srv, 1), 0);
    ck_assert_int_eq(chmod(path, geteuid() == 0 ? 0600 : 0), 0);
    ck_assert_int_eq(pipe(fds), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct leased_error err;
        struct leased_conn *c;

        close(fds[0]);
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
            _exit(2);
        }
        c = leased_connect(path, NULL, &err);
        if (c || err.sys_errno != EACCES) {
            _exit(3);
        }
        n = write(fds[1], err.message, strlen(err.message));
        _exit(n > 0 ? 0 : 4);
    }
    close(fds[1]);
    n = read(fds[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    close(srv);
    unlink(path);
    rmdir(dir);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child: status %d", status);
    ck_assert_msg(strstr(msg, path) && strstr(msg, "socket's group"),
                  "message: %s", msg);
}
END_TEST

START_TEST(test_stats)
{
    struct leased_error err;
    struct leased_conn *c;
    json_t *st = NULL, *parsed;
    char *text = NULL;
    int rc;

    h_start(NULL);
    c = conn();
    rc = leased_stats(c, &st, &err);
    CK_OK(rc, err, "stats");
    ck_assert(json_is_object(st));
    ck_assert_int_ge(json_integer_value(json_object_get(st, "sessions")), 1);
    json_decref(st);

    rc = leased_stats_text(c, &text, &err);
    CK_OK(rc, err, "stats_text");
    parsed = json_loads(text, 0, NULL);
    ck_assert_msg(json_is_object(parsed), "not a JSON object: %s", text);
    ck_assert(json_is_object(json_object_get(parsed, "requests_by_op")));
    ck_assert_int_ge(json_integer_value(json_object_get(
                         json_object_get(parsed, "requests_by_op"), "stats")),
                     2);
    json_decref(parsed);
    leased_free(text);
    leased_close(c);
}
END_TEST

/* --- locks -------------------------------------------------------------- */

START_TEST(test_locks)
{
    struct leased_conn *a, *b;
    struct leased_lock_result r1, r2, rb;
    struct leased_unlock_result ur;
    struct leased_lock_info info;
    struct leased_error err;
    struct leased_lock_args args = {0};
    long long lease;
    int rc;

    h_start(NULL);
    a = conn();
    b = conn();

    lock_ok(a, "lk", NULL, &r1);
    ck_assert_msg(strlen(r1.token) >= 16, "short token '%s'", r1.token);
    ck_assert_int_eq(r1.count, 1);
    ck_assert_int_gt(r1.fence, 0);
    ck_assert_int_gt(r1.lease_ms, 0);

    /* Reentry: same token and fence, count 2. */
    lock_ok(a, "lk", NULL, &r2);
    ck_assert_str_eq(r2.token, r1.token);
    ck_assert_int_eq(r2.count, 2);

    /* Another session: not acquired, with the holder's lease left. */
    rc = leased_lock(b, "lk", NULL, &rb, &err);
    CK_OK(rc, err, "contended lock");
    ck_assert(!rb.acquired);
    ck_assert_msg(rb.ttl_ms == -1 || rb.ttl_ms > 0, "ttl_ms %lld", rb.ttl_ms);

    rc = leased_lock_info(b, "lk", NULL, NULL, &info, &err);
    CK_OK(rc, err, "lock.info from b");
    ck_assert(info.locked);
    ck_assert(!info.mine);
    ck_assert_int_gt(info.ttl_ms, 0);
    rc = leased_lock_info(a, "lk", "", NULL, &info, &err);
    CK_OK(rc, err, "lock.info from a");
    ck_assert(info.locked);
    ck_assert(info.mine);
    ck_assert_int_eq(info.count, 2);

    rc = leased_extend(a, "lk", NULL, NULL, 45000, &lease, &err);
    CK_OK(rc, err, "extend");
    ck_assert_int_gt(lease, 40000);
    ck_assert_int_le(lease, 45000);

    /* Someone else's lock: not_held "other", and it stays. */
    rc = leased_unlock(b, "lk", NULL, NULL, &ur, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "unlock by b");
    ck_assert_str_eq(err.reason, "other");
    rc = leased_extend(b, "lk", NULL, NULL, 1000, NULL, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "extend by b");

    rc = leased_unlock(a, "lk", NULL, NULL, &ur, &err);
    CK_OK(rc, err, "unlock 1");
    ck_assert(!ur.released);
    ck_assert_int_eq(ur.count, 1);
    rc = leased_unlock(a, "lk", NULL, NULL, &ur, &err);
    CK_OK(rc, err, "unlock 2");
    ck_assert(ur.released);
    ck_assert_int_eq(ur.count, 0);
    rc = leased_unlock(a, "lk", NULL, NULL, &ur, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "unlock of a free lock");
    ck_assert_str_eq(err.reason, "absent");

    rc = leased_lock_info(b, "lk", NULL, NULL, &info, &err);
    CK_OK(rc, err, "lock.info after unlock");
    ck_assert(!info.locked);

    /* The next holder gets a higher fence. */
    lock_ok(b, "lk", NULL, &rb);
    ck_assert_int_gt(rb.fence, r1.fence);
    rc = leased_unlock(b, "lk", NULL, NULL, NULL, &err);
    CK_OK(rc, err, "unlock by b");

    /* Owners inside one session exclude each other. */
    args.owner = "t1";
    lock_ok(a, "own", &args, &r1);
    args.owner = "t2";
    rc = leased_lock(a, "own", &args, &r2, &err);
    CK_OK(rc, err, "lock by another owner");
    ck_assert(!r2.acquired);
    rc = leased_unlock(a, "own", "t1", NULL, NULL, &err);
    CK_OK(rc, err, "unlock t1");

    /* Detached: outlives the session, released by token elsewhere. */
    memset(&args, 0, sizeof args);
    args.detach = true;
    args.ttl_ms = 60000;
    lock_ok(a, "det", &args, &r1);
    ck_assert_int_le(r1.lease_ms, 60000);
    leased_close(a);
    rc = leased_lock_info(b, "det", NULL, NULL, &info, &err);
    CK_OK(rc, err, "lock.info det");
    ck_assert_msg(info.locked, "a detached lock died with its session");
    rc = leased_extend(b, "det", NULL, r1.token, 30000, &lease, &err);
    CK_OK(rc, err, "extend by token");
    rc = leased_unlock(b, "det", NULL, r1.token, &ur, &err);
    CK_OK(rc, err, "unlock by token");
    ck_assert(ur.released);

    /* A session-bound lock dies with its session. */
    a = conn();
    lock_ok(a, "bound", NULL, &r1);
    leased_close(a);
    memset(&args, 0, sizeof args);
    args.wait_ms = 5000;
    lock_ok(b, "bound", &args, &rb);
    leased_close(b);
}
END_TEST

struct unlocker {
    struct leased_conn *holder;
    struct leased_conn *watcher;
    const char *key;
    int rc;
};

/* Release the lock once a waiter is queued (on its own connections). */
static void *
unlock_when_waited(void *arg)
{
    struct unlocker *u = arg;
    struct leased_error err;
    long long deadline = h_now_ms() + 10000;

    while (h_now_ms() < deadline) {
        json_t *st = NULL;

        if (leased_stats(u->watcher, &st, &err) == LEASED_OK &&
            json_integer_value(json_object_get(st, "lock_waiters")) >= 1) {
            json_decref(st);
            break;
        }
        json_decref(st);
        usleep(10000);
    }
    u->rc = leased_unlock(u->holder, u->key, NULL, NULL, NULL, &err);
    return NULL;
}

/* A group of keys: all or none, a fence per key, unlock and extend. */
START_TEST(test_several_keys_at_once)
{
    static const char *const keys[] = {"g:2", "g:1", "g:3"};
    struct leased_conn *a, *b;
    struct leased_lock_result r, rb;
    struct leased_unlock_result ur;
    struct leased_error err;
    long long fences[3], lease;
    int rc;

    h_start(NULL);
    a = conn();
    b = conn();
    lock_ok(b, "g:3", NULL, &rb);
    rc = leased_lock_keys(a, keys, 3, NULL, &r, fences, &err);
    CK_OK(rc, err, "lock_keys held");
    ck_assert(!r.acquired);
    ck_assert_int_eq(stat_of(a, "locks_held"), 1);
    rc = leased_unlock(b, "g:3", NULL, NULL, NULL, &err);
    CK_OK(rc, err, "unlock g:3");

    rc = leased_lock_keys(a, keys, 3, NULL, &r, fences, &err);
    CK_OK(rc, err, "lock_keys");
    ck_assert(r.acquired);
    ck_assert_int_eq(r.count, 1);
    ck_assert_int_gt(fences[0], 0);
    ck_assert_int_gt(fences[1], 0);
    ck_assert_int_gt(fences[2], rb.fence);
    rc = leased_extend_keys(b, keys, 3, NULL, r.token, 50000, &lease, &err);
    CK_OK(rc, err, "extend_keys");
    ck_assert_int_eq(lease, 50000);
    rc = leased_unlock_keys(b, keys, 3, NULL, NULL, &ur, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "unlock_keys by b");
    rc = leased_unlock_keys(a, keys, 3, NULL, NULL, &ur, &err);
    CK_OK(rc, err, "unlock_keys");
    ck_assert(ur.released);
    ck_assert_int_eq(stat_of(a, "locks_held"), 0);
    leased_close(a);
    leased_close(b);
}
END_TEST

/* leased_unlock_rid: the same request id sent again (from a new
 * connection, by token) releases no second hold. */
START_TEST(test_unlock_request_id)
{
    static const char *const keys[] = {"ri:1", "ri:2"};
    struct leased_conn *a, *b;
    struct leased_lock_result r1, r2;
    struct leased_unlock_result ur;
    struct leased_lock_info info;
    struct leased_error err;
    struct leased_lock_args args = {0};
    int rc;

    h_start(NULL);
    a = conn();
    b = conn();
    args.detach = true;
    args.ttl_ms = 60000;
    lock_ok(a, "ri", &args, &r1);
    args.detach = false;
    args.token = r1.token;
    lock_ok(a, "ri", &args, &r2);
    ck_assert_int_eq(r2.count, 2);
    rc = leased_unlock_rid(a, "ri", NULL, NULL, r1.token, "u1", &ur, &err);
    CK_OK(rc, err, "unlock u1");
    ck_assert(!ur.released);
    ck_assert_int_eq(ur.count, 1);
    leased_close(a);
    rc = leased_unlock_rid(b, "ri", NULL, NULL, r1.token, "u1", &ur, &err);
    CK_OK(rc, err, "unlock u1 again");
    ck_assert(!ur.released);
    ck_assert_int_eq(ur.count, 1);
    rc = leased_lock_info(b, "ri", NULL, r1.token, &info, &err);
    CK_OK(rc, err, "lock.info");
    ck_assert(info.locked);
    ck_assert_int_eq(info.count, 1);
    rc = leased_unlock_rid(b, "ri", NULL, NULL, r1.token, "u2", &ur, &err);
    CK_OK(rc, err, "unlock u2");
    ck_assert(ur.released);
    rc = leased_unlock_rid(b, "ri", NULL, NULL, r1.token, "", &ur, &err);
    CK_CODE(rc, err, LEASED_E_BAD_REQUEST, "empty request id");

    rc = leased_unlock_keys_rid(b, keys, 2, NULL, NULL, "g1", &ur, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "unlock_keys_rid not held");
    rc = leased_lock_keys(b, keys, 2, NULL, &r2, NULL, &err);
    CK_OK(rc, err, "lock_keys");
    rc = leased_unlock_keys_rid(b, keys, 2, NULL, NULL, "g1", &ur, &err);
    CK_OK(rc, err, "unlock_keys_rid");
    ck_assert(ur.released);
    rc = leased_unlock_keys_rid(b, keys, 2, NULL, r2.token, "g1", &ur, &err);
    CK_OK(rc, err, "unlock_keys_rid again");
    ck_assert(ur.released);
    rc = leased_unlock_rid(b, "ri-none", "read", NULL, NULL, "u3", &ur, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "unlock_rid of a read side");
    leased_close(b);
}
END_TEST

START_TEST(test_lock_wait)
{
    struct leased_conn *a, *b, *w;
    struct leased_lock_result ra, rb;
    struct leased_lock_args args = {0};
    struct leased_options opt;
    struct leased_error err;
    struct unlocker u;
    pthread_t th;
    long long t0;
    int rc;

    h_start(NULL);
    a = conn();
    w = conn();
    /* A short call timeout: only the wait_ms extension lets a waiting
     * lock finish. */
    leased_options_init(&opt);
    opt.timeout_ms = 200;
    b = conn_opt(D.sock, &opt);

    lock_ok(a, "w", NULL, &ra);
    args.wait_ms = 600;
    t0 = h_now_ms();
    rc = leased_lock(b, "w", &args, &rb, &err);
    CK_OK(rc, err, "lock with wait_ms 600 and a 200 ms timeout");
    ck_assert(!rb.acquired);
    ck_assert_int_ge(elapsed_since(t0), 550);

    /* Woken by the unlock, long before wait_ms. */
    u = (struct unlocker){a, w, "w", -1};
    ck_assert_int_eq(pthread_create(&th, NULL, unlock_when_waited, &u), 0);
    args.wait_ms = 20000;
    t0 = h_now_ms();
    rc = leased_lock(b, "w", &args, &rb, &err);
    pthread_join(th, NULL);
    CK_OK(rc, err, "waiting lock");
    ck_assert_int_eq(u.rc, LEASED_OK);
    ck_assert_msg(rb.acquired, "not acquired after the holder's unlock");
    ck_assert_int_gt(rb.fence, ra.fence);
    ck_assert_int_lt(elapsed_since(t0), 15000);

    leased_close(a);
    leased_close(b);
    leased_close(w);
}
END_TEST

/* --- cache -------------------------------------------------------------- */

START_TEST(test_cache)
{
    struct leased_conn *c;
    struct leased_cache_result g, m[3];
    struct leased_invalidate_result inv;
    struct leased_error err;
    const char *keys[3] = {"c:a", "c:b", "c:none"};
    /* Quotes, backslash, newline, multi-byte UTF-8: all survive. */
    const char bin[] = "q\"b\\n\nz\xc3\xa9\xe2\x82\xac";
    bool flag;
    char *lease;
    int rc;

    h_start(NULL);
    c = conn();

    /* Miss with a lease, fill, hit. */
    rc = leased_cache_get(c, "c:a", LEASED_UNSET, true, &g, &err);
    CK_OK(rc, err, "cache.get miss");
    ck_assert(!g.hit);
    ck_assert_ptr_nonnull(g.lease);
    rc = leased_cache_fill(c, "c:a", g.lease, "value-a", (size_t)-1, 0, &flag,
                           &err);
    CK_OK(rc, err, "cache.fill");
    ck_assert(flag);
    leased_cache_result_free(&g);
    rc = leased_cache_get(c, "c:a", LEASED_UNSET, true, &g, &err);
    CK_OK(rc, err, "cache.get hit");
    ck_assert(g.hit);
    ck_assert(!g.is_null);
    ck_assert_str_eq(g.value, "value-a");
    ck_assert_uint_eq(g.value_len, 7);
    ck_assert_ptr_null(g.lease);
    leased_cache_result_free(&g);

    /* set, with characters JSON escapes, and a cached null. */
    rc = leased_cache_set(c, "c:b", bin, sizeof bin - 1, 60000, &err);
    CK_OK(rc, err, "cache.set");
    rc = leased_cache_get(c, "c:b", LEASED_UNSET, true, &g, &err);
    CK_OK(rc, err, "cache.get after set");
    ck_assert(g.hit);
    ck_assert_uint_eq(g.value_len, sizeof bin - 1);
    ck_assert(!memcmp(g.value, bin, sizeof bin - 1));
    leased_cache_result_free(&g);
    rc = leased_cache_set(c, "c:null", NULL, 0, 0, &err);
    CK_OK(rc, err, "cache.set null");
    rc = leased_cache_get(c, "c:null", LEASED_UNSET, true, &g, &err);
    CK_OK(rc, err, "cache.get null");
    ck_assert(g.hit);
    ck_assert(g.is_null);
    ck_assert_ptr_null(g.value);
    leased_cache_result_free(&g);

    /* mget: hit, hit, miss with its own lease. */
    rc = leased_cache_mget(c, keys, 3, LEASED_UNSET, true, m, &err);
    CK_OK(rc, err, "cache.mget");
    ck_assert(m[0].hit);
    ck_assert_str_eq(m[0].value, "value-a");
    ck_assert(m[1].hit);
    ck_assert(!m[2].hit);
    ck_assert_ptr_nonnull(m[2].lease);
    /* Give that lease back: the next reader gets one at once. */
    rc = leased_cache_release(c, "c:none", m[2].lease, &flag, &err);
    CK_OK(rc, err, "cache.release");
    ck_assert(flag);
    for (int i = 0; i < 3; i++) {
        leased_cache_result_free(&m[i]);
    }

    /* A plain read never takes a lease. */
    rc = leased_cache_get(c, "c:none", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get lease:false");
    ck_assert(!g.hit);
    ck_assert_ptr_null(g.lease);
    leased_cache_result_free(&g);

    /* A fill after an invalidation is stale and not stored. */
    rc = leased_cache_get(c, "c:race", 0, true, &g, &err);
    CK_OK(rc, err, "cache.get c:race");
    ck_assert_ptr_nonnull(g.lease);
    lease = strdup(g.lease);
    leased_cache_result_free(&g);
    {
        const char *k[2] = {"c:race", "c:a"};

        rc = leased_cache_invalidate(c, k, 2, 0, &inv, &err);
        CK_OK(rc, err, "cache.invalidate");
        ck_assert_int_ge(inv.deleted, 1);
        ck_assert(!inv.queued);
    }
    rc = leased_cache_fill(c, "c:race", lease, "stale", (size_t)-1, 0, &flag,
                           &err);
    CK_OK(rc, err, "stale cache.fill");
    ck_assert_msg(!flag, "a fill after invalidate was stored");
    free(lease);
    rc = leased_cache_get(c, "c:a", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get after invalidate");
    ck_assert(!g.hit);
    leased_cache_result_free(&g);

    /* Foreign data under a cache key: wrong_type, for that key alone in
     * an mget. */
    {
        redisReply *r = h_redis_cmd(&R, "MSET leased:cache:{c:alien} x "
                                        "leased:cache:c:alien x");
        const char *k[2] = {"c:alien", "c:b"};

        ck_assert_ptr_nonnull(r);
        freeReplyObject(r);
        rc = leased_cache_get(c, "c:alien", LEASED_UNSET, false, &g, &err);
        CK_CODE(rc, err, LEASED_E_WRONG_TYPE, "cache.get of a string key");
        rc = leased_cache_mget(c, k, 2, LEASED_UNSET, false, m, &err);
        CK_OK(rc, err, "cache.mget with a string key");
        ck_assert_int_eq(m[0].error, LEASED_E_WRONG_TYPE);
        ck_assert_ptr_nonnull(m[0].error_message);
        ck_assert(!m[0].hit);
        ck_assert_int_eq(m[1].error, LEASED_OK);
        ck_assert(m[1].hit);
        leased_cache_result_free(&m[0]);
        leased_cache_result_free(&m[1]);
    }

    /* One key, default delay: a second delete is pending. */
    rc = leased_cache_invalidate(c, keys + 1, 1, LEASED_UNSET, &inv, &err);
    CK_OK(rc, err, "cache.invalidate one key");
    ck_assert_int_eq(inv.deleted, 1);
    ck_assert_int_ge(inv.pending, 1);
    leased_close(c);
}
END_TEST

/* Versioned writes: a hit's version, and set and fill over a version,
 * refused with the current one when it moved on. */
START_TEST(test_cache_versioned)
{
    struct leased_conn *c;
    struct leased_cache_result g;
    struct leased_error err;
    long long v1, v2, cur;
    bool stored;
    int rc;

    h_start(NULL);
    c = conn();

    rc = leased_cache_set_if(c, "v:a", "one", (size_t)-1, 0, 0, &stored, &v1,
                             &err);
    CK_OK(rc, err, "cache.set if_version 0");
    ck_assert(stored);
    ck_assert_int_gt(v1, 0);
    rc = leased_cache_get(c, "v:a", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get");
    ck_assert(g.hit);
    ck_assert_int_eq(g.version, v1);
    leased_cache_result_free(&g);
    rc = leased_cache_set_if(c, "v:a", "two", (size_t)-1, 0, v1, &stored, &v2,
                             &err);
    CK_OK(rc, err, "cache.set over v1");
    ck_assert(stored);
    ck_assert_int_gt(v2, v1);
    rc = leased_cache_set_if(c, "v:a", "late", (size_t)-1, 0, v1, &stored,
                             &cur, &err);
    CK_OK(rc, err, "cache.set over v1 again");
    ck_assert(!stored);
    ck_assert_int_eq(cur, v2);
    /* Unconditional, as leased_cache_set. */
    rc = leased_cache_set_if(c, "v:a", "three", (size_t)-1, 0, LEASED_UNSET,
                             &stored, &cur, &err);
    CK_OK(rc, err, "cache.set unconditional");
    ck_assert(stored);
    ck_assert_int_gt(cur, v2);

    /* A fill over 0 (the miss it loaded for); a wrong version is refused
     * and the lease kept. */
    rc = leased_cache_get(c, "v:f", LEASED_UNSET, true, &g, &err);
    CK_OK(rc, err, "cache.get miss");
    ck_assert_ptr_nonnull(g.lease);
    ck_assert_int_eq(g.version, 0);
    rc = leased_cache_fill_if(c, "v:f", g.lease, "x", (size_t)-1, 0, 5,
                              &stored, &cur, &err);
    CK_OK(rc, err, "cache.fill over 5");
    ck_assert(!stored);
    ck_assert_int_eq(cur, 0);
    rc = leased_cache_fill_if(c, "v:f", g.lease, NULL, 0, 0, 0, &stored, &cur,
                              &err);
    CK_OK(rc, err, "cache.fill null over 0");
    ck_assert(stored);
    ck_assert_int_gt(cur, 0);
    leased_cache_result_free(&g);
    rc = leased_cache_get(c, "v:f", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get null");
    ck_assert(g.hit && g.is_null);
    ck_assert_int_eq(g.version, cur);
    leased_cache_result_free(&g);

    /* A bad if_version is the daemon's bad_request. */
    rc = leased_cache_set_if(c, "v:a", "x", (size_t)-1, 0, -5, &stored, NULL,
                             &err);
    ck_assert_int_eq(rc, LEASED_E_BAD_REQUEST);
    leased_close(c);
}
END_TEST

/* leased_cache_mset: the count, each entry's outcome in order, values
 * (binary-safe, null) readable afterwards with their TTLs. */
START_TEST(test_cache_mset)
{
    static const char bin[] = "a\"b\\c\n\x01z";
    struct leased_conn *c;
    struct leased_cache_result g;
    struct leased_mset_result res[4];
    struct leased_error err;
    size_t stored;
    int rc;

    h_start(NULL);
    c = conn();
    h_r_do(&R, "SET leased:cache:{m:alien} x");
    const struct leased_mset_entry es[4] = {
        {"m:a", "value-a", (size_t)-1, 60000},
        {"m:bin", bin, sizeof bin - 1, 0},
        {"m:null", NULL, 0, 0},
        {"m:alien", "x", (size_t)-1, 0},
    };
    rc = leased_cache_mset(c, es, 4, &stored, res, &err);
    CK_OK(rc, err, "cache.mset");
    ck_assert_uint_eq(stored, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(res[i].error, LEASED_OK);
        ck_assert_ptr_null(res[i].error_message);
    }
    ck_assert_int_eq(res[3].error, LEASED_E_WRONG_TYPE);
    ck_assert_ptr_nonnull(res[3].error_message);
    for (int i = 0; i < 4; i++) {
        leased_mset_result_free(&res[i]);
    }

    rc = leased_cache_get(c, "m:a", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get m:a");
    ck_assert(g.hit);
    ck_assert_str_eq(g.value, "value-a");
    leased_cache_result_free(&g);
    long long pttl = h_r_int(&R, "PTTL leased:cache:{m:a}");
    ck_assert_msg(pttl > 40000 && pttl <= 66000, "pttl %lld", pttl);
    rc = leased_cache_get(c, "m:bin", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get m:bin");
    ck_assert_uint_eq(g.value_len, sizeof bin - 1);
    ck_assert(!memcmp(g.value, bin, sizeof bin - 1));
    leased_cache_result_free(&g);
    rc = leased_cache_get(c, "m:null", LEASED_UNSET, false, &g, &err);
    CK_OK(rc, err, "cache.get m:null");
    ck_assert(g.hit && g.is_null);
    leased_cache_result_free(&g);

    /* Results may be left out; no entries is the caller's mistake. */
    rc = leased_cache_mset(c, es, 1, &stored, NULL, &err);
    CK_OK(rc, err, "cache.mset without results");
    ck_assert_uint_eq(stored, 1);
    rc = leased_cache_mset(c, es, 0, &stored, NULL, &err);
    CK_CODE(rc, err, LEASED_E_INVALID, "cache.mset of nothing");
    leased_close(c);
}
END_TEST

/* --- errors ------------------------------------------------------------- */

START_TEST(test_errors)
{
    struct leased_conn *c;
    struct leased_lock_result lr;
    struct leased_cache_result g;
    struct leased_error err;
    char *reply = NULL, *big;
    size_t n = 3000;
    int rc;

    h_start("limits:\n  max_request_bytes: 1024\n");
    c = conn();

    rc = leased_lock(c, "", NULL, &lr, &err);
    CK_CODE(rc, err, LEASED_E_BAD_REQUEST, "lock with an empty key");
    ck_assert_msg(strstr(err.message, "key"), "message: %s", err.message);
    rc = leased_cache_get(c, "", LEASED_UNSET, true, &g, &err);
    CK_CODE(rc, err, LEASED_E_BAD_REQUEST, "cache.get with an empty key");

    rc = leased_call_raw(c, "{\"op\":\"no.such.op\"}", 0, &reply, &err);
    CK_CODE(rc, err, LEASED_E_UNKNOWN_OP, "raw unknown op");
    ck_assert_ptr_nonnull(reply);
    ck_assert_msg(strstr(reply, "unknown_op") && !strstr(reply, "\"id\""),
                  "raw reply: %s", reply);
    leased_free(reply);
    rc = leased_call_raw(c, "{\"op\":\"ping\"}", 0, &reply, &err);
    CK_OK(rc, err, "raw ping");
    ck_assert_str_eq(reply, "{\"ok\":true}");
    leased_free(reply);
    rc = leased_call_raw(c, "not json", 0, NULL, &err);
    CK_CODE(rc, err, LEASED_E_INVALID, "raw non-JSON");

    rc = leased_unlock(c, "never", NULL, NULL, NULL, &err);
    CK_CODE(rc, err, LEASED_E_NOT_HELD, "unlock never held");

    /* A line over max_request_bytes; the connection stays usable. */
    big = malloc(n + 64);
    ck_assert_ptr_nonnull(big);
    snprintf(big, n + 64, "{\"op\":\"ping\",\"pad\":\"%0*d\"}", (int)n, 0);
    rc = leased_call_raw(c, big, 0, NULL, &err);
    CK_CODE(rc, err, LEASED_E_TOO_LARGE, "a 3 kB line");
    free(big);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping after too_large");

    /* A key holding data leased did not write. */
    {
        redisReply *r = h_redis_cmd(&R, "MSET leased:lock:{alien} x "
                                        "leased:lock:alien x");

        ck_assert_ptr_nonnull(r);
        freeReplyObject(r);
    }
    rc = leased_lock(c, "alien", NULL, &lr, &err);
    CK_CODE(rc, err, LEASED_E_WRONG_TYPE, "lock on a string key");

    /* Bad arguments never reach the daemon. */
    rc = leased_cache_invalidate(c, NULL, 0, 0, NULL, &err);
    CK_CODE(rc, err, LEASED_E_INVALID, "invalidate without keys");
    rc = leased_lock(c, "\xff\xfe", NULL, &lr, &err);
    CK_CODE(rc, err, LEASED_E_INVALID, "a key that is not UTF-8");
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping at the end");
    leased_close(c);
}
END_TEST

START_TEST(test_unauthorized)
{
    struct leased_options opt;
    struct leased_error err;
    struct leased_conn *c;
    char tcp[64];
    int rc;

    h_start("listen:\n"
            "  unix: \"@DIR@/leased.sock\"\n"
            "  tcp: \"127.0.0.1:0\"\n"
            "  auth_token: \"libleased-T0ken\"\n");
    tcp_target(tcp, sizeof tcp);

    c = conn_opt(tcp, NULL);
    rc = leased_ping(c, &err);
    CK_CODE(rc, err, LEASED_E_UNAUTHORIZED, "ping without hello");
    leased_close(c);

    leased_options_init(&opt);
    opt.auth = "libleased-T0kem";
    c = leased_connect(tcp, &opt, &err);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(err.code, LEASED_E_UNAUTHORIZED);

    opt.auth = "libleased-T0ken";
    opt.client = "check_libleased";
    c = conn_opt(tcp, &opt);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping after hello with the token");
    leased_close(c);
}
END_TEST

START_TEST(test_busy)
{
    struct leased_options opt;
    struct leased_error err;
    struct leased_conn *a, *b, *c;
    long long t0 = h_now_ms();
    int rc;

    h_start("limits:\n  max_clients: 2\n");
    a = conn();
    /* The harness's readiness probes must be gone before we count. */
    while (stat_of(a, "sessions") != 1 && elapsed_since(t0) < T_MS) {
        usleep(10000);
    }
    ck_assert_int_eq(stat_of(a, "sessions"), 1);
    b = conn();
    rc = leased_ping(b, &err);
    CK_OK(rc, err, "second client");

    leased_options_init(&opt);
    opt.client = "one too many";
    c = leased_connect(D.sock, &opt, &err);
    ck_assert_ptr_null(c);
    ck_assert_msg(err.code == LEASED_E_BUSY, "hello of a 3rd client: %s: %s",
                  leased_strerror(err.code), err.message);

    c = conn();
    rc = leased_ping(c, &err);
    CK_CODE(rc, err, LEASED_E_BUSY, "ping of a 3rd client");
    rc = leased_ping(c, &err);
    CK_CODE(rc, err, LEASED_E_IO, "after busy, the connection is closed");
    ck_assert_int_eq(leased_fd(c), -1);
    leased_close(c);

    rc = leased_ping(a, &err);
    CK_OK(rc, err, "the first client still works");
    leased_close(a);
    leased_close(b);
}
END_TEST

START_TEST(test_redis_unavailable)
{
    struct leased_conn *c;
    struct leased_lock_result lr;
    struct leased_cache_result g;
    struct leased_invalidate_result inv;
    struct leased_error err;
    const char *key = "gone";
    char yaml[200];
    int rc;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = conn();
    lock_ok(c, "before", NULL, &lr);

    h_redis_kill(&R);
    rc = leased_lock(c, "during", NULL, &lr, &err);
    CK_CODE(rc, err, LEASED_E_REDIS_UNAVAILABLE, "lock without Redis");
    rc = leased_cache_get(c, key, LEASED_UNSET, true, &g, &err);
    CK_CODE(rc, err, LEASED_E_REDIS_UNAVAILABLE, "cache.get without Redis");
    /* An invalidation is never refused: journaled and retried. */
    rc = leased_cache_invalidate(c, &key, 1, LEASED_UNSET, &inv, &err);
    CK_OK(rc, err, "cache.invalidate without Redis");
    ck_assert(inv.queued);
    ck_assert_int_eq(inv.deleted, 0);
    ck_assert_int_ge(inv.pending, 1);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping without Redis");
    leased_close(c);
}
END_TEST

/* --- events ------------------------------------------------------------- */

struct seen {
    int count;
    enum leased_event_type type;
    char key[64];
    char token[LEASED_TOKEN_MAX];
    char reason[32];
};

static void
on_event(struct leased_conn *c, const struct leased_event *ev, void *arg)
{
    struct seen *s = arg;

    (void)c;
    s->count++;
    s->type = ev->type;
    snprintf(s->key, sizeof s->key, "%s", ev->key ? ev->key : "");
    snprintf(s->token, sizeof s->token, "%s", ev->token ? ev->token : "");
    snprintf(s->reason, sizeof s->reason, "%s", ev->reason ? ev->reason : "");
}

static bool
known_reason(const char *r)
{
    return r && (!strcmp(r, "expired") || !strcmp(r, "taken") ||
                 !strcmp(r, "redis_unavailable") || !strcmp(r, "max_hold"));
}

START_TEST(test_lock_lost)
{
    struct leased_conn *c, *other;
    struct leased_lock_result r1, r2, r3, ro;
    struct leased_lock_args args = {0};
    struct leased_event ev;
    struct leased_error err;
    struct seen seen = {0};
    long long t0;
    int rc;

    h_start("lock:\n  watchdog_ms: 300\n");
    c = conn();
    other = conn();

    /* Polled with leased_next_event. */
    lock_ok(c, "lost1", NULL, &r1);
    rc = leased_next_event(c, 0, &ev, &err);
    CK_CODE(rc, err, LEASED_E_TIMEOUT, "no event yet");
    h_delete_lock_key(&R, "lost1");
    rc = leased_next_event(c, 5000, &ev, &err);
    CK_OK(rc, err, "lock_lost event");
    ck_assert_int_eq(ev.type, LEASED_EV_LOCK_LOST);
    ck_assert_str_eq(ev.name, "lock_lost");
    ck_assert_str_eq(ev.key, "lost1");
    ck_assert_str_eq(ev.token, r1.token);
    ck_assert_msg(known_reason(ev.reason), "reason %s", ev.reason);
    leased_event_clear(&ev);
    ck_assert_ptr_null(ev.key);

    /* Arriving in the middle of another call: kept, not taken for its
     * reply. The call waits on a lock held elsewhere meanwhile. */
    lock_ok(other, "busy-key", NULL, &ro);
    lock_ok(c, "lost2", NULL, &r2);
    h_delete_lock_key(&R, "lost2");
    args.wait_ms = 1500;
    rc = leased_lock(c, "busy-key", &args, &r3, &err);
    CK_OK(rc, err, "a waiting lock while lost2 is lost");
    ck_assert(!r3.acquired);
    rc = leased_next_event(c, 0, &ev, &err);
    CK_OK(rc, err, "the event queued during the call");
    ck_assert_int_eq(ev.type, LEASED_EV_LOCK_LOST);
    ck_assert_str_eq(ev.key, "lost2");
    leased_event_clear(&ev);

    /* By callback. */
    leased_set_event_callback(c, on_event, &seen);
    lock_ok(c, "lost3", NULL, &r3);
    h_delete_lock_key(&R, "lost3");
    t0 = h_now_ms();
    while (seen.count == 0 && elapsed_since(t0) < 5000) {
        rc = leased_dispatch(c, 200, &err);
        ck_assert_msg(rc == LEASED_OK || rc == LEASED_E_TIMEOUT,
                      "dispatch: %s", err.message);
    }
    ck_assert_int_eq(seen.count, 1);
    ck_assert_int_eq(seen.type, LEASED_EV_LOCK_LOST);
    ck_assert_str_eq(seen.key, "lost3");
    ck_assert_str_eq(seen.token, r3.token);
    ck_assert_msg(known_reason(seen.reason), "reason %s", seen.reason);
    /* With a callback nothing is queued. */
    rc = leased_next_event(c, 0, &ev, &err);
    CK_CODE(rc, err, LEASED_E_TIMEOUT, "queue with a callback");
    leased_set_event_callback(c, NULL, NULL);

    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping after the events");
    leased_close(c);
    leased_close(other);
}
END_TEST

/* Two at-risk events (lock and semaphore, in either order) or two safe
 * ones: each kind once, for its key and token, with the field it carries. */
/* A hold is at risk half a pass (a third of the watchdog) after its
 * renewal goes unanswered and lost at the lease's end, so Redis must run
 * again within about a pass of the event: one hold at a time, resumed as
 * soon as its event arrives, and a pass of 2 s (667 ms was too short on a
 * loaded machine). */
#define AT_RISK_WATCHDOG "6000"

/* The next event on C: TYPE for KEY and TOKEN, with the figure its type
 * carries. */
static void
expect_event(struct leased_conn *c, enum leased_event_type type,
             const char *key, const char *token)
{
    struct leased_event ev;
    struct leased_error err;
    bool at_risk = type == LEASED_EV_LOCK_AT_RISK ||
                   type == LEASED_EV_SEM_AT_RISK;

    int rc = leased_next_event(c, 6000, &ev, &err);
    CK_OK(rc, err, at_risk ? "at-risk event" : "safe event");
    ck_assert_msg(ev.type == type, "unexpected event %s", ev.name);
    ck_assert_str_eq(ev.key, key);
    ck_assert_str_eq(ev.token, token);
    if (at_risk) {
        ck_assert_msg(ev.lease_left_ms > 0 &&
                          ev.lease_left_ms < atoll(AT_RISK_WATCHDOG),
                      "%s lease_left_ms %lld", ev.name, ev.lease_left_ms);
        ck_assert_int_eq(ev.lease_ms, -1);
    } else {
        ck_assert_int_gt(ev.lease_ms, 0);
        ck_assert_int_eq(ev.lease_left_ms, -1);
    }
    leased_event_clear(&ev);
}

/* Redis stopped (SIGSTOP) under a fresh hold: its first renewal goes
 * unanswered, so it is at risk, typed, with the lease left; Redis resumed:
 * safe with the new lease; nothing more. */
static void
stall_and_recover(struct leased_conn *c, enum leased_event_type at_risk,
                  enum leased_event_type safe, const char *key,
                  const char *token)
{
    struct leased_event ev;
    struct leased_error err;
    h_redis_signal(&R, SIGSTOP);
    expect_event(c, at_risk, key, token);
    h_redis_signal(&R, SIGCONT);
    expect_event(c, safe, key, token);
    int rc = leased_next_event(c, 0, &ev, &err);
    CK_CODE(rc, err, LEASED_E_TIMEOUT, "nothing after safe");
}

/* A lock, then a semaphore grant, each through a stall of Redis: at risk,
 * then safe, never lost. */
START_TEST(test_at_risk)
{
    struct leased_conn *c;
    struct leased_lock_result lr;
    struct leased_sem_result sr;
    struct leased_sem_args sa = {0};
    struct leased_error err;
    char yaml[256];
    int rc;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 60000\n"
             "lock:\n  watchdog_ms: " AT_RISK_WATCHDOG "\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = conn();
    lock_ok(c, "risky", NULL, &lr);
    stall_and_recover(c, LEASED_EV_LOCK_AT_RISK, LEASED_EV_LOCK_SAFE, "risky",
                      lr.token);
    rc = leased_unlock(c, "risky", NULL, lr.token, NULL, &err);
    CK_OK(rc, err, "unlock after safe");
    rc = leased_sem_acquire(c, "risky-pool", 2, &sa, &sr, &err);
    CK_OK(rc, err, "sem_acquire");
    ck_assert(sr.acquired);
    stall_and_recover(c, LEASED_EV_SEM_AT_RISK, LEASED_EV_SEM_SAFE,
                      "risky-pool", sr.token);
    leased_close(c);
}
END_TEST

struct waiter {
    struct leased_conn *c;
    int rc;
    struct leased_error err;
    long long took_ms;
};

static void *
wait_forever(void *arg)
{
    struct waiter *w = arg;
    struct leased_lock_args args = {0};
    struct leased_lock_result res;
    long long t0 = h_now_ms();

    args.wait_ms = -1;
    w->rc = leased_lock(w->c, "held", &args, &res, &w->err);
    w->took_ms = h_now_ms() - t0;
    return NULL;
}

START_TEST(test_shutdown)
{
    struct leased_conn *idle, *holder, *waiting, *watch;
    struct leased_lock_result r;
    struct leased_event ev;
    struct leased_error err;
    struct stat_want sw;
    struct waiter w = {0};
    pthread_t th;
    int rc;

    h_start(NULL);
    idle = conn();
    holder = conn();
    waiting = conn();
    watch = conn();
    lock_ok(holder, "held", NULL, &r);
    w.c = waiting;
    ck_assert_int_eq(pthread_create(&th, NULL, wait_forever, &w), 0);
    sw = (struct stat_want){watch, "lock_waiters", 1};
    ck_assert_msg(h_wait_until(stat_reached, &sw, T_MS), "no waiter");
    leased_close(watch);

    h_daemon_signal(&D, SIGTERM);

    rc = leased_next_event(idle, 10000, &ev, &err);
    CK_OK(rc, err, "shutdown event");
    ck_assert_int_eq(ev.type, LEASED_EV_SHUTDOWN);
    ck_assert_str_eq(ev.name, "shutdown");
    leased_event_clear(&ev);
    rc = leased_ping(idle, &err);
    ck_assert_msg(rc == LEASED_E_IO || rc == LEASED_E_SHUTTING_DOWN,
                  "ping after shutdown: %s (%s)", leased_strerror(rc),
                  err.message);
    rc = leased_next_event(idle, 5000, &ev, &err);
    CK_CODE(rc, err, LEASED_E_IO, "events after the close");

    /* A lock waiting without limit ends with the daemon, not never. */
    pthread_join(th, NULL);
    ck_assert_msg(w.rc != LEASED_E_TIMEOUT, "the waiter timed out");
    ck_assert_int_lt(w.took_ms, 20000);
    ck_assert_int_eq(h_daemon_wait(&D, 15000), 0);

    leased_close(idle);
    leased_close(holder);
    leased_close(waiting);
}
END_TEST

/* --- restart, timeout, pipelining --------------------------------------- */

START_TEST(test_reconnect)
{
    struct leased_options opt;
    struct leased_conn *c, *fresh;
    struct leased_lock_result r;
    struct leased_error err;
    char old_session[128];
    int rc;

    h_start(NULL);
    leased_options_init(&opt);
    opt.client = "reconnecting";
    c = conn_opt(D.sock, &opt);
    snprintf(old_session, sizeof old_session, "%s", leased_session(c));
    lock_ok(c, "mine", NULL, &r);

    ck_assert_int_eq(h_daemon_restart(&D), 0);

    /* The old connection reports the loss, and keeps reporting it. */
    rc = leased_ping(c, &err);
    CK_CODE(rc, err, LEASED_E_IO, "ping over the old connection");
    rc = leased_lock(c, "mine", NULL, &r, &err);
    CK_CODE(rc, err, LEASED_E_IO, "lock over the old connection");
    ck_assert_int_eq(leased_fd(c), -1);

    /* A new connection works; so does leased_reconnect, as a new
     * session that holds nothing. */
    fresh = conn();
    rc = leased_ping(fresh, &err);
    CK_OK(rc, err, "ping over a new connection");
    rc = leased_reconnect(c, &err);
    CK_OK(rc, err, "reconnect");
    ck_assert_ptr_nonnull(leased_session(c));
    ck_assert_str_ne(leased_session(c), old_session);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping after reconnect");
    lock_ok(c, "mine", NULL, &r);

    /* Reconnecting to a daemon that is gone fails cleanly, and works
     * again once it is back. */
    h_daemon_kill(&D);
    rc = leased_reconnect(c, &err);
    CK_CODE(rc, err, LEASED_E_CONNECT, "reconnect with no daemon");
    rc = leased_ping(c, &err);
    ck_assert_int_ne(rc, LEASED_OK);
    ck_assert_int_eq(h_daemon_restart(&D), 0);
    rc = leased_reconnect(c, &err);
    CK_OK(rc, err, "reconnect to the restarted daemon");
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping after the second reconnect");
    leased_close(fresh);
    leased_close(c);
}
END_TEST

START_TEST(test_timeout)
{
    struct leased_conn *c;
    struct leased_error err;
    long long t0, took;
    char *reply = NULL;
    int rc;

    h_start(NULL);
    c = conn();
    leased_set_timeout(c, 300);

    /* Time passing is the point here: a stopped daemon never answers. */
    h_daemon_signal(&D, SIGSTOP);
    t0 = h_now_ms();
    rc = leased_ping(c, &err);
    took = elapsed_since(t0);
    CK_CODE(rc, err, LEASED_E_TIMEOUT, "ping to a stopped daemon");
    ck_assert_msg(took >= 250 && took < 3000, "timed out after %lld ms", took);
    h_daemon_signal(&D, SIGCONT);

    /* The late reply to that ping is dropped, not given to this call. */
    leased_set_timeout(c, T_MS);
    rc = leased_call_raw(c, "{\"op\":\"hello\",\"client\":\"after\"}", 0,
                         &reply, &err);
    CK_OK(rc, err, "hello after the timeout");
    ck_assert_msg(strstr(reply, "\"session\""), "reply: %s", reply);
    leased_free(reply);
    rc = leased_ping(c, &err);
    CK_OK(rc, err, "ping after the timeout");
    leased_close(c);
}
END_TEST

START_TEST(test_pipelining)
{
    struct leased_conn *a, *b;
    struct leased_lock_result r;
    struct leased_error err;
    json_t *req, *reply;
    uint64_t id_lock, id_ping, id_stats;
    long long t0;
    int rc;

    h_start(NULL);
    a = conn();
    b = conn();
    lock_ok(a, "pipe", NULL, &r);

    /* A waiting lock, then a ping and stats behind it: the ping's reply
     * comes first and the lock's is kept for later. */
    t0 = h_now_ms();
    req = json_pack("{s:s,s:s,s:i}", "op", "lock", "key", "pipe", "wait_ms",
                    1500);
    rc = leased_send(b, req, &id_lock, &err);
    json_decref(req);
    CK_OK(rc, err, "send lock");
    req = json_pack("{s:s}", "op", "ping");
    rc = leased_send(b, req, &id_ping, &err);
    CK_OK(rc, err, "send ping");
    json_decref(req);
    req = json_pack("{s:s}", "op", "stats");
    rc = leased_send(b, req, &id_stats, &err);
    CK_OK(rc, err, "send stats");
    json_decref(req);
    ck_assert(id_lock != id_ping && id_ping != id_stats);

    rc = leased_wait_reply(b, id_ping, T_MS, &reply, &err);
    CK_OK(rc, err, "ping reply");
    ck_assert_ptr_null(json_object_get(reply, "id"));
    json_decref(reply);
    ck_assert_int_lt(elapsed_since(t0), 1000);
    rc = leased_wait_reply(b, id_stats, T_MS, &reply, &err);
    CK_OK(rc, err, "stats reply");
    ck_assert(json_is_object(json_object_get(reply, "stats")));
    json_decref(reply);

    /* Not there yet: a timeout keeps the request in flight. */
    rc = leased_wait_reply(b, id_lock, 100, &reply, &err);
    CK_CODE(rc, err, LEASED_E_TIMEOUT, "early wait for the lock");
    rc = leased_wait_reply(b, id_lock, T_MS, &reply, &err);
    CK_OK(rc, err, "lock reply");
    ck_assert(json_is_false(json_object_get(reply, "acquired")));
    json_decref(reply);
    ck_assert_int_ge(elapsed_since(t0), 1400);

    rc = leased_wait_reply(b, id_lock, 100, &reply, &err);
    CK_CODE(rc, err, LEASED_E_INVALID, "a reply taken twice");
    leased_close(a);
    leased_close(b);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(connect, 60),
        H_CASE(connect_denied, 60),
        H_CASE(stats, 60),
        H_CASE(locks, 60),
        H_CASE(lock_wait, 60),
        H_CASE(several_keys_at_once, 60),
        H_CASE(unlock_request_id, 60),
        H_CASE(cache, 60),
        H_CASE(cache_mset, 60),
        H_CASE(cache_versioned, 60),
        H_CASE(errors, 60),
        H_CASE(unauthorized, 60),
        H_CASE(busy, 60),
        H_CASE(redis_unavailable, 60),
        H_CASE(lock_lost, 60),
        H_CASE(at_risk, 60),
        H_CASE(shutdown, 60),
        H_CASE(reconnect, 90),
        H_CASE(timeout, 60),
        H_CASE(pipelining, 60),
    };

    return H_MAIN(fx, cases);
}
