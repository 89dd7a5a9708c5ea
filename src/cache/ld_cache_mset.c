/*
 * cache.mset: many cache.set writes in one request, for a warm-up before
 * traffic. Each entry is written exactly as cache.set writes one (the same
 * script, TTL and jitter, null handling, local bookkeeping), so an
 * outstanding fill lease on its key becomes worthless and an owed
 * invalidation is neither waited for nor cancelled, as with cache.set.
 *
 * Every entry's script is issued in the same turn of the loop: the Redis
 * layer pipelines them on each connection (one per cluster node), so the
 * request costs about one round trip per node, not one per entry, as the
 * fetches of cache.mget do.
 *
 * The answer counts the entries stored and has one result per entry, in
 * order: {"ok":true,"stored":true,"version":N}, {"ok":true,"stored":false,
 * "version":CURRENT} for an entry whose if_version no longer holds, or an
 * error object as cache.mget's results have them. A malformed entry fails alone; a malformed request (no entries,
 * too many) fails whole.
 */
#include "ld_cache_int.h"

#include "ld_errcode.h"
#include "ld_mem.h"
#include "ld_proto.h"

#include <stdio.h>
#include <stdlib.h>

struct mset;

/* One entry on its way to Redis. Its key points into the request's body,
 * which lives as long as the request, answered only once all are back. */
struct mset_entry {
    struct mset *op;
    size_t i;
    const char *key;
    size_t len;
};

struct mset {
    struct ld_req *req;
    size_t left;      /* entries not answered yet */
    long long stored; /* entries Redis stored */
    json_t *results;  /* one per entry, null until answered */
    struct mset_entry *e;
};

static void
entry_error(struct mset *op, size_t i, int code, json_t *extra,
            const char *msg)
{
    json_array_set_new(op->results, i, cache_result_error(code, extra, msg));
}

static void
mset_settled(struct mset *op)
{
    if (--op->left > 0) {
        return;
    }
    ld_reply_ok(op->req,
                json_pack("{s:I,s:o}", "stored", (json_int_t)op->stored,
                          "results", op->results));
    free(op->e);
    free(op);
}

static void
entry_cb(redisReply *reply, void *arg)
{
    struct mset_entry *e = arg;
    struct mset *op = e->op;
    /* Touched again now that it is answered: see write_reply_ok in
     * ld_cache.c (a read issued meanwhile may have gone out first). */
    cache_key_touched(e->key, e->len);
    struct cache_write_err err;
    struct cache_write_res res;
    if (cache_write_check(reply, "cache.mset", e->key, e->len, &err, &res)) {
        bool stored = res.rc == CACHE_WRITE_DONE;
        op->stored += stored;
        json_array_set_new(op->results, e->i,
                           json_pack("{s:b,s:b,s:I}", "ok", 1, "stored",
                                     stored, "version",
                                     (json_int_t)res.version));
    } else {
        entry_error(op, e->i, err.code, err.extra, err.msg);
    }
    mset_settled(op);
}

/* Checks entry J (an element of "entries") as cache.set checks its
 * fields and sends it; an entry it cannot send is answered at once. */
static void
entry_begin(struct mset *op, size_t i, json_t *j)
{
    if (!json_is_object(j)) {
        entry_error(op, i, LD_E_BAD_REQUEST, NULL,
                    "an entry must be an object with key, value and "
                    "optionally ttl_ms and if_version");
        mset_settled(op);
        return;
    }
    json_t *k = json_object_get(j, "key");
    json_t *v = json_object_get(j, "value");
    json_t *t = json_object_get(j, "ttl_ms");
    long long if_version = -1;
    const char *why = NULL;
    if (!json_is_string(k)) {
        why = "field 'key' is required and must be a string";
    } else if (!ld_key_valid(json_string_value(k), json_string_length(k))) {
        why = "field 'key' is empty or over-long";
    } else if (v == NULL) {
        why = "field 'value' is required";
    } else if (!json_is_string(v) && !json_is_null(v)) {
        why = "field 'value' must be a string or null";
    } else if (t != NULL &&
               (!json_is_integer(t) || json_integer_value(t) < 1 ||
                json_integer_value(t) > LD_TTL_MS_MAX)) {
        why = "field 'ttl_ms' must be an integer between 1 and 2^40";
    } else {
        why = cache_if_version(json_object_get(j, "if_version"), &if_version);
    }
    if (why != NULL) {
        entry_error(op, i, LD_E_BAD_REQUEST, NULL, why);
        mset_settled(op);
        return;
    }
    struct mset_entry *e = &op->e[i];
    e->op = op;
    e->i = i;
    e->key = json_string_value(k);
    e->len = json_string_length(k);
    bool is_null = json_is_null(v);
    long long ttl = cache_entry_ttl(is_null, t != NULL,
                                    t != NULL ? json_integer_value(t) : 0);
    cache_send_set(e->key, e->len, is_null ? "" : json_string_value(v),
                   is_null ? 0 : json_string_length(v), is_null, ttl,
                   if_version, entry_cb, e);
}

void
cache_op_mset(struct ld_req *req)
{
    struct ld_rval rv;
    ld_req_get(req, "entries", &rv);
    if (rv.kind == LD_RV_ABSENT) {
        ld_reply_error(req, LD_E_BAD_REQUEST, "field 'entries' is required");
        return;
    }
    json_t *arr = rv.j;
    if (!json_is_array(arr)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'entries' must be an array of objects");
        return;
    }
    size_t n = json_array_size(arr);
    if (n == 0) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'entries' must not be empty");
        return;
    }
    if (n > CACHE_MAX_KEYS) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'entries' has more than %d entries",
                       CACHE_MAX_KEYS);
        return;
    }
    struct mset *op = ld_xcalloc(1, sizeof(*op));
    op->req = req;
    op->left = n;
    op->e = ld_xcalloc(n, sizeof(*op->e));
    op->results = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(op->results, json_null());
    }
    /* Redis callbacks never run before this returns, so only entries that
     * fail their checks can settle inside the loop: the last one to do so
     * answers (and frees OP) only when every entry failed, on the last
     * turn of the loop. */
    for (size_t i = 0; i < n; i++) {
        entry_begin(op, i, json_array_get(arr, i));
    }
}
