#ifndef LD_NEAR_UTIL_H
#define LD_NEAR_UTIL_H

/* Reads shared by the near-cache test programs (static inline, so a
 * program that does not use one does not warn). */

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NEAR_T_MS 5000 /* how long a reply, or a change to be seen, may take */

/* cache.get of KEY without a fill lease; the reply must be ok. */
static inline json_t *
near_get(struct h_conn *c, const char *key)
{
    return h_must(h_callf(c, NEAR_T_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                          "key", key, "lease", 0));
}

/* Whether reply R is a hit of VALUE, served near or not. */
static inline bool
near_hit_of(const json_t *r, const char *value)
{
    const char *v = jstr(r, "value");
    return jtrue(r, "hit") && v != NULL && strcmp(v, value) == 0;
}

/* Read KEY until a near hit of VALUE (it is kept once the PTTL that
 * follows the read is in); asserts one came within the deadline. */
static inline void
near_get_until_near(struct h_conn *c, const char *key, const char *value)
{
    long long deadline = h_now_ms() + NEAR_T_MS;
    for (;;) {
        json_t *r = near_get(c, key);
        bool near = jtrue(r, "near");
        ck_assert_msg(near_hit_of(r, value),
                      "%s: expected a hit of %s, got %s", key, value,
                      h_dump(r));
        json_decref(r);
        if (near) {
            return;
        }
        ck_assert_msg(h_now_ms() < deadline, "%s never became a near hit",
                      key);
        usleep(2000);
    }
}

/* Read KEY until the answer is a hit of VALUE (NULL: a miss); returns how
 * long it took in ms, asserting it came within the deadline. Answers of
 * redis_unavailable are read past (Redis may be on its way back). */
static inline long long
near_get_until(struct h_conn *c, const char *key, const char *value)
{
    long long t0 = h_now_ms();
    for (;;) {
        json_t *r = h_callf(c, NEAR_T_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                            "key", key, "lease", 0);
        const char *code = h_errcode(r);
        ck_assert_msg(r != NULL && (code == NULL ||
                                    strcmp(code, "redis_unavailable") == 0),
                      "%s: %s", key, h_dump(r));
        bool done = value != NULL ? near_hit_of(r, value) : !jtrue(r, "hit");
        char seen[2048];
        snprintf(seen, sizeof seen, "%s", h_dump(r));
        json_decref(r);
        if (done) {
            return h_now_ms() - t0;
        }
        ck_assert_msg(h_now_ms() - t0 < NEAR_T_MS, "%s: still %s", key, seen);
        usleep(1000);
    }
}

/* The id of the daemon's client named ...:ROLE ("track", "cmd") on
 * server R (CLIENT LIST), -1 if none. */
static inline long long
near_client_id(const struct h_redis *r, const char *role)
{
    redisReply *rep = h_redis_cmd(r, "CLIENT LIST");
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING,
                  "CLIENT LIST");
    long long id = -1;
    char suffix[64];
    snprintf(suffix, sizeof suffix, ":%s ", role);
    char *save = NULL;
    for (char *line = strtok_r(rep->str, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *name = strstr(line, " name=leased:");
        if (name != NULL && strstr(name, suffix) != NULL) {
            sscanf(line, "id=%lld", &id);
            break;
        }
    }
    freeReplyObject(rep);
    return id;
}

#endif
