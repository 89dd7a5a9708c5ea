/* ld_cache_hot: the space-saving top-K of read keys and its sliding
 * window, with the clock in the test's hands. */
#include "ld_common.h"

#include "ld_cache_hot.h"

#include "unit.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W LD_HOT_WINDOW_MS

/* AddressSanitizer owns malloc: the count below needs glibc's, so the
 * sanitizer build leaves it out (the plain build runs it). */
#if !defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 1
/* Every allocation of the process is counted (glibc's own functions do
 * the work), so that the steady state can be shown to make none. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
static volatile unsigned long allocs;

void *
malloc(size_t n)
{
    allocs++;
    return __libc_malloc(n);
}

void *
calloc(size_t n, size_t size)
{
    allocs++;
    return __libc_calloc(n, size);
}

void *
realloc(void *p, size_t n)
{
    allocs++;
    return __libc_realloc(p, n);
}
#endif

static void
read_n(const char *key, int n, bool hit, uint64_t now)
{
    for (int i = 0; i < n; i++) {
        ld_cache_hot_note(key, strlen(key), hit, now);
    }
}

static bool
is(const struct ld_hot_key *k, const char *key)
{
    return k->len == strlen(key) && memcmp(k->key, key, k->len) == 0;
}

START_TEST(off_is_noop)
{
    struct ld_hot_key top[4];
    ld_cache_hot_init(0);
    ck_assert(!ld_cache_hot_enabled());
    read_n("a", 10, true, 1000);
    ck_assert_uint_eq(ld_cache_hot_top(top, 4, 1000), 0);
    ld_cache_hot_free();
}
END_TEST

START_TEST(ranking_and_ratio)
{
    struct ld_hot_key top[8];
    ld_cache_hot_init(4);
    uint64_t t = 5000;
    read_n("a", 30, true, t);
    read_n("b", 20, false, t);
    read_n("c", 10, true, t);
    read_n("c", 10, false, t);
    read_n("d", 5, true, t);
    size_t n = ld_cache_hot_top(top, 8, t + 2000);
    ck_assert_uint_eq(n, 4);
    ck_assert(is(&top[0], "a"));
    ck_assert(is(&top[1], "b") || is(&top[1], "c"));
    ck_assert(is(&top[3], "d"));
    ck_assert_double_eq_tol(top[0].hit_ratio, 1.0, 1e-9);
    ck_assert_double_eq_tol(top[3].hit_ratio, 1.0, 1e-9);
    for (size_t i = 0; i < n; i++) {
        if (is(&top[i], "b")) {
            ck_assert_double_eq_tol(top[i].hit_ratio, 0.0, 1e-9);
        }
        if (is(&top[i], "c")) {
            ck_assert_double_eq_tol(top[i].hit_ratio, 0.5, 1e-9);
        }
    }
    /* 30 reads within the first 2 s of the daemon's life. */
    ck_assert_double_eq_tol(top[0].reads_per_s, 15.0, 1e-6);
    /* The limit. */
    ck_assert_uint_eq(ld_cache_hot_top(top, 2, t + 2000), 2);
    ck_assert(is(&top[0], "a"));
    ld_cache_hot_free();
}
END_TEST

/* Many more keys than slots, one of them hot: it stays, ranked first,
 * and the slots never hold a key twice. */
START_TEST(space_saving_keeps_the_hot_one)
{
    struct ld_hot_key top[16];
    char key[32];
    ld_cache_hot_init(16);
    for (int round = 0; round < 2000; round++) {
        ld_cache_hot_note("hot", 3, true, 100);
        snprintf(key, sizeof key, "cold-%d", round % 500);
        ld_cache_hot_note(key, strlen(key), false, 100);
        if (round % 4 == 0) {
            ld_cache_hot_note("warm", 4, true, 100);
        }
    }
    size_t n = ld_cache_hot_top(top, 16, 100);
    ck_assert_uint_eq(n, 16);
    ck_assert(is(&top[0], "hot"));
    ck_assert_uint_eq(top[0].reads, 2000);
    ck_assert(is(&top[1], "warm"));
    ck_assert_uint_eq(top[1].reads, 500);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = i + 1; j < n; j++) {
            ck_assert(!(top[i].len == top[j].len &&
                        memcmp(top[i].key, top[j].key, top[i].len) == 0));
        }
    }
    ld_cache_hot_free();
}
END_TEST

/* The window: a key read only long ago falls out; the previous period
 * counts for the part of it still inside the window. */
START_TEST(sliding_window)
{
    struct ld_hot_key top[4];
    ld_cache_hot_init(4);
    uint64_t t0 = 1000000;
    read_n("old", 100, true, t0);
    read_n("new", 10, true, t0 + W + 1);
    /* Half a period into the second one: "old" counts half. */
    size_t n = ld_cache_hot_top(top, 4, t0 + W + W / 2);
    ck_assert_uint_eq(n, 2);
    ck_assert(is(&top[0], "old"));
    ck_assert_uint_eq(top[0].reads, 50);
    ck_assert(is(&top[1], "new"));
    /* Over the window's length: 50 + 10 reads in one window. */
    ck_assert_double_eq_tol(top[0].reads_per_s, 50.0 / (W / 1000.0), 1e-6);
    /* Later in the period "new" overtakes "old". */
    read_n("new", 50, true, t0 + W + 9 * W / 10);
    n = ld_cache_hot_top(top, 4, t0 + W + 9 * W / 10);
    ck_assert(is(&top[0], "new"));
    /* Two periods on, "old" is gone; "new" is in the previous one. */
    n = ld_cache_hot_top(top, 4, t0 + 2 * W + 1);
    ck_assert_uint_eq(n, 1);
    ck_assert(is(&top[0], "new"));
    /* And after a long silence nothing is left. */
    n = ld_cache_hot_top(top, 4, t0 + 10 * W);
    ck_assert_uint_eq(n, 0);
    /* The slots are free again. */
    read_n("x", 3, false, t0 + 10 * W);
    n = ld_cache_hot_top(top, 4, t0 + 10 * W);
    ck_assert_uint_eq(n, 1);
    ck_assert_double_eq_tol(top[0].hit_ratio, 0.0, 1e-9);
    ld_cache_hot_free();
}
END_TEST

/* Across periods, with slots freed by rolls and taken again: the index
 * stays consistent (no key twice, the hot key counted exactly). */
START_TEST(churn_across_periods)
{
    struct ld_hot_key top[8];
    char key[32];
    ld_cache_hot_init(8);
    uint64_t t = 50;
    for (int period = 0; period < 6; period++) {
        int cold = period % 2 ? 3 : 300;
        for (int i = 0; i < 1000; i++) {
            ld_cache_hot_note("hot", 3, true, t);
            snprintf(key, sizeof key, "c%d-%d", period, i % cold);
            ld_cache_hot_note(key, strlen(key), false, t);
        }
        size_t n = ld_cache_hot_top(top, 8, t);
        ck_assert_uint_ge(n, 2);
        ck_assert(is(&top[0], "hot"));
        for (size_t i = 0; i < n; i++) {
            for (size_t j = i + 1; j < n; j++) {
                ck_assert(!(top[i].len == top[j].len &&
                            memcmp(top[i].key, top[j].key, top[i].len) == 0));
            }
        }
        t += W;
    }
    /* The last period: 1000 reads now, 1000 in the one before (weight 1
     * right at the start of the next period). */
    ck_assert_uint_ge(ld_cache_hot_top(top, 8, t - W), 1);
    ck_assert(is(&top[0], "hot"));
    ck_assert_uint_eq(top[0].reads, 2000);
    ld_cache_hot_free();
}
END_TEST

#ifdef COUNT_ALLOCS
/* Once every slot has held a key as long as any that comes, reads and
 * evictions allocate nothing. */
START_TEST(steady_state_allocates_nothing)
{
    char key[32];
    unsigned long at_init = allocs;
    ld_cache_hot_init(64);
    ck_assert_uint_gt(allocs, at_init); /* the counting works */
    for (int i = 0; i < 64; i++) {
        snprintf(key, sizeof key, "warm-up-%06d", i);
        ld_cache_hot_note(key, strlen(key), true, 1000);
    }
    unsigned long before = allocs;
    for (int i = 0; i < 100000; i++) {
        snprintf(key, sizeof key, "k%d", (i * 7919) % 5000);
        ld_cache_hot_note(key, strlen(key), i % 3 == 0, 1000 + i / 100);
        ld_cache_hot_note("hot", 3, true, 1000 + i / 100);
    }
    ck_assert_uint_eq(allocs - before, 0);
    struct ld_hot_key top[4];
    ck_assert_uint_eq(ld_cache_hot_top(top, 4, 1999), 4);
    ck_assert(is(&top[0], "hot"));
    ck_assert_uint_eq(top[0].reads, 100000);
    ld_cache_hot_free();
}
END_TEST
#endif

/* Keys are bytes: a NUL inside and the empty key are keys like others. */
START_TEST(binary_keys)
{
    struct ld_hot_key top[4];
    ld_cache_hot_init(2);
    ld_cache_hot_note("a\0b", 3, true, 10);
    ld_cache_hot_note("a\0b", 3, true, 10);
    ld_cache_hot_note("a", 1, true, 10);
    ck_assert_uint_eq(ld_cache_hot_top(top, 4, 10), 2);
    ck_assert_uint_eq(top[0].len, 3);
    ck_assert_uint_eq(top[0].reads, 2);
    ld_cache_hot_free();
}
END_TEST

static Suite *
hot_suite(void)
{
    Suite *s = suite_create("hot");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, off_is_noop);
    tcase_add_test(tc, ranking_and_ratio);
    tcase_add_test(tc, space_saving_keeps_the_hot_one);
    tcase_add_test(tc, sliding_window);
    tcase_add_test(tc, binary_keys);
    tcase_add_test(tc, churn_across_periods);
#ifdef COUNT_ALLOCS
    tcase_add_test(tc, steady_state_allocates_nothing);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(hot_suite());
}
