/* Stopping without losing anything, and health: a SIGTERM with
 * shutdown.drain_ms keeps the sessions already open served (their locks
 * renewed) while new connections are refused and /readyz fails, until
 * the sessions close, the drain time passes or a second signal comes;
 * /livez and /readyz on the metrics listener; leasectl wait. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define T_MS 5000
#define WATCHDOG_MS 300

static struct h_redis R;
static struct h_daemon D, D2;
static const struct h_fixture fx = {
    .suite = "drain",
    .redis = {&R},
    .daemons = {&D, &D2},
};

#define DRAIN_YAML(ms)                                                        \
    "lock:\n  watchdog_ms: 300\nshutdown:\n  drain_ms: " #ms "\n"

static int metrics_port;

/* EXTRA with the metrics listener on a free port, into BUF. */
static const char *
with_metrics(char *buf, size_t len, const char *extra)
{
    metrics_port = h_free_port();
    snprintf(buf, len, "metrics:\n  listen: \"127.0.0.1:%d\"\n%s",
             metrics_port, extra);
    return buf;
}

static void
start(const char *extra)
{
    char yaml[512];

    h_start(with_metrics(yaml, sizeof yaml, extra));
}

/* --- HTTP on the metrics listener ---------------------------------------- */

struct http {
    int status;
    char body[512];
};

/* GET PATH on the daemon's metrics listener; false when nothing answered
 * (the listener is gone). */
static bool
http_get(const char *path, struct http *h)
{
    char req[256], buf[4096];
    struct sockaddr_in sa;
    struct timeval tv = {5, 0};
    size_t len = 0;
    ssize_t n;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_int_ge(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)metrics_port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return false;
    }
    snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
             path);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    while (len < sizeof buf - 1 &&
           (n = read(fd, buf + len, sizeof buf - 1 - len)) > 0) {
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    h->body[0] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &h->status) != 1) {
        return false;
    }
    const char *body = strstr(buf, "\r\n\r\n");
    if (body != NULL) {
        snprintf(h->body, sizeof h->body, "%s", body + 4);
    }
    return true;
}

static void
assert_http(const char *path, int status, const char *body)
{
    struct http h;

    ck_assert_msg(http_get(path, &h), "GET %s: no answer", path);
    ck_assert_msg(h.status == status && strcmp(h.body, body) == 0,
                  "GET %s: %d \"%s\", want %d \"%s\"", path, h.status, h.body,
                  status, body);
}

struct readyz_want {
    const char *body;
    struct http last;
};

static bool
readyz_is(void *arg)
{
    struct readyz_want *w = arg;

    return http_get("/readyz", &w->last) && strcmp(w->last.body, w->body) == 0;
}

static void
wait_readyz(const char *body)
{
    struct readyz_want w = {.body = body};

    ck_assert_msg(h_wait_until(readyz_is, &w, 10000),
                  "/readyz never said \"%s\" (last: %d \"%s\")", body,
                  w.last.status, w.last.body);
}

/* --- helpers ------------------------------------------------------------- */

static long long
lock_key_pttl(const char *key)
{
    long long a = h_r_int(&R, "PTTL leased:lock:%s", key);
    long long b = h_r_int(&R, "PTTL leased:lock:{%s}", key);

    return a > b ? a : b;
}

static struct h_conn *
lock_session(const char *key)
{
    struct h_conn *c = h_connect_ok(&D);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", key);

    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "lock: %s", h_dump(r));
    json_decref(r);
    return c;
}

/* A new connection during a drain gets one error line, then the close. */
static void
assert_refused(void)
{
    char buf[1024];
    size_t len = 0;
    ssize_t n;
    int fd = h_raw_unix(D.sock);
    struct pollfd p = {.fd = fd, .events = POLLIN};

    while (len < sizeof buf - 1 && poll(&p, 1, T_MS) == 1 &&
           (n = read(fd, buf + len, sizeof buf - 1 - len)) > 0) {
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    json_t *r = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    ck_assert_msg(r != NULL && strchr(buf, '\n') == buf + len - 1,
                  "not one line then the close: \"%s\"", buf);
    ck_assert_str_eq(h_errcode(r), "shutting_down");
    ck_assert_msg(strstr(jmsg(r), "draining") != NULL, "message: %s", jmsg(r));
    json_decref(r);
}

struct renewals {
    struct h_conn *c;
    long long from;
};

/* The watchdog renews every third of its period: six renewals span two
 * periods. */
static bool
renewed_twice_over(void *arg)
{
    struct renewals *w = arg;

    return h_stat(w->c, "lock_renewals_ok") >= w->from + 6;
}

static bool
shutdown_event(struct h_conn *c)
{
    json_t *ev = h_event(c, T_MS);
    bool ok = ev != NULL && strcmp(jstr(ev, "event"), "shutdown") == 0;

    json_decref(ev);
    return ok;
}

/* --- drain --------------------------------------------------------------- */

/* The open session keeps its lock, renewed well past the watchdog period,
 * while a new connection is refused and /readyz says draining; a second
 * SIGTERM ends the drain: the lock is released and the daemon exits. */
START_TEST(test_drain_serves_open_sessions)
{
    start(DRAIN_YAML(60000));
    struct h_conn *c = lock_session("dr");
    assert_http("/readyz", 200, "ready\n");

    h_daemon_signal(&D, SIGTERM);
    wait_readyz("draining\n");
    assert_http("/livez", 200, "ok\n");
    assert_refused();

    long long t0 = h_now_ms();
    struct renewals w = {c, h_stat(c, "lock_renewals_ok")};
    ck_assert_msg(h_wait_until(renewed_twice_over, &w, 10000),
                  "the lock was not renewed during the drain");
    ck_assert_msg(h_now_ms() - t0 >= WATCHDOG_MS,
                  "renewed too fast to be the watchdog");
    ck_assert_int_gt(lock_key_pttl("dr"), 0);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "dr");
    ck_assert_msg(h_ok(r) && jtrue(r, "locked"), "lock.info: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_daemon_wait(&D, 0), -1);

    h_daemon_signal(&D, SIGTERM);
    ck_assert_msg(shutdown_event(c), "no shutdown event");
    ck_assert_int_eq(h_daemon_wait(&D, T_MS), 0);
    ck_assert_int_lt(lock_key_pttl("dr"), 0);
    ck_assert_msg(h_log_has(&D, "drain ended by a second signal"),
                  "no log line for the second signal");
    h_close(c);
}
END_TEST

/* The drain ends as soon as the last session closes. */
START_TEST(test_drain_ends_with_last_session)
{
    start(DRAIN_YAML(60000));
    struct h_conn *c = lock_session("last");

    h_daemon_signal(&D, SIGTERM);
    wait_readyz("draining\n");
    ck_assert_int_eq(h_daemon_wait(&D, 0), -1);
    h_close(c);
    ck_assert_int_eq(h_daemon_wait(&D, T_MS), 0);
    ck_assert_int_lt(lock_key_pttl("last"), 0);
}
END_TEST

/* drain_ms bounds it: a session that stays is told and closed, and its
 * locks are released. */
START_TEST(test_drain_deadline)
{
    start(DRAIN_YAML(400));
    struct h_conn *c = lock_session("dl");

    h_daemon_signal(&D, SIGTERM);
    ck_assert_msg(shutdown_event(c), "no shutdown event");
    ck_assert_int_eq(h_daemon_wait(&D, T_MS), 0);
    ck_assert_int_lt(lock_key_pttl("dl"), 0);
    ck_assert_msg(h_log_has(&D, "drain time is over"),
                  "no log line for the drain's end");
    h_close(c);
}
END_TEST

/* Without drain_ms, SIGTERM stops at once as it always did. */
START_TEST(test_no_drain_by_default)
{
    start("");
    struct h_conn *c = lock_session("nd");

    h_daemon_signal(&D, SIGTERM);
    ck_assert_msg(shutdown_event(c), "no shutdown event");
    ck_assert_int_eq(h_daemon_wait(&D, T_MS), 0);
    ck_assert_int_lt(lock_key_pttl("nd"), 0);
    h_close(c);
}
END_TEST

/* --- health -------------------------------------------------------------- */

START_TEST(test_readyz_redis_down)
{
    char redis[128], yaml[512];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(redis, sizeof redis,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    with_metrics(yaml, sizeof yaml, redis);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    assert_http("/readyz", 200, "ready\n");
    assert_http("/livez", 200, "ok\n");

    h_redis_kill(&R);
    wait_readyz("redis_unavailable\n");
    assert_http("/readyz", 503, "redis_unavailable\n");
    assert_http("/livez", 200, "ok\n");

    ck_assert_int_eq(h_redis_restart(&R), 0);
    wait_readyz("ready\n");
    assert_http("/readyz", 200, "ready\n");
}
END_TEST

/* --- second deletes handed over ---------------------------------------- */

/* Long enough for a stop and a start under valgrind on a loaded machine,
 * so that the delete is seen waiting for its due time. */
#define DUE_DELAY_MS 10000
/* How late a handed-over delete may run: the daemons look each second. */
#define DUE_LATE_MS 5000
#define DUE_SET "leased:cache:due"

static bool
entry_gone(void *arg)
{
    (void)arg;
    return h_r_int(&R, "EXISTS leased:cache:{handed}") == 0;
}

static bool
due_set_empty(void *arg)
{
    (void)arg;
    return h_r_int(&R, "ZCARD %s", DUE_SET) == 0;
}

/* Through D: a value for "handed", then its invalidation with a second
 * delete due DUE_DELAY_MS later; then D stops, handing that delete to
 * Redis, and its directory (journal and all) goes away. Returns the
 * time of the invalidation. */
static long long
invalidate_and_stop(void)
{
    struct h_conn *c = h_connect_ok(&D);
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", "handed", "value", "v1")));
    long long t0 = h_now_ms();
    json_t *r = h_must(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op",
                               "cache.invalidate", "key", "handed", "delay_ms",
                               DUE_DELAY_MS));
    ck_assert_int_eq(jint(r, "pending"), 1);
    json_decref(r);
    h_close(c);

    ck_assert_int_eq(h_daemon_stop(&D), 0);
    ck_assert_int_eq(h_r_int(&R, "ZCARD %s", DUE_SET), 1);
    ck_assert_msg(h_log_has(&D, "deletes handed over to Redis\" count=1"),
                  "no hand-over logged");
    h_daemon_cleanup(&D);
    return t0;
}

/* A reader brings the old value back through D2 before the delete is
 * due; the handed-over delete must remove it on time. */
static void
assert_deleted_on_time(long long t0)
{
    struct h_conn *c2 = h_connect_ok(&D2);
    json_decref(h_must(h_callf(c2, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", "handed", "value", "v1")));
    h_close(c2);
    ck_assert_msg(h_now_ms() - t0 < DUE_DELAY_MS - 500,
                  "too slow to test the delay: %lld ms", h_now_ms() - t0);

    ck_assert_msg(h_wait_until(entry_gone, NULL,
                               DUE_DELAY_MS + 2 * DUE_LATE_MS),
                  "the handed-over delete never ran");
    long long took = h_now_ms() - t0;
    ck_assert_msg(took >= DUE_DELAY_MS - 100 &&
                      took <= DUE_DELAY_MS + DUE_LATE_MS,
                  "deleted %lld ms after the invalidation, delay %d", took,
                  DUE_DELAY_MS);
    ck_assert_msg(h_wait_until(due_set_empty, NULL, T_MS),
                  "the member stayed in the due set");
}

/* Another daemon on the same Redis, running all along, carries out the
 * delete a stopped one handed over. */
START_TEST(test_second_delete_handed_over)
{
    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    assert_deleted_on_time(invalidate_and_stop());
}
END_TEST

/* A daemon started after the hand-over looks at the set at once. */
START_TEST(test_second_delete_taken_over_at_start)
{
    h_start(NULL);
    long long t0 = invalidate_and_stop();
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    assert_deleted_on_time(t0);
}
END_TEST

/* Calls of the due set's ZCARD (in the claim script) Redis has run. */
static long long
due_polls(void)
{
    redisReply *r = h_redis_cmd(&R, "INFO commandstats");
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STRING, "INFO failed");
    const char *at = strstr(r->str, "cmdstat_zcard:calls=");
    long long n = at != NULL ? atoll(at + strlen("cmdstat_zcard:calls=")) : 0;
    freeReplyObject(r);
    return n;
}

static bool
due_polled_since(void *arg)
{
    return due_polls() > *(long long *)arg;
}

/* With the due set empty, the look at start is the only one: an idle
 * daemon does not ask Redis about it each second. */
START_TEST(test_empty_due_set_not_polled)
{
    h_start(NULL);
    long long none = 0;
    ck_assert_msg(h_wait_until(due_polled_since, &none, T_MS),
                  "the due set was not looked at after the start");
    long long polls = due_polls();
    ck_assert_msg(!h_wait_until(due_polled_since, &polls, 3500),
                  "an empty due set was asked about again (%lld looks)",
                  due_polls());
    ck_assert_int_eq(h_r_int(&R, "ZCARD %s", DUE_SET), 0);
}
END_TEST

/* --- leasectl wait ------------------------------------------------------- */

static const char *
ctl_bin(void)
{
    const char *p = getenv("LEASECTL_BIN");

    return p && *p ? p : "tools/leasectl";
}

static int
ctl_wait(const char *timeout, char *out, char *err)
{
    const char *argv[] = {ctl_bin(),   "-s",    D.sock, "wait",
                          "--timeout", timeout, NULL};

    return h_run(argv, out, 512, err, 512, 30000);
}

START_TEST(test_leasectl_wait)
{
    char yaml[256], out[512], err[512];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    ck_assert_int_eq(ctl_wait("5s", out, err), 0);
    ck_assert_str_eq(out, "ready\n");

    h_redis_kill(&R);
    long long t0 = h_now_ms();
    int rc = ctl_wait("300ms", out, err);
    ck_assert_msg(rc != 0 && strstr(err, "leasectl: wait: not ready after "
                                         "300 ms: ") != NULL,
                  "exit %d, stderr: %s", rc, err);
    ck_assert_int_ge(h_now_ms() - t0, 300);

    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert_int_eq(ctl_wait("20s", out, err), 0);
    ck_assert_str_eq(out, "ready\n");

    /* No daemon at all: the wait ends with the connect error. */
    h_daemon_kill(&D);
    rc = ctl_wait("200ms", out, err);
    ck_assert_msg(rc != 0 && strstr(err, "connect") != NULL,
                  "exit %d, stderr: %s", rc, err);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(drain_serves_open_sessions, 60),
        H_CASE(drain_ends_with_last_session, 60),
        H_CASE(drain_deadline, 60),
        H_CASE(no_drain_by_default, 60),
        H_CASE(readyz_redis_down, 60),
        H_CASE(second_delete_handed_over, 90),
        H_CASE(second_delete_taken_over_at_start, 90),
        H_CASE(empty_due_set_not_polled, 60),
        H_CASE(leasectl_wait, 90),
    };

    return H_MAIN(fx, cases);
}
