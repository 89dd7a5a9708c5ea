/* How the daemon reads its clients: whole lines of a read are dispatched
 * where they lie, a line cut by the end of a read waits in the session's
 * buffer for the rest, and the end of the input ends the session once the
 * requests before it are answered. The cuts are made by the client here:
 * a line sent a byte at a time, two sessions cut at the same place, a
 * line at the size limit spread over many reads, a half-close after a
 * pipeline longer than one turn, and the end in the middle of a line. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_MS 5000

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "reads",
    .redis = {&R},
    .daemons = {&D},
};

/* A ping with ID padded to exactly LEN bytes (no terminator), into BUF of
 * at least LEN + 1 bytes. */
static void
padded_ping(char *buf, size_t len, int id)
{
    int n = snprintf(buf, len + 1, "{\"op\":\"ping\",\"id\":%d,\"pad\":\"",
                     id);
    ck_assert(n > 0 && (size_t)n + 2 <= len);
    memset(buf + n, 'x', len - (size_t)n - 2);
    memcpy(buf + len - 2, "\"}", 2);
    buf[len] = '\0';
}

/* Every request of a pipeline sent one byte per write is answered, in
 * order, whatever the reads the daemon sees. */
START_TEST(test_byte_at_a_time)
{
    char all[4096];
    size_t len = 0;
    struct h_conn *c;

    h_start(NULL);
    c = h_connect_ok(&D);
    for (int id = 1; id <= 20; id++) {
        len += (size_t)snprintf(all + len, sizeof all - len,
                                id % 2 ? "{\"op\":\"ping\",\"id\":%d}\n"
                                       : "{\"id\":%d,\"op\":\"ping\"}\r\n",
                                id);
    }
    for (size_t i = 0; i < len; i++) {
        ck_assert_int_eq(h_send_raw(c, all + i, 1), 0);
    }
    for (int id = 1; id <= 20; id++) {
        json_t *r = h_recv(c, T_MS);
        ck_assert_msg(r != NULL, "no answer to request %d", id);
        ck_assert_msg(h_ok(r), "request %d: %s", id, h_errcode(r));
        ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), id);
        json_decref(r);
    }
    h_assert_ping(c);
    h_close(c);
}
END_TEST

/* Two sessions whose lines are cut at the same place: what one kept is
 * its own, whatever the other read meanwhile. */
START_TEST(test_cut_lines_stay_apart)
{
    struct h_conn *a, *b, *z;
    static const char head_a[] = "{\"op\":\"ping\",\"id\":1";
    static const char head_b[] = "{\"op\":\"ping\",\"id\":2";

    h_start(NULL);
    a = h_connect_ok(&D);
    b = h_connect_ok(&D);
    z = h_connect_ok(&D);
    for (int round = 0; round < 50; round++) {
        ck_assert_int_eq(h_send_raw(a, head_a, strlen(head_a)), 0);
        ck_assert_int_eq(h_send_raw(b, head_b, strlen(head_b)), 0);
        /* Both halves are read before the rest is sent: the daemon has
         * answered a request sent after them. */
        h_assert_ping(z);
        ck_assert_int_eq(h_send_raw(b, "1}\n", 3), 0);
        ck_assert_int_eq(h_send_raw(a, "1}\n", 3), 0);
        json_t *ra = h_recv(a, T_MS);
        json_t *rb = h_recv(b, T_MS);
        ck_assert_ptr_nonnull(ra);
        ck_assert_ptr_nonnull(rb);
        ck_assert_int_eq(json_integer_value(json_object_get(ra, "id")), 11);
        ck_assert_int_eq(json_integer_value(json_object_get(rb, "id")), 21);
        json_decref(ra);
        json_decref(rb);
    }
    h_close(a);
    h_close(b);
    h_close(z);
}
END_TEST

/* limits.max_request_bytes at its default of 1 MB: a line of exactly
 * that size spread over many reads is served, one byte more is refused,
 * and the short line that follows each in the same write is served. */
START_TEST(test_megabyte_line_at_limit)
{
    const size_t limit = 1048576;
    char *buf = malloc(2 * limit + 256);
    struct h_conn *c;

    ck_assert_ptr_nonnull(buf);
    h_start(NULL);
    c = h_connect_ok(&D);
    for (int extra = 0; extra < 2; extra++) {
        size_t len = limit + (size_t)extra;
        padded_ping(buf, len, 7);
        len += (size_t)sprintf(buf + len, "\n{\"op\":\"ping\",\"id\":8}\n");
        ck_assert_int_eq(h_send_raw(c, buf, len), 0);
        json_t *r = h_recv(c, T_MS);
        ck_assert_ptr_nonnull(r);
        if (extra == 0) {
            ck_assert_msg(h_ok(r), "line at the limit: %s", h_errcode(r));
            ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 7);
        } else {
            ck_assert_str_eq(h_errcode(r), "too_large");
        }
        json_decref(r);
        r = h_recv(c, T_MS);
        ck_assert_ptr_nonnull(r);
        ck_assert(h_ok(r));
        ck_assert_int_eq(json_integer_value(json_object_get(r, "id")), 8);
        json_decref(r);
    }
    h_assert_ping(c);
    h_close(c);
    free(buf);
}
END_TEST

/* A pipeline longer than one turn (64 lines), requests that need Redis
 * among them, then shutdown(SHUT_WR) in the same breath: every request
 * is answered before the session ends. */
START_TEST(test_half_close_after_long_pipeline)
{
    enum { N = 300 };
    char *all = malloc(N * 96);
    size_t len = 0;
    struct h_conn *c;

    ck_assert_ptr_nonnull(all);
    h_start(NULL);
    c = h_connect_ok(&D);
    for (int id = 1; id <= N; id++) {
        if (id % 3 == 0) {
            len += (size_t)sprintf(all + len,
                                   "{\"id\":%d,\"op\":\"lock\",\"key\":"
                                   "\"rd-%d\",\"detach\":true,"
                                   "\"ttl_ms\":60000}\n",
                                   id, id);
        } else {
            len += (size_t)sprintf(all + len, "{\"id\":%d,\"op\":\"ping\"}\n",
                                   id);
        }
    }
    ck_assert_int_eq(h_send_raw(c, all, len), 0);
    ck_assert_int_eq(h_shutdown_write(c), 0);
    for (int id = 1; id <= N; id++) {
        json_t *r = h_recv_id(c, id, T_MS);
        ck_assert_msg(r != NULL, "no answer to request %d after half-close",
                      id);
        ck_assert_msg(h_ok(r), "request %d: %s", id, h_errcode(r));
        if (id % 3 == 0) {
            ck_assert(json_is_true(json_object_get(r, "acquired")));
        }
        json_decref(r);
    }
    ck_assert(h_wait_closed(c, T_MS));
    h_close(c);
    free(all);
}
END_TEST

/* The input ends in the middle of a line: the requests before it are
 * answered, the cut line is neither run nor answered, and the session
 * ends. */
START_TEST(test_eof_mid_line)
{
    static const char bytes[] =
        "{\"id\":1,\"op\":\"lock\",\"key\":\"rd-cut\","
        "\"detach\":true,\"ttl_ms\":60000}\n"
        "{\"id\":2,\"op\":\"lock\",\"key\":\"rd-never\","
        "\"detach\":true,\"ttl_ms\":60000";
    struct h_conn *c, *other;
    json_t *r;

    h_start(NULL);
    c = h_connect_ok(&D);
    ck_assert_int_eq(h_send_raw(c, bytes, strlen(bytes)), 0);
    ck_assert_int_eq(h_shutdown_write(c), 0);
    r = h_recv_id(c, 1, T_MS);
    ck_assert_ptr_nonnull(r);
    ck_assert(json_is_true(json_object_get(r, "acquired")));
    json_decref(r);
    ck_assert(h_wait_closed(c, T_MS));
    h_close(c);

    other = h_connect_ok(&D);
    r = h_callf(other, T_MS, "{s:s,s:s}", "op", "lock", "key", "rd-never");
    ck_assert_msg(json_is_true(json_object_get(r, "acquired")),
                  "the cut line was run");
    json_decref(r);
    r = h_callf(other, T_MS, "{s:s,s:s}", "op", "lock", "key", "rd-cut");
    ck_assert(h_ok(r));
    ck_assert(json_is_false(json_object_get(r, "acquired")));
    json_decref(r);
    h_close(other);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(byte_at_a_time, 60),
        H_CASE(cut_lines_stay_apart, 60),
        H_CASE(megabyte_line_at_limit, 120),
        H_CASE(half_close_after_long_pipeline, 60),
        H_CASE(eof_mid_line, 60),
    };

    return H_MAIN(fx, cases);
}
