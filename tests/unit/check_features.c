/* ld_features: the names hello announces in "features". */
#include "ld_common.h"

#include "ld_features.h"

#include "unit.h"

#include <check.h>
#include <jansson.h>
#include <string.h>

START_TEST(added_once_in_order)
{
    ld_features_clear();
    json_t *a = ld_features_json();
    ck_assert(json_is_array(a));
    ck_assert_uint_eq(json_array_size(a), 0);
    json_decref(a);

    ld_features_add("rwlock");
    ld_features_add("admin");
    ld_features_add("rwlock");
    ck_assert(ld_features_has("admin"));
    ck_assert(ld_features_has("rwlock"));
    ck_assert(!ld_features_has("near"));
    a = ld_features_json();
    ck_assert_uint_eq(json_array_size(a), 2);
    ck_assert_str_eq(json_string_value(json_array_get(a, 0)), "rwlock");
    ck_assert_str_eq(json_string_value(json_array_get(a, 1)), "admin");
    json_decref(a);

    ld_features_clear();
    ck_assert(!ld_features_has("admin"));
}
END_TEST

static bool on_flag;

static bool
flag_on(void)
{
    return on_flag;
}

/* A name whose part the configuration turns on and off is asked at each
 * listing. */
START_TEST(conditional)
{
    ld_features_clear();
    ld_features_add("stale");
    ld_features_add_if("early_refresh", flag_on);
    on_flag = false;
    ck_assert(!ld_features_has("early_refresh"));
    json_t *a = ld_features_json();
    ck_assert_uint_eq(json_array_size(a), 1);
    json_decref(a);
    on_flag = true;
    ck_assert(ld_features_has("early_refresh"));
    a = ld_features_json();
    ck_assert_uint_eq(json_array_size(a), 2);
    ck_assert_str_eq(json_string_value(json_array_get(a, 1)), "early_refresh");
    json_decref(a);
    ld_features_clear();
}
END_TEST

/* The contract closes the list at eight names; a table that overflows
 * keeps what it had instead of writing past its end. */
START_TEST(bounded)
{
    static const char *const names[] = {
        "near",          "rwlock", "semaphore", "multilock", "cancel", "stale",
        "early_refresh", "admin",  "x9",        "x10",       "x11",    "x12",
        "x13",           "x14",    "x15",       "x16",       "x17",    "x18",
    };
    ld_features_clear();
    for (size_t i = 0; i < LD_ARRAY_LEN(names); i++) {
        ld_features_add(names[i]);
    }
    json_t *a = ld_features_json();
    ck_assert_uint_eq(json_array_size(a), 16);
    ck_assert(ld_features_has("admin"));
    ck_assert(!ld_features_has("x18"));
    json_decref(a);
    ld_features_clear();
}
END_TEST

static Suite *
features_suite(void)
{
    Suite *s = suite_create("features");
    TCase *tc = tcase_create("features");
    tcase_add_test(tc, added_once_in_order);
    tcase_add_test(tc, conditional);
    tcase_add_test(tc, bounded);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(features_suite());
}
