/* The session lifecycle without a daemon: sessions over socketpairs in a
 * real event base, with a test line handler in place of proto. No Redis,
 * no network. */
#include "ld_common.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_errcode.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include "unit.h"

#include <check.h>
#include <errno.h>
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

/* What the test handler saw. With BEGIN set each line starts a request,
 * which the test answers itself. */
static struct {
    bool begin;
    int lines;
    char text[16][64];
    struct ld_session *last;
    int closed; /* close hook calls */
    struct ld_session *closed_s;
} seen;

static void
test_line(struct ld_session *s, const char *line, size_t len)
{
    if (seen.lines < (int)LD_ARRAY_LEN(seen.text)) {
        snprintf(seen.text[seen.lines], sizeof(seen.text[0]), "%.*s", (int)len,
                 line);
    }
    seen.lines++;
    seen.last = s;
    if (seen.begin) {
        ld_session_req_begin(s);
    }
}

static char *
test_error_line(int code, const char *message, size_t *len)
{
    char *buf = malloc(256);
    ck_assert_ptr_nonnull(buf);
    int n = snprintf(buf, 256, "E %s %s\n", ld_errcode_name(code), message);
    *len = (size_t)n;
    return buf;
}

static const struct ld_session_handlers handlers = {
    .line = test_line,
    .error_line = test_error_line,
};

static void
close_hook(struct ld_session *s)
{
    /* Hooks run once, while the session is already marked closed. */
    ck_assert(!s->open);
    seen.closed++;
    seen.closed_s = s;
}

static void
setup(void)
{
    memset(&seen, 0, sizeof(seen));
    ld_conf_defaults(&cfg);
    memset(&ctx, 0, sizeof(ctx));
    ctx.base = event_base_new();
    ck_assert_ptr_nonnull(ctx.base);
    ctx.cfg = &cfg;
    ctx.instance = "0123456789abcdef";
    ctx.start_ms = ld_now_ms();
    ld_stats_init(&ctx);
    ld_session_init(&ctx, &handlers);
    ld_session_on_close(close_hook);
}

static void
teardown(void)
{
    ld_session_cleanup();
    event_base_free(ctx.base);
    ld_conf_free(&cfg);
}

/* A session on one end of a socketpair; returns the client's end. */
static int
open_session(struct ld_session **out)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_int_eq(evutil_make_socket_nonblocking(sv[0]), 0);
    ck_assert_int_eq(evutil_make_socket_nonblocking(sv[1]), 0);
    struct ld_session *s = ld_session_new(sv[1], false, "test");
    if (out != NULL) {
        *out = s;
    }
    return sv[0];
}

static void
send_all(int fd, const char *text)
{
    size_t len = strlen(text);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
}

/* Turn the loop until COND holds or WAIT_MS pass; the timer bounds each
 * turn so that the condition is looked at often. */
#define run_until(cond)                                                       \
    do {                                                                      \
        uint64_t deadline_ = ld_now_ms() + WAIT_MS;                           \
        while (!(cond)) {                                                     \
            ck_assert_msg(ld_now_ms() < deadline_, "timed out: %s", #cond);   \
            struct timeval tv_ = {0, 10 * 1000};                              \
            event_base_loopexit(ctx.base, &tv_);                              \
            event_base_loop(ctx.base, EVLOOP_ONCE);                           \
        }                                                                     \
    } while (0)

/* What the client end has received so far; EOF once the session's side
 * has closed. */
struct client_in {
    char buf[4096];
    size_t len;
    bool eof;
};

static void
client_read(int fd, struct client_in *in)
{
    for (;;) {
        size_t room = sizeof(in->buf) - 1 - in->len;
        ssize_t n = read(fd, in->buf + in->len, room);
        if (n > 0) {
            in->len += (size_t)n;
            in->buf[in->len] = '\0';
            continue;
        }
        if (n == 0) {
            in->eof = true;
        }
        return;
    }
}

static bool
client_has(int fd, struct client_in *in, const char *text)
{
    client_read(fd, in);
    return strstr(in->buf, text) != NULL;
}

static bool
client_eof(int fd, struct client_in *in)
{
    client_read(fd, in);
    return in->eof;
}

/* Bytes in, whole lines out to the handler, in order, whatever the
 * chunking; CRLF is a line end too. */
START_TEST(lines_to_handler)
{
    struct ld_session *s = NULL;
    int c = open_session(&s);
    ck_assert_ptr_nonnull(s);
    ck_assert(s->open);
    ck_assert_int_eq(ld_session_count(), 1);
    ck_assert_int_eq(ld_stats.sessions, 1);
    ck_assert_int_eq(ld_stats.connections_accepted, 1);
    ck_assert(strncmp(s->name, "0123456789abcdef-", 17) == 0);

    send_all(c, "one\ntw");
    run_until(seen.lines == 1);
    send_all(c, "o\r\nthree\n");
    run_until(seen.lines == 3);
    ck_assert_str_eq(seen.text[0], "one");
    ck_assert_str_eq(seen.text[1], "two");
    ck_assert_str_eq(seen.text[2], "three");
    ck_assert_ptr_eq(seen.last, s);
    ck_assert_int_eq(ld_stats.requests, 3);
    ck_assert_int_eq(s->pending, 0);
    close(c);
    run_until(ld_session_count() == 0);
    ck_assert_int_eq(seen.closed, 1);
}
END_TEST

/* A request holds a reference and counts as pending until answered; the
 * reply reaches the client. */
START_TEST(request_and_reply)
{
    struct ld_session *s = NULL;
    struct client_in in = {.len = 0};
    int c = open_session(&s);
    seen.begin = true;
    ck_assert_uint_eq(s->refs, 1);

    send_all(c, "req\n");
    run_until(seen.lines == 1);
    ck_assert_int_eq(s->pending, 1);
    ck_assert_int_eq(ld_stats.requests_pending, 1);
    ck_assert_uint_eq(s->refs, 2);

    ld_session_write(s, "reply\n", 6);
    ld_session_req_done(s);
    ck_assert_int_eq(s->pending, 0);
    ck_assert_int_eq(ld_stats.requests_pending, 0);
    ck_assert_uint_eq(s->refs >= 1, 1);
    run_until(client_has(c, &in, "reply\n"));
    ck_assert_str_eq(in.buf, "reply\n");

    /* An event goes out as one JSON line. */
    ld_session_event(s, json_pack("{s:s}", "event", "x"));
    run_until(client_has(c, &in, "{\"event\":\"x\"}\n"));
    close(c);
    run_until(ld_session_count() == 0);
}
END_TEST

/* Closing with a request in flight: hooks run once, the session leaves
 * the open list at once, but its memory and its socket stay until the
 * answer is written, which the client still receives; then the socket
 * closes. */
START_TEST(close_with_request_in_flight)
{
    struct ld_session *s = NULL;
    struct client_in in = {.len = 0};
    int c = open_session(&s);
    seen.begin = true;
    send_all(c, "req\n");
    run_until(seen.lines == 1);

    ld_session_close(s, "test");
    ck_assert(!s->open);
    ck_assert_int_eq(seen.closed, 1);
    ck_assert_ptr_eq(seen.closed_s, s);
    ck_assert_int_eq(ld_session_count(), 0);
    ck_assert_ptr_null(ld_session_first());
    ck_assert_int_eq(ld_session_lingering(), 1);
    /* A second close is nothing. */
    ld_session_close(s, "again");
    ck_assert_int_eq(seen.closed, 1);

    /* The reader is off: more lines are not handled. */
    send_all(c, "late\n");
    ld_session_write(s, "answer\n", 7);
    ld_session_req_done(s);
    run_until(ld_session_lingering() == 0);
    run_until(client_eof(c, &in));
    ck_assert_str_eq(in.buf, "answer\n");
    ck_assert_int_eq(seen.lines, 1);
    close(c);
}
END_TEST

/* A closed session whose answer never comes lingers only within its bound
 * (redis.timeout_ms plus a margin); the late answer is then dropped and
 * the memory goes with it. */
START_TEST(linger_is_bounded)
{
    struct ld_session *s = NULL;
    struct client_in in = {.len = 0};
    cfg.redis.timeout_ms = 50;
    int c = open_session(&s);
    seen.begin = true;
    send_all(c, "req\n");
    run_until(seen.lines == 1);
    uint64_t t0 = ld_now_ms();
    ld_session_close(s, "test");
    ck_assert_int_eq(ld_session_lingering(), 1);
    run_until(ld_session_lingering() == 0);
    /* The bound is timeout_ms plus two seconds (LINGER_EXTRA_MS). */
    ck_assert_msg(ld_now_ms() - t0 >= 2000, "released after %llu ms",
                  (unsigned long long)(ld_now_ms() - t0));
    run_until(client_eof(c, &in));
    ck_assert_uint_eq(in.len, 0);
    /* The request still holds the struct: the answer is dropped. */
    ck_assert_int_eq(s->pending, 1);
    ld_session_write(s, "late\n", 5);
    ld_session_req_done(s);
    close(c);
}
END_TEST

/* A reference taken by a module keeps the struct past the close and the
 * release of the socket; the last unref frees it (ASan and valgrind see
 * a leak or a use after free otherwise). */
START_TEST(reference_outlives_close)
{
    struct ld_session *s = NULL;
    int c = open_session(&s);
    ld_session_ref(s);
    ck_assert_uint_eq(s->refs, 2);
    close(c);
    run_until(seen.closed == 1);
    run_until(ld_session_lingering() == 0);
    ck_assert(!s->open);
    ck_assert_ptr_null(s->bev);
    ck_assert_uint_eq(s->refs, 1);
    /* Writing to it now is harmless. */
    ld_session_write(s, "x\n", 2);
    ld_session_unref(s);
}
END_TEST

/* Over limits.max_clients the connection gets one error line and is
 * closed; no session is made. */
START_TEST(refused_at_max_clients)
{
    struct client_in in = {.len = 0};
    cfg.limits.max_clients = 1;
    int c1 = open_session(NULL);
    struct ld_session *s2 = (struct ld_session *)1;
    int c2 = open_session(&s2);
    ck_assert_ptr_null(s2);
    ck_assert_int_eq(ld_session_count(), 1);
    ck_assert_int_eq(ld_stats.connections_rejected, 1);
    run_until(client_eof(c2, &in));
    ck_assert_str_eq(in.buf, "E busy too many clients (limits.max_clients)\n");
    close(c2);
    close(c1);
    run_until(ld_session_count() == 0);
}
END_TEST

/* A line over limits.max_request_bytes is answered by the session
 * itself and never reaches the handler; the next line does. */
START_TEST(line_too_large)
{
    struct client_in in = {.len = 0};
    char big[200];
    cfg.limits.max_request_bytes = 64;
    int c = open_session(NULL);
    memset(big, 'x', sizeof(big) - 2);
    big[sizeof(big) - 2] = '\n';
    big[sizeof(big) - 1] = '\0';
    send_all(c, big);
    send_all(c, "ok\n");
    run_until(seen.lines == 1);
    ck_assert_str_eq(seen.text[0], "ok");
    run_until(client_has(c, &in, "\n"));
    ck_assert(strncmp(in.buf, "E too_large ", 12) == 0);
    close(c);
    run_until(ld_session_count() == 0);
}
END_TEST

/* The graceful stop tells every session and closes it; foreach visits
 * each open session once, also when the visit closes it. */
START_TEST(shutdown_all_and_foreach)
{
    struct client_in in1 = {.len = 0}, in2 = {.len = 0};
    struct ld_session *s1 = NULL, *s2 = NULL;
    int c1 = open_session(&s1);
    int c2 = open_session(&s2);
    ck_assert_int_eq(ld_session_count(), 2);
    int n = 0;
    for (struct ld_session *s = ld_session_first(); s != NULL;
         s = ld_session_next(s)) {
        ck_assert(s == s1 || s == s2);
        n++;
    }
    ck_assert_int_eq(n, 2);

    ld_session_shutdown_all();
    ck_assert_int_eq(ld_session_count(), 0);
    ck_assert_int_eq(seen.closed, 2);
    run_until(client_eof(c1, &in1) && client_eof(c2, &in2));
    ck_assert_str_eq(in1.buf, "{\"event\":\"shutdown\"}\n");
    ck_assert_str_eq(in2.buf, "{\"event\":\"shutdown\"}\n");
    run_until(ld_session_lingering() == 0);
    close(c1);
    close(c2);
}
END_TEST

/* While stopping, a new connection is refused with shutting_down. */
START_TEST(refused_while_stopping)
{
    struct client_in in = {.len = 0};
    struct ld_session *s = (struct ld_session *)1;
    ctx.shutting_down = true;
    int c = open_session(&s);
    ck_assert_ptr_null(s);
    run_until(client_eof(c, &in));
    ck_assert(strncmp(in.buf, "E shutting_down ", 16) == 0);
    close(c);
}
END_TEST

static Suite *
session_suite(void)
{
    Suite *s = suite_create("session");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"lines_to_handler", lines_to_handler},
        {"request_and_reply", request_and_reply},
        {"close_with_request_in_flight", close_with_request_in_flight},
        {"linger_is_bounded", linger_is_bounded},
        {"reference_outlives_close", reference_outlives_close},
        {"refused_at_max_clients", refused_at_max_clients},
        {"line_too_large", line_too_large},
        {"shutdown_all_and_foreach", shutdown_all_and_foreach},
        {"refused_while_stopping", refused_while_stopping},
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
    return ld_unit_run(session_suite());
}
