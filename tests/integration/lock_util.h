#ifndef LD_LOCK_UTIL_H
#define LD_LOCK_UTIL_H

/* Small helpers shared by the lock test programs (static inline, so a
 * program that does not use one does not warn). */

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MS 5000 /* how long a plain reply may take */
#define NO_TTL 0  /* lk_lock: leave ttl_ms out (watchdog) */

/* {"op":"lock","key":KEY} plus owner (NULL: absent), ttl_ms (0: absent)
 * and wait_ms (0: absent). */
static inline json_t *
lk_req(const char *key, const char *owner, long long ttl_ms, long long wait_ms)
{
    json_t *req = json_pack("{s:s,s:s}", "op", "lock", "key", key);
    if (owner != NULL) {
        json_object_set_new(req, "owner", json_string(owner));
    }
    if (ttl_ms != 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    if (wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    return req;
}

static inline json_t *
lk_lock(struct h_conn *c, const char *key, const char *owner, long long ttl_ms,
        long long wait_ms)
{
    int t = wait_ms < 0 || wait_ms > 55000 ? 60000 : (int)wait_ms + T_MS;
    json_t *r = h_call(c, lk_req(key, owner, ttl_ms, wait_ms), t);
    ck_assert_msg(r != NULL, "no reply to lock %s", key);
    return r;
}

/* Lock and insist on getting it; returns the reply. */
static inline json_t *
lk_must(struct h_conn *c, const char *key, const char *owner, long long ttl_ms,
        long long wait_ms)
{
    json_t *r = lk_lock(c, key, owner, ttl_ms, wait_ms);
    ck_assert_msg(h_ok(r), "lock %s: error %s", key, h_errcode(r));
    ck_assert_msg(jtrue(r, "acquired"), "lock %s not acquired", key);
    return r;
}

/* Send a lock request with our own id, without waiting for the reply. */
static inline void
lk_send(struct h_conn *c, json_int_t id, const char *key, const char *owner,
        long long ttl_ms, long long wait_ms)
{
    json_t *req = lk_req(key, owner, ttl_ms, wait_ms);
    json_object_set_new(req, "id", json_integer(id));
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    size_t n = strlen(line);
    line = realloc(line, n + 2);
    line[n] = '\n';
    line[n + 1] = '\0';
    ck_assert_int_eq(h_send_raw(c, line, n + 1), 0);
    free(line);
}

static inline json_t *
lk_unlock(struct h_conn *c, const char *key, const char *owner)
{
    json_t *r = owner != NULL ? h_callf(c, T_MS, "{s:s,s:s,s:s}", "op",
                                        "unlock", "key", key, "owner", owner)
                              : h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock",
                                        "key", key);
    ck_assert_msg(r != NULL, "no reply to unlock %s", key);
    return r;
}

static inline void
lk_unlock_ok(struct h_conn *c, const char *key, const char *owner)
{
    json_t *r = lk_unlock(c, key, owner);
    ck_assert_msg(h_ok(r), "unlock %s: %s", key, h_errcode(r));
    json_decref(r);
}

static inline json_t *
lk_info(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", key);
    ck_assert_msg(h_ok(r), "lock.info %s: %s", key, h_errcode(r));
    return r;
}

/* Total EVAL + EVALSHA calls Redis has served (INFO commandstats). */
static inline long long
r_eval_calls(const struct h_redis *r)
{
    redisReply *rep = h_redis_cmd(r, "INFO commandstats");
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING,
                  "INFO commandstats failed");
    long long total = 0;
    const char *names[] = {"cmdstat_evalsha:calls=", "cmdstat_eval:calls="};
    for (size_t i = 0; i < 2; i++) {
        const char *p = strstr(rep->str, names[i]);
        if (p != NULL) {
            total += atoll(p + strlen(names[i]));
        }
    }
    freeReplyObject(rep);
    return total;
}

/* For h_wait_until: the watchdog renewed at least RENEWALS times and
 * AFTER_MS have passed since SINCE_MS. */
struct renewals_want {
    struct h_conn *c;
    long long renewals; /* lock_renewals_ok at least this */
    long long since_ms; /* and at least AFTER_MS after this */
    long long after_ms;
};

static inline bool
renewals_done(void *arg)
{
    const struct renewals_want *w = arg;
    return h_now_ms() - w->since_ms >= w->after_ms &&
           h_stat(w->c, "lock_renewals_ok") >= w->renewals;
}

static inline struct h_conn *
lk_connect(const struct h_daemon *d)
{
    struct h_conn *c = h_connect(d);
    ck_assert_msg(c != NULL, "cannot connect to %s", d->sock);
    return c;
}

#endif
