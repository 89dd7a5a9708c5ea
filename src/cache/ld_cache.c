/*
 * Cache-aside: cache.get, cache.mget, cache.fill, cache.release,
 * cache.set and cache.invalidate, with single-flight fills and delayed
 * double delete that survives crashes.
 *
 * Redis layout. An entry is one hash at cache.prefix + "{" + key + "}"
 * (so an entry and its channel share a hash tag) with the fields
 *   v  the value                      (absent while there is none)
 *   n  "1": a cached null ("not found", distinct from every string)
 *   l  the current fill lease token   (only while there is no value)
 * While the entry holds only a lease its TTL is cache.fill_lease_ms, so the
 * lease of a loader that vanished ends with the key; once a value or a
 * null is stored the TTL is the entry's. Every write publishes on
 * entry + ":fill", which is what waiters everywhere listen to. Each op is
 * one Lua script (src/lua/cache_*.lua), so a check and the write it guards
 * are atomic: a fill stores only under the lease that is current, and a
 * cache.set or an invalidation (which delete or replace the hash, lease and
 * all) makes every older lease worthless.
 *
 * Reading (struct ckey, one per key somebody in this daemon is reading or
 * waiting for). Every getter of a key in this daemon attaches to the one
 * cache_get script in flight for that key (struct fetch), so concurrent
 * getters cost one Redis round trip. A fetch that finds the lease held
 * turns its getters into waiters; the key then subscribes to its channel,
 * and a message, the subscription's confirmation (which covers a fill that
 * happened before we listened), or the end of the holder's lease (by its
 * PTTL) wakes the waiters into one new fetch. When that fetch grants a
 * lease, the oldest waiter gets it and the rest wait on. A "generation"
 * counter per key, bumped by every wake-up and every local write, keeps
 * getters from attaching to a fetch that was sent before the change they
 * are meant to see.
 *
 * Invalidation (struct del, one per promised delete). cache.invalidate
 * records a first delete (due now) and a second delete (due after
 * delay_ms) per key in the journal (ld_journal.c), syncs it (one fdatasync
 * for all invalidations of a loop iteration under fsync "always"), then
 * deletes. Each delete is retried with capped backoff until Redis takes it,
 * then retired by a done record. At start the journal is replayed: every
 * delete not retired runs at its due time, or at once when overdue.
 *
 * Files: ld_cache.c owns the module state (cache_mod), start and stop, and
 * the writes (cache.fill, cache.release, cache.set); cache.mset is
 * ld_cache_mset.c; reading is
 * ld_cache_get.c, answering ld_cache_reply.c, invalidation ld_cache_inval.c,
 * the due set ld_cache_due.c, the near cache ld_near*.c. Nothing in the cache
 * package reaches into the lock or semaphore packages.
 */
#include "ld_cache.h"

#include "ld_cache_int.h"
#include "ld_cache_hot.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_dispatch.h"
#include "ld_features.h"
#include "ld_fsync.h"
#include "ld_journal.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_near.h"
#include "ld_proto.h"
#include "ld_pubsub.h"
#include "ld_redis.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define TICK_MS 1000
#define CHAN_SUFFIX ":fill"

struct cache_mod_state cache_mod;

/* ---- helpers --------------------------------------------------------- */

size_t
cache_names_size(size_t len)
{
    return strlen(cache_mod.ctx->cfg->cache.prefix) + len +
           sizeof(CHAN_SUFFIX) + 2;
}

void
cache_put_names(char *buf, const char *key, size_t len, size_t *entry_len,
                size_t *chan_len)
{
    const char *prefix = cache_mod.ctx->cfg->cache.prefix;
    size_t plen = strlen(prefix);
    size_t elen = plen + 1 + len + 1;
    size_t slen = sizeof(CHAN_SUFFIX) - 1;
    memcpy(buf, prefix, plen);
    buf[plen] = '{';
    memcpy(buf + plen + 1, key, len);
    buf[plen + 1 + len] = '}';
    memcpy(buf + elen, CHAN_SUFFIX, slen);
    buf[elen + slen] = '\0';
    *entry_len = elen;
    *chan_len = elen + slen;
}

char *
cache_make_names(const char *key, size_t len, size_t *entry_len,
                 size_t *chan_len)
{
    char *buf = ld_xmalloc(cache_names_size(len));
    cache_put_names(buf, key, len, entry_len, chan_len);
    return buf;
}

void
cache_set_timer(struct event *ev, uint64_t delay_us)
{
    struct timeval tv = ld_tv_us(delay_us);
    event_add(ev, &tv);
}

/* An acknowledged invalidation must reach the journal: while it cannot
 * be synced the daemon is not ready (leasectl ping, the stats op). */
static const char *
cache_journal_not_ready(void)
{
    if (cache_mod.journal != NULL && ld_journal_failed(cache_mod.journal)) {
        return "journal_failed";
    }
    return NULL;
}

void
cache_update_journal_stats(void)
{
    if (cache_mod.journal != NULL) {
        ld_stats.journal_bytes = (long long)ld_journal_bytes(
            cache_mod.journal);
        ld_stats.cache_invalidations_pending = (long long)ld_journal_live(
            cache_mod.journal);
    }
}

/* The "value" field: required, a string or null. */
static int
req_value(struct ld_req *req, const char **v, size_t *len, bool *is_null)
{
    struct ld_rval x;
    ld_req_get(req, "value", &x);
    if (x.kind == LD_RV_ABSENT) {
        ld_reply_error(req, LD_E_BAD_REQUEST, "field 'value' is required");
        return LD_ERR;
    }
    if (x.kind == LD_RV_NULL) {
        *is_null = true;
        *v = "";
        *len = 0;
        return LD_OK;
    }
    if (x.kind != LD_RV_STR) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'value' must be a string or null");
        return LD_ERR;
    }
    *is_null = false;
    *v = x.s;
    *len = x.len;
    return LD_OK;
}

/* A local write to KEY: getters arriving from now on must not share a
 * fetch that was sent before it. */
void
cache_key_touched(const char *key, size_t len)
{
    struct ckey *ck = ld_dict_get(cache_mod.keys, key, len);
    if (ck != NULL) {
        ck->gen++;
    }
    ld_near_evict(key, len);
}

/* ---- cache.fill / cache.release / cache.set -------------------------- */

static int
ttl_param(struct ld_req *req, long long *ttl_ms, bool *present)
{
    return ld_req_int(req, "ttl_ms", false, 1, LD_TTL_MS_MAX, ttl_ms, present);
}

/* The TTL an entry gets: nulls always cache.null_ttl_ms (a "not found"
 * must stay short-lived whatever TTL the caller uses for values), values
 * ttl_ms or cache.ttl_ms; spread by cache.ttl_jitter either way. */
long long
cache_entry_ttl(bool is_null, bool ttl_given, long long ttl_ms)
{
    const struct ld_config *cfg = cache_mod.ctx->cfg;
    long long base = is_null ? cfg->cache.null_ttl_ms
                             : (ttl_given ? ttl_ms : cfg->cache.ttl_ms);
    return ld_jitter_ttl(base, cfg->cache.ttl_jitter);
}

const char *
cache_layout_arg(void)
{
    return cache_mod.ctx->cfg->cache.layout == 2 ? "2" : "1";
}

/* A write that got no answer: it may have happened when it left, and the
 * client is told so instead of "nothing changed". */
static void
write_unanswered(struct cache_write_err *err)
{
    if (ld_redis_outcome() != LD_REDIS_NOT_SENT) {
        err->extra = json_pack("{s:s}", "outcome", "unknown");
    }
    err->code = LD_E_REDIS_UNAVAILABLE;
    snprintf(err->msg, sizeof(err->msg), "redis unavailable: %s",
             ld_redis_failure_reason()[0] != '\0' ? ld_redis_failure_reason()
                                                  : "no answer");
}

/* A write script's {rc, version} into RES; a bare number is an rc
 * (version -1), or above the rcs cache_set's DONE with that version
 * (versions are Redis' clock in microseconds: cache_shape.lua); false for
 * any other shape. */
static bool
write_result(const redisReply *reply, struct cache_write_res *res)
{
    res->version = -1;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_INTEGER &&
        reply->element[1]->type == REDIS_REPLY_INTEGER) {
        res->rc = reply->element[0]->integer;
        res->version = reply->element[1]->integer;
        return true;
    }
    if (reply->type == REDIS_REPLY_INTEGER) {
        res->rc = reply->integer;
        if (reply->integer > CACHE_WRITE_MOVED) {
            res->rc = CACHE_WRITE_DONE;
            res->version = reply->integer;
        }
        return true;
    }
    return false;
}

bool
cache_write_check(const redisReply *reply, const char *op, const char *key,
                  size_t klen, struct cache_write_err *err,
                  struct cache_write_res *res)
{
    int kl = klen > 200 ? 200 : (int)klen;
    err->extra = NULL;
    if (reply == NULL) {
        write_unanswered(err);
        return false;
    }
    if (ld_reply_is_unavailable(reply)) {
        log_info("redis refused op=%s key=\"%.*s\" error=\"%s\"", op, kl,
                 key != NULL ? key : "", reply->str);
        err->code = LD_E_REDIS_UNAVAILABLE;
        snprintf(err->msg, sizeof(err->msg), "redis: %s", reply->str);
        return false;
    }
    if (!write_result(reply, res)) {
        const char *why = reply->type == REDIS_REPLY_ERROR ? reply->str
                                                           : "bad shape";
        log_error("cache script failed op=%s key=\"%.*s\" error=\"%s\"", op,
                  kl, key != NULL ? key : "", why);
        err->code = LD_E_INTERNAL;
        snprintf(err->msg, sizeof(err->msg), "unexpected reply to %s: %s", op,
                 why);
        return false;
    }
    if (res->rc == CACHE_WRITE_WRONG_TYPE) {
        err->code = LD_E_WRONG_TYPE;
        snprintf(err->msg, sizeof(err->msg),
                 "the Redis key of entry '%.*s' holds data leased did not "
                 "write; nothing was changed",
                 kl, key != NULL ? key : "");
        return false;
    }
    return true;
}

/* Common checks of a write script's reply; returns true when the caller
 * should go on with RES. */
static bool
write_reply_ok(struct ld_req *req, const redisReply *reply, const char *op,
               struct cache_write_res *res)
{
    struct ld_rval k;
    ld_req_get(req, "key", &k);
    const char *key = k.s;
    if (key != NULL) {
        /* Touched when it was issued, and again now: a write held in a
         * batch (redis.batch_max) goes out at the end of the turn. On its
         * own connection every command waits for it, but when that one is
         * lost or set aside later in the same turn (or another one
         * becomes ready), a read issued meanwhile goes out first on
         * another connection and the write follows it there: the read
         * finds the old value under the generation of after the write.
         * Nothing it read is kept near, or shared with getters, once the
         * write is answered. No test arranges those events within one
         * turn of the loop; the tracking message of the write evicts
         * such a value too, but possibly only after this answer. */
        cache_key_touched(key, k.len);
    }
    struct cache_write_err err;
    if (!cache_write_check(reply, op, key, key != NULL ? k.len : 0, &err,
                           res)) {
        ld_reply_error_extra(req, err.code, err.extra, "%s", err.msg);
        return false;
    }
    return true;
}

static void
fill_cb(redisReply *reply, void *arg)
{
    struct ld_req *req = arg;
    struct cache_write_res res;
    if (!write_reply_ok(req, reply, "cache.fill", &res)) {
        return;
    }
    bool stored = res.rc == CACHE_WRITE_DONE;
    if (stored) {
        ld_stats.cache_fills_stored++;
    } else {
        ld_stats.cache_fills_rejected++;
    }
    ld_reply_ok(req, json_pack("{s:b,s:I}", "stored", stored, "version",
                               (json_int_t)res.version));
}

static void
release_cb(redisReply *reply, void *arg)
{
    struct ld_req *req = arg;
    struct cache_write_res res;
    if (!write_reply_ok(req, reply, "cache.release", &res)) {
        return;
    }
    ld_reply_ok(req,
                json_pack("{s:b}", "released", res.rc == CACHE_WRITE_DONE));
}

static void
set_cb(redisReply *reply, void *arg)
{
    struct ld_req *req = arg;
    struct cache_write_res res;
    if (!write_reply_ok(req, reply, "cache.set", &res)) {
        return;
    }
    ld_reply_ok(req,
                json_pack("{s:b,s:I}", "stored", res.rc == CACHE_WRITE_DONE,
                          "version", (json_int_t)res.version));
}

const char *
cache_if_version(const json_t *j, long long *if_version)
{
    *if_version = -1;
    if (j == NULL || json_is_null(j)) {
        return NULL;
    }
    if (!json_is_integer(j) || json_integer_value(j) < 0 ||
        json_integer_value(j) > CACHE_VERSION_MAX) {
        return "field 'if_version' must be an integer between 0 and 2^53";
    }
    *if_version = json_integer_value(j);
    return NULL;
}

/* The request's if_version into *IF_VERSION (-1: absent); LD_ERR when it
 * answered bad_request. */
static int
req_if_version(struct ld_req *req, long long *if_version)
{
    bool present;
    *if_version = -1;
    if (ld_req_int(req, "if_version", false, 0, CACHE_VERSION_MAX, if_version,
                   &present) != LD_OK) {
        return LD_ERR;
    }
    if (!present) {
        *if_version = -1;
    }
    return LD_OK;
}

/* The ARGV text of IF_VERSION: "" when absent. */
static size_t
if_version_text(char *buf, size_t size, long long if_version)
{
    if (if_version < 0) {
        buf[0] = '\0';
        return 0;
    }
    return (size_t)snprintf(buf, size, "%lld", if_version);
}

/* Run a write script on KEY's entry: ARGV[0] is replaced by the entry key
 * and every NULL element of ARGV by the channel. */
static void
run_write(struct ld_req *req, enum ld_script_id script, const char *key,
          size_t len, int argc, const char **argv, size_t *argvlen,
          ld_redis_cb *cb)
{
    size_t elen, clen;
    char *names = cache_make_names(key, len, &elen, &clen);
    argv[0] = names;
    argvlen[0] = elen;
    for (int i = 1; i < argc; i++) {
        if (argv[i] == NULL) {
            argv[i] = names;
            argvlen[i] = clen;
        }
    }
    cache_key_touched(key, len);
    ld_redis_script(script, names, elen, 1, argc, argv, argvlen, cb, req);
    free(names);
}

static void
op_fill(struct ld_req *req)
{
    const char *key, *lease, *value;
    size_t len, lease_len, value_len;
    bool is_null, ttl_given;
    long long ttl_ms = 0, if_version;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        ld_req_str(req, "lease", true, &lease, &lease_len, NULL) != LD_OK ||
        req_value(req, &value, &value_len, &is_null) != LD_OK ||
        ttl_param(req, &ttl_ms, &ttl_given) != LD_OK ||
        req_if_version(req, &if_version) != LD_OK) {
        return;
    }
    char ttl[24], ifv[24];
    snprintf(ttl, sizeof(ttl), "%lld",
             cache_entry_ttl(is_null, ttl_given, ttl_ms));
    size_t ifv_len = if_version_text(ifv, sizeof(ifv), if_version);
    const char *argv[] = {NULL, lease, is_null ? "n" : "v", value, ttl,
                          NULL, ifv,   cache_layout_arg()};
    size_t argvlen[] = {0,           lease_len, 1,       value_len,
                        strlen(ttl), 0,         ifv_len, 1};
    run_write(req, LD_SCRIPT_cache_fill, key, len, 8, argv, argvlen, fill_cb);
}

static void
op_release(struct ld_req *req)
{
    const char *key, *lease;
    size_t len, lease_len;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        ld_req_str(req, "lease", true, &lease, &lease_len, NULL) != LD_OK) {
        return;
    }
    const char *argv[] = {NULL, lease, NULL};
    size_t argvlen[] = {0, lease_len, 0};
    run_write(req, LD_SCRIPT_cache_release, key, len, 3, argv, argvlen,
              release_cb);
}

static void
op_set(struct ld_req *req)
{
    const char *key, *value;
    size_t len, value_len;
    bool is_null, ttl_given;
    long long ttl_ms = 0, if_version;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        req_value(req, &value, &value_len, &is_null) != LD_OK ||
        ttl_param(req, &ttl_ms, &ttl_given) != LD_OK ||
        req_if_version(req, &if_version) != LD_OK) {
        return;
    }
    cache_send_set(key, len, value, value_len, is_null,
                   cache_entry_ttl(is_null, ttl_given, ttl_ms), if_version,
                   set_cb, req);
}

void
cache_send_set(const char *key, size_t len, const char *value,
               size_t value_len, bool is_null, long long ttl_ms,
               long long if_version, ld_redis_cb *cb, void *arg)
{
    char ttl[24], ifv[24];
    snprintf(ttl, sizeof(ttl), "%lld", ttl_ms);
    size_t ifv_len = if_version_text(ifv, sizeof(ifv), if_version);
    size_t elen, clen;
    char *names = cache_make_names(key, len, &elen, &clen);
    const char *argv[] = {names, is_null ? "n" : "v", value, ttl, names,
                          ifv,   cache_layout_arg()};
    size_t argvlen[] = {elen, 1, value_len, strlen(ttl), clen, ifv_len, 1};
    cache_key_touched(key, len);
    ld_redis_script(LD_SCRIPT_cache_set, names, elen, 1, 7, argv, argvlen, cb,
                    arg);
    free(names);
}

/* ---- sessions, init and teardown ------------------------------------- */

static void
getter_detach(struct getter *g)
{
    struct ckey *ck = g->ck;
    switch (g->state) {
    case G_FETCH:
        glist_remove(&g->fetch->getters, g);
        g->fetch = NULL;
        break;
    case G_WAIT:
        glist_remove(&ck->waiters, g);
        cache_ckey_arm(ck);
        cache_ckey_maybe_free(ck);
        break;
    default:
        break;
    }
    cache_getter_done(g);
}

static void
on_session_close(struct ld_session *s)
{
    struct csess *cs = s->cache_state;
    if (cs == NULL) {
        return;
    }
    s->cache_state = NULL;
    /* Its waiters leave the queues, so that a lease is never handed to a
     * caller that can no longer load the value. */
    struct cop *op;
    while ((op = LIST_FIRST(&cs->ops)) != NULL) {
        for (size_t i = 0; i < op->n; i++) {
            getter_detach(&op->g[i]);
        }
        /* A client that only half-closed still reads this answer: the
         * read did not finish, so it is a miss without a lease ("load,
         * but do not fill"), always a safe answer in cache-aside. */
        if (op->mget) {
            for (size_t i = 0; i < op->n; i++) {
                if (op->texts[i] == NULL && op->dup_of[i] == SIZE_MAX) {
                    op->texts[i] = cache_chunk_of_json(
                        json_pack("{s:b,s:b,s:n}", "ok", 1, "hit", 0,
                                  "lease"));
                }
            }
            cache_mget_finish(op);
        } else {
            cache_cop_unlink(op);
            ld_reply_ok(op->req, json_pack("{s:b,s:n}", "hit", 0, "lease"));
            cache_cop_free(op);
        }
    }
    free(cs);
}

/* hello offers early_refresh while the live configuration enables it. */
static bool
early_refresh_on(void)
{
    return cache_mod.ctx->cfg->cache.early_refresh;
}

/* The journal, and every delete it still promises back on its way. */
static int
open_journal(const struct ld_config *cfg)
{
    if (ld_journal_open(&cache_mod.journal, cfg->journal.path,
                        cfg->journal.fsync) != LD_OK) {
        log_error("cannot open the invalidation journal path=%s",
                  cfg->journal.path);
        return LD_ERR;
    }
    struct replay_state st = {0, ld_dict_new()};
    ld_journal_each(cache_mod.journal, cache_replay_one, &st);
    ld_dict_free(st.by_id);
    size_t replayed = st.count;
    log_info("journal opened path=%s fsync=%s bytes=%llu pending=%zu",
             cfg->journal.path,
             cfg->journal.fsync == LD_FSYNC_ALWAYS ? "always" : "everysec",
             (unsigned long long)ld_journal_bytes(cache_mod.journal),
             replayed);
    cache_update_journal_stats();
    return LD_OK;
}

/* The periodic duty, and the deferred journal sync. */
static void
start_timers(const struct ld_ctx *ctx)
{
    cache_mod.tick_ev = event_new(ctx->base, -1, EV_PERSIST, cache_tick_cb,
                                  NULL);
    if (cache_mod.tick_ev == NULL) {
        ld_oom_in("event_new");
    }
    ld_defer_init(&cache_mod.sync_defer, ctx->base, cache_sync_run, NULL);
    if (ctx->cfg->journal.fsync == LD_FSYNC_ALWAYS) {
        /* Without it the loop syncs itself, as it always could. */
        cache_mod.syncer = ld_fsync_new(ctx->base);
    }
    struct timeval tv = ld_tv_ms(TICK_MS);
    event_add(cache_mod.tick_ev, &tv);
}

/* The cache ops and the features hello announces for them. */
static int
cache_ops_register(void)
{
    static const struct ld_op cache_ops[] = {
        {"cache.get", cache_op_get, LD_OP_ADDS_WORK},
        {"cache.mget", cache_op_mget, LD_OP_ADDS_WORK},
        {"cache.fill", op_fill, LD_OP_ADDS_WORK},
        {"cache.release", op_release, 0},
        {"cache.set", op_set, LD_OP_ADDS_WORK},
        {"cache.mset", cache_op_mset, LD_OP_ADDS_WORK},
        {"cache.invalidate", cache_op_invalidate, 0},
    };
    if (ld_dispatch_register_ops(cache_ops, LD_ARRAY_LEN(cache_ops)) !=
            LD_OK ||
        cache_hot_init() != LD_OK) {
        return LD_ERR;
    }
    ld_features_add("stale");
    ld_features_add("mset");
    ld_features_add("versioned");
    ld_features_add_if("early_refresh", early_refresh_on);
    return LD_OK;
}

int
ld_cache_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    bool hooks = cache_mod.hooks_registered;

    memset(&cache_mod, 0, sizeof(cache_mod));
    cache_mod.ctx = ctx;
    cache_mod.hooks_registered = hooks;
    LIST_INIT(&cache_mod.fetches);
    LIST_INIT(&cache_mod.dels);
    STAILQ_INIT(&cache_mod.sync_q);
    STAILQ_INIT(&cache_mod.sync_running);
    cache_mod.keys = ld_dict_new();
    cache_mod.owed = ld_dict_new();
    if (open_journal(cfg) != LD_OK) {
        ld_dict_free(cache_mod.keys);
        cache_mod.keys = NULL;
        ld_dict_free(cache_mod.owed);
        cache_mod.owed = NULL;
        return LD_ERR;
    }
    ld_stats_add_refresh(cache_refresh_overdue);
    start_timers(ctx);

    if (!cache_mod.hooks_registered) {
        ld_session_on_close(on_session_close);
        ld_redis_on_state(cache_redis_state_cb, NULL);
        cache_mod.hooks_registered = true;
    }
    ld_dispatch_add_ready_check(cache_journal_not_ready);
    cache_mod.inited = true;
    cache_due_init();
    if (ld_near_init(ctx) != LD_OK) {
        return LD_ERR;
    }
    return cache_ops_register();
}

void
ld_cache_shutdown(void)
{
    if (cache_mod.journal != NULL) {
        ld_journal_sync(cache_mod.journal);
    }
}

/* Fetches still in flight: answer their getters now and leave the
 * structs to their callbacks, which ld_redis_free may still run. */
static void
orphan_fetches(void)
{
    struct fetch *f;
    LIST_FOREACH(f, &cache_mod.fetches, link)
    {
        struct getter *g;
        while ((g = glist_pop(&f->getters)) != NULL) {
            g->state = G_IDLE;
            cache_getter_settle(g, NULL, LD_E_SHUTTING_DOWN,
                                "the daemon is stopping");
        }
        f->ck = NULL;
    }
    LIST_INIT(&cache_mod.fetches);
}

/* Every key, its waiters answered. */
static void
free_keys(void)
{
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, cache_mod.keys);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct ckey *ck = v;
        struct getter *g;
        while ((g = glist_pop(&ck->waiters)) != NULL) {
            g->state = G_IDLE;
            cache_getter_settle(g, NULL, LD_E_SHUTTING_DOWN,
                                "the daemon is stopping");
        }
        if (ck->sub != NULL) {
            ld_pubsub_unsubscribe(ck->sub);
        }
        event_free(ck->timer);
        free(ck);
    }
    ld_dict_free(cache_mod.keys);
    cache_mod.keys = NULL;
    cache_mod.n_waiters = 0;
    cache_ckey_spares_free();
}

/* Deletes stay in the journal for the next start. A sync still on the
 * worker is waited for; its invalidations are answered here, through
 * their deletes, like those still queued. A delete whose command is out
 * is left to its callback. */
static void
free_dels(void)
{
    ld_fsync_free(cache_mod.syncer);
    cache_mod.syncer = NULL;
    STAILQ_INIT(&cache_mod.sync_q);
    STAILQ_INIT(&cache_mod.sync_running);
    struct del *next;
    for (struct del *d = LIST_FIRST(&cache_mod.dels); d != NULL; d = next) {
        next = LIST_NEXT(d, link);
        if (d->inv != NULL) {
            struct inv *inv = d->inv;
            d->inv = NULL;
            if (--inv->left == 0) {
                ld_reply_error(inv->req, LD_E_SHUTTING_DOWN,
                               "the daemon is stopping; the invalidation "
                               "is journaled and runs at the next start");
                cache_inv_free(inv);
            }
        }
        event_free(d->ev);
        d->ev = NULL;
        if (d->running) {
            d->orphan = true;
        } else {
            free(d->member);
            free(d);
        }
    }
    LIST_INIT(&cache_mod.dels);
    ld_dict_free(cache_mod.owed);
    cache_mod.owed = NULL;
}

void
ld_cache_free(void)
{
    if (!cache_mod.inited) {
        return;
    }
    cache_mod.inited = false;
    cache_due_free();
    ld_near_free();
    orphan_fetches();
    free_keys();
    free_dels();
    if (cache_mod.tick_ev != NULL) {
        event_free(cache_mod.tick_ev);
    }
    ld_defer_free(&cache_mod.sync_defer);
    cache_mod.tick_ev = NULL;
    ld_journal_close(cache_mod.journal);
    cache_mod.journal = NULL;
    ld_stats.journal_bytes = 0;
    ld_cache_hot_free();
}
