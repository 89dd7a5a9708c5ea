#ifndef LD_SEM_UTIL_H
#define LD_SEM_UTIL_H
/* Helpers of the semaphore and cancel tests. */

#include "harness.h"

#include <stdlib.h>
#include <string.h>

#ifndef T_MS
#define T_MS 5000 /* how long a plain reply may take */
#endif

/* Send REQ (stolen) under our own ID, without waiting for the reply. */
static inline void
s_send_id(struct h_conn *c, json_int_t id, json_t *req)
{
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

/* {"op":"sem.acquire","key":KEY,"limit":LIMIT} with permits (0: absent),
 * wait_ms (0: absent) and ttl_ms (0: absent). */
static inline json_t *
s_req(const char *key, long long limit, long long permits, long long wait_ms,
      long long ttl_ms)
{
    json_t *req = json_pack("{s:s,s:s,s:I}", "op", "sem.acquire", "key", key,
                            "limit", (json_int_t)limit);
    if (permits != 0) {
        json_object_set_new(req, "permits", json_integer(permits));
    }
    if (wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    if (ttl_ms != 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    return req;
}

static inline json_t *
s_acquire(struct h_conn *c, const char *key, long long limit,
          long long permits, long long wait_ms, long long ttl_ms)
{
    int t = wait_ms < 0 || wait_ms > 55000 ? 60000 : (int)wait_ms + T_MS;
    json_t *r = h_call(c, s_req(key, limit, permits, wait_ms, ttl_ms), t);
    ck_assert_msg(r != NULL, "no reply to sem.acquire %s", key);
    return r;
}

/* Acquire and insist on getting it; the token goes to TOK (65 bytes). */
static inline void
s_must(struct h_conn *c, const char *key, long long limit, long long permits,
       long long ttl_ms, char *tok)
{
    json_t *r = s_acquire(c, key, limit, permits, 0, ttl_ms);
    ck_assert_msg(h_ok(r), "sem.acquire %s: %s", key, h_errcode(r));
    ck_assert_msg(jtrue(r, "acquired"), "sem.acquire %s: no permit", key);
    snprintf(tok, 65, "%s", jstr(r, "token"));
    json_decref(r);
}

static inline json_t *
s_release(struct h_conn *c, const char *key, const char *tok)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "sem.release", "key",
                        key, "token", tok);
    ck_assert_msg(r != NULL, "no reply to sem.release %s", key);
    return r;
}

/* sem.info: the number of permits held (asserts the call succeeded). */
static inline long long
s_held(struct h_conn *c, const char *key, long long limit)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:I}", "op", "sem.info", "key", key,
                        "limit", (json_int_t)limit);
    ck_assert_msg(r != NULL && h_ok(r), "sem.info %s: %s", key,
                  r != NULL ? h_errcode(r) : "no reply");
    long long held = jint(r, "held");
    ck_assert_int_eq(jint(r, "available"),
                     limit - held > 0 ? limit - held : 0);
    json_decref(r);
    return held;
}

struct s_held_want {
    struct h_conn *c;
    const char *key;
    long long limit, held;
};

static inline bool
s_held_is(void *arg)
{
    struct s_held_want *w = arg;
    return s_held(w->c, w->key, w->limit) == w->held;
}

/* Wait up to TIMEOUT_MS until sem.info says HELD, and assert it. */
static inline void
s_wait_held(struct h_conn *c, const char *key, long long limit, long long held,
            int timeout_ms)
{
    struct s_held_want w = {c, key, limit, held};
    ck_assert_msg(h_wait_until(s_held_is, &w, timeout_ms),
                  "sem %s: held is not %lld", key, held);
}

#endif
