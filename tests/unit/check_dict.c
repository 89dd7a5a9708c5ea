/* ld_dict: the hash table under sessions, locks and waiters. */
#include "ld_common.h"

#include "ld_dict.h"

#include "unit.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIG 100000

static void *
num(uintptr_t n)
{
    return (void *)n;
}

START_TEST(set_get_del)
{
    struct ld_dict *d = ld_dict_new();
    int a = 1, b = 2;

    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(ld_dict_size(d), 0);
    ck_assert_ptr_null(ld_dict_get(d, "a", 1));
    ck_assert_int_eq(ld_dict_set(d, "a", 1, &a), LD_OK);
    ck_assert_int_eq(ld_dict_set(d, "b", 1, &b), LD_OK);
    ck_assert_uint_eq(ld_dict_size(d), 2);
    ck_assert_ptr_eq(ld_dict_get(d, "a", 1), &a);
    ck_assert_ptr_eq(ld_dict_get(d, "b", 1), &b);
    /* Length is part of the key. */
    ck_assert_ptr_null(ld_dict_get(d, "ab", 2));
    ck_assert_ptr_null(ld_dict_get(d, "", 0));

    ck_assert_ptr_eq(ld_dict_del(d, "a", 1), &a);
    ck_assert_ptr_null(ld_dict_del(d, "a", 1));
    ck_assert_ptr_null(ld_dict_get(d, "a", 1));
    ck_assert_uint_eq(ld_dict_size(d), 1);
    ld_dict_free(d);
}
END_TEST

START_TEST(replace_keeps_size)
{
    struct ld_dict *d = ld_dict_new();
    int a = 1, b = 2;

    ck_assert_int_eq(ld_dict_set(d, "k", 1, &a), LD_OK);
    ck_assert_int_eq(ld_dict_set(d, "k", 1, &b), LD_OK);
    ck_assert_uint_eq(ld_dict_size(d), 1);
    ck_assert_ptr_eq(ld_dict_get(d, "k", 1), &b);
    ld_dict_free(d);
}
END_TEST

START_TEST(keys_are_copied)
{
    struct ld_dict *d = ld_dict_new();
    char key[] = "order:42";

    ck_assert_int_eq(ld_dict_set(d, key, strlen(key), num(7)), LD_OK);
    key[0] = 'X';
    ck_assert_ptr_null(ld_dict_get(d, key, strlen(key)));
    ck_assert_ptr_eq(ld_dict_get(d, "order:42", 8), num(7));
    ld_dict_free(d);
}
END_TEST

START_TEST(many_entries)
{
    struct ld_dict *d = ld_dict_new();
    char key[32];

    for (uintptr_t i = 0; i < BIG; i++) {
        int n = snprintf(key, sizeof(key), "key:%lu", (unsigned long)i);
        ck_assert_int_eq(ld_dict_set(d, key, (size_t)n, num(i + 1)), LD_OK);
    }
    ck_assert_uint_eq(ld_dict_size(d), BIG);
    for (uintptr_t i = 0; i < BIG; i++) {
        int n = snprintf(key, sizeof(key), "key:%lu", (unsigned long)i);
        ck_assert_ptr_eq(ld_dict_get(d, key, (size_t)n), num(i + 1));
    }
    /* Delete the even ones and check the odd ones survived every move. */
    for (uintptr_t i = 0; i < BIG; i += 2) {
        int n = snprintf(key, sizeof(key), "key:%lu", (unsigned long)i);
        ck_assert_ptr_eq(ld_dict_del(d, key, (size_t)n), num(i + 1));
    }
    ck_assert_uint_eq(ld_dict_size(d), BIG / 2);
    for (uintptr_t i = 0; i < BIG; i++) {
        int n = snprintf(key, sizeof(key), "key:%lu", (unsigned long)i);
        ck_assert_ptr_eq(ld_dict_get(d, key, (size_t)n),
                         i % 2 ? num(i + 1) : NULL);
    }
    ld_dict_free(d);
}
END_TEST

START_TEST(iterate_visits_each_once)
{
    struct ld_dict *d = ld_dict_new();
    static unsigned char seen[1000];
    char key[16];
    const void *k;
    size_t klen;
    void *v;
    struct ld_dict_iter it;
    size_t count = 0;

    memset(seen, 0, sizeof(seen));
    for (uintptr_t i = 0; i < 1000; i++) {
        int n = snprintf(key, sizeof(key), "%lu", (unsigned long)i);
        ld_dict_set(d, key, (size_t)n, num(i));
    }
    ld_dict_iter_init(&it, d);
    while (ld_dict_iter_next(&it, &k, &klen, &v)) {
        uintptr_t i = (uintptr_t)v;
        int n = snprintf(key, sizeof(key), "%lu", (unsigned long)i);
        ck_assert_uint_eq(klen, (size_t)n);
        ck_assert_int_eq(memcmp(k, key, klen), 0);
        ck_assert_int_eq(seen[i], 0);
        seen[i] = 1;
        count++;
    }
    ck_assert_uint_eq(count, 1000);
    ld_dict_free(d);
}
END_TEST

START_TEST(iterate_while_deleting)
{
    struct ld_dict *d = ld_dict_new();
    char key[32];
    const void *k;
    size_t klen;
    void *v;
    struct ld_dict_iter it;
    size_t visited = 0;

    for (uintptr_t i = 0; i < BIG; i++) {
        int n = snprintf(key, sizeof(key), "w:%lu", (unsigned long)i);
        ld_dict_set(d, key, (size_t)n, num(i));
    }
    /* Delete every other entry as it is visited: the shape of "release
     * every lock of a closing session". */
    ld_dict_iter_init(&it, d);
    while (ld_dict_iter_next(&it, &k, &klen, &v)) {
        visited++;
        if ((uintptr_t)v % 2 == 0) {
            ck_assert_ptr_eq(ld_dict_del(d, k, klen), v);
        }
    }
    ck_assert_uint_eq(visited, BIG);
    ck_assert_uint_eq(ld_dict_size(d), BIG / 2);

    /* Then all of them; the iterator tolerates it to the end. */
    visited = 0;
    ld_dict_iter_init(&it, d);
    while (ld_dict_iter_next(&it, &k, &klen, NULL)) {
        ck_assert_ptr_nonnull(ld_dict_del(d, k, klen));
        visited++;
    }
    ck_assert_uint_eq(visited, BIG / 2);
    ck_assert_uint_eq(ld_dict_size(d), 0);
    ld_dict_iter_init(&it, d);
    ck_assert(!ld_dict_iter_next(&it, NULL, NULL, NULL));
    ld_dict_free(d);
}
END_TEST

START_TEST(binary_keys)
{
    struct ld_dict *d = ld_dict_new();
    const char a[] = {'k', '\0', 'a'};
    const char b[] = {'k', '\0', 'b'};
    const char c[] = {'\0'};
    const char e[] = {'\0', '\0'};

    ck_assert_int_eq(ld_dict_set(d, a, sizeof(a), num(1)), LD_OK);
    ck_assert_int_eq(ld_dict_set(d, b, sizeof(b), num(2)), LD_OK);
    ck_assert_int_eq(ld_dict_set(d, c, sizeof(c), num(3)), LD_OK);
    ck_assert_int_eq(ld_dict_set(d, e, sizeof(e), num(4)), LD_OK);
    ck_assert_int_eq(ld_dict_set(d, "", 0, num(5)), LD_OK);
    ck_assert_uint_eq(ld_dict_size(d), 5);
    ck_assert_ptr_eq(ld_dict_get(d, a, sizeof(a)), num(1));
    ck_assert_ptr_eq(ld_dict_get(d, b, sizeof(b)), num(2));
    ck_assert_ptr_eq(ld_dict_get(d, c, sizeof(c)), num(3));
    ck_assert_ptr_eq(ld_dict_get(d, e, sizeof(e)), num(4));
    ck_assert_ptr_eq(ld_dict_get(d, "", 0), num(5));
    ck_assert_ptr_null(ld_dict_get(d, "k", 1));
    ck_assert_ptr_eq(ld_dict_del(d, c, sizeof(c)), num(3));
    ck_assert_ptr_eq(ld_dict_get(d, e, sizeof(e)), num(4));
    ld_dict_free(d);
}
END_TEST

START_TEST(null_values_and_free_empty)
{
    struct ld_dict *d = ld_dict_new();

    /* A NULL value is stored, even if get cannot tell it from absent. */
    ck_assert_int_eq(ld_dict_set(d, "n", 1, NULL), LD_OK);
    ck_assert_uint_eq(ld_dict_size(d), 1);
    ld_dict_free(d);
    ld_dict_free(NULL);
}
END_TEST

static Suite *
dict_suite(void)
{
    Suite *s = suite_create("dict");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"set_get_del", set_get_del},
        {"replace_keeps_size", replace_keeps_size},
        {"keys_are_copied", keys_are_copied},
        {"many_entries", many_entries},
        {"iterate_visits_each_once", iterate_visits_each_once},
        {"iterate_while_deleting", iterate_while_deleting},
        {"binary_keys", binary_keys},
        {"null_values_and_free_empty", null_values_and_free_empty},
    };

    for (size_t i = 0; i < LD_ARRAY_LEN(cases); i++) {
        TCase *tc = tcase_create(cases[i].name);
        /* 100000 entries under ASan and valgrind take a while. */
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int
main(void)
{
    return ld_unit_run(dict_suite());
}
