/*
 * The near cache's store: entries by user key, least recently used first
 * out when cache.near.max_bytes is passed, each dropped at its Redis TTL,
 * and the reads on their way to becoming entries.
 *
 * Correctness rests on three rules. (1) A value is kept only when its
 * read was tracked: CLIENT CACHING yes, the probe and PTTL all answered on
 * one connection that ld_near_track.c trusts (tracking on, redirected to
 * the live tracking connection). (2) A read is kept only when nothing
 * could have changed the key between the moment it was sent and the
 * moment it is kept: every read holds its key's "flight" record, whose
 * generation an invalidation (from Redis or from this daemon's own
 * writes) bumps, and the store's epoch, which every flush bumps; a read
 * whose generation or epoch moved is dropped. This is the race of an
 * invalidation that overtakes the reply of the read of the old value.
 * (3) Whenever invalidations may have been lost (the tracking connection
 * or a tracked command connection went away, the master moved, the slot
 * map of a cluster changed, Redis flushed) everything is flushed at once,
 * before another near hit.
 *
 * The life of a key's near entry:
 *   ABSENT   a read from Redis (the probe of cache.get) of a key
 *            admitted (cache.near.min_hits) while tracking is armed
 *            begins a near read (ld_near_read_begin).
 *            -> READING
 *   READING  struct ld_near_read, holding its key's flight and the epoch;
 *            three answers to come: CLIENT CACHING, the read, PTTL.
 *            -> KEPT     all three came on one trusted connection, and
 *                        neither the flight's generation nor the epoch
 *                        moved (rules 1 and 2): stored, first in the LRU;
 *            -> ABSENT   anything else: the read is dropped (a read
 *                        orphaned by ld_near_free only frees itself).
 *   KEPT     struct nentry, answering cache.get and cache.mget (a hit
 *            moves it to the front of the LRU).
 *            -> ABSENT   Redis' TTL passed (seen at the next lookup), the
 *                        LRU pushed it out (max_bytes), the key changed
 *                        (Redis' invalidation, this daemon's own write or
 *                        delete: ld_near_evict), a flush (rule 3);
 *            -> KEPT     a newer read of the key replaces it.
 *
 * It owns the entries and the flights; whether a connection's tracking can be
 * trusted is ld_near_track.c's call, not this file's.
 */
#include "ld_features.h"
#include "ld_near.h"
#include "ld_near_int.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_json.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_redis.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

/* What an entry costs beyond its key and value: the struct, the dict's
 * entry and its copy of the key's header. */
#define ENTRY_OVERHEAD 96
/* Slots of the table counting recent reads for cache.near.min_hits. */
#define ADMIT_SLOTS 16384

enum cause { CAUSE_LRU, CAUSE_TTL, CAUSE_TRACKING, CAUSE_FLUSH };

struct nentry {
    TAILQ_ENTRY(nentry) lru; /* most recently used first */
    uint64_t expire_us;      /* monotonic; 0: no TTL in Redis */
    uint64_t version;        /* of the value, as Redis holds it */
    size_t key_len, val_len, bytes;
    char data[]; /* the key, then the value as a JSON string literal */
};

/* The reads of one key in flight. */
struct nflight {
    uint64_t gen;
    unsigned n;
};

struct admit_slot {
    uint64_t hash;
    uint64_t start_ms;
    uint64_t count;
};

struct ld_near_read {
    LIST_ENTRY(ld_near_read) link;
    struct nflight *fl; /* NULL once orphaned by ld_near_free */
    char *key;
    size_t key_len;
    char *entry; /* its Redis key */
    size_t entry_len;
    uint64_t epoch, gen, begin_us;
    int parts; /* answers still to come: CACHING, the read, PTTL */
    bool caching_ok;
    bool have_value;
    bool have_pttl;
    uint64_t caching_conn, value_conn, pttl_conn;
    long long pttl_ms;
    uint64_t version;
    char *value; /* as a JSON string literal */
    size_t vlen;
    char *raw; /* as Redis has it, for the shared segments */
    size_t raw_len;
};

static struct {
    const struct ld_ctx *ctx;
    bool enabled;
    struct ld_dict *entries; /* user key -> struct nentry */
    struct ld_dict *flights; /* user key -> struct nflight */
    TAILQ_HEAD(nentry_lru_head, nentry) lru;
    LIST_HEAD(, ld_near_read) reads;
    uint64_t epoch;
    long long bytes;
    bool flushing;            /* the segments were flushed whole already */
    struct admit_slot *admit; /* only with min_hits > 0 */
} near_mod;

bool
ld_near_enabled(void)
{
    return near_mod.enabled;
}

static const struct ld_config *
cfg(void)
{
    return near_mod.ctx->cfg;
}

static void
update_gauges(void)
{
    ld_stats.near_entries = (long long)ld_dict_size(near_mod.entries);
    ld_stats.near_bytes = near_mod.bytes;
}

static void
entry_drop(struct nentry *e, enum cause cause)
{
    switch (cause) {
    case CAUSE_LRU:
        ld_stats.near_evictions_lru++;
        break;
    case CAUSE_TTL:
        ld_stats.near_evictions_ttl++;
        break;
    case CAUSE_TRACKING:
        ld_stats.near_evictions_tracking++;
        break;
    case CAUSE_FLUSH:
        ld_stats.near_evictions_flush++;
        break;
    }
    /* Out of the segments first: whatever this drop answers or counts
     * comes after it. */
    if (!near_mod.flushing) {
        near_seg_del(e->data, e->key_len);
    }
    TAILQ_REMOVE(&near_mod.lru, e, lru);
    ld_dict_del(near_mod.entries, e->data, e->key_len);
    LD_ASSERT(near_mod.bytes >= (long long)e->bytes);
    near_mod.bytes -= (long long)e->bytes;
    free(e);
}

/* KEY changed: drop its entry, and reads in flight must not be kept. */
static void
key_changed(const char *key, size_t len)
{
    struct nflight *fl = ld_dict_get(near_mod.flights, key, len);
    if (fl != NULL) {
        fl->gen++;
    }
    struct nentry *e = ld_dict_get(near_mod.entries, key, len);
    if (e != NULL) {
        entry_drop(e, CAUSE_TRACKING);
        update_gauges();
    }
}

void
near_flush(const char *why)
{
    size_t n = ld_dict_size(near_mod.entries);
    near_mod.epoch++;
    ld_stats.near_flushes++;
    near_seg_flush();
    near_mod.flushing = true;
    struct nentry *e;
    while ((e = TAILQ_FIRST(&near_mod.lru)) != NULL) {
        entry_drop(e, CAUSE_FLUSH);
    }
    near_mod.flushing = false;
    update_gauges();
    if (n > 0) {
        log_info("near cache flushed entries=%zu reason=\"%s\"", n, why);
    } else {
        log_debug("near cache flushed entries=0 reason=\"%s\"", why);
    }
}

void
near_invalidate(const char *rkey, size_t len)
{
    /* An entry's Redis key is prefix "{" key "}"; anything else is not
     * ours (tracking reports every key read on a tracked connection). */
    const char *prefix = cfg()->cache.prefix;
    size_t plen = strlen(prefix);
    if (len < plen + 2 || memcmp(rkey, prefix, plen) != 0 ||
        rkey[plen] != '{' || rkey[len - 1] != '}') {
        return;
    }
    key_changed(rkey + plen + 1, len - plen - 2);
}

void
ld_near_evict(const char *key, size_t len)
{
    if (near_mod.enabled) {
        key_changed(key, len);
    }
}

/* ---- cache.near.min_hits --------------------------------------------- */

/* One slot per key hash, the count restarting when the window has passed
 * or another key takes the slot: bounded memory, no allocation per read,
 * and a collision can only delay a key's admission, never admit one that
 * was not read. */
static struct admit_slot *
admit_slot(const char *key, size_t len, uint64_t *hash)
{
    *hash = ld_hash(key, len);
    return &near_mod.admit[*hash % ADMIT_SLOTS];
}

static void
admit_count(const char *key, size_t len)
{
    uint64_t hash, now = ld_now_ms();
    struct admit_slot *s = admit_slot(key, len, &hash);
    if (s->hash != hash ||
        now - s->start_ms > (uint64_t)cfg()->cache.near.min_hits_window_ms) {
        s->hash = hash;
        s->start_ms = now;
        s->count = 0;
    }
    s->count++;
}

static bool
admitted(const char *key, size_t len)
{
    long long min = cfg()->cache.near.min_hits;
    if (min == 0) {
        return true;
    }
    uint64_t hash, now = ld_now_ms();
    const struct admit_slot *s = admit_slot(key, len, &hash);
    return s->hash == hash &&
           now - s->start_ms <=
               (uint64_t)cfg()->cache.near.min_hits_window_ms &&
           s->count >= (uint64_t)min;
}

/* ---- lookups ---------------------------------------------------------- */

bool
ld_near_get(const char *key, size_t len, uint64_t now_us, const char **json,
            size_t *jlen)
{
    uint64_t version;
    return ld_near_get_version(key, len, now_us, json, jlen, &version);
}

bool
ld_near_get_version(const char *key, size_t len, uint64_t now_us,
                    const char **json, size_t *jlen, uint64_t *version)
{
    if (!near_mod.enabled) {
        return false;
    }
    struct nentry *e = ld_dict_get(near_mod.entries, key, len);
    if (e != NULL && e->expire_us != 0 && now_us >= e->expire_us) {
        entry_drop(e, CAUSE_TTL);
        update_gauges();
        e = NULL;
    }
    if (e == NULL || !near_track_armed()) {
        if (near_mod.admit != NULL) {
            admit_count(key, len);
        }
        return false;
    }
    if (TAILQ_FIRST(&near_mod.lru) != e) {
        TAILQ_REMOVE(&near_mod.lru, e, lru);
        TAILQ_INSERT_HEAD(&near_mod.lru, e, lru);
    }
    ld_stats.near_hits++;
    *json = e->data + e->key_len;
    *jlen = e->val_len;
    *version = e->version;
    return true;
}

/* ---- reads that may become entries ----------------------------------- */

static void
store(const struct ld_near_read *nr)
{
    size_t bytes = ENTRY_OVERHEAD + nr->key_len + nr->vlen;
    if ((long long)bytes > cfg()->cache.near.max_bytes) {
        return;
    }
    struct nentry *old = ld_dict_get(near_mod.entries, nr->key, nr->key_len);
    if (old != NULL) {
        /* The same key read again: the newer read replaces it, uncounted. */
        TAILQ_REMOVE(&near_mod.lru, old, lru);
        ld_dict_del(near_mod.entries, old->data, old->key_len);
        near_mod.bytes -= (long long)old->bytes;
        free(old);
    }
    struct nentry *e = ld_xmalloc(sizeof(*e) + nr->key_len + nr->vlen);
    e->key_len = nr->key_len;
    e->val_len = nr->vlen;
    e->version = nr->version;
    e->bytes = bytes;
    /* PTTL was measured after the read was sent: counting from the send
     * ends the entry no later than Redis ends the key; less one ms, for
     * Redis' clock counts whole milliseconds. */
    e->expire_us = nr->pttl_ms > 0
                       ? nr->begin_us + (uint64_t)(nr->pttl_ms - 1) * 1000
                       : 0;
    memcpy(e->data, nr->key, nr->key_len);
    memcpy(e->data + nr->key_len, nr->value, nr->vlen);
    ld_dict_set(near_mod.entries, e->data, e->key_len, e);
    TAILQ_INSERT_HEAD(&near_mod.lru, e, lru);
    near_mod.bytes += (long long)bytes;
    if (nr->raw != NULL) {
        near_seg_put(nr->key, nr->key_len, nr->raw, nr->raw_len, e->expire_us,
                     e->version);
    }
    struct nentry *t;
    while (near_mod.bytes > cfg()->cache.near.max_bytes &&
           (t = TAILQ_LAST(&near_mod.lru, nentry_lru_head)) != NULL) {
        entry_drop(t, CAUSE_LRU);
    }
    update_gauges();
}

/* Rules (1) and (2) of the top of this file. */
static bool
keepable(const struct ld_near_read *nr)
{
    uint64_t conn = nr->value_conn;
    return nr->have_value && nr->caching_ok && nr->have_pttl &&
           (nr->pttl_ms == -1 || nr->pttl_ms > 1) && conn != 0 &&
           nr->caching_conn == conn && nr->pttl_conn == conn &&
           nr->epoch == near_mod.epoch && nr->fl->gen == nr->gen &&
           near_track_trusted(conn);
}

static void
read_part_done(struct ld_near_read *nr)
{
    LD_ASSERT(nr->parts > 0);
    if (--nr->parts > 0) {
        return;
    }
    if (nr->fl != NULL) {
        if (keepable(nr)) {
            store(nr);
        } else if (nr->have_value) {
            /* Why a value read was not kept, for whoever wonders why a
             * key is never a near hit. */
            log_debug("near read not kept key=\"%.*s\" value=%d caching=%d "
                      "pttl=%d/%lld conns=%llu/%llu/%llu epoch=%d gen=%d "
                      "trusted=%d",
                      (int)(nr->key_len > 60 ? 60 : nr->key_len), nr->key,
                      nr->have_value, nr->caching_ok, nr->have_pttl,
                      nr->pttl_ms, (unsigned long long)nr->caching_conn,
                      (unsigned long long)nr->value_conn,
                      (unsigned long long)nr->pttl_conn,
                      nr->epoch == near_mod.epoch, nr->fl->gen == nr->gen,
                      near_track_trusted(nr->value_conn));
        }
        LD_ASSERT(nr->fl->n > 0);
        if (--nr->fl->n == 0) {
            ld_dict_del(near_mod.flights, nr->key, nr->key_len);
            free(nr->fl);
        }
        LIST_REMOVE(nr, link);
    }
    free(nr->value);
    free(nr->raw);
    free(nr->key);
    free(nr->entry);
    free(nr);
}

static void
caching_cb(redisReply *reply, void *arg)
{
    struct ld_near_read *nr = arg;
    nr->caching_ok = reply != NULL && reply->type == REDIS_REPLY_STATUS &&
                     strcmp(reply->str, "OK") == 0;
    nr->caching_conn = ld_redis_conn_id();
    read_part_done(nr);
}

static void
pttl_cb(redisReply *reply, void *arg)
{
    struct ld_near_read *nr = arg;
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
        nr->have_pttl = true;
        nr->pttl_ms = reply->integer;
    }
    nr->pttl_conn = ld_redis_conn_id();
    read_part_done(nr);
}

struct ld_near_read *
ld_near_read_begin(const char *key, size_t len, const char *entry,
                   size_t entry_len)
{
    if (!near_mod.enabled || !near_track_armed() ||
        cfg()->cache.near.max_bytes == 0 || !admitted(key, len)) {
        return NULL;
    }
    struct nflight *fl = ld_dict_get(near_mod.flights, key, len);
    if (fl == NULL) {
        fl = ld_xcalloc(1, sizeof(*fl));
        ld_dict_set(near_mod.flights, key, len, fl);
    }
    fl->n++;
    struct ld_near_read *nr = ld_xcalloc(1, sizeof(*nr));
    nr->fl = fl;
    nr->key = ld_xmemdup(key, len);
    nr->key_len = len;
    nr->entry = ld_xmemdup(entry, entry_len);
    nr->entry_len = entry_len;
    nr->epoch = near_mod.epoch;
    nr->gen = fl->gen;
    nr->begin_us = ld_now_us();
    nr->parts = 3;
    LIST_INSERT_HEAD(&near_mod.reads, nr, link);
    /* Tracking is opt-in (OPTIN, see ld_near_track.c): only the next
     * command, the probe, is remembered by Redis for us. */
    const char *argv[] = {"CLIENT", "CACHING", "yes"};
    size_t argvlen[] = {6, 7, 3};
    ld_redis_command(entry, entry_len, 3, argv, argvlen, caching_cb, nr);
    return nr;
}

void
ld_near_read_sent(struct ld_near_read *nr)
{
    if (nr == NULL) {
        return;
    }
    /* The read's route, so the same connection, right after it. */
    const char *argv[] = {"PTTL", nr->entry};
    size_t argvlen[] = {4, nr->entry_len};
    ld_redis_command(nr->entry, nr->entry_len, 2, argv, argvlen, pttl_cb, nr);
}

/* The exact room ld_json_quote needs for V: a value near max_value_bytes
 * (up to 1 GiB) must not cost six times its size while it is escaped. */
static size_t
quoted_room(const char *v, size_t len)
{
    size_t n = len + 2;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)v[i];
        n += c < 0x20 ? 5 : (c == '"' || c == '\\');
    }
    return n;
}

void
ld_near_read_version(struct ld_near_read *nr, uint64_t version)
{
    if (nr != NULL) {
        nr->version = version;
    }
}

void
ld_near_read_done(struct ld_near_read *nr, uint64_t conn_id, const char *v,
                  size_t vlen)
{
    if (nr == NULL) {
        return;
    }
    nr->value_conn = conn_id;
    if (v != NULL && nr->fl != NULL &&
        (long long)vlen <= cfg()->cache.near.max_value_bytes) {
        /* Kept as the text a hit sends: a near hit copies it rather than
         * check and escape it again. A value that is not UTF-8 has no
         * such text (its reads answer wrong_type): it is not kept. */
        char *q = ld_xmalloc(quoted_room(v, vlen));
        size_t qlen = ld_json_quote(q, v, vlen);
        if (qlen > 0) {
            nr->value = q;
            nr->vlen = qlen;
            nr->have_value = true;
            if (near_seg_on()) {
                nr->raw = ld_xmemdup(v, vlen);
                nr->raw_len = vlen;
            }
        } else {
            free(q);
        }
    }
    read_part_done(nr);
}

/* ---- init and teardown ------------------------------------------------ */

int
ld_near_init(const struct ld_ctx *ctx)
{
    memset(&near_mod, 0, sizeof(near_mod));
    near_mod.ctx = ctx;
    near_mod.enabled = ctx->cfg->cache.near.enabled;
    TAILQ_INIT(&near_mod.lru);
    LIST_INIT(&near_mod.reads);
    /* Its ops answer that it is off when the near cache is. */
    if (near_seg_init(ctx) != LD_OK) {
        return LD_ERR;
    }
    if (!near_mod.enabled) {
        return LD_OK;
    }
    ld_features_add("near"); /* cache.near.enabled is not reloadable */
    near_mod.entries = ld_dict_new();
    near_mod.flights = ld_dict_new();
    if (ctx->cfg->cache.near.min_hits > 0) {
        near_mod.admit = ld_xcalloc(ADMIT_SLOTS, sizeof(*near_mod.admit));
    }
    log_info("near cache enabled max_bytes=%lld max_value_bytes=%lld "
             "min_hits=%lld",
             ctx->cfg->cache.near.max_bytes,
             ctx->cfg->cache.near.max_value_bytes,
             ctx->cfg->cache.near.min_hits);
    return near_track_init(ctx);
}

void
ld_near_start(void)
{
    if (near_mod.enabled) {
        near_track_start();
    }
}

void
ld_near_set_address(const struct ld_conn_addr *addr)
{
    if (!near_mod.enabled) {
        return;
    }
    near_flush("the master moved");
    near_track_set_address(addr);
}

void
ld_near_reloaded(void)
{
    if (near_seg_reload() && near_mod.enabled) {
        near_flush("shared segments replaced");
    }
}

void
ld_near_free(void)
{
    near_seg_free();
    if (!near_mod.enabled) {
        return;
    }
    near_track_free();
    /* Reads still owe answers that ld_redis_free may yet deliver: they
     * finish on their own, touching nothing here. */
    struct ld_near_read *nr;
    while ((nr = LIST_FIRST(&near_mod.reads)) != NULL) {
        LIST_REMOVE(nr, link);
        nr->fl = NULL;
    }
    struct nentry *e;
    while ((e = TAILQ_FIRST(&near_mod.lru)) != NULL) {
        TAILQ_REMOVE(&near_mod.lru, e, lru);
        free(e);
    }
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, near_mod.flights);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        free(v);
    }
    ld_dict_free(near_mod.flights);
    ld_dict_free(near_mod.entries);
    free(near_mod.admit);
    memset(&near_mod, 0, sizeof(near_mod));
    ld_stats.near_entries = 0;
    ld_stats.near_bytes = 0;
}
