/* ld_cluster_slot: the key to slot function of Redis Cluster, checked
 * against what redis-server 7.0's CLUSTER KEYSLOT answers. */
#include "ld_common.h"

#include "ld_cluster_slot.h"

#include "unit.h"

#include <check.h>
#include <string.h>

START_TEST(slots_as_redis)
{
    static const struct {
        const char *key;
        unsigned slot;
    } known[] = {
        {"foo", 12182},
        {"bar", 5061},
        {"123456789", 12739},
        {"{user1000}.following", 3443},
        /* "{}" is no tag: the whole key counts. */
        {"foo{}{bar}", 8363},
        {"{}", 15257},
        /* The tag ends at the first '}' after the first '{'. */
        {"foo{{bar}}zap", 4015},
        {"foo{bar}{zap}", 5061},
        {"", 0},
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(known); i++) {
        ck_assert_msg(ld_cluster_slot(known[i].key, strlen(known[i].key)) ==
                          known[i].slot,
                      "slot of \"%s\": %u, Redis says %u", known[i].key,
                      ld_cluster_slot(known[i].key, strlen(known[i].key)),
                      known[i].slot);
    }
    /* The check value of CRC16/XMODEM. */
    ck_assert_uint_eq(ld_crc16("123456789", 9), 0x31c3);
}
END_TEST

START_TEST(names_of_one_lock_share_a_slot)
{
    /* What ld_lock and ld_cache name: every key of one entry carries the
     * same tag, so its scripts touch one slot. */
    unsigned h = ld_cluster_slot("leased:lock:{order:7}", 21);
    ck_assert_uint_eq(ld_cluster_slot("leased:lock:{order:7}:fence", 27), h);
    ck_assert_uint_eq(ld_cluster_slot("leased:lock:{order:7}:unlock", 28), h);
    ck_assert_uint_eq(ld_cluster_slot("order:7", 7), h);
}
END_TEST

START_TEST(hash_tags_pick_the_slot)
{
#define SLOT(s) ld_cluster_slot((s), strlen(s))
    ck_assert_uint_eq(SLOT("{user1000}.following"),
                      SLOT("{user1000}.followers"));
    ck_assert_uint_eq(SLOT("{user1000}.following"), SLOT("user1000"));
    ck_assert_uint_eq(SLOT("leased:lock:{order:42}"), SLOT("order:42"));
    /* Only the first '{' and the first '}' after it count. */
    ck_assert_uint_eq(SLOT("foo{bar}{zap}"), SLOT("bar"));
    ck_assert_uint_eq(SLOT("foo{{bar}}zap"), SLOT("{bar"));
    /* An empty tag, or no closing brace, hashes the whole key. */
    ck_assert_uint_ne(SLOT("foo{}{bar}"), SLOT("bar"));
    ck_assert_uint_ne(SLOT("{bar"), SLOT("bar"));
#undef SLOT
}
END_TEST

static Suite *
slot_suite(void)
{
    Suite *s = suite_create("cluster_slot");
    TCase *tc = tcase_create("slots");
    tcase_add_test(tc, slots_as_redis);
    tcase_add_test(tc, names_of_one_lock_share_a_slot);
    tcase_add_test(tc, hash_tags_pick_the_slot);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(slot_suite());
}
