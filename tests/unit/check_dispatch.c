/* The op table without a daemon: requests over a socketpair through the
 * real session, proto and dispatch modules, to test ops registered with
 * each flag. What an op is refused follows from its row's flags alone.
 * No Redis, no network. */
#include "ld_common.h"

#include "ld_admin.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_ns.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include "unit.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

/* Generous: ASan and valgrind on a loaded two-core machine. */
#define WAIT_MS 10000

static struct ld_config cfg;
static struct ld_ctx ctx;

static const struct ld_session_handlers handlers = {
    .line = ld_proto_on_line,
    .error_line = ld_proto_bare_error_line,
};

/* Every test op answers with its name and which handler ran. */
static void
op_first(struct ld_req *req)
{
    ld_reply_ok(req, json_pack("{s:s,s:s}", "ran", req->op, "by", "first"));
}

static void
op_second(struct ld_req *req)
{
    ld_reply_ok(req, json_pack("{s:s,s:s}", "ran", req->op, "by", "second"));
}

static const struct ld_op test_ops[] = {
    {"t.plain", op_first, 0},
    {"t.admin", op_first, LD_OP_ADMIN},
    {"t.adds", op_first, LD_OP_ADDS_WORK},
    {"t.waits", op_first, LD_OP_WAITS},
};

/* The configuration of YAML (empty: the defaults), then the modules as
 * ld_server_wire wires them, and the test ops. */
static void
wire(const char *yaml)
{
    char err[256] = "";
    if (yaml[0] != '\0') {
        ck_assert_msg(ld_conf_load_string(&cfg, yaml, strlen(yaml), "d.yml",
                                          err, sizeof(err)) == LD_OK,
                      "%s", err);
    }
    ld_session_init(&ctx, &handlers);
    ld_proto_init(&ctx, ld_dispatch);
    ld_dispatch_init(&ctx);
    ck_assert_int_eq(ld_admin_init(&ctx), LD_OK);
    ck_assert_int_eq(ld_ns_init(&ctx), LD_OK);
    ck_assert_int_eq(ld_dispatch_register_ops(test_ops,
                                              LD_ARRAY_LEN(test_ops)),
                     LD_OK);
}

static void
setup(void)
{
    ld_conf_defaults(&cfg);
    memset(&ctx, 0, sizeof(ctx));
    ctx.base = event_base_new();
    ck_assert_ptr_nonnull(ctx.base);
    ctx.cfg = &cfg;
    ctx.instance = "0123456789abcdef";
    ctx.start_ms = ld_now_ms();
    ld_stats_init(&ctx);
}

static void
teardown(void)
{
    ld_session_cleanup();
    ld_admin_free();
    ld_dispatch_free();
    ld_proto_free();
    event_base_free(ctx.base);
    ld_conf_free(&cfg);
}

/* A session on one end of a socketpair (AUTH: its listener requires
 * hello first); returns the client's end. */
static int
open_session(bool auth, struct ld_session **out)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_int_eq(evutil_make_socket_nonblocking(sv[0]), 0);
    ck_assert_int_eq(evutil_make_socket_nonblocking(sv[1]), 0);
    *out = ld_session_new(sv[1], auth, "test");
    ck_assert_ptr_nonnull(*out);
    return sv[0];
}

/* What the client end has received and not yet looked at. */
static struct {
    char buf[8192];
    size_t len;
    char line[1024];
} client;

/* The next whole line received into client.line, if one came. */
static bool
next_line(int fd)
{
    ssize_t n = read(fd, client.buf + client.len,
                     sizeof(client.buf) - 1 - client.len);
    if (n > 0) {
        client.len += (size_t)n;
    }
    char *nl = memchr(client.buf, '\n', client.len);
    if (nl == NULL) {
        return false;
    }
    size_t len = (size_t)(nl - client.buf);
    ck_assert_uint_lt(len, sizeof(client.line));
    memcpy(client.line, client.buf, len);
    client.line[len] = '\0';
    memmove(client.buf, nl + 1, client.len - len - 1);
    client.len -= len + 1;
    return true;
}

/* Send REQUEST and return its answer: requests go one at a time, so the
 * next line is it. */
static const char *
ask(int fd, const char *request)
{
    size_t len = strlen(request);
    ck_assert_int_eq(write(fd, request, len), (ssize_t)len);
    ck_assert_int_eq(write(fd, "\n", 1), 1);
    uint64_t deadline = ld_now_ms() + WAIT_MS;
    while (!next_line(fd)) {
        ck_assert_msg(ld_now_ms() < deadline, "no answer to %s", request);
        struct timeval tv = {0, 10 * 1000};
        event_base_loopexit(ctx.base, &tv);
        event_base_loop(ctx.base, EVLOOP_ONCE);
    }
    return client.line;
}

/* Close the client's end and turn the loop until the session has seen it
 * and gone, so that nothing of it outlives the case. */
static void
close_session(int fd)
{
    close(fd);
    uint64_t deadline = ld_now_ms() + WAIT_MS;
    while (ld_session_count() > 0) {
        ck_assert_msg(ld_now_ms() < deadline, "the session stayed");
        struct timeval tv = {0, 10 * 1000};
        event_base_loopexit(ctx.base, &tv);
        event_base_loop(ctx.base, EVLOOP_ONCE);
    }
}

#define ck_answer(fd, request, text)                                          \
    do {                                                                      \
        const char *a_ = ask((fd), (request));                                \
        ck_assert_msg(strstr(a_, (text)) != NULL, "%s answered %s, not %s",   \
                      (request), a_, (text));                                 \
    } while (0)

#define UNAUTHORIZED "\"code\":\"unauthorized\""

/* Before hello only hello runs (LD_OP_NO_AUTH): any other op, known or
 * not, is refused unauthorized, and after it the same ones run. */
START_TEST(only_hello_before_auth)
{
    wire("listen:\n  auth_token: secret-token\n");
    struct ld_session *s;
    int c = open_session(true, &s);

    ck_answer(c, "{\"op\":\"t.plain\"}", UNAUTHORIZED);
    ck_answer(c, "{\"op\":\"ping\"}", UNAUTHORIZED);
    ck_answer(c, "{\"op\":\"no.such\"}", UNAUTHORIZED);
    ck_assert(!s->authed);
    ck_answer(c, "{\"op\":\"hello\",\"auth\":\"wrong\"}", UNAUTHORIZED);
    ck_answer(c, "{\"op\":\"hello\",\"auth\":\"secret-token\"}",
              "\"server\":\"leased\"");
    ck_assert(s->authed);
    ck_answer(c, "{\"op\":\"t.plain\"}", "\"ran\":\"t.plain\"");
    ck_answer(c, "{\"op\":\"ping\"}", "\"ok\":true");
    ck_answer(c, "{\"op\":\"no.such\"}", "\"code\":\"unknown_op\"");
    close_session(c);
}
END_TEST

/* An LD_OP_ADMIN op needs the session's admin identity; the others do
 * not look at it. */
START_TEST(admin_flag_needs_operator)
{
    wire("");
    struct ld_session *s;
    int c = open_session(false, &s);

    ck_assert(s->admin); /* the Unix socket's sessions are operators */
    ck_answer(c, "{\"op\":\"t.admin\"}", "\"ran\":\"t.admin\"");
    s->admin = false;
    ck_answer(c, "{\"op\":\"t.admin\"}", "is for operators");
    ck_answer(c, "{\"op\":\"lock.list\"}", "is for operators");
    ck_answer(c, "{\"op\":\"t.plain\"}", "\"ran\":\"t.plain\"");
    close_session(c);
}
END_TEST

/* Over limits.max_memory_bytes an LD_OP_ADDS_WORK op is refused busy, an
 * LD_OP_WAITS one only when its wait_ms is not 0, and an op with neither
 * flag runs. */
START_TEST(memory_flags)
{
    /* One request in flight already counts for more than a byte. */
    wire("limits:\n  max_memory_bytes: 1\n");
    struct ld_session *s;
    int c = open_session(false, &s);

    ck_answer(c, "{\"op\":\"t.adds\"}", "\"code\":\"busy\"");
    ck_answer(c, "{\"op\":\"t.waits\",\"wait_ms\":5}", "\"code\":\"busy\"");
    ck_answer(c, "{\"op\":\"t.waits\",\"wait_ms\":0}", "\"ran\":\"t.waits\"");
    ck_answer(c, "{\"op\":\"t.waits\"}", "\"ran\":\"t.waits\"");
    ck_answer(c, "{\"op\":\"t.plain\"}", "\"ran\":\"t.plain\"");
    close_session(c);
}
END_TEST

/* Under the limit the same ops run. */
START_TEST(memory_flags_under_limit)
{
    wire("");
    struct ld_session *s;
    int c = open_session(false, &s);

    ck_answer(c, "{\"op\":\"t.adds\"}", "\"ran\":\"t.adds\"");
    ck_answer(c, "{\"op\":\"t.waits\",\"wait_ms\":5}", "\"ran\":\"t.waits\"");
    close_session(c);
}
END_TEST

/* A name registered again takes the new row: its handler and flags. */
START_TEST(register_again_replaces)
{
    static const struct ld_op again[] = {
        {"t.plain", op_second, LD_OP_ADMIN},
    };
    wire("");
    struct ld_session *s;
    int c = open_session(false, &s);

    ck_answer(c, "{\"op\":\"t.plain\"}", "\"by\":\"first\"");
    ck_assert_int_eq(ld_dispatch_register_ops(again, LD_ARRAY_LEN(again)),
                     LD_OK);
    ck_answer(c, "{\"op\":\"t.plain\"}", "\"by\":\"second\"");
    s->admin = false;
    ck_answer(c, "{\"op\":\"t.plain\"}", "is for operators");
    close_session(c);
}
END_TEST

/* While the daemon stops every op is refused, hello and ping too. */
START_TEST(stopping_refuses_every_op)
{
    wire("");
    struct ld_session *s;
    int c = open_session(false, &s);

    ck_answer(c, "{\"op\":\"ping\"}", "\"ok\":true");
    ctx.shutting_down = true;
    ck_answer(c, "{\"op\":\"hello\"}", "\"code\":\"shutting_down\"");
    ck_answer(c, "{\"op\":\"ping\"}", "\"code\":\"shutting_down\"");
    ck_answer(c, "{\"op\":\"t.plain\"}", "\"code\":\"shutting_down\"");
    ck_answer(c, "{\"op\":\"no.such\"}", "\"code\":\"unknown_op\"");
    ctx.shutting_down = false;
    close_session(c);
}
END_TEST

static Suite *
dispatch_suite(void)
{
    Suite *s = suite_create("dispatch");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"only_hello_before_auth", only_hello_before_auth},
        {"admin_flag_needs_operator", admin_flag_needs_operator},
        {"memory_flags", memory_flags},
        {"memory_flags_under_limit", memory_flags_under_limit},
        {"register_again_replaces", register_again_replaces},
        {"stopping_refuses_every_op", stopping_refuses_every_op},
    };

    for (size_t i = 0; i < LD_ARRAY_LEN(cases); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int
main(void)
{
    return ld_unit_run(dispatch_suite());
}
