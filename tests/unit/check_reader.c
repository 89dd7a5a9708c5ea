/* The bounds of hiredis' reader (ld_reader): values within them parse as
 * with hiredis alone, values past them fail the reader without being
 * built or buffered further. */
#include "ld_reader.h"

#include "unit.h"

#include <check.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

/* Feed BYTES to a reader bounded to MAX_VALUE and return the status of
 * one redisReaderGetReply (*REPLY set on success, NULL if incomplete). */
static int
parse(struct ld_reader_bounds *b, size_t max_value, const char *bytes,
      size_t len, redisReply **reply)
{
    ld_reader_bounds_init(b, max_value);
    redisReader *r = ld_reader_new(b);
    void *out = NULL;
    redisReaderFeed(r, bytes, len);
    int rc = redisReaderGetReply(r, &out);
    if (rc == REDIS_OK && out == NULL && !ld_reader_within(r, b)) {
        rc = REDIS_ERR;
    }
    redisReaderFree(r);
    *reply = out;
    return rc;
}

START_TEST(within_bounds_parse)
{
    static const char msg[] = "*3\r\n$3\r\nhit\r\n:42\r\n*2\r\n$-1\r\n"
                              "$5\r\nhello\r\n";
    struct ld_reader_bounds b;
    redisReply *r = NULL;

    ck_assert_int_eq(parse(&b, 5, msg, sizeof msg - 1, &r), REDIS_OK);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
    ck_assert_uint_eq(r->elements, 3);
    ck_assert_str_eq(r->element[0]->str, "hit");
    ck_assert_int_eq(r->element[1]->integer, 42);
    ck_assert_str_eq(r->element[2]->element[1]->str, "hello");
    ck_assert_str_eq(b.why, "");
    freeReplyObject(r);
}
END_TEST

START_TEST(string_over_bound)
{
    static const char msg[] = "$6\r\nhello!\r\n";
    struct ld_reader_bounds b;
    redisReply *r = NULL;

    ck_assert_int_eq(parse(&b, 5, msg, sizeof msg - 1, &r), REDIS_ERR);
    ck_assert_ptr_null(r);
    ck_assert_str_eq(b.why, "string of 6 bytes, over 5");
}
END_TEST

/* The header alone, before any element: nothing is allocated for it. */
START_TEST(array_over_bound)
{
    static const char msg[] = "*2147483647\r\n";
    struct ld_reader_bounds b;
    redisReply *r = NULL;

    ck_assert_int_eq(parse(&b, 1024, msg, sizeof msg - 1, &r), REDIS_ERR);
    ck_assert_ptr_null(r);
    ck_assert_str_eq(b.why, "array of 2147483647 elements, over 1048576");
}
END_TEST

/* A bulk header far over the bound, then bytes: refused once more than
 * the bound is buffered, not when the announced length has come. */
START_TEST(partial_bulk_over_bound)
{
    size_t len = 2048;
    char *msg = malloc(len);
    struct ld_reader_bounds b;
    redisReply *r = NULL;

    memset(msg, 'x', len);
    memcpy(msg, "$1000000000\r\n", 13);
    ck_assert_int_eq(parse(&b, 1024, msg, len, &r), REDIS_ERR);
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(b.why, "of one reply buffered") != NULL, "%s", b.why);
    /* Within the bound, the same header only waits for more. */
    ck_assert_int_eq(parse(&b, 1024, msg, 512, &r), REDIS_OK);
    ck_assert_ptr_null(r);
    free(msg);
}
END_TEST

/* Many strings each within the bound, together over the reply's. */
START_TEST(reply_over_bound)
{
    struct ld_reader_bounds b;
    size_t n = 300, cap = n * 120 + 32, off = 0;
    char *msg = malloc(cap);

    off += (size_t)snprintf(msg, cap, "*%zu\r\n", n);
    for (size_t i = 0; i < n; i++) {
        off += (size_t)snprintf(msg + off, cap - off, "$100\r\n");
        memset(msg + off, 'y', 100);
        off += 100;
        memcpy(msg + off, "\r\n", 2);
        off += 2;
    }
    ld_reader_bounds_init(&b, 100);
    b.max_reply = 10000; /* smaller than the 300 strings */
    redisReader *rd = ld_reader_new(&b);
    void *out = NULL;
    redisReaderFeed(rd, msg, off);
    ck_assert_int_eq(redisReaderGetReply(rd, &out), REDIS_ERR);
    ck_assert_msg(strstr(b.why, "reply over 10000 bytes") != NULL, "%s",
                  b.why);
    redisReaderFree(rd);
    free(msg);
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("reader");
    TCase *tc = tcase_create("reader");
    tcase_add_test(tc, within_bounds_parse);
    tcase_add_test(tc, string_over_bound);
    tcase_add_test(tc, array_over_bound);
    tcase_add_test(tc, partial_bulk_over_bound);
    tcase_add_test(tc, reply_over_bound);
    suite_add_tcase(s, tc);
    return ld_unit_run(s);
}
