/* libleased's read-write locks: leased_lock with args.mode, and
 * leased_unlock_mode, leased_extend_mode, leased_lock_info_mode, against
 * a real leased and redis-server. */

#include "harness.h"
#include "leased/client.h"

#include <check.h>
#include <string.h>

static struct h_redis R;
static struct h_daemon D;

static const struct h_fixture fx = {
    .suite = "rwlock_lib",
    .redis = {&R},
    .daemons = {&D},
};

static struct leased_conn *
conn(void)
{
    struct leased_error err;
    struct leased_conn *c = leased_connect(D.sock, NULL, &err);
    ck_assert_msg(c != NULL, "connect: %s", err.message);
    return c;
}

START_TEST(test_lib_read_write)
{
    h_start(NULL);
    struct leased_conn *a = conn(), *b = conn();
    struct leased_error err;
    struct leased_lock_result res;
    struct leased_lock_args rd = {.mode = "read"};
    struct leased_lock_args wr = {.mode = "write"};
    ck_assert_int_eq(leased_lock(a, "k", &rd, &res, &err), LEASED_OK);
    ck_assert(res.acquired);
    ck_assert_int_eq(leased_lock(b, "k", &rd, &res, &err), LEASED_OK);
    ck_assert(res.acquired);
    ck_assert_int_eq(leased_lock(b, "k", &wr, &res, &err), LEASED_OK);
    ck_assert(!res.acquired);
    struct leased_lock_info info;
    ck_assert_int_eq(leased_lock_info_mode(a, "k", "read", NULL, NULL, &info,
                                           &err),
                     LEASED_OK);
    ck_assert(info.locked && info.mine && info.count == 1);
    ck_assert_str_eq(info.mode, "read");
    long long lease = 0;
    ck_assert_int_eq(leased_extend_mode(a, "k", "read", NULL, NULL, 9000,
                                        &lease, &err),
                     LEASED_OK);
    ck_assert_int_eq(lease, 9000);
    struct leased_unlock_result u;
    ck_assert_int_eq(leased_unlock_mode(a, "k", "read", NULL, NULL, &u, &err),
                     LEASED_OK);
    ck_assert(u.released);
    ck_assert_int_eq(leased_unlock_mode(b, "k", "read", NULL, NULL, &u, &err),
                     LEASED_OK);
    ck_assert_int_eq(leased_lock(b, "k", &wr, &res, &err), LEASED_OK);
    ck_assert(res.acquired && res.fence > 0);
    ck_assert_int_eq(leased_unlock_mode(a, "k", "write", NULL, NULL, &u, &err),
                     LEASED_E_NOT_HELD);
    /* A plain lock on it is the wrong type. */
    ck_assert_int_eq(leased_lock(a, "k", NULL, &res, &err),
                     LEASED_E_WRONG_TYPE);
    struct leased_lock_args bad = {.mode = "shared"};
    ck_assert_int_eq(leased_lock(a, "k", &bad, &res, &err),
                     LEASED_E_BAD_REQUEST);
    leased_close(a);
    leased_close(b);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(lib_read_write, 60),
    };
    return H_MAIN(fx, cases);
}
