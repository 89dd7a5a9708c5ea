/*
 * cache.invalidate, the deletes it promises and the journal's replay at
 * start (see the overview in ld_cache.c).
 *
 * It owns the invalidations (struct inv), the deletes (struct del) and their
 * journal records; the readers are only told that a key changed.
 */
#include "ld_cache_int.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_fsync.h"
#include "ld_journal.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_near.h"
#include "ld_proto.h"
#include "ld_redis.h"
#include "ld_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#define INVALIDATE_MAX_KEYS 1000
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 5000

/* ---- cache.invalidate and the deletes it promises -------------------- */

int64_t
cache_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void del_timer_cb(evutil_socket_t fd, short what, void *arg);
static void del_cb(redisReply *reply, void *arg);

static void
note_oldest_due(const struct ld_journal_entry *e, void *arg)
{
    int64_t *oldest = arg;
    /* An add after another holds a delay, not a time, until its first
     * delete is done; it cannot be late before then. */
    if (e->after_id == 0 && e->due_ms < *oldest) {
        *oldest = e->due_ms;
    }
}

void
cache_refresh_overdue(void)
{
    int64_t now = cache_wall_ms(), oldest = now;

    if (cache_mod.journal != NULL) {
        ld_journal_each(cache_mod.journal, note_oldest_due, &oldest);
    }
    ld_stats.cache_invalidations_overdue_ms = (long long)(now - oldest);
}

static struct del *
del_new(const char *key, size_t len, int64_t due_ms, bool second, bool stale)
{
    struct del *d = ld_xcalloc(1, sizeof(*d) + len);
    d->ev = evtimer_new(cache_mod.ctx->base, del_timer_cb, d);
    if (d->ev == NULL) {
        ld_oom_in("evtimer_new");
    }
    d->due_ms = due_ms;
    d->second = second;
    d->stale = stale;
    d->key_len = len;
    memcpy(d->key, key, len);
    LIST_INSERT_HEAD(&cache_mod.dels, d, link);
    return d;
}

static void
del_unlink(struct del *d)
{
    LIST_REMOVE(d, link);
}

static void
owed_add(struct del *d)
{
    uintptr_t n = (uintptr_t)ld_dict_get(cache_mod.owed, d->key, d->key_len);
    ld_dict_set(cache_mod.owed, d->key, d->key_len, (void *)(n + 1));
    d->owed = true;
}

static void
owed_drop(struct del *d)
{
    if (!d->owed) {
        return;
    }
    d->owed = false;
    uintptr_t n = (uintptr_t)ld_dict_get(cache_mod.owed, d->key, d->key_len);
    if (n > 1) {
        ld_dict_set(cache_mod.owed, d->key, d->key_len, (void *)(n - 1));
    } else {
        ld_dict_del(cache_mod.owed, d->key, d->key_len);
    }
}

bool
cache_first_owed(const char *key, size_t len)
{
    return cache_mod.owed != NULL && ld_dict_size(cache_mod.owed) > 0 &&
           ld_dict_get(cache_mod.owed, key, len) != NULL;
}

static void
del_free(struct del *d)
{
    owed_drop(d);
    del_unlink(d);
    if (d->ev != NULL) {
        event_free(d->ev);
    }
    free(d->member);
    free(d);
}

/* Run D at its due time (at once when that has passed). */
static void
del_schedule(struct del *d)
{
    int64_t wait = d->due_ms - cache_wall_ms();
    cache_set_timer(d->ev, wait > 0 ? (uint64_t)wait * 1000 : 0);
}

/* What the delete scripts answer: cache_del the keys removed (0 or 1),
 * cache_stale also DEL_MARKED. */
#define DEL_MARKED 2

static void inv_first_result(struct inv *inv, bool ok, long long n);

static void
del_failed(struct del *d)
{
    if (d->inv != NULL) {
        struct inv *inv = d->inv;
        d->inv = NULL;
        for (size_t i = 0; inv->queued_at != NULL && i < inv->n; i++) {
            if (inv->firsts[i] == d) {
                inv->queued_at[i] = true;
            }
        }
        inv_first_result(inv, false, 0);
    }
    d->retrying = true;
    d->backoff_ms = d->backoff_ms == 0 ? RETRY_MIN_MS : d->backoff_ms * 2;
    if (d->backoff_ms > RETRY_MAX_MS) {
        d->backoff_ms = RETRY_MAX_MS;
    }
    /* Spread the retries of many deletes queued at the same moment. */
    uint64_t us = (uint64_t)d->backoff_ms * 1000;
    us = us * 3 / 4 + (uint64_t)(ld_random_unit() * (double)(us / 2));
    cache_set_timer(d->ev, us);
}

static void
del_run(struct del *d)
{
    if (d->running) {
        return;
    }
    /* The second delete and the replayed ones too: whatever a reader
     * brought back meanwhile is not served from here. */
    ld_near_evict(d->key, d->key_len);
    if (!ld_redis_ready()) {
        del_failed(d);
        return;
    }
    size_t elen, clen;
    char *names = cache_make_names(d->key, d->key_len, &elen, &clen);
    d->running = true;
    if (d->stale) {
        char stale_ms[24];
        snprintf(stale_ms, sizeof(stale_ms), "%lld",
                 cache_mod.ctx->cfg->cache.stale_ms);
        const char *argv[] = {names, stale_ms, names};
        size_t argvlen[] = {elen, strlen(stale_ms), clen};
        ld_redis_script(LD_SCRIPT_cache_stale, names, elen, 1, 3, argv,
                        argvlen, del_cb, d);
    } else {
        const char *argv[] = {names, names};
        size_t argvlen[] = {elen, clen};
        ld_redis_script(LD_SCRIPT_cache_del, names, elen, 1, 2, argv, argvlen,
                        del_cb, d);
    }
    free(names);
}

/* D, a first delete, is done: its second delete is due its delay_ms
 * from now. */
static void
start_second(struct del *d)
{
    struct del *d2 = d->then;
    LD_ASSERT(d2->after == d && d2->second);
    d->then = NULL;
    d2->after = NULL;
    d2->due_ms = cache_wall_ms() + d2->delay_ms;
    del_schedule(d2);
}

/* D is carried out: its record in the journal, or in the due set, is
 * retired. */
static void
retire(const struct del *d)
{
    if (d->id != 0) {
        ld_journal_done(cache_mod.journal, d->id);
        cache_update_journal_stats();
    }
    if (d->member != NULL) {
        cache_due_done(d->member, d->member_len);
    }
}

static void
del_cb(redisReply *reply, void *arg)
{
    struct del *d = arg;
    LD_ASSERT(d->running);
    d->running = false;
    if (d->orphan) {
        /* ld_cache_free ran; the journal or the due set keeps it. */
        free(d->member);
        free(d);
        return;
    }
    /* A read that overtook the delete on another connection (see
     * write_reply_ok) is neither kept near nor shared from now on. */
    cache_key_touched(d->key, d->key_len);
    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER) {
        if (reply != NULL && !d->retrying) {
            log_warn("cache delete failed, will retry id=%llu error=\"%s\"",
                     (unsigned long long)d->id,
                     reply->type == REDIS_REPLY_ERROR ? reply->str
                                                      : "bad shape");
        }
        del_failed(d);
        return;
    }
    if (d->inv != NULL) {
        struct inv *inv = d->inv;
        d->inv = NULL;
        /* One entry per delete: anything else from Redis is not a count
         * to add up (a hostile reply could overflow the sum). */
        long long n = reply->integer == DEL_MARKED ? DEL_MARKED
                      : reply->integer > 0         ? 1
                                                   : 0;
        inv_first_result(inv, true, n);
    }
    if (d->then != NULL) {
        start_second(d);
    }
    retire(d);
    /* No longer owed before the waiters look again: a lease is to be had
     * from now on. */
    owed_drop(d);
    cache_key_deleted(d->key, d->key_len);
    del_free(d);
}

static void
del_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct del *d = arg;
    if (d->retrying) {
        ld_stats.cache_invalidations_retried++;
    }
    del_run(d);
}

void
cache_del_take_over(const char *key, size_t len, bool stale, char *member,
                    size_t member_len)
{
    struct del *d = del_new(key, len, cache_wall_ms(), true, stale);
    d->member = member;
    d->member_len = member_len;
    del_run(d);
}

/* Redis holds D now, in the due set: the journal and this daemon are
 * done with it, and so is the delete it waited for or that waited. */
void
cache_del_handed(struct del *d)
{
    if (d->then != NULL) {
        d->then->after = NULL;
    }
    if (d->after != NULL) {
        d->after->then = NULL;
    }
    if (d->id != 0) {
        ld_journal_done(cache_mod.journal, d->id);
    }
    del_free(d);
}

/* Redis is back: every delete waiting out a backoff goes now. */
void
cache_redis_state_cb(bool up, void *arg)
{
    LD_UNUSED(arg);
    if (!up || !cache_mod.inited) {
        return;
    }
    struct del *next;
    for (struct del *d = LIST_FIRST(&cache_mod.dels); d != NULL; d = next) {
        next = LIST_NEXT(d, link);
        if (d->retrying && !d->running) {
            event_del(d->ev);
            ld_stats.cache_invalidations_retried++;
            del_run(d);
        }
    }
}

void
cache_inv_free(struct inv *inv)
{
    free(inv->queued_at);
    free(inv->firsts);
    free(inv);
}

static void
inv_reply(struct inv *inv)
{
    if (inv->journal_failed) {
        ld_reply_error(inv->req, LD_E_INTERNAL,
                       "the invalidation could not be made durable in the "
                       "journal; the deletes run but would not survive a "
                       "crash");
    } else {
        json_t *f = inv->stale_mode
                        ? json_pack("{s:I,s:I,s:I}", "deleted",
                                    (json_int_t)inv->deleted, "stale",
                                    (json_int_t)inv->stale, "pending",
                                    (json_int_t)inv->pending)
                        : json_pack("{s:I,s:I}", "deleted",
                                    (json_int_t)inv->deleted, "pending",
                                    (json_int_t)inv->pending);
        if (inv->queued) {
            json_object_set_new(f, "queued", json_true());
        }
        if (inv->queued && inv->queued_at != NULL) {
            /* Keys on a master that could not be reached (cluster mode)
             * or all of them: named, in the request's order. */
            json_t *keys = json_object_get(ld_req_body(inv->req), "keys");
            json_t *q = json_array();
            for (size_t i = 0; i < inv->n; i++) {
                if (inv->queued_at[i]) {
                    json_array_append(q, json_array_get(keys, i));
                }
            }
            json_object_set_new(f, "queued_keys", q);
        }
        ld_reply_ok(inv->req, f);
    }
    cache_inv_free(inv);
}

static void
inv_first_result(struct inv *inv, bool ok, long long n)
{
    LD_ASSERT(inv->left > 0);
    if (ok && n == DEL_MARKED) {
        inv->stale++;
    } else if (ok) {
        inv->deleted += n;
    } else {
        inv->queued = true;
        /* A key whose second delete is scheduled is already counted. */
        if (inv->pending < (long long)inv->n) {
            inv->pending++;
        }
    }
    if (--inv->left == 0) {
        inv_reply(inv);
    }
}

static void
inv_start(struct inv *inv)
{
    /* Hold the request: a delete can fail (and answer) synchronously. */
    inv->left++;
    for (size_t i = 0; i < inv->n; i++) {
        if (inv->firsts[i] != NULL) {
            del_run(inv->firsts[i]);
        }
    }
    if (--inv->left == 0) {
        inv_reply(inv);
    }
}

/* Answer (start) the invalidations of BATCH, whose records RC says were
 * made durable or not. */
static void
sync_settle(struct inv_q *batch, int rc)
{
    struct inv *inv;
    while ((inv = STAILQ_FIRST(batch)) != NULL) {
        STAILQ_REMOVE_HEAD(batch, link);
        if (rc != LD_OK) {
            inv->journal_failed = true;
        }
        inv_start(inv);
    }
}

static void
sync_done(int rc, int err, void *arg)
{
    LD_UNUSED(arg);
    int r = ld_journal_sync_end(cache_mod.journal, rc, err);
    sync_settle(&cache_mod.sync_running, r);
    /* Those that came meanwhile make the next group. */
    if (!STAILQ_EMPTY(&cache_mod.sync_q)) {
        ld_defer_kick(&cache_mod.sync_defer);
    }
}

/* One fdatasync for every invalidation of this loop iteration, on the
 * worker thread when there is one: the loop serves other sessions while
 * the disk works, and these replies go out when it is done. */
void
cache_sync_run(void *arg)
{
    LD_UNUSED(arg);
    if (cache_mod.syncer != NULL && ld_fsync_busy(cache_mod.syncer)) {
        return; /* sync_done starts the next group */
    }
    struct inv_q batch = STAILQ_HEAD_INITIALIZER(batch);
    STAILQ_CONCAT(&batch, &cache_mod.sync_q);
    if (cache_mod.syncer == NULL) {
        sync_settle(&batch, ld_journal_sync(cache_mod.journal));
        return;
    }
    int fd = -1;
    int r = ld_journal_sync_begin(cache_mod.journal, &fd);
    if (r <= 0) {
        sync_settle(&batch, r == 0 ? LD_OK : LD_ERR);
        return;
    }
    STAILQ_CONCAT(&cache_mod.sync_running, &batch);
    ld_fsync_run(cache_mod.syncer, fd, ld_journal_fdatasync_fn, sync_done,
                 NULL);
}

/* The fields of a cache.invalidate: KEYS (then KEY is NULL) or KEY,
 * DELAY_MS and STALE. LD_ERR when the request was answered with an
 * error. */
static int
inval_params(struct ld_req *req, json_t **keys, const char **key, size_t *len,
             long long *delay_ms, bool *stale)
{
    struct ld_rval jkey, jkeys;
    ld_req_get(req, "key", &jkey);
    ld_req_get(req, "keys", &jkeys);
    bool has_key = ld_rval_given(&jkey);
    bool has_keys = ld_rval_given(&jkeys);

    *delay_ms = cache_mod.ctx->cfg->cache.double_delete_ms;
    if (has_key && has_keys) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'key' and field 'keys' exclude each other");
        return LD_ERR;
    }
    if (has_keys) {
        if (ld_req_keys(req, "keys", INVALIDATE_MAX_KEYS, keys) != LD_OK) {
            return LD_ERR;
        }
    } else if (ld_req_key(req, "key", key, len) != LD_OK) {
        return LD_ERR;
    }
    *stale = cache_mod.ctx->cfg->cache.invalidate_mode == LD_INVALIDATE_STALE;
    if (ld_req_int(req, "delay_ms", false, 0, LD_DELAY_MS_MAX, delay_ms,
                   NULL) != LD_OK ||
        ld_req_bool(req, "stale", stale) != LD_OK) {
        return LD_ERR;
    }
    return LD_OK;
}

static struct inv *
inv_new(struct ld_req *req, size_t n, bool many, bool stale)
{
    struct inv *inv = ld_xcalloc(1, sizeof(*inv));
    inv->firsts = ld_xcalloc(n, sizeof(*inv->firsts));
    if (many) {
        inv->queued_at = ld_xcalloc(n, sizeof(*inv->queued_at));
    }
    inv->req = req;
    inv->stale_mode = stale;
    inv->n = n;
    inv->left = n;
    return inv;
}

/* The second delete of KEY, DELAY_MS after D1, journaled. */
static void
inv_add_second(struct inv *inv, struct del *d1, const char *key, size_t len,
               int64_t now, long long delay_ms, bool stale)
{
    unsigned jflags = stale ? LD_JOURNAL_F_STALE : 0;
    struct del *d2 = del_new(key, len, now + delay_ms, true, stale);
    /* Recorded as waiting for the first, so that a replay keeps the two
     * apart too. Without the first's record there is nothing to wait for
     * in the file: a plain add then (the request is answered with an
     * error anyway). */
    int rc = d1->id != 0
                 ? ld_journal_add_after_flags(cache_mod.journal, d1->id,
                                              delay_ms, jflags, key, len,
                                              &d2->id)
                 : ld_journal_add_flags(cache_mod.journal, now + delay_ms,
                                        jflags, key, len, &d2->id);
    if (rc != LD_OK) {
        d2->id = 0;
        inv->journal_failed = true;
    }
    inv->pending++;
    d2->delay_ms = delay_ms;
    d2->after = d1;
    d1->then = d2;
}

/* Slot I of INV: the first delete of KEY, due now and journaled, and the
 * second after DELAY_MS when there is one. */
static void
inv_add_key(struct inv *inv, size_t i, const char *key, size_t len,
            int64_t now, long long delay_ms, bool stale)
{
    unsigned jflags = stale ? LD_JOURNAL_F_STALE : 0;
    ld_stats.cache_invalidations++;
    cache_key_touched(key, len);
    struct del *d1 = del_new(key, len, now, false, stale);
    owed_add(d1);
    if (ld_journal_add_flags(cache_mod.journal, now, jflags, key, len,
                             &d1->id) != LD_OK) {
        d1->id = 0;
        inv->journal_failed = true;
    }
    d1->inv = inv;
    inv->firsts[i] = d1;
    if (delay_ms > 0) {
        inv_add_second(inv, d1, key, len, now, delay_ms, stale);
    }
}

void
cache_op_invalidate(struct ld_req *req)
{
    json_t *keys = NULL;
    const char *key = NULL;
    size_t len = 0;
    long long delay_ms;
    bool stale;

    if (inval_params(req, &keys, &key, &len, &delay_ms, &stale) != LD_OK) {
        return;
    }
    size_t n = keys != NULL ? json_array_size(keys) : 1;
    struct inv *inv = inv_new(req, n, keys != NULL, stale);
    int64_t now = cache_wall_ms();
    for (size_t i = 0; i < n; i++) {
        if (keys != NULL) {
            key = json_string_value(json_array_get(keys, i));
            len = json_string_length(json_array_get(keys, i));
        }
        inv_add_key(inv, i, key, len, now, delay_ms, stale);
    }
    cache_update_journal_stats();
    if (ld_journal_mode(cache_mod.journal) == LD_FSYNC_ALWAYS) {
        STAILQ_INSERT_TAIL(&cache_mod.sync_q, inv, link);
        ld_defer_kick(&cache_mod.sync_defer);
    } else {
        inv_start(inv);
    }
}

/* ---- journal replay and the periodic duty ---------------------------- */

void
cache_replay_one(const struct ld_journal_entry *e, void *arg)
{
    struct replay_state *st = arg;
    struct del *d = del_new(e->key, e->key_len, e->due_ms, true,
                            (e->flags & LD_JOURNAL_F_STALE) != 0);
    d->id = e->id;
    st->count++;
    /* An add due already is a first delete the last run did not carry
     * out (or a second one that is late anyway). */
    if (e->after_id == 0 && e->due_ms <= cache_wall_ms()) {
        owed_add(d);
    }
    if (e->after_id == 0) {
        if (st->by_id != NULL) {
            ld_dict_set(st->by_id, &d->id, sizeof(d->id), d);
        }
        del_schedule(d);
        return;
    }
    /* Entries come in id order, so the first delete, if still owed, is
     * known by now: wait for it. If it is done, it happened at some time
     * before this start, so the delay counts from now. */
    d->delay_ms = e->due_ms;
    struct del *first = st->by_id != NULL
                            ? ld_dict_get(st->by_id, &e->after_id,
                                          sizeof(e->after_id))
                            : NULL;
    if (first != NULL && first->then == NULL) {
        first->then = d;
        d->after = first;
        d->due_ms = 0;
    } else {
        d->due_ms = cache_wall_ms() + d->delay_ms;
        del_schedule(d);
    }
}

void
cache_tick_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    /* The whole of fsync "everysec"; under "always" it makes the done
     * records durable too, which spares a restart redundant deletes. */
    ld_journal_sync(cache_mod.journal);
    cache_due_poll();
    if (ld_journal_should_compact(cache_mod.journal)) {
        ld_journal_compact(cache_mod.journal);
    }
    cache_update_journal_stats();
}
