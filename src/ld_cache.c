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
 */
#include "ld_cache.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_defer.h"
#include "ld_dispatch.h"
#include "ld_journal.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_pubsub.h"
#include "ld_redis.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/event.h>

#define MGET_MAX_KEYS 1000
/* Until the sessions' limits.max_output_bytes can be read here, its
 * default: one cache.mget reply larger than this closes the session. */
/* Result texts shorter than this are copied into the reply; longer ones
 * are added by reference, so a value named many times is never copied. */
#define REF_MIN_BYTES 512
#define INVALIDATE_MAX_KEYS 1000
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 5000
/* PTTL is rounded and Redis expires a key a little after its time; waking
 * a touch late saves a fetch that would only find the lease still there. */
#define LEASE_SLACK_US 3000
#define TICK_MS 1000
#define CHAN_SUFFIX ":fill"

struct ckey;
struct fetch;
struct cop;

/* ---- small lists ----------------------------------------------------- */

enum gstate { G_IDLE, G_FETCH, G_WAIT, G_DONE };

/* One key of a cache.get or cache.mget on its way to an answer. */
struct getter {
    struct cop *op;
    size_t slot;
    struct ckey *ck;
    bool want_lease;
    bool waited;              /* counted in cache_waits */
    bool holds_place;         /* one of cache_mod.n_waiters, until it is
                               * answered */
    uint64_t deadline_us;     /* end of wait_ms, monotonic */
    uint64_t seq;             /* arrival order: waiters are served FIFO */
    enum gstate state;
    struct fetch *fetch;      /* while G_FETCH */
    struct glist *on;         /* the list it is on, if any */
    TAILQ_ENTRY(getter) link;
};

struct glist {
    TAILQ_HEAD(gq, getter) q;
    size_t n;
};

/* A cache.get (one slot) or cache.mget (one slot per key) request. */
struct cop {
    struct ld_req *req;
    bool mget;
    size_t n;
    size_t left;              /* slots not answered yet */
    struct chunk **texts;     /* mget: each distinct slot's result */
    bool *leased;             /* mget: that result carries a lease */
    size_t *dup_of;           /* mget: earlier slot with the same key */
    struct getter *g;         /* n getters (dups unused) */
    LIST_ENTRY(cop) link;     /* its session's list */
    struct csess *cs;
};

/* One result of a cache.mget, serialised once: "," then the object, so
 * that every element but the first brings its separator along. Shared by
 * reference between the slots naming the same key and the reply. */
struct chunk {
    unsigned refs;
    size_t len;
    char data[];
};

/* A session's cache state (ld_session.cache_state). */
struct csess {
    LIST_HEAD(, cop) ops;
};

/* One cache_get script in flight. */
struct fetch {
    struct ckey *ck;          /* NULL once orphaned by ld_cache_free */
    struct glist getters;
    uint64_t gen;             /* the key's generation when it was sent */
    bool grant;
    bool probing;             /* the HMGET is out, not yet the script */
    char token[LD_TOKEN_LEN + 1];
    LIST_ENTRY(fetch) link;   /* every fetch in flight */
};

struct ckey {
    char *key;
    size_t key_len;
    char *names;              /* entry key followed by ":fill" */
    size_t entry_len, chan_len;
    struct fetch *fetch;      /* newest fetch in flight, or NULL */
    unsigned nfetch;          /* fetches in flight for this key */
    uint64_t gen;
    struct glist waiters;
    struct ld_pubsub_sub *sub;
    struct event *timer;      /* lease end or a waiter's deadline */
    uint64_t lease_end_us;    /* 0: unknown, or no expiry */
};

/* One cache.invalidate request awaiting its first deletes. */
struct inv {
    struct ld_req *req;
    struct del **firsts;
    size_t n;
    size_t left;
    long long deleted;
    long long pending;
    bool queued;
    bool journal_failed;
    STAILQ_ENTRY(inv) link;   /* the sync queue */
};

/* One promised delete: in the journal (id != 0) until done. */
struct del {
    uint64_t id;
    int64_t due_ms;           /* wall clock */
    struct inv *inv;          /* the request waiting for it, if any */
    struct event *ev;         /* due time or retry backoff */
    int backoff_ms;
    bool running;             /* its script is in flight */
    bool retrying;            /* failed before; the timer is a backoff */
    bool orphan;              /* ld_cache_free ran while it was running */
    bool second;              /* the delayed one */
    /* A second delete waits for its first: it is due delay_ms after the
     * first one has been carried out, not after it was promised, so the
     * two never run together when both are late (Redis was down, or the
     * daemon restarted). */
    struct del *then;         /* first: the second delete waiting for it */
    struct del *after;        /* second: the first one, while it waits */
    int64_t delay_ms;
    LIST_ENTRY(del) link;     /* every delete owed, until done */
    size_t key_len;
    char key[];
};

static struct {
    const struct ld_ctx *ctx;
    bool inited;
    bool hooks_registered;
    struct ld_journal *journal;
    struct ld_dict *keys;     /* user key -> struct ckey */
    LIST_HEAD(, fetch) fetches;
    LIST_HEAD(, del) dels;
    struct event *tick_ev;
    /* Invalidations waiting for the fdatasync of this loop turn. */
    struct ld_defer sync_defer;
    STAILQ_HEAD(, inv) sync_q;
    /* Getters that wait or once waited and are not answered yet: a
     * waiter keeps its place under limits.max_waiters while a wake-up
     * refetches for it, so that newcomers cannot take it meanwhile. */
    long long n_waiters;
    uint64_t next_seq;
} cache_mod;

static void
glist_init(struct glist *l)
{
    TAILQ_INIT(&l->q);
    l->n = 0;
}

static void
glist_push(struct glist *l, struct getter *g)
{
    LD_ASSERTF(g->on == NULL, "getter of slot %zu is on a list", g->slot);
    TAILQ_INSERT_TAIL(&l->q, g, link);
    g->on = l;
    l->n++;
}

static void
glist_remove(struct glist *l, struct getter *g)
{
    LD_ASSERTF(g->on == l, "getter of slot %zu is not on this list",
               g->slot);
    LD_ASSERT(l->n > 0);
    TAILQ_REMOVE(&l->q, g, link);
    g->on = NULL;
    l->n--;
}

static struct getter *
glist_pop(struct glist *l)
{
    struct getter *g = TAILQ_FIRST(&l->q);
    if (g != NULL) {
        glist_remove(l, g);
    }
    return g;
}

/* Merge SRC into DST, both in arrival order; SRC ends empty. */
static void
glist_merge(struct glist *dst, struct glist *src)
{
    struct getter *pos = TAILQ_FIRST(&dst->q);
    struct getter *g;
    while ((g = glist_pop(src)) != NULL) {
        while (pos != NULL && pos->seq < g->seq) {
            pos = TAILQ_NEXT(pos, link);
        }
        if (pos == NULL) {
            glist_push(dst, g);
            continue;
        }
        TAILQ_INSERT_BEFORE(pos, g, link);
        g->on = dst;
        dst->n++;
    }
    LD_ASSERT(src->n == 0);
}

/* ---- helpers --------------------------------------------------------- */

static int64_t
wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* prefix "{" key "}" ":fill" in one buffer: the entry key is its first
 * *ENTRY_LEN bytes, the channel all of it. */
static char *
make_names(const char *key, size_t len, size_t *entry_len, size_t *chan_len)
{
    const char *prefix = cache_mod.ctx->cfg->cache.prefix;
    size_t plen = strlen(prefix);
    size_t elen = plen + 1 + len + 1;
    size_t slen = sizeof(CHAN_SUFFIX) - 1;
    char *buf = ld_xmalloc(elen + slen + 1);
    memcpy(buf, prefix, plen);
    buf[plen] = '{';
    memcpy(buf + plen + 1, key, len);
    buf[plen + 1 + len] = '}';
    memcpy(buf + elen, CHAN_SUFFIX, slen);
    buf[elen + slen] = '\0';
    *entry_len = elen;
    *chan_len = elen + slen;
    return buf;
}

static void
set_timer(struct event *ev, uint64_t delay_us)
{
    struct timeval tv = {(time_t)(delay_us / 1000000),
                         (suseconds_t)(delay_us % 1000000)};
    event_add(ev, &tv);
}

static void
update_journal_stats(void)
{
    if (cache_mod.journal != NULL) {
        ld_stats.journal_bytes = (long long)ld_journal_bytes(cache_mod.journal);
        ld_stats.cache_invalidations_pending =
            (long long)ld_journal_live(cache_mod.journal);
    }
}

/* The "value" field: required, a string or null. */
static int
req_value(struct ld_req *req, const char **v, size_t *len, bool *is_null)
{
    json_t *x = json_object_get(req->body, "value");
    if (x == NULL) {
        ld_reply_error(req, LD_E_BAD_REQUEST, "field 'value' is required");
        return LD_ERR;
    }
    if (json_is_null(x)) {
        *is_null = true;
        *v = "";
        *len = 0;
        return LD_OK;
    }
    if (!json_is_string(x)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'value' must be a string or null");
        return LD_ERR;
    }
    *is_null = false;
    *v = json_string_value(x);
    *len = json_string_length(x);
    return LD_OK;
}

/* A local write to KEY: getters arriving from now on must not share a
 * fetch that was sent before it. */
static void
key_touched(const char *key, size_t len)
{
    struct ckey *ck = ld_dict_get(cache_mod.keys, key, len);
    if (ck != NULL) {
        ck->gen++;
    }
}

/* ---- per-session bookkeeping ----------------------------------------- */

static struct csess *
csess_of(struct ld_session *s)
{
    if (s->cache_state == NULL) {
        struct csess *cs = ld_xcalloc(1, sizeof(*cs));
        LIST_INIT(&cs->ops);
        s->cache_state = cs;
    }
    return s->cache_state;
}

static void
cop_link(struct cop *op)
{
    struct csess *cs = csess_of(op->req->sess);
    LD_ASSERT(op->cs == NULL);
    op->cs = cs;
    LIST_INSERT_HEAD(&cs->ops, op, link);
}

static void
cop_unlink(struct cop *op)
{
    /* Both the answer and the session's close may unlink first. */
    if (op->cs == NULL) {
        return;
    }
    LIST_REMOVE(op, link);
    op->cs = NULL;
}

static void
chunk_unref(struct chunk *c)
{
    LD_ASSERT(c == NULL || c->refs > 0);
    if (c != NULL && --c->refs == 0) {
        free(c);
    }
}

static void
chunk_cleanup_cb(const void *data, size_t len, void *arg)
{
    LD_UNUSED(data);
    LD_UNUSED(len);
    chunk_unref(arg);
}

static struct chunk *
chunk_new(size_t cap)
{
    struct chunk *c = malloc(sizeof(*c) + cap);
    if (c != NULL) {
        c->refs = 1;
        c->len = 0;
    }
    return c;
}

static void
cop_free(struct cop *op)
{
    if (op->texts != NULL) {
        for (size_t i = 0; i < op->n; i++) {
            chunk_unref(op->texts[i]);
        }
    }
    free(op->texts);
    free(op->leased);
    free(op->dup_of);
    free(op->g);
    free(op);
}

/* ---- answering getters ----------------------------------------------- */

static json_t *
error_object(int code, const char *msg)
{
    return json_pack("{s:b,s:{s:s,s:s}}", "ok", 0, "error", "code",
                     ld_errcode_name(code), "message", msg);
}

/* "," and OBJ (stolen) serialised: a slot's result text. */
static struct chunk *
chunk_of_json(json_t *obj)
{
    char *s = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (s == NULL) {
        return NULL;
    }
    size_t n = strlen(s);
    struct chunk *c = chunk_new(n + 1);
    if (c != NULL) {
        c->data[0] = ',';
        memcpy(c->data + 1, s, n);
        c->len = n + 1;
    }
    free(s);
    return c;
}

/* ",{"ok":true,"hit":true,"value":"V"}", escaped once whatever the number
 * of slots naming the key; NULL when V is not valid UTF-8 (or no
 * memory). */
static struct chunk *
chunk_of_hit(const char *v, size_t len)
{
    static const char head[] = ",{\"ok\":true,\"hit\":true,\"value\":";
    struct chunk *c = chunk_new(sizeof(head) + ld_json_quote_max(len) + 1);
    if (c == NULL) {
        return NULL;
    }
    memcpy(c->data, head, sizeof(head) - 1);
    size_t q = ld_json_quote(c->data + sizeof(head) - 1, v, len);
    if (q == 0) {
        free(c);
        return NULL;
    }
    c->len = sizeof(head) - 1 + q;
    c->data[c->len++] = '}';
    return c;
}

static void
add_text(struct evbuffer *buf, struct chunk *c, bool first)
{
    const char *p = c->data + (first ? 1 : 0);
    size_t len = c->len - (first ? 1 : 0);
    if (len < REF_MIN_BYTES) {
        evbuffer_add(buf, p, len);
        return;
    }
    c->refs++;
    if (evbuffer_add_reference(buf, p, len, chunk_cleanup_cb, c) != 0) {
        c->refs--;
        evbuffer_add(buf, p, len);
    }
}

static void
mget_finish(struct cop *op)
{
    /* The same key again gets the same answer, but a lease belongs to
     * one caller only, and the first occurrence has it. (A duplicate is
     * never the first element, so its text keeps its comma.) */
    static const char dup_miss[] =
        ",{\"ok\":true,\"hit\":false,\"lease\":null}";
    cop_unlink(op);
    struct ld_req *req = op->req;
    char *idtext = NULL;
    if (req->id != NULL) {
        idtext = json_dumps(req->id, JSON_ENCODE_ANY | JSON_COMPACT);
    }
    /* Size first: a reply over the output limit is never built. */
    size_t total = 32 + (idtext != NULL ? strlen(idtext) : 0);
    bool bad = false;
    for (size_t i = 0; i < op->n; i++) {
        size_t j = op->dup_of[i] != SIZE_MAX ? op->dup_of[i] : i;
        const struct chunk *c = op->texts[j];
        if (c == NULL) {
            bad = true;
            break;
        }
        total += j != i && op->leased[j] ? sizeof(dup_miss) - 1 : c->len;
    }
    if (bad) {
        free(idtext);
        ld_reply_error(req, LD_E_INTERNAL, "out of memory");
        cop_free(op);
        return;
    }
    struct ld_session *s = req->sess;
    if (s != NULL && total > ld_session_output_limit()) {
        /* This reply alone passes limits.max_output_bytes (it could be
         * 1000 times a large value): it is never built; the client is
         * told why, and the session ends as the contract says. */
        log_warn("session closed: one reply over the output limit "
                 "session=%s op=cache.mget keys=%zu reply_bytes=%zu "
                 "limit=%zu", s->name, op->n, total,
                 ld_session_output_limit());
        free(idtext);
        ld_reply_error(req, LD_E_BUSY,
                       "the reply would take %zu bytes, over the output "
                       "limit (limits.max_output_bytes); the session is "
                       "closed", total);
        cop_free(op);
        ld_session_close(s, "reply over limits.max_output_bytes");
        return;
    }
    if (s != NULL && !ld_session_output_room(s, total)) {
        /* With what the client has not taken yet it would pass the
         * limit: the session is closing and its output is dropped. */
        free(idtext);
        ld_reply_error(req, LD_E_BUSY, "over the output limit");
        cop_free(op);
        return;
    }
    struct evbuffer *buf = evbuffer_new();
    if (buf == NULL) {
        ld_oom(0);
    }
    if (idtext != NULL) {
        evbuffer_add_printf(buf, "{\"id\":%s,", idtext);
        free(idtext);
    } else {
        evbuffer_add(buf, "{", 1);
    }
    static const char results[] = "\"ok\":true,\"results\":[";
    evbuffer_add(buf, results, sizeof(results) - 1);
    for (size_t i = 0; i < op->n; i++) {
        size_t j = op->dup_of[i] != SIZE_MAX ? op->dup_of[i] : i;
        if (j != i && op->leased[j]) {
            evbuffer_add(buf, dup_miss, sizeof(dup_miss) - 1);
        } else {
            add_text(buf, op->texts[j], i == 0);
        }
    }
    evbuffer_add(buf, "]}\n", 3);
    ld_reply_buffer(req, buf);
    evbuffer_free(buf);
    cop_free(op);
}

/* G is answered or gone: its place among the waiters is free. */
static void
getter_done(struct getter *g)
{
    LD_ASSERTF(g->on == NULL, "answered getter of slot %zu still queued",
               g->slot);
    g->state = G_DONE;
    if (g->holds_place) {
        LD_ASSERT(cache_mod.n_waiters > 0);
        g->holds_place = false;
        cache_mod.n_waiters--;
    }
}

/* Answer one getter: FIELDS (stolen) on success, else CODE and MSG. */
static void
getter_settle(struct getter *g, json_t *fields, int code, const char *msg)
{
    struct cop *op = g->op;
    LD_ASSERT(g->state == G_IDLE);
    getter_done(g);
    if (!op->mget) {
        cop_unlink(op);
        if (fields != NULL) {
            ld_reply_ok(op->req, fields);
        } else {
            ld_reply_error(op->req, code, "%s", msg);
        }
        cop_free(op);
        return;
    }
    if (fields != NULL) {
        /* Each result reads like a cache.get reply, "ok" first. */
        json_t *res = json_pack("{s:b}", "ok", 1);
        json_t *lease = json_object_get(fields, "lease");
        op->leased[g->slot] = lease != NULL && json_is_string(lease);
        json_object_update(res, fields);
        json_decref(fields);
        op->texts[g->slot] = chunk_of_json(res);
    } else {
        op->texts[g->slot] = chunk_of_json(error_object(code, msg));
    }
    if (--op->left == 0) {
        mget_finish(op);
    }
}

static void
settle_hit(struct getter *g, const char *v, size_t len)
{
    struct cop *op = g->op;
    if (!op->mget) {
        /* The common case, built straight into the reply line: a JSON
         * tree would check and escape a large value byte by byte. */
        struct ld_req *req = op->req;
        op->req = NULL;
        if (ld_reply_ok_hit(req, v, len) == LD_OK) {
            ld_stats.cache_hits++;
            getter_done(g);
            cop_unlink(op);
            cop_free(op);
            return;
        }
        op->req = req;    /* not UTF-8: answered below */
    } else {
        /* Escaped once here; the reply refers to it for every slot
         * naming this key. */
        struct chunk *c = chunk_of_hit(v, len);
        if (c != NULL) {
            ld_stats.cache_hits++;
            op->texts[g->slot] = c;
            getter_done(g);
            if (--op->left == 0) {
                mget_finish(op);
            }
            return;
        }
    }
    json_t *f = json_pack("{s:b,s:s%}", "hit", 1, "value", v, len);
    if (f == NULL) {
        getter_settle(g, NULL, LD_E_WRONG_TYPE,
                      "the cached value is not valid UTF-8; leased did not "
                      "write it");
        return;
    }
    ld_stats.cache_hits++;
    getter_settle(g, f, 0, NULL);
}

static void
settle_null(struct getter *g)
{
    ld_stats.cache_negative_hits++;
    getter_settle(g, json_pack("{s:b,s:n}", "hit", 1, "value"), 0, NULL);
}

static void
settle_miss(struct getter *g, const char *lease)
{
    ld_stats.cache_misses++;
    json_t *f = lease != NULL
                    ? json_pack("{s:b,s:s}", "hit", 0, "lease", lease)
                    : json_pack("{s:b,s:n}", "hit", 0, "lease");
    getter_settle(g, f, 0, NULL);
}

/* ---- keys, fetches and waiting --------------------------------------- */

static void fetch_cb(redisReply *reply, void *arg);
static void ckey_timer_cb(evutil_socket_t fd, short what, void *arg);

static struct ckey *
ckey_get(const char *key, size_t len)
{
    struct ckey *ck = ld_dict_get(cache_mod.keys, key, len);
    if (ck != NULL) {
        return ck;
    }
    ck = ld_xcalloc(1, sizeof(*ck));
    ck->key = ld_xstrndup(key, len);
    ck->names = make_names(key, len, &ck->entry_len, &ck->chan_len);
    ck->timer = evtimer_new(cache_mod.ctx->base, ckey_timer_cb, ck);
    if (ck->timer == NULL) {
        ld_oom(0);
    }
    ck->key_len = len;
    glist_init(&ck->waiters);
    ld_dict_set(cache_mod.keys, key, len, ck);
    return ck;
}

/* Forget a key nobody reads or waits for any more. */
static void
ckey_maybe_free(struct ckey *ck)
{
    if (ck->waiters.n > 0 || ck->nfetch > 0) {
        return;
    }
    LD_ASSERT(ck->fetch == NULL);
    if (ck->sub != NULL) {
        ld_pubsub_unsubscribe(ck->sub);
    }
    event_free(ck->timer);
    ld_dict_del(cache_mod.keys, ck->key, ck->key_len);
    free(ck->key);
    free(ck->names);
    free(ck);
}

static bool
attachable(const struct ckey *ck, bool want_lease)
{
    return ck->fetch != NULL && ck->fetch->gen == ck->gen &&
           (ck->fetch->grant || !want_lease);
}

static struct fetch *
fetch_start(struct ckey *ck, bool grant)
{
    struct fetch *f = ld_xcalloc(1, sizeof(*f));
    f->ck = ck;
    f->gen = ck->gen;
    f->grant = grant;
    glist_init(&f->getters);
    LIST_INSERT_HEAD(&cache_mod.fetches, f, link);
    ck->fetch = f;
    ck->nfetch++;

    /* Most reads are hits: a plain HMGET answers them in one cheap
     * command, with no script and no lease token. Only when it finds no
     * value does the script run, to decide about the lease atomically. */
    static const char *fields[] = {"HMGET", NULL, "v", "n"};
    const char *argv[4];
    size_t argvlen[4] = {5, ck->entry_len, 1, 1};
    memcpy(argv, fields, sizeof(argv));
    argv[1] = ck->names;
    f->probing = true;
    ld_redis_command(ck->names, ck->entry_len, 4, argv, argvlen, fetch_cb, f);
    return f;
}

static int
fetch_send_script(struct fetch *f)
{
    struct ckey *ck = f->ck;
    if (f->grant && ld_token_new(f->token) != LD_OK) {
        return LD_ERR;
    }
    char lease_ms[24];
    snprintf(lease_ms, sizeof(lease_ms), "%lld",
             cache_mod.ctx->cfg->cache.fill_lease_ms);
    const char *argv[] = {ck->names, f->token, lease_ms,
                          f->grant ? "1" : "0"};
    size_t argvlen[] = {ck->entry_len, strlen(f->token), strlen(lease_ms),
                        1};
    ld_redis_script(LD_SCRIPT_cache_get, ck->names, ck->entry_len, 1, 4,
                    argv, argvlen, fetch_cb, f);
    return LD_OK;
}

/* Put G on a fetch of its key: the one in flight when it is fresh enough,
 * else a new one. */
static void
getter_fetch(struct getter *g)
{
    struct ckey *ck = g->ck;
    struct fetch *f = attachable(ck, g->want_lease)
                          ? ck->fetch
                          : fetch_start(ck, g->want_lease);
    g->state = G_FETCH;
    g->fetch = f;
    struct getter *last = TAILQ_LAST(&f->getters.q, gq);
    if (last != NULL && last->seq > g->seq) {
        struct glist one;
        glist_init(&one);
        glist_push(&one, g);
        glist_merge(&f->getters, &one);
    } else {
        glist_push(&f->getters, g);
    }
}

/* The waiters need a fresh look at the entry: one fetch for all. */
static void
ckey_refresh(struct ckey *ck)
{
    if (ck->waiters.n == 0) {
        return;
    }
    struct fetch *f = attachable(ck, true) ? ck->fetch : fetch_start(ck, true);
    struct getter *g;
    TAILQ_FOREACH(g, &ck->waiters.q, link) {
        LD_ASSERT(g->state == G_WAIT);
        g->state = G_FETCH;
        g->fetch = f;
    }
    glist_merge(&f->getters, &ck->waiters);
    event_del(ck->timer);
}

static void
ckey_wake(struct ckey *ck)
{
    ck->gen++;
    ckey_refresh(ck);
}

static void
ckey_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    ckey_wake(arg);
}

static void
ckey_arm(struct ckey *ck)
{
    if (ck->waiters.n == 0) {
        event_del(ck->timer);
        return;
    }
    uint64_t at = ck->lease_end_us;
    struct getter *g;
    TAILQ_FOREACH(g, &ck->waiters.q, link) {
        if (at == 0 || g->deadline_us < at) {
            at = g->deadline_us;
        }
    }
    uint64_t now = ld_now_us();
    set_timer(ck->timer, at > now ? at - now : 0);
}

static void
sub_cb(enum ld_pubsub_event ev, const char *msg, size_t len, void *arg)
{
    LD_UNUSED(msg);
    LD_UNUSED(len);
    struct ckey *ck = arg;
    /* SUBSCRIBED as well as MESSAGE: a fill may have landed between the
     * fetch that said "held" and the moment we started listening. LOST
     * needs nothing, SUBSCRIBED follows it. */
    if (ev == LD_PUBSUB_MESSAGE || ev == LD_PUBSUB_SUBSCRIBED) {
        ckey_wake(ck);
    }
}

/* A lease nobody can use any more (its getter went away meanwhile): give
 * it back so that others need not wait for it to run out. */
static void
ignore_cb(redisReply *reply, void *arg)
{
    LD_UNUSED(reply);
    LD_UNUSED(arg);
}

static void
release_unused(const struct ckey *ck, const char *token)
{
    const char *argv[] = {ck->names, token, ck->names};
    size_t argvlen[] = {ck->entry_len, strlen(token), ck->chan_len};
    ld_redis_script(LD_SCRIPT_cache_release, ck->names, ck->entry_len, 1, 3,
                    argv, argvlen, ignore_cb, NULL);
}

/* What a read found. R_HIT to R_WRONG are also the answers of the
 * cache_get script, by the names in get_replies (its header comment lists
 * them); R_DOWN and R_ERROR are Redis' silence and anything else. */
enum fres { R_HIT, R_NULL, R_HELD, R_GRANTED, R_MISS, R_WRONG, R_DOWN,
            R_ERROR };

static const struct {
    const char *name;
    enum fres res;
} get_replies[] = {
    {"hit", R_HIT},         /* {"hit", value} */
    {"null", R_NULL},       /* a cached "not found" */
    {"held", R_HELD},       /* {"held", pttl}: another caller's lease */
    {"granted", R_GRANTED}, /* the lease token sent is now the lease */
    {"miss", R_MISS},       /* nothing there, no lease asked for */
    {"wrong_type", R_WRONG},
};

static enum fres
parse_fetch(const redisReply *r, const redisReply **value,
            long long *pttl)
{
    if (r == NULL) {
        return R_DOWN;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        return R_ERROR;
    }
    enum fres res = R_ERROR;
    for (size_t i = 0; i < LD_ARRAY_LEN(get_replies); i++) {
        if (strcmp(r->element[0]->str, get_replies[i].name) == 0) {
            res = get_replies[i].res;
            break;
        }
    }
    switch (res) {
    case R_HIT:
        if (r->elements < 2 || r->element[1]->type != REDIS_REPLY_STRING) {
            return R_ERROR;
        }
        *value = r->element[1];
        break;
    case R_HELD:
        if (r->elements < 2 || r->element[1]->type != REDIS_REPLY_INTEGER) {
            return R_ERROR;
        }
        *pttl = r->element[1]->integer;
        break;
    default:
        break;
    }
    return res;
}

static void
fetch_unlink(struct fetch *f)
{
    LIST_REMOVE(f, link);
}

/* The HMGET probe decides hits, cached nulls, a key of another type and
 * an unreachable Redis; R_MISS means "ask the script". */
static enum fres
parse_probe(const redisReply *r, const redisReply **value)
{
    if (r == NULL) {
        return R_DOWN;
    }
    if (ld_reply_is_error(r, "WRONGTYPE")) {
        return R_WRONG;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        return R_ERROR;
    }
    if (r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type != REDIS_REPLY_STRING) {
        *value = r->element[0];
        return R_HIT;
    }
    if (r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[0]->type != REDIS_REPLY_STRING) {
        /* Anything but our "1" (or a null beside a value) is not ours:
         * the script says so. */
        if (r->element[1]->len == 1 && r->element[1]->str[0] == '1') {
            return R_NULL;
        }
    }
    return R_MISS;
}

static void
fetch_cb(redisReply *reply, void *arg)
{
    struct fetch *f = arg;
    struct ckey *ck = f->ck;
    const redisReply *value = NULL;
    long long pttl = -1;
    enum fres res;

    if (ck == NULL) {
        free(f); /* orphaned by ld_cache_free; its getters were answered */
        return;
    }
    if (f->probing) {
        f->probing = false;
        res = parse_probe(reply, &value);
        if (res == R_MISS) {
            if (fetch_send_script(f) == LD_OK) {
                return;       /* still in flight, getters still attached */
            }
            res = R_ERROR;
        }
    } else {
        res = parse_fetch(reply, &value, &pttl);
    }
    fetch_unlink(f);
    LD_ASSERT(ck->nfetch > 0);
    ck->nfetch--;
    if (ck->fetch == f) {
        ck->fetch = NULL;
    }

    uint64_t now = ld_now_us();
    char errmsg[160];

    if (res == R_ERROR) {
        snprintf(errmsg, sizeof(errmsg), "unexpected reply to cache.get: %s",
                 reply != NULL && reply->type == REDIS_REPLY_ERROR
                     ? reply->str
                     : "bad shape");
        log_error("cache script failed op=cache.get key=\"%.*s\" "
                  "error=\"%s\"", (int)(ck->key_len > 200 ? 200
                                                        : ck->key_len),
                  ck->key, errmsg);
    }
    if (res == R_WRONG) {
        snprintf(errmsg, sizeof(errmsg), "the Redis key of entry '%.*s' "
                 "holds data leased did not write; nothing was changed",
                 (int)(ck->key_len > 60 ? 60 : ck->key_len), ck->key);
    }
    if (res == R_HELD) {
        ck->lease_end_us = pttl >= 0
                               ? now + (uint64_t)pttl * 1000 + LEASE_SLACK_US
                               : 0;
    } else if (res == R_GRANTED) {
        ck->lease_end_us =
            now + (uint64_t)cache_mod.ctx->cfg->cache.fill_lease_ms * 1000 +
            LEASE_SLACK_US;
    }

    bool given = false;
    struct glist keep;
    glist_init(&keep);
    struct getter *g;
    while ((g = glist_pop(&f->getters)) != NULL) {
        g->fetch = NULL;
        g->state = G_IDLE;
        switch (res) {
        case R_HIT:
            settle_hit(g, value->str, value->len);
            continue;
        case R_NULL:
            settle_null(g);
            continue;
        case R_WRONG:
            getter_settle(g, NULL, LD_E_WRONG_TYPE, errmsg);
            continue;
        case R_DOWN:
            getter_settle(g, NULL, LD_E_REDIS_UNAVAILABLE,
                          "redis did not answer in time");
            continue;
        case R_ERROR:
            getter_settle(g, NULL, LD_E_INTERNAL, errmsg);
            continue;
        case R_MISS:
            settle_miss(g, NULL);
            continue;
        case R_GRANTED:
            if (g->want_lease && !given) {
                given = true;
                ld_stats.cache_leases_granted++;
                settle_miss(g, f->token);
                continue;
            }
            break;
        case R_HELD:
            break;
        }
        /* Somebody else loads the value. */
        if (!g->want_lease || now >= g->deadline_us) {
            settle_miss(g, NULL);
        } else if (!g->holds_place &&
                   cache_mod.n_waiters >=
                       cache_mod.ctx->cfg->limits.max_waiters) {
            /* Counted one by one as they are parked: one fetch may
             * bring any number of new waiters at once. */
            getter_settle(g, NULL, LD_E_BUSY,
                          "too many waiters (limits.max_waiters)");
        } else {
            if (!g->waited) {
                g->waited = true;
                ld_stats.cache_waits++;
            }
            if (!g->holds_place) {
                g->holds_place = true;
                cache_mod.n_waiters++;
            }
            g->state = G_WAIT;
            glist_push(&keep, g);
        }
    }
    if (res == R_GRANTED && !given) {
        release_unused(ck, f->token);
    }
    uint64_t sent_gen = f->gen;
    free(f);

    if (keep.n > 0) {
        glist_merge(&ck->waiters, &keep);
        if (ck->sub == NULL) {
            ck->sub =
                ld_pubsub_subscribe(ck->names, ck->chan_len, sub_cb, ck);
        }
        /* Something happened to the entry while this answer was on its
         * way (a message, a local write): the "held" it says may already
         * be stale, and the wake-up that said so went to others. */
        if (ck->gen != sent_gen) {
            ckey_refresh(ck);
        }
    }
    ckey_arm(ck);
    ckey_maybe_free(ck);
}

/* ---- cache.get / cache.mget ------------------------------------------ */

static struct cop *
cop_new(struct ld_req *req, size_t n, bool mget)
{
    /* N is at most MGET_MAX_KEYS: small. */
    struct cop *op = ld_xcalloc(1, sizeof(*op));
    op->req = req;
    op->mget = mget;
    op->n = n;
    op->left = n;
    op->g = ld_xcalloc(n, sizeof(*op->g));
    if (mget) {
        op->texts = ld_xcalloc(n, sizeof(*op->texts));
        op->leased = ld_xcalloc(n, sizeof(*op->leased));
        op->dup_of = ld_xmalloc(n * sizeof(*op->dup_of));
    }
    return op;
}

/* Set up slot I of OP for KEY and send it on its way. */
static void
getter_begin(struct cop *op, size_t i, const char *key, size_t len,
             bool want_lease, long long wait_ms)
{
    struct getter *g = &op->g[i];
    g->op = op;
    g->slot = i;
    g->want_lease = want_lease;
    g->seq = ++cache_mod.next_seq;
    g->deadline_us = ld_now_us() + (uint64_t)wait_ms * 1000;
    g->ck = ckey_get(key, len);
    getter_fetch(g);
}

static int
get_params(struct ld_req *req, long long *wait_ms, bool *lease)
{
    *wait_ms = cache_mod.ctx->cfg->cache.wait_ms;
    *lease = true;
    if (ld_req_int(req, "wait_ms", false, 0, LD_WAIT_MS_MAX, wait_ms, NULL) !=
            LD_OK ||
        ld_req_bool(req, "lease", lease) != LD_OK) {
        return LD_ERR;
    }
    return LD_OK;
}

static bool
drop_if_closed(struct ld_req *req)
{
    /* A request of a session that has closed: its close hook has run,
     * so nothing may be parked for it. */
    if (!ld_req_session_open(req)) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the session has ended");
        return true;
    }
    return false;
}

static void
op_get(struct ld_req *req)
{
    const char *key;
    size_t len;
    long long wait_ms;
    bool lease;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        get_params(req, &wait_ms, &lease) != LD_OK || drop_if_closed(req)) {
        return;
    }
    struct cop *op = cop_new(req, 1, false);
    cop_link(op);
    getter_begin(op, 0, key, len, lease, wait_ms);
}

static void
op_mget(struct ld_req *req)
{
    json_t *keys;
    long long wait_ms;
    bool lease;

    if (ld_req_keys(req, "keys", MGET_MAX_KEYS, &keys) != LD_OK ||
        get_params(req, &wait_ms, &lease) != LD_OK || drop_if_closed(req)) {
        return;
    }
    size_t n = json_array_size(keys);
    struct cop *op = cop_new(req, n, true);
    struct ld_dict *seen = ld_dict_new();
    if (seen == NULL) {
        cop_free(op);
        ld_reply_error(req, LD_E_INTERNAL, "out of memory");
        return;
    }
    /* Count the duplicates out first: the op may complete (and be freed)
     * inside the loop below once every real slot has an answer. */
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, i);
        const char *s = json_string_value(k);
        size_t len = json_string_length(k);
        void *prev = ld_dict_get(seen, s, len);
        if (prev != NULL) {
            op->dup_of[i] = (size_t)(uintptr_t)prev - 1;
            op->left--;
        } else {
            op->dup_of[i] = SIZE_MAX;
            ld_dict_set(seen, s, len, (void *)(uintptr_t)(i + 1));
        }
    }
    ld_dict_free(seen);
    cop_link(op);
    /* The request body (and KEYS) stays alive as long as REQ does, and
     * REQ is freed with the op: stop touching either once the last slot
     * has settled. Callbacks are never synchronous, so that can only
     * happen here for slots that fail at once. */
    size_t real = op->left;
    for (size_t i = 0; i < n && real > 0; i++) {
        if (op->dup_of[i] != SIZE_MAX) {
            continue;
        }
        json_t *k = json_array_get(keys, i);
        real--;
        getter_begin(op, i, json_string_value(k), json_string_length(k),
                     lease, wait_ms);
    }
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
static long long
entry_ttl(bool is_null, bool ttl_given, long long ttl_ms)
{
    const struct ld_config *cfg = cache_mod.ctx->cfg;
    long long base = is_null ? cfg->cache.null_ttl_ms
                             : (ttl_given ? ttl_ms : cfg->cache.ttl_ms);
    return ld_jitter_ttl(base, cfg->cache.ttl_jitter);
}

/* What the write scripts (cache_fill, cache_release, cache_set) return,
 * named once: each script's header comment uses the same names. */
enum cache_write_rc {
    CACHE_WRITE_WRONG_TYPE = -1, /* data leased did not write, untouched */
    CACHE_WRITE_REFUSED = 0,     /* the lease given is not the current one */
    CACHE_WRITE_DONE = 1,        /* stored, released, set */
};

/* Common checks of a write script's reply; returns true when the caller
 * should go on with REPLY->integer. */
static bool
write_reply_ok(struct ld_req *req, const redisReply *reply, const char *op)
{
    const char *key = json_string_value(json_object_get(req->body, "key"));
    int klen = (int)json_string_length(json_object_get(req->body, "key"));
    if (reply == NULL) {
        ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                       "redis did not answer in time");
        return false;
    }
    if (reply->type != REDIS_REPLY_INTEGER) {
        const char *why = reply->type == REDIS_REPLY_ERROR ? reply->str
                                                            : "bad shape";
        log_error("cache script failed op=%s key=\"%.*s\" error=\"%s\"",
                  op, klen > 200 ? 200 : klen, key != NULL ? key : "", why);
        ld_reply_error(req, LD_E_INTERNAL, "unexpected reply to %s: %s", op,
                       why);
        return false;
    }
    if (reply->integer == CACHE_WRITE_WRONG_TYPE) {
        ld_reply_error(req, LD_E_WRONG_TYPE,
                       "the Redis key of entry '%.*s' holds data leased did "
                       "not write; nothing was changed",
                       klen > 200 ? 200 : klen, key != NULL ? key : "");
        return false;
    }
    return true;
}

static void
fill_cb(redisReply *reply, void *arg)
{
    struct ld_req *req = arg;
    if (!write_reply_ok(req, reply, "cache.fill")) {
        return;
    }
    bool stored = reply->integer == CACHE_WRITE_DONE;
    if (stored) {
        ld_stats.cache_fills_stored++;
    } else {
        ld_stats.cache_fills_rejected++;
    }
    ld_reply_ok(req, json_pack("{s:b}", "stored", stored));
}

static void
release_cb(redisReply *reply, void *arg)
{
    struct ld_req *req = arg;
    if (!write_reply_ok(req, reply, "cache.release")) {
        return;
    }
    ld_reply_ok(req, json_pack("{s:b}", "released",
                               reply->integer == CACHE_WRITE_DONE));
}

static void
set_cb(redisReply *reply, void *arg)
{
    struct ld_req *req = arg;
    if (!write_reply_ok(req, reply, "cache.set")) {
        return;
    }
    ld_reply_ok(req, NULL);
}

/* Run a write script on KEY's entry: ARGV[0] is replaced by the entry key
 * and every NULL element of ARGV by the channel. */
static void
run_write(struct ld_req *req, enum ld_script_id script, const char *key,
          size_t len, int argc, const char **argv, size_t *argvlen,
          ld_redis_cb *cb)
{
    size_t elen, clen;
    char *names = make_names(key, len, &elen, &clen);
    argv[0] = names;
    argvlen[0] = elen;
    for (int i = 1; i < argc; i++) {
        if (argv[i] == NULL) {
            argv[i] = names;
            argvlen[i] = clen;
        }
    }
    key_touched(key, len);
    ld_redis_script(script, names, elen, 1, argc, argv, argvlen, cb, req);
    free(names);
}

static void
op_fill(struct ld_req *req)
{
    const char *key, *lease, *value;
    size_t len, lease_len, value_len;
    bool is_null, ttl_given;
    long long ttl_ms = 0;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        ld_req_str(req, "lease", true, &lease, &lease_len, NULL) != LD_OK ||
        req_value(req, &value, &value_len, &is_null) != LD_OK ||
        ttl_param(req, &ttl_ms, &ttl_given) != LD_OK) {
        return;
    }
    char ttl[24];
    snprintf(ttl, sizeof(ttl), "%lld", entry_ttl(is_null, ttl_given, ttl_ms));
    const char *argv[] = {NULL, lease, is_null ? "n" : "v", value, ttl, NULL};
    size_t argvlen[] = {0, lease_len, 1, value_len, strlen(ttl), 0};
    run_write(req, LD_SCRIPT_cache_fill, key, len, 6, argv, argvlen, fill_cb);
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
    long long ttl_ms = 0;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        req_value(req, &value, &value_len, &is_null) != LD_OK ||
        ttl_param(req, &ttl_ms, &ttl_given) != LD_OK) {
        return;
    }
    char ttl[24];
    snprintf(ttl, sizeof(ttl), "%lld", entry_ttl(is_null, ttl_given, ttl_ms));
    const char *argv[] = {NULL, is_null ? "n" : "v", value, ttl, NULL};
    size_t argvlen[] = {0, 1, value_len, strlen(ttl), 0};
    run_write(req, LD_SCRIPT_cache_set, key, len, 5, argv, argvlen, set_cb);
}

/* ---- cache.invalidate and the deletes it promises -------------------- */

static void del_timer_cb(evutil_socket_t fd, short what, void *arg);
static void del_cb(redisReply *reply, void *arg);

static struct del *
del_new(const char *key, size_t len, int64_t due_ms, bool second)
{
    struct del *d = ld_xcalloc(1, sizeof(*d) + len);
    d->ev = evtimer_new(cache_mod.ctx->base, del_timer_cb, d);
    if (d->ev == NULL) {
        ld_oom(0);
    }
    d->due_ms = due_ms;
    d->second = second;
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
del_free(struct del *d)
{
    del_unlink(d);
    if (d->ev != NULL) {
        event_free(d->ev);
    }
    free(d);
}

/* Run D at its due time (at once when that has passed). */
static void
del_schedule(struct del *d)
{
    int64_t wait = d->due_ms - wall_ms();
    set_timer(d->ev, wait > 0 ? (uint64_t)wait * 1000 : 0);
}

static void inv_first_result(struct inv *inv, bool ok, long long n);

static void
del_failed(struct del *d)
{
    if (d->inv != NULL) {
        struct inv *inv = d->inv;
        d->inv = NULL;
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
    set_timer(d->ev, us);
}

static void
del_run(struct del *d)
{
    if (d->running) {
        return;
    }
    if (!ld_redis_ready()) {
        del_failed(d);
        return;
    }
    size_t elen, clen;
    char *names = make_names(d->key, d->key_len, &elen, &clen);
    d->running = true;
    const char *argv[] = {names, names};
    size_t argvlen[] = {elen, clen};
    ld_redis_script(LD_SCRIPT_cache_del, names, elen, 1, 2, argv, argvlen,
                    del_cb, d);
    free(names);
}

static void
del_cb(redisReply *reply, void *arg)
{
    struct del *d = arg;
    LD_ASSERT(d->running);
    d->running = false;
    if (d->orphan) {
        free(d); /* ld_cache_free ran; the journal keeps it for next time */
        return;
    }
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
        inv_first_result(inv, true, reply->integer);
    }
    if (d->then != NULL) {
        struct del *d2 = d->then;
        LD_ASSERT(d2->after == d && d2->second);
        d->then = NULL;
        d2->after = NULL;
        d2->due_ms = wall_ms() + d2->delay_ms;
        del_schedule(d2);
    }
    if (d->id != 0) {
        ld_journal_done(cache_mod.journal, d->id);
        update_journal_stats();
    }
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

/* Redis is back: every delete waiting out a backoff goes now. */
static void
redis_state_cb(bool up, void *arg)
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

static void
inv_reply(struct inv *inv)
{
    if (inv->journal_failed) {
        ld_reply_error(inv->req, LD_E_INTERNAL,
                       "the invalidation could not be made durable in the "
                       "journal; the deletes run but would not survive a "
                       "crash");
    } else {
        json_t *f = json_pack("{s:I,s:I}", "deleted",
                              (json_int_t)inv->deleted, "pending",
                              (json_int_t)inv->pending);
        if (inv->queued) {
            json_object_set_new(f, "queued", json_true());
        }
        ld_reply_ok(inv->req, f);
    }
    free(inv->firsts);
    free(inv);
}

static void
inv_first_result(struct inv *inv, bool ok, long long n)
{
    LD_ASSERT(inv->left > 0);
    if (ok) {
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

/* One fdatasync for every invalidation of this loop iteration. */
static void
sync_run(void *arg)
{
    LD_UNUSED(arg);
    STAILQ_HEAD(, inv) batch = STAILQ_HEAD_INITIALIZER(batch);
    STAILQ_CONCAT(&batch, &cache_mod.sync_q);
    int rc = ld_journal_sync(cache_mod.journal);
    struct inv *inv;
    while ((inv = STAILQ_FIRST(&batch)) != NULL) {
        STAILQ_REMOVE_HEAD(&batch, link);
        if (rc != LD_OK) {
            inv->journal_failed = true;
        }
        inv_start(inv);
    }
}

static void
op_invalidate(struct ld_req *req)
{
    json_t *jkey = json_object_get(req->body, "key");
    json_t *jkeys = json_object_get(req->body, "keys");
    json_t *keys = NULL;
    const char *key = NULL;
    size_t len = 0;
    long long delay_ms = cache_mod.ctx->cfg->cache.double_delete_ms;

    if (jkey != NULL && !json_is_null(jkey) && jkeys != NULL &&
        !json_is_null(jkeys)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'key' and field 'keys' exclude each other");
        return;
    }
    if (jkeys != NULL && !json_is_null(jkeys)) {
        if (ld_req_keys(req, "keys", INVALIDATE_MAX_KEYS, &keys) != LD_OK) {
            return;
        }
    } else if (ld_req_key(req, "key", &key, &len) != LD_OK) {
        return;
    }
    if (ld_req_int(req, "delay_ms", false, 0, LD_DELAY_MS_MAX, &delay_ms,
                   NULL) != LD_OK) {
        return;
    }
    size_t n = keys != NULL ? json_array_size(keys) : 1;
    struct inv *inv = ld_xcalloc(1, sizeof(*inv));
    inv->firsts = ld_xcalloc(n, sizeof(*inv->firsts));
    inv->req = req;
    inv->n = n;
    inv->left = n;
    int64_t now = wall_ms();
    for (size_t i = 0; i < n; i++) {
        if (keys != NULL) {
            key = json_string_value(json_array_get(keys, i));
            len = json_string_length(json_array_get(keys, i));
        }
        ld_stats.cache_invalidations++;
        key_touched(key, len);
        struct del *d1 = del_new(key, len, now, false);
        if (ld_journal_add(cache_mod.journal, now, key, len, &d1->id) !=
            LD_OK) {
            d1->id = 0;
            inv->journal_failed = true;
        }
        d1->inv = inv;
        inv->firsts[i] = d1;
        if (delay_ms > 0) {
            struct del *d2 = del_new(key, len, now + delay_ms, true);
            /* Recorded as waiting for the first, so that a replay keeps
             * the two apart too. Without the first's record there is
             * nothing to wait for in the file: a plain add then (the
             * request is answered with an error anyway). */
            int rc = d1->id != 0
                         ? ld_journal_add_after(cache_mod.journal, d1->id,
                                                delay_ms, key, len, &d2->id)
                         : ld_journal_add(cache_mod.journal, now + delay_ms,
                                          key, len, &d2->id);
            if (rc != LD_OK) {
                d2->id = 0;
                inv->journal_failed = true;
            }
            inv->pending++;
            d2->delay_ms = delay_ms;
            d2->after = d1;
            d1->then = d2;
        }
    }
    update_journal_stats();
    if (ld_journal_mode(cache_mod.journal) == LD_FSYNC_ALWAYS) {
        STAILQ_INSERT_TAIL(&cache_mod.sync_q, inv, link);
        ld_defer_kick(&cache_mod.sync_defer);
    } else {
        inv_start(inv);
    }
}

/* ---- journal replay and the periodic duty ---------------------------- */

struct replay_state {
    size_t count;
    struct ld_dict *by_id;    /* id -> struct del, while replaying */
};

static void
replay_one(const struct ld_journal_entry *e, void *arg)
{
    struct replay_state *st = arg;
    struct del *d = del_new(e->key, e->key_len, e->due_ms, true);
    d->id = e->id;
    st->count++;
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
        d->due_ms = wall_ms() + d->delay_ms;
        del_schedule(d);
    }
}

static void
tick_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    /* The whole of fsync "everysec"; under "always" it makes the done
     * records durable too, which spares a restart redundant deletes. */
    ld_journal_sync(cache_mod.journal);
    if (ld_journal_should_compact(cache_mod.journal)) {
        ld_journal_compact(cache_mod.journal);
    }
    update_journal_stats();
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
        ckey_arm(ck);
        ckey_maybe_free(ck);
        break;
    default:
        break;
    }
    getter_done(g);
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
                    op->texts[i] = chunk_of_json(json_pack(
                        "{s:b,s:b,s:n}", "ok", 1, "hit", 0, "lease"));
                }
            }
            mget_finish(op);
        } else {
            cop_unlink(op);
            ld_reply_ok(op->req, json_pack("{s:b,s:n}", "hit", 0, "lease"));
            cop_free(op);
        }
    }
    free(cs);
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
    cache_mod.keys = ld_dict_new();
    if (cache_mod.keys == NULL) {
        return LD_ERR;
    }
    if (ld_journal_open(&cache_mod.journal, cfg->journal.path,
                        cfg->journal.fsync) != LD_OK) {
        log_error("cannot open the invalidation journal path=%s",
                  cfg->journal.path);
        ld_dict_free(cache_mod.keys);
        cache_mod.keys = NULL;
        return LD_ERR;
    }
    struct replay_state st = {0, ld_dict_new()};
    ld_journal_each(cache_mod.journal, replay_one, &st);
    ld_dict_free(st.by_id);
    size_t replayed = st.count;
    log_info("journal opened path=%s fsync=%s bytes=%llu pending=%zu",
             cfg->journal.path,
             cfg->journal.fsync == LD_FSYNC_ALWAYS ? "always" : "everysec",
             (unsigned long long)ld_journal_bytes(cache_mod.journal), replayed);
    update_journal_stats();

    cache_mod.tick_ev = event_new(ctx->base, -1, EV_PERSIST, tick_cb, NULL);
    if (cache_mod.tick_ev == NULL) {
        ld_oom(0);
    }
    ld_defer_init(&cache_mod.sync_defer, ctx->base, sync_run, NULL);
    struct timeval tv = {TICK_MS / 1000, (TICK_MS % 1000) * 1000};
    event_add(cache_mod.tick_ev, &tv);

    if (!cache_mod.hooks_registered) {
        ld_session_on_close(on_session_close);
        ld_redis_on_state(redis_state_cb, NULL);
        cache_mod.hooks_registered = true;
    }
    cache_mod.inited = true;
    if (ld_dispatch_register("cache.get", op_get) != LD_OK ||
        ld_dispatch_register("cache.mget", op_mget) != LD_OK ||
        ld_dispatch_register("cache.fill", op_fill) != LD_OK ||
        ld_dispatch_register("cache.release", op_release) != LD_OK ||
        ld_dispatch_register("cache.set", op_set) != LD_OK ||
        ld_dispatch_register("cache.invalidate", op_invalidate) != LD_OK) {
        return LD_ERR;
    }
    return LD_OK;
}

void
ld_cache_shutdown(void)
{
    if (cache_mod.journal != NULL) {
        ld_journal_sync(cache_mod.journal);
    }
}

void
ld_cache_free(void)
{
    if (!cache_mod.inited) {
        return;
    }
    cache_mod.inited = false;

    /* Fetches still in flight: answer their getters now and leave the
     * structs to their callbacks, which ld_redis_free may still run. */
    struct fetch *f;
    LIST_FOREACH(f, &cache_mod.fetches, link) {
        struct getter *g;
        while ((g = glist_pop(&f->getters)) != NULL) {
            g->state = G_IDLE;
            getter_settle(g, NULL, LD_E_SHUTTING_DOWN,
                          "the daemon is stopping");
        }
        f->ck = NULL;
    }
    LIST_INIT(&cache_mod.fetches);

    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, cache_mod.keys);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct ckey *ck = v;
        struct getter *g;
        while ((g = glist_pop(&ck->waiters)) != NULL) {
            g->state = G_IDLE;
            getter_settle(g, NULL, LD_E_SHUTTING_DOWN,
                          "the daemon is stopping");
        }
        if (ck->sub != NULL) {
            ld_pubsub_unsubscribe(ck->sub);
        }
        event_free(ck->timer);
        free(ck->key);
        free(ck->names);
        free(ck);
    }
    ld_dict_free(cache_mod.keys);
    cache_mod.keys = NULL;
    cache_mod.n_waiters = 0;

    /* Deletes stay in the journal for the next start. */
    STAILQ_INIT(&cache_mod.sync_q);
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
                free(inv->firsts);
                free(inv);
            }
        }
        event_free(d->ev);
        d->ev = NULL;
        if (d->running) {
            d->orphan = true;
        } else {
            free(d);
        }
    }
    LIST_INIT(&cache_mod.dels);

    if (cache_mod.tick_ev != NULL) {
        event_free(cache_mod.tick_ev);
    }
    ld_defer_free(&cache_mod.sync_defer);
    cache_mod.tick_ev = NULL;
    ld_journal_close(cache_mod.journal);
    cache_mod.journal = NULL;
    ld_stats.journal_bytes = 0;
}
