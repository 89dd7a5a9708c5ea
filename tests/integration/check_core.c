/* Foundation integration tests: framing, errors, identity, limits, TCP
 * auth, Redis loss and return, graceful stop, command line, socket
 * activation and clean-up, against a real redis-server and the real
 * leased. Every test starts its own processes. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <errno.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 5000 /* how long a reply may take */

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "core",
    .redis = {&R},
    .daemons = {&D},
};

static bool
matches(const char *re, const char *s)
{
    regex_t rx;
    bool ok;

    ck_assert_int_eq(regcomp(&rx, re, REG_EXTENDED | REG_NOSUB), 0);
    ok = s && regexec(&rx, s, 0, NULL, 0) == 0;
    regfree(&rx);
    return ok;
}

/* Send LINE raw and expect the very next reply to be error CODE. Returns
 * the reply (caller frees) for further checks. */
static json_t *
expect_error(struct h_conn *c, const char *line, const char *code)
{
    json_t *r;

    ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
    r = h_recv(c, T_MS);
    ck_assert_msg(r != NULL, "no reply to %s", line);
    ck_assert_msg(!h_ok(r), "expected %s for %s", code, line);
    ck_assert_str_eq(h_errcode(r), code);
    ck_assert(json_is_string(
        json_object_get(json_object_get(r, "error"), "message")));
    return r;
}

#define PAD_HEAD "{\"op\":\"ping\",\"id\":21,\"pad\":\""

static int
send_str(struct h_conn *c, const char *s)
{
    return h_send_raw(c, s, strlen(s));
}

/* --- hello, ping, stats ------------------------------------------------ */

START_TEST(test_hello_ping_stats)
{
    struct h_conn *c, *c2;
    json_t *r, *st;
    const char *s1;
    char sess1[64];

    h_start(NULL);
    c = h_connect_ok(&D);
    h_assert_ping(c);

    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "client", "core-test");
    ck_assert_msg(h_ok(r), "hello: %s", h_errcode(r));
    ck_assert_str_eq(json_string_value(json_object_get(r, "server")),
                     "leased");
    ck_assert_msg(matches("^[0-9]+\\.[0-9]+\\.[0-9]+",
                          json_string_value(json_object_get(r, "version"))),
                  "version is not semver");
    ck_assert(json_is_integer(json_object_get(r, "protocol")));
    ck_assert_int_eq(json_integer_value(json_object_get(r, "protocol")), 1);
    /* Only names of the contract's optional parts. */
    ck_assert(json_is_array(json_object_get(r, "features")));
    for (size_t i = 0; i < json_array_size(json_object_get(r, "features"));
         i++) {
        const char *f = json_string_value(
            json_array_get(json_object_get(r, "features"), i));
        /* The names protocol.md fixes, those of wave 3 included. */
        ck_assert_msg(f != NULL && matches("^(near|rwlock|semaphore|multilock|"
                                           "cancel|stale|early_refresh|"
                                           "admin|rate|bloom|versioned|"
                                           "mset|shared_near)$",
                                           f),
                      "unknown feature %s", f != NULL ? f : "(not a string)");
    }
    /* The optional parts offered: stale-while-revalidate among them. */
    {
        json_t *f = json_object_get(r, "features");
        bool stale = false;
        for (size_t i = 0; i < json_array_size(f); i++) {
            const char *n = json_string_value(json_array_get(f, i));
            stale = stale || (n != NULL && strcmp(n, "stale") == 0);
        }
        ck_assert_msg(stale, "hello does not offer \"stale\"");
    }
    s1 = json_string_value(json_object_get(r, "session"));
    ck_assert_msg(s1 && *s1, "hello has no session id");
    snprintf(sess1, sizeof sess1, "%s", s1);
    json_decref(r);

    /* Another connection is another session. */
    c2 = h_connect_ok(&D);
    r = h_callf(c2, T_MS, "{s:s}", "op", "hello");
    ck_assert_msg(h_ok(r), "hello without client: %s", h_errcode(r));
    ck_assert_str_ne(json_string_value(json_object_get(r, "session")), sess1);
    json_decref(r);

    r = h_callf(c, T_MS, "{s:s}", "op", "stats");
    ck_assert_msg(h_ok(r), "stats: %s", h_errcode(r));
    st = json_object_get(r, "stats");
    ck_assert(json_is_object(st));
    ck_assert(json_is_number(json_object_get(st, "uptime_s")));
    ck_assert(json_is_integer(json_object_get(st, "sessions")));
    ck_assert_int_eq(json_integer_value(json_object_get(st, "sessions")), 2);
    ck_assert(json_is_object(json_object_get(st, "requests_by_op")));
    ck_assert(json_is_object(json_object_get(st, "errors_by_code")));
    ck_assert_int_ge(json_integer_value(
                         json_object_get(json_object_get(st, "requests_by_op"),
                                         "ping")),
                     1);
    ck_assert_int_ge(json_integer_value(
                         json_object_get(json_object_get(st, "requests_by_op"),
                                         "hello")),
                     2);
    json_decref(r);

    /* The daemon connects to Redis on its own, without any request. */
    ck_assert_int_ge(h_stat(c, "redis_connected"), 1);

    h_close(c2);
    h_close(c);
}
END_TEST

/* --- bad input keeps the connection usable ----------------------------- */

START_TEST(test_errors)
{
    struct h_conn *c;
    json_t *r;
    char *line;
    size_t n;

    h_start("limits:\n  max_request_bytes: 1024\n");
    c = h_connect_ok(&D);

    /* Not JSON. */
    json_decref(expect_error(c, "{nope\n", "bad_request"));
    h_assert_ping(c);
    /* JSON, but not an object. */
    json_decref(expect_error(c, "[1]\n", "bad_request"));
    h_assert_ping(c);
    json_decref(expect_error(c, "42\n", "bad_request"));
    h_assert_ping(c);
    /* No op: the message names the field, the id is echoed. */
    r = expect_error(c, "{\"id\":11}\n", "bad_request");
    ck_assert_msg(strstr(jmsg(r), "op") != NULL,
                  "message does not name op: %s", jmsg(r));
    ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 11);
    json_decref(r);
    h_assert_ping(c);
    /* op of the wrong type. */
    r = expect_error(c, "{\"op\":5,\"id\":12}\n", "bad_request");
    ck_assert_msg(strstr(jmsg(r), "op") != NULL,
                  "message does not name op: %s", jmsg(r));
    json_decref(r);
    h_assert_ping(c);
    /* Unknown op, id echoed. */
    r = expect_error(c, "{\"op\":\"no.such.op\",\"id\":13}\n", "unknown_op");
    ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 13);
    json_decref(r);
    h_assert_ping(c);
    /* A field of the wrong type, in an op the core has. */
    r = expect_error(c, "{\"op\":\"hello\",\"client\":5}\n", "bad_request");
    ck_assert_msg(strstr(jmsg(r), "client") != NULL,
                  "message does not name client: %s", jmsg(r));
    json_decref(r);
    h_assert_ping(c);
    /* Invalid UTF-8 inside a string. */
    json_decref(expect_error(c, "{\"op\":\"ping\",\"x\":\"\xff\xfe\"}\n",
                             "bad_request"));
    h_assert_ping(c);

    /* A line over max_request_bytes, sent in pieces: one too_large, the
     * rest of the line discarded, then back to normal. */
    n = 5000;
    line = malloc(n + 1);
    ck_assert_ptr_nonnull(line);
    memset(line, 'x', n);
    memcpy(line, PAD_HEAD, strlen(PAD_HEAD));
    memcpy(line + n - 3, "\"}\n", 3);
    line[n] = '\0';
    ck_assert_int_eq(h_send_raw(c, line, 1000), 0);
    ck_assert_int_eq(h_send_raw(c, line + 1000, 1000), 0);
    ck_assert_int_eq(h_send_raw(c, line + 2000, n - 2000), 0);
    r = h_recv(c, T_MS);
    ck_assert_str_eq(h_errcode(r), "too_large");
    json_decref(r);
    /* The next reply is the ping's: nothing else came from that line. */
    ck_assert_int_eq(send_str(c, "{\"op\":\"ping\",\"id\":22}\n"), 0);
    r = h_recv(c, T_MS);
    ck_assert_msg(h_ok(r), "ping after too_large: %s", h_errcode(r));
    ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 22);
    json_decref(r);
    /* A line just under the limit is fine. */
    memcpy(line + 900 - 3, "\"}\n", 3);
    ck_assert_int_eq(h_send_raw(c, line, 900), 0);
    r = h_recv(c, T_MS);
    ck_assert_msg(h_ok(r), "900-byte ping: %s", h_errcode(r));
    ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 21);
    json_decref(r);
    free(line);

    h_close(c);
}
END_TEST

START_TEST(test_ids_and_crlf)
{
    struct h_conn *c;
    json_t *r;

    h_start(NULL);
    c = h_connect_ok(&D);

    ck_assert_int_eq(h_send(c, "{s:s,s:s}", "op", "ping", "id", "req-a7"), 0);
    r = h_recv(c, T_MS);
    ck_assert(h_ok(r));
    ck_assert_str_eq(json_string_value(json_object_get(r, "id")), "req-a7");
    json_decref(r);

    ck_assert_int_eq(h_send(c, "{s:s,s:I}", "op", "ping", "id",
                            (json_int_t)9007199254740993LL),
                     0);
    r = h_recv(c, T_MS);
    ck_assert(h_ok(r));
    ck_assert(json_is_integer(json_object_get(r, "id")));
    ck_assert(json_integer_value(json_object_get(r, "id")) ==
              9007199254740993LL);
    json_decref(r);

    ck_assert_int_eq(h_send(c, "{s:s,s:f}", "op", "ping", "id", 2.5), 0);
    r = h_recv(c, T_MS);
    ck_assert(h_ok(r));
    ck_assert(json_is_real(json_object_get(r, "id")));
    ck_assert(json_real_value(json_object_get(r, "id")) == 2.5);
    json_decref(r);

    /* No id at all: a reply without one. */
    ck_assert_int_eq(send_str(c, "{\"op\":\"ping\"}\n"), 0);
    r = h_recv(c, T_MS);
    ck_assert(h_ok(r));
    ck_assert_ptr_null(json_object_get(r, "id"));
    json_decref(r);

    /* CRLF line endings. */
    ck_assert_int_eq(send_str(c, "{\"op\":\"ping\",\"id\":31}\r\n"), 0);
    r = h_recv(c, T_MS);
    ck_assert_msg(h_ok(r), "CRLF ping: %s", h_errcode(r));
    ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 31);
    json_decref(r);

    /* Two requests in one write, the second split across writes. */
    ck_assert_int_eq(send_str(c, "{\"op\":\"ping\",\"id\":32}\n{\"op\":"), 0);
    ck_assert_int_eq(send_str(c, "\"ping\",\"id\":33}\n"), 0);
    r = h_recv_id(c, 32, T_MS);
    ck_assert(h_ok(r));
    json_decref(r);
    r = h_recv_id(c, 33, T_MS);
    ck_assert(h_ok(r));
    json_decref(r);

    h_close(c);
}
END_TEST

/* The id comes back as jansson writes the value that was sent, however
 * it was written and whichever way the daemon read the request (plain
 * requests without a JSON tree, the rest through jansson), in ok lines,
 * cache hits, op errors and errors of requests that were refused. */
static void
expect_id_back(int fd, const char *req)
{
    json_t *sent = json_loads(req, JSON_ALLOW_NUL, NULL);
    ck_assert_ptr_nonnull(sent);
    char *want = json_dumps(json_object_get(sent, "id"),
                            JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(sent);
    size_t n = strlen(req);
    ck_assert_int_eq(write(fd, req, n), (ssize_t)n);
    char line[4096];
    size_t len = 0;
    long long deadline = h_now_ms() + T_MS;
    while (len == 0 || line[len - 1] != '\n') {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = deadline - h_now_ms();
        ck_assert_msg(left > 0 && poll(&p, 1, (int)left) == 1,
                      "no reply to %s", req);
        ssize_t got = read(fd, line + len, 1);
        ck_assert_int_eq(got, 1);
        len++;
        ck_assert_uint_lt(len, sizeof(line));
    }
    line[len] = '\0';
    char head[256];
    snprintf(head, sizeof(head), "{\"id\":%s,", want);
    ck_assert_msg(strncmp(line, head, strlen(head)) == 0,
                  "request %s: reply %s does not begin with %s", req, line,
                  head);
    free(want);
}

START_TEST(test_ids_echoed_exactly)
{
    static const char *reqs[] = {
        "{\"op\":\"ping\",\"id\":\"plain\"}\n",
        "{\"op\":\"ping\",\"id\":\"\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80\"}\n",
        "{\"op\":\"ping\",\"id\":\"\\u00e9t\\u00e9\"}\n",
        "{\"op\":\"ping\",\"id\":\"q\\\"\\\\\\/\\n\"}\n",
        "{\"op\":\"ping\",\"id\":-42}\n",
        "{\"op\":\"ping\",\"id\":-0}\n",
        "{\"op\":\"ping\",\"id\":1e2}\n",
        "{\"op\":\"ping\",\"id\":true}\n",
        "{\"op\":\"ping\",\"id\":null}\n",
        "{\"op\":\"ping\",\"id\":\"a\",\"id\":\"b\"}\n",
        "{ \"id\" : 5 , \"op\" : \"ping\" }\n",
        "{\"op\":\"ping\",\"id\":\"n\",\"x\":{\"a\":[1]}}\n",
        "{\"op\":\"nope\",\"id\":\"e1\"}\n",
        "{\"op\":\"nope\",\"id\":\"\\u0065\\u0032\"}\n",
        "{\"id\":\"no-op\"}\n",
        "{\"op\":7,\"id\":77}\n",
        "{\"op\":\"ping\\u0000\",\"id\":78}\n",
        "{\"op\":\"cache.get\",\"key\":\"idk\",\"id\":\"g\\u00e9t\"}\n",
        "{\"op\":\"cache.get\",\"key\":\"idk\",\"id\":\"get\"}\n",
        "{\"op\":\"lock\",\"key\":7,\"id\":\"bad-key\"}\n",
    };
    struct h_conn *c;

    h_start(NULL);
    c = h_connect_ok(&D);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "cache.set", "key",
                        "idk", "value", "v", "ttl_ms", 60000);
    ck_assert_msg(h_ok(r), "cache.set: %s", h_errcode(r));
    json_decref(r);
    int fd = h_raw_unix(D.sock);
    ck_assert_int_ge(fd, 0);
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        expect_id_back(fd, reqs[i]);
    }
    close(fd);
    h_close(c);
}
END_TEST

/* --- pipelining --------------------------------------------------------- */

START_TEST(test_pipelined_pings)
{
    enum { N = 10000 };
    struct h_conn *c;
    char *buf;
    size_t used = 0;
    unsigned char *seen;

    h_start("log:\n  level: info\n");
    c = h_connect_ok(&D);
    buf = malloc((size_t)N * 40);
    seen = calloc(N + 1, 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(seen);
    for (int i = 1; i <= N; i++) {
        used += (size_t)sprintf(buf + used, "{\"op\":\"ping\",\"id\":%d}\n",
                                i);
    }
    ck_assert_int_eq(h_send_raw(c, buf, used), 0);
    free(buf);

    for (int i = 0; i < N; i++) {
        json_t *r = h_recv(c, T_MS);
        json_t *id = json_object_get(r, "id");
        json_int_t v;

        ck_assert_msg(r != NULL, "only %d of %d replies", i, N);
        ck_assert_msg(h_ok(r), "reply %d not ok: %s", i, h_errcode(r));
        ck_assert(json_is_integer(id));
        v = json_integer_value(id);
        ck_assert_msg(v >= 1 && v <= N, "unexpected id %lld", (long long)v);
        ck_assert_msg(!seen[v], "id %lld answered twice", (long long)v);
        seen[v] = 1;
        json_decref(r);
    }
    free(seen);
    /* Nothing beyond the N replies. */
    {
        json_t *extra = h_recv(c, 200);

        ck_assert_ptr_null(extra);
    }
    h_assert_ping(c);
    h_close(c);
}
END_TEST

/* --- TCP and auth ------------------------------------------------------ */

START_TEST(test_tcp_plain)
{
    struct h_conn *c;

    h_start(NULL);
    ck_assert_int_gt(D.tcp_port, 0);
    c = h_connect_tcp(&D);
    ck_assert_msg(c != NULL, "tcp connect: %s", strerror(errno));
    h_assert_ping(c);
    h_close(c);
}
END_TEST

START_TEST(test_tcp_auth)
{
    struct h_conn *c, *u;
    json_t *r;

    h_start("listen:\n"
            "  unix: \"@DIR@/leased.sock\"\n"
            "  tcp: \"127.0.0.1:0\"\n"
            "  auth_token: \"s3cret-T0ken\"\n");
    ck_assert_int_gt(D.tcp_port, 0);
    c = h_connect_tcp(&D);
    ck_assert_msg(c != NULL, "tcp connect: %s", strerror(errno));

    r = h_callf(c, T_MS, "{s:s}", "op", "ping");
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "stats");
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "hello");
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "auth", "s3cret-T0kem");
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "auth", "s3cret");
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "ping");
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    json_decref(r);

    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "hello", "client", "t", "auth",
                "s3cret-T0ken");
    ck_assert_msg(h_ok(r), "hello with the token: %s", h_errcode(r));
    ck_assert_str_eq(json_string_value(json_object_get(r, "server")),
                     "leased");
    json_decref(r);
    h_assert_ping(c);

    /* Authentication belongs to the session, not the client address. */
    {
        struct h_conn *c2 = h_connect_tcp(&D);

        ck_assert_ptr_nonnull(c2);
        r = h_callf(c2, T_MS, "{s:s}", "op", "ping");
        ck_assert_str_eq(h_errcode(r), "unauthorized");
        json_decref(r);
        h_close(c2);
    }
    /* The Unix socket is not behind the token. */
    u = h_connect_ok(&D);
    h_assert_ping(u);
    h_close(u);
    h_close(c);
}
END_TEST

/* --- limits.max_clients -------------------------------------------------- */

START_TEST(test_max_clients)
{
    struct h_conn *c[3], *extra;
    json_t *r;

    h_start("limits:\n  max_clients: 3\n");
    c[0] = h_connect_ok(&D);
    /* The harness's readiness probes must be gone before we count. */
    ck_assert_msg(h_wait_stat(c[0], "sessions", 1, T_MS), "sessions != 1");
    for (int i = 1; i < 3; i++) {
        c[i] = h_connect_ok(&D);
        h_assert_ping(c[i]);
    }

    extra = h_connect(&D);
    ck_assert_ptr_nonnull(extra);
    r = h_recv(extra, T_MS);
    ck_assert_msg(r != NULL, "the 4th connection got no line");
    ck_assert_str_eq(h_errcode(r), "busy");
    json_decref(r);
    ck_assert_msg(h_wait_closed(extra, T_MS), "the 4th was not closed");
    ck_assert_ptr_null(h_recv(extra, 0));
    h_close(extra);

    /* The three keep working, and a freed slot can be taken again. */
    for (int i = 0; i < 3; i++) {
        h_assert_ping(c[i]);
    }
    h_close(c[2]);
    ck_assert_msg(h_wait_stat(c[0], "sessions", 2, T_MS), "sessions != 2");
    c[2] = h_connect_ok(&D);
    h_assert_ping(c[2]);
    for (int i = 0; i < 3; i++) {
        h_close(c[i]);
    }
}
END_TEST

/* --- Redis goes away and comes back ----------------------------------- */

START_TEST(test_redis_restart)
{
    struct h_conn *c;
    json_t *r;
    pid_t pid;

    h_start(NULL);
    pid = D.pid;
    c = h_connect_ok(&D);
    ck_assert_msg(h_wait_stat_min(c, "redis_connected", 1, 10000),
                  "never connected to Redis");

    h_redis_kill(&R);
    ck_assert_msg(h_wait_stat(c, "redis_connected", 0, 10000),
                  "redis_connected stayed above 0 with Redis dead");
    /* Still serving while Redis is away, and an op that needs Redis gets
     * a clear answer rather than silence. */
    for (int i = 0; i < 20; i++) {
        h_assert_ping(c);
    }
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "rr");
    ck_assert_msg(r != NULL, "no answer to lock with Redis dead");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);

    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert_msg(h_wait_stat_min(c, "redis_connected", 1, 20000),
                  "did not reconnect to the restarted Redis");
    ck_assert_int_ge(h_stat(c, "redis_reconnects"), 1);
    h_assert_ping(c);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "rr");
    ck_assert_msg(h_ok(r) && json_is_true(json_object_get(r, "acquired")),
                  "lock did not work again after Redis came back");
    json_decref(r);

    /* Same process, same connection. */
    ck_assert_int_eq(D.pid, pid);
    ck_assert_int_eq(kill(pid, 0), 0);
    ck_assert_int_eq(waitpid(pid, NULL, WNOHANG), 0);
    h_close(c);
}
END_TEST

/* --- the Redis backend ------------------------------------------------------ */

static json_t *
lock_ok(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", key);

    ck_assert_msg(r != NULL, "no answer to lock %s", key);
    ck_assert_msg(h_ok(r), "lock %s: %s", key, h_errcode(r));
    ck_assert_msg(json_is_true(json_object_get(r, "acquired")),
                  "lock %s not acquired", key);
    return r;
}

/* Redis with requirepass and an ACL user: the daemon authenticates every
 * connection (commands and subscriber) and selects redis.db. */
START_TEST(test_redis_auth_db)
{
    char yaml[512];
    struct h_conn *c;
    redisContext *rc;
    redisReply *rep;
    json_t *r;

    ck_assert_int_eq(h_redis_start(&R, "--requirepass s3cret"), 0);
    rc = h_redis_connect(&R);
    ck_assert_ptr_nonnull(rc);
    rep = redisCommand(rc, "AUTH s3cret");
    ck_assert(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    rep = redisCommand(rc, "ACL SETUSER app on >apppw ~* &* +@all");
    ck_assert(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);

    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  username: app\n"
             "  password: apppw\n  db: 3\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = h_connect_ok(&D);
    r = lock_ok(c, "authdb");
    json_decref(r);

    rep = redisCommand(rc, "SELECT 3");
    freeReplyObject(rep);
    rep = redisCommand(rc, "EXISTS leased:lock:{authdb}");
    ck_assert(rep && rep->type == REDIS_REPLY_INTEGER);
    ck_assert_int_eq(rep->integer, 1);
    freeReplyObject(rep);
    rep = redisCommand(rc, "SELECT 0");
    freeReplyObject(rep);
    rep = redisCommand(rc, "EXISTS leased:lock:{authdb}");
    ck_assert_int_eq(rep->integer, 0);
    freeReplyObject(rep);
    redisFree(rc);
    h_close(c);
}
END_TEST

/* A wrong password: the daemon keeps running, answers redis_unavailable
 * and logs why, instead of exiting or hanging. */
START_TEST(test_redis_bad_auth)
{
    char yaml[256];
    struct h_conn *c;
    json_t *r;

    ck_assert_int_eq(h_redis_start(&R, "--requirepass s3cret"), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  password: wrong\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = h_connect_ok(&D);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "x");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    ck_assert_int_eq(h_stat(c, "redis_connected"), 0);
    h_close(c);
}
END_TEST

/* redis.address as a Unix socket path. */
START_TEST(test_redis_unix_socket)
{
    char dir[200], args[300], yaml[400];
    struct h_conn *c;
    json_t *r;

    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--unixsocket %s/r.sock", dir);
    ck_assert_int_eq(h_redis_start(&R, args), 0);
    snprintf(yaml, sizeof yaml, "redis:\n  address: \"%s/r.sock\"\n", dir);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = h_connect_ok(&D);
    r = lock_ok(c, "unix");
    json_decref(r);
    /* The subscriber works over the socket too: a waiter is woken. */
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", "unix");
    ck_assert(h_ok(r));
    json_decref(r);
    h_close(c);
    h_daemon_cleanup(&D);
    h_redis_stop(&R);
    h_rmdir(dir);
}
END_TEST

/* Scripts run by EVALSHA; after SCRIPT FLUSH the daemon falls back to EVAL
 * and the client never notices. */
START_TEST(test_noscript_fallback)
{
    struct h_conn *c;
    redisReply *rep;
    json_t *r;

    h_start(NULL);
    c = h_connect_ok(&D);
    r = lock_ok(c, "ns1");
    json_decref(r);
    rep = h_redis_cmd(&R, "SCRIPT FLUSH");
    ck_assert(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    r = lock_ok(c, "ns2");
    json_decref(r);
    ck_assert_int_ge(h_stat(c, "redis_noscript"), 1);
    r = lock_ok(c, "ns3");
    json_decref(r);
    h_close(c);
}
END_TEST

/* A Redis that stops answering (SIGSTOP) is noticed by the daemon's own
 * timer: redis_unavailable after about redis.timeout_ms, not a hang, and
 * everything works again once it answers. */
START_TEST(test_redis_timeout)
{
    struct h_conn *c;
    json_t *r;
    long long t0, took;

    char yaml[256];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = h_connect_ok(&D);
    r = lock_ok(c, "to1");
    json_decref(r);

    h_redis_signal(&R, SIGSTOP);
    t0 = h_now_ms();
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "to2");
    took = h_now_ms() - t0;
    h_redis_signal(&R, SIGCONT);
    ck_assert_msg(r != NULL, "no answer while Redis was stopped");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    ck_assert_msg(took >= 250 && took < 2000,
                  "answered after %lld ms with timeout_ms 300", took);
    ck_assert_int_ge(h_stat(c, "redis_timeouts"), 1);

    ck_assert(h_wait_stat_min(c, "redis_connected", 1, 10000));
    r = lock_ok(c, "to3");
    json_decref(r);
    h_close(c);
}
END_TEST

static bool
log_has_reload_failure(void *arg)
{
    return h_log_has(arg, "reload failed");
}

/* SIGHUP applies what can change live and keeps the old configuration
 * when the new file is bad. */
START_TEST(test_reload)
{
    struct h_conn *c;
    json_t *r;
    FILE *f;
    char line[700];

    h_start("limits:\n  max_request_bytes: 100000\n");
    c = h_connect_ok(&D);
    memset(line, 0, sizeof line);
    snprintf(line, sizeof line, "{\"op\":\"ping\",\"id\":5,\"pad\":\"");
    memset(line + strlen(line), 'x', 500);
    strcat(line, "\"}\n");
    r = h_recv(c, 0);
    ck_assert(r == NULL);
    ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
    r = h_recv(c, T_MS);
    ck_assert(h_ok(r));
    json_decref(r);

    /* Lower the limit in the file and reload. */
    {
        char cmd[800];
        snprintf(cmd, sizeof cmd,
                 "sed -i 's/max_request_bytes: 100000/"
                 "max_request_bytes: 200/' '%s'",
                 D.conf);
        ck_assert_int_eq(system(cmd), 0);
    }
    h_daemon_signal(&D, SIGHUP);
    for (int i = 0; i < 200; i++) {
        ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
        r = h_recv(c, T_MS);
        ck_assert_ptr_nonnull(r);
        bool refused = h_errcode(r) && strcmp(h_errcode(r), "too_large") == 0;
        json_decref(r);
        if (refused) {
            break;
        }
        ck_assert_msg(i < 199, "reload did not lower max_request_bytes");
        usleep(10000);
    }

    /* A broken file: the daemon logs, keeps running with what it had. */
    f = fopen(D.conf, "a");
    ck_assert_ptr_nonnull(f);
    fputs("nonsense_key: 1\n", f);
    fclose(f);
    h_daemon_signal(&D, SIGHUP);
    ck_assert(h_wait_until(log_has_reload_failure, &D, 5000));
    h_assert_ping(c);
    ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
    r = h_recv(c, T_MS);
    ck_assert_str_eq(h_errcode(r), "too_large");
    json_decref(r);
    h_close(c);
}
END_TEST

/* Settings of the file format that this version does not implement make
 * the daemon refuse to start, saying why, rather than run without them. */
START_TEST(test_unsupported_refused)
{
    static const struct {
        const char *yaml;
        const char *says;
    } cases[] = {
        {"redis:\n  mode: cluster\n  db: 1\n  addresses: [\"127.0.0.1:1\"]\n",
         "must be 0 in cluster mode"},
    };

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&D, 0, sizeof D);
        ck_assert_msg(h_daemon_start(&D, &R, cases[i].yaml) != 0,
                      "started with: %s", cases[i].yaml);
        ck_assert_msg(h_log_has(&D, cases[i].says), "log does not say '%s'",
                      cases[i].says);
        h_daemon_cleanup(&D);
    }
}
END_TEST

/* --- half-close ----------------------------------------------------------- */

/* socat and nc -N shut their write side after the last request: the answers
 * to requests that need Redis must still arrive, and the session must end
 * at once (its session-bound lock released, not held until the lease). */
START_TEST(test_half_close)
{
    struct h_conn *c, *other;
    json_t *r;
    const char *reqs = "{\"id\":1,\"op\":\"lock\",\"key\":\"hc-bound\"}\n"
                       "{\"id\":2,\"op\":\"lock\",\"key\":\"hc-detached\","
                       "\"detach\":true,\"ttl_ms\":60000}\n";

    h_start(NULL);
    c = h_connect_ok(&D);
    ck_assert_int_eq(h_send_raw(c, reqs, strlen(reqs)), 0);
    ck_assert_int_eq(h_shutdown_write(c), 0);
    for (int id = 1; id <= 2; id++) {
        r = h_recv_id(c, id, T_MS);
        ck_assert_msg(r != NULL, "no answer to request %d after half-close",
                      id);
        ck_assert_msg(json_is_true(json_object_get(r, "acquired")),
                      "request %d not acquired", id);
        json_decref(r);
    }
    ck_assert(h_wait_closed(c, T_MS));
    h_close(c);

    other = h_connect_ok(&D);
    /* Session-bound: released when the session ended, long before the
     * 30 s watchdog lease (the release may still be on its way to Redis
     * when the socket closes, so this waits for it, well short of the
     * lease). Detached: still held. */
    r = h_callf(other, T_MS + 5000, "{s:s,s:s,s:i}", "op", "lock", "key",
                "hc-bound", "wait_ms", 5000);
    ck_assert_msg(json_is_true(json_object_get(r, "acquired")),
                  "session-bound lock survived its half-closed session");
    json_decref(r);
    r = h_callf(other, T_MS, "{s:s,s:s}", "op", "lock", "key", "hc-detached");
    ck_assert(h_ok(r));
    ck_assert(json_is_false(json_object_get(r, "acquired")));
    json_decref(r);
    h_close(other);
}
END_TEST

/* --- graceful stop ------------------------------------------------------- */

START_TEST(test_sigterm)
{
    struct h_conn *c;
    json_t *ev, *r;
    char sock[sizeof D.sock];
    int status;

    h_start(NULL);
    snprintf(sock, sizeof sock, "%s", D.sock);
    c = h_connect_ok(&D);
    h_assert_ping(c);

    h_daemon_signal(&D, SIGTERM);
    ev = h_event(c, 10000);
    ck_assert_msg(ev != NULL, "no shutdown event");
    ck_assert_str_eq(json_string_value(json_object_get(ev, "event")),
                     "shutdown");
    ck_assert_ptr_null(json_object_get(ev, "id"));
    json_decref(ev);
    ck_assert_msg(h_wait_closed(c, 10000), "connection not closed");
    /* Nothing else (no stray reply) before the close. */
    r = h_recv(c, 0);
    ck_assert_ptr_null(r);

    status = h_daemon_wait(&D, 15000);
    ck_assert_msg(status == 0, "exit status %d", status);
    ck_assert_msg(access(sock, F_OK) != 0 && errno == ENOENT,
                  "socket file %s left behind", sock);
    h_close(c);
}
END_TEST

/* --- command line -------------------------------------------------------- */

START_TEST(test_cmdline)
{
    char dir[256], good[300], bad[300], out[4096], err[4096];
    int rc;

    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(good, sizeof good, "%s/good.yml", dir);
    snprintf(bad, sizeof bad, "%s/bad.yml", dir);
    {
        FILE *f = fopen(good, "w");

        ck_assert_ptr_nonnull(f);
        fputs("redis:\n  address: 127.0.0.1:6379\n"
              "limits:\n  max_clients: 50\nlog:\n  level: warn\n",
              f);
        fclose(f);
        f = fopen(bad, "w");
        ck_assert_ptr_nonnull(f);
        fputs("log:\n  level: info\n  no_such_key: 1\n", f);
        fclose(f);
    }
    {
        const char *argv[] = {h_leased_bin(), "-t", "-c", good, NULL};

        rc = h_run(argv, out, sizeof out, err, sizeof err, 10000);
        ck_assert_msg(rc == 0, "-t good.yml: exit %d, stderr: %s", rc, err);
    }
    {
        const char *argv[] = {h_leased_bin(), "-t", "-c", bad, NULL};

        rc = h_run(argv, out, sizeof out, err, sizeof err, 10000);
        ck_assert_msg(rc == 1, "-t bad.yml: exit %d, stderr: %s", rc, err);
        ck_assert_msg(strstr(err, "bad.yml:3:") != NULL,
                      "no bad.yml:3: position in: %s", err);
        ck_assert_msg(strstr(err, "no_such_key") != NULL,
                      "the bad key is not named in: %s", err);
    }
    {
        const char *argv[] = {h_leased_bin(), "-v", NULL};

        rc = h_run(argv, out, sizeof out, err, sizeof err, 10000);
        ck_assert_msg(rc == 0, "-v: exit %d", rc);
        ck_assert_msg(matches("[0-9]+\\.[0-9]+\\.[0-9]+", out),
                      "-v printed no version: %s", out);
    }
    h_rmdir(dir);
    ck_assert_int_ne(access(dir, F_OK), 0);
}
END_TEST

/* --- socket activation --------------------------------------------------- */

START_TEST(test_socket_activation)
{
    char dir[256], path[300];
    struct sockaddr_un sa;
    struct h_conn *c;
    int fd;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/activated.sock", dir);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 16), 0);

    ck_assert_int_eq(h_daemon_start_fd(&D, &R, NULL, fd, path), 0);
    close(fd); /* only the daemon holds it now */

    c = h_connect_ok(&D);
    h_assert_ping(c);
    {
        json_t *r = h_callf(c, T_MS, "{s:s}", "op", "hello");

        ck_assert_msg(h_ok(r), "hello over the adopted socket: %s",
                      h_errcode(r));
        json_decref(r);
    }
    h_close(c);
    h_daemon_cleanup(&D);
    h_rmdir(dir);
}
END_TEST

/* --- nothing left behind -------------------------------------------------- */

START_TEST(test_cleanup)
{
    pid_t rpid, dpid;
    char rdir[sizeof R.dir], ddir[sizeof D.dir];

    h_start(NULL);
    rpid = R.pid;
    dpid = D.pid;
    snprintf(rdir, sizeof rdir, "%s", R.dir);
    snprintf(ddir, sizeof ddir, "%s", D.dir);
    ck_assert_int_gt(rpid, 0);
    ck_assert_int_gt(dpid, 0);
    ck_assert_int_eq(access(ddir, F_OK), 0);

    h_daemon_cleanup(&D);
    h_redis_stop(&R);

    ck_assert_int_eq(D.pid, 0);
    ck_assert_int_eq(R.pid, 0);
    errno = 0;
    ck_assert_int_eq(kill(dpid, 0), -1);
    ck_assert_int_eq(errno, ESRCH);
    errno = 0;
    ck_assert_int_eq(kill(rpid, 0), -1);
    ck_assert_int_eq(errno, ESRCH);
    ck_assert_int_ne(access(rdir, F_OK), 0);
    ck_assert_int_ne(access(ddir, F_OK), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(hello_ping_stats, 60),
        H_CASE(errors, 60),
        H_CASE(ids_and_crlf, 60),
        H_CASE(ids_echoed_exactly, 60),
        H_CASE(pipelined_pings, 120),
        H_CASE(tcp_plain, 60),
        H_CASE(tcp_auth, 60),
        H_CASE(max_clients, 60),
        H_CASE(redis_restart, 90),
        H_CASE(redis_auth_db, 60),
        H_CASE(redis_bad_auth, 60),
        H_CASE(redis_unix_socket, 60),
        H_CASE(noscript_fallback, 60),
        H_CASE(redis_timeout, 60),
        H_CASE(reload, 60),
        H_CASE(unsupported_refused, 60),
        H_CASE(half_close, 60),
        H_CASE(sigterm, 60),
        H_CASE(cmdline, 60),
        H_CASE(socket_activation, 60),
        H_CASE(cleanup, 60),
    };

    return H_MAIN(fx, cases);
}
