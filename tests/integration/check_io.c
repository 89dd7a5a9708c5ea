/* The daemon's writes to Redis, made by the daemon itself at the end of
 * the loop turn rather than by the bufferevent's write events: the
 * commands of one turn leave in one write, replies match their requests
 * and keep their order, and a Redis restarted in the middle of a burst
 * still leaves no request unanswered. */
#include "harness.h"
#include "lock_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct h_redis R;
static struct h_daemon D;

static const struct h_fixture fx = {
    .suite = "io",
    .redis = {&R},
    .daemons = {&D},
};

#define NP 64            /* requests pipelined in one write */
#define BASE_ID 700000LL /* ids of pipelined requests (h_call's are low) */

static void
start_daemon(int timeout_ms)
{
    char yaml[256];
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  connections: 1\n"
             "  timeout_ms: %d\n",
             R.port, timeout_ms);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
}

/* NP locks of free keys in one write go to Redis in one write, not one
 * per command; each answer is its own request's, and they come back in
 * the order sent. */
START_TEST(test_pipelined_in_order)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(2000);
    struct h_conn *st = h_connect_ok(&D);
    struct h_conn *c = h_connect_ok(&D);
    h_assert_ping(c);
    long long w0 = h_stat(st, "redis_writes");
    long long c0 = h_stat(st, "redis_commands");

    json_t *reqs[NP];
    char keys[NP][32], tokens[NP][80];
    for (int i = 0; i < NP; i++) {
        snprintf(keys[i], sizeof keys[i], "ew-%d", i);
        reqs[i] = lk_req(keys[i], NULL, NO_TTL, 0);
    }
    ck_assert_int_eq(h_send_all(c, reqs, NP, BASE_ID), 0);
    for (int i = 0; i < NP; i++) {
        json_t *r = h_recv(c, 15000);
        ck_assert_msg(r != NULL, "no reply %d", i);
        ck_assert_int_eq(jint(r, "id"), BASE_ID + i);
        ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "lock %s: %s", keys[i],
                      h_dump(r));
        snprintf(tokens[i], sizeof tokens[i], "%s", jstr(r, "token"));
        ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{%s} %s", keys[i],
                                 tokens[i]),
                         1);
        json_decref(r);
    }
    long long dw = h_stat(st, "redis_writes") - w0;
    long long dc = h_stat(st, "redis_commands") - c0;
    ck_assert_int_ge(dc, NP);
    /* The lines of one read are dispatched in one turn (up to 64), and
     * a turn's commands leave together: a write or two, not NP. */
    ck_assert_msg(dw >= 1 && dw <= 3, "writes %lld for %lld commands", dw, dc);

    for (int i = 0; i < NP; i++) {
        reqs[i] = json_pack("{s:s,s:s,s:s}", "op", "unlock", "key", keys[i],
                            "token", tokens[i]);
    }
    ck_assert_int_eq(h_send_all(c, reqs, NP, BASE_ID + NP), 0);
    for (int i = 0; i < NP; i++) {
        json_t *r = h_recv(c, 15000);
        ck_assert_msg(r != NULL, "no unlock reply %d", i);
        ck_assert_int_eq(jint(r, "id"), BASE_ID + NP + i);
        ck_assert_msg(h_ok(r), "unlock %s: %s", keys[i], h_dump(r));
        json_decref(r);
        ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{%s}", keys[i]), 0);
    }
    h_close(c);
    h_close(st);
}
END_TEST

#define NS 8     /* sessions of the burst */
#define BURST 32 /* requests per session and wave */

static void
send_wave(struct h_conn **s, int wave)
{
    for (int k = 0; k < NS; k++) {
        json_t *reqs[BURST];
        for (int i = 0; i < BURST; i++) {
            char key[48];
            snprintf(key, sizeof key, "rb-%d-%d-%d", wave, k, i);
            reqs[i] = lk_req(key, NULL, 2000, 0);
        }
        ck_assert_int_eq(h_send_all(s[k], reqs, BURST, BASE_ID + wave * BURST),
                         0);
    }
}

/* Redis killed and started again while bursts are on their way: every
 * request gets an answer, its own (a grant, or redis_unavailable), and
 * the daemon locks again once Redis is back. */
START_TEST(test_redis_restarted_mid_burst)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(2000);
    struct h_conn *s[NS];
    for (int k = 0; k < NS; k++) {
        s[k] = h_connect_ok(&D);
    }
    send_wave(s, 0);
    h_redis_kill(&R);
    send_wave(s, 1);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    send_wave(s, 2);
    int ok = 0, unavailable = 0;
    for (int k = 0; k < NS; k++) {
        for (int w = 0; w < 3; w++) {
            for (int i = 0; i < BURST; i++) {
                long long id = BASE_ID + w * BURST + i;
                json_t *r = h_recv_id(s[k], id, 15000);
                ck_assert_msg(r != NULL, "session %d: no reply to %lld", k,
                              id);
                if (h_ok(r)) {
                    ck_assert_msg(jtrue(r, "acquired"), "%s", h_dump(r));
                    ok++;
                } else {
                    ck_assert_msg(strcmp(h_errcode(r), "redis_unavailable") ==
                                      0,
                                  "session %d id %lld: %s", k, id, h_dump(r));
                    unavailable++;
                }
                json_decref(r);
            }
        }
    }
    ck_assert_int_eq(ok + unavailable, NS * 3 * BURST);
    ck_assert_msg(unavailable > 0, "the restart went unnoticed");
    /* Back: a new lock is granted (the connection may still be coming
     * up: poll with a deadline). */
    long long deadline = h_now_ms() + 10000;
    bool granted = false;
    while (!granted && h_now_ms() < deadline) {
        json_t *r = lk_lock(s[0], "rb-after", NULL, 2000, 0);
        granted = h_ok(r) && jtrue(r, "acquired");
        json_decref(r);
    }
    ck_assert(granted);
    for (int k = 0; k < NS; k++) {
        h_assert_ping(s[k]);
        h_close(s[k]);
    }
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(pipelined_in_order, 60),
        H_CASE(redis_restarted_mid_burst, 90),
    };
    return H_MAIN(fx, cases);
}
