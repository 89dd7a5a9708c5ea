/* listen.namespaces through the configuration loader: every kind of
 * entry and its resolved id, the defaults, copy and equality as reload
 * uses them, and a later file replacing the list of an earlier one. */
#include "ld_conf.h"
#include "ld_ns_conf.h"

#include "unit.h"

#include <check.h>
#include <grp.h>
#include <pwd.h>
#include <string.h>

static int
load(struct ld_config *cfg, const char *yaml, char *err, size_t errlen)
{
    return ld_conf_load_string(cfg, yaml, strlen(yaml), "n.yml", err, errlen);
}

START_TEST(default_is_empty)
{
    struct ld_config c;
    ld_conf_defaults(&c);
    ck_assert_uint_eq(c.listen.namespaces.count, 0);
    ck_assert_ptr_null(c.listen.namespaces.items);
    ld_conf_free(&c);
}
END_TEST

START_TEST(every_kind)
{
    struct ld_config c;
    char err[256] = "";
    struct group *root_group = getgrgid(0);
    char yaml[1024];

    ck_assert_ptr_nonnull(root_group);
    snprintf(yaml, sizeof yaml,
             "listen:\n  namespaces:\n"
             "    - {uid: 1001, prefixes: [\"a:\", \"b:\"]}\n"
             "    - {gid: 1002, prefixes: [\"c:\"], admin: false}\n"
             "    - {user: root, prefixes: [\"r:\"], admin: true}\n"
             "    - {group: %s, prefixes: [\"g:\"]}\n"
             "    - token: \"t\\u00e9\"\n"
             "      prefixes:\n"
             "        - \"\"\n",
             root_group->gr_name);
    ld_conf_defaults(&c);
    ck_assert_msg(load(&c, yaml, err, sizeof err) == LD_OK, "%s", err);
    const struct ld_ns_list *l = &c.listen.namespaces;
    ck_assert_uint_eq(l->count, 5);
    ck_assert_int_eq(l->items[0].kind, LD_NS_UID);
    ck_assert_uint_eq(l->items[0].id, 1001);
    ck_assert_uint_eq(l->items[0].nprefixes, 2);
    ck_assert_str_eq(l->items[0].prefixes[1], "b:");
    ck_assert_int_eq(l->items[1].kind, LD_NS_GID);
    ck_assert_uint_eq(l->items[1].id, 1002);
    ck_assert(!l->items[1].admin);
    ck_assert_int_eq(l->items[2].kind, LD_NS_UID);
    ck_assert_uint_eq(l->items[2].id, 0);
    ck_assert(l->items[2].admin);
    ck_assert_int_eq(l->items[3].kind, LD_NS_GID);
    ck_assert_uint_eq(l->items[3].id, 0);
    ck_assert_int_eq(l->items[4].kind, LD_NS_TOKEN);
    ck_assert_str_eq(l->items[4].token, "t\xc3\xa9");
    ck_assert_uint_eq(l->items[4].token_len, 3);
    /* "" is a prefix of every key: allowed, and explicit. */
    ck_assert_str_eq(l->items[4].prefixes[0], "");

    /* Copy and equality, as reload compares and applies the list. */
    struct ld_ns_list copy;
    ld_ns_list_copy(&copy, l);
    ck_assert(ld_ns_list_equal(&copy, l));
    copy.items[4].token[0] = 'u';
    ck_assert(!ld_ns_list_equal(&copy, l));
    ld_ns_list_free(&copy);
    ck_assert_uint_eq(copy.count, 0);

    /* A later file replaces the list, and an empty one clears it. */
    ck_assert_msg(load(&c,
                       "listen:\n  namespaces: [{uid: 7, prefixes: [x]}]\n",
                       err, sizeof err) == LD_OK,
                  "%s", err);
    ck_assert_uint_eq(c.listen.namespaces.count, 1);
    ck_assert_uint_eq(c.listen.namespaces.items[0].id, 7);
    ck_assert_msg(load(&c, "listen:\n  namespaces: []\n", err, sizeof err) ==
                      LD_OK,
                  "%s", err);
    ck_assert_uint_eq(c.listen.namespaces.count, 0);
    ld_conf_free(&c);
}
END_TEST

/* A refused file leaves the list it had. */
START_TEST(error_keeps_list)
{
    struct ld_config c;
    char err[256] = "";

    ld_conf_defaults(&c);
    ck_assert(load(&c, "listen:\n  namespaces: [{uid: 7, prefixes: [x]}]\n",
                   err, sizeof err) == LD_OK);
    ck_assert(load(&c,
                   "listen:\n  namespaces:\n"
                   "    - {uid: 8, prefixes: [y]}\n"
                   "    - {uid: 9, prefixes: {a: b}}\n",
                   err, sizeof err) != LD_OK);
    ck_assert_msg(strncmp(err, "n.yml:4:", 8) == 0, "%s", err);
    ck_assert_msg(strstr(err, "prefixes: expected a list") != NULL, "%s", err);
    ck_assert_uint_eq(c.listen.namespaces.count, 1);
    ck_assert_uint_eq(c.listen.namespaces.items[0].id, 7);
    ld_conf_free(&c);
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("ns");
    TCase *tc = tcase_create("conf");
    tcase_add_test(tc, default_is_empty);
    tcase_add_test(tc, every_kind);
    tcase_add_test(tc, error_keeps_list);
    suite_add_tcase(s, tc);
    return ld_unit_run(s);
}
