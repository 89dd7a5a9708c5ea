#ifndef LD_CACHE_INT_H
#define LD_CACHE_INT_H

/* The cache module's own types and the calls between its files; for
 * src/cache/ld_cache*.c only. ld_cache.c: the ops that write and the module
 * itself; ld_cache_get.c: keys, fetches, waiting and the single flight of
 * cache.get and cache.mget; ld_cache_reply.c: answering getters and the
 * mget reply; ld_cache_inval.c: cache.invalidate, the deletes it promises
 * and the journal's replay. */

#include "ld_common.h"
#include "ld_assert.h"
#include "ld_defer.h"
#include "ld_redis.h"
#include "ld_util.h"

#include <sys/queue.h>

#include <event2/util.h>
#include <jansson.h>

struct event;
struct ld_ctx;
struct ld_dict;
struct ld_fsync;
struct ld_journal;
struct ld_journal_entry;
struct ld_near_read;
struct ld_pubsub_sub;
struct ld_req;

struct ckey;
struct fetch;
struct cop;

enum gstate { G_IDLE, G_FETCH, G_WAIT, G_DONE };

/* One key of a cache.get or cache.mget on its way to an answer. */
struct getter {
    struct cop *op;
    size_t slot;
    struct ckey *ck;
    bool want_lease;
    bool waited;          /* counted in cache_waits */
    bool holds_place;     /* one of cache_mod.n_waiters, until it is
                               * answered */
    uint64_t deadline_us; /* end of wait_ms, monotonic */
    uint64_t seq;         /* arrival order: waiters are served FIFO */
    enum gstate state;
    struct fetch *fetch; /* while G_FETCH */
    struct glist *on;    /* the list it is on, if any */
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
    size_t left;          /* slots not answered yet */
    struct chunk **texts; /* mget: each distinct slot's result */
    bool *leased;         /* mget: that result carries a lease */
    /* mget: for a hit that carries a lease (stale, early refresh), the
     * same hit without it, for the slots repeating the key; NULL until
     * one is needed. */
    struct chunk **dup_texts;
    size_t *dup_of;       /* mget: earlier slot with the same key */
    struct getter *g;     /* n getters (dups unused) */
    LIST_ENTRY(cop) link; /* its session's list */
    struct csess *cs;
    struct getter g1; /* G of a cache.get: no allocation of its own */
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
    struct ckey *ck; /* NULL once orphaned by ld_cache_free */
    struct glist getters;
    uint64_t gen; /* the key's generation when it was sent */
    bool grant;
    /* A lease was wanted but not asked for: a first delete was owed. */
    bool withheld;
    bool probing; /* the probe is out, not yet the script */
    char token[LD_TOKEN_LEN + 1];
    struct ld_near_read *near; /* the probe may be kept near */
    LIST_ENTRY(fetch) link;    /* every fetch in flight */
};

/* KEY and NAMES live in the same allocation, after the struct: a key is
 * made and dropped for most reads. */
struct ckey {
    char *key;
    size_t key_len;
    char *names; /* entry key followed by ":fill" */
    size_t entry_len, chan_len;
    struct fetch *fetch; /* newest fetch in flight, or NULL */
    unsigned nfetch;     /* fetches in flight for this key */
    uint64_t gen;
    struct glist waiters;
    struct ld_pubsub_sub *sub;
    struct event *timer;   /* lease end or a waiter's deadline */
    uint64_t lease_end_us; /* 0: unknown, or no expiry */
};

/* One cache.invalidate request awaiting its first deletes. */
struct inv {
    struct ld_req *req;
    struct del **firsts;
    size_t n;
    size_t left;
    long long deleted;
    long long stale; /* entries marked stale instead of deleted */
    long long pending;
    bool stale_mode; /* the reply says "stale" */
    bool queued;
    bool journal_failed;
    bool *queued_at;        /* "keys": which ones were only queued */
    STAILQ_ENTRY(inv) link; /* the sync queue */
};
STAILQ_HEAD(inv_q, inv);

/* One promised delete: in the journal (id != 0) until done. */
struct del {
    uint64_t id;
    int64_t due_ms;   /* wall clock */
    struct inv *inv;  /* the request waiting for it, if any */
    struct event *ev; /* due time or retry backoff */
    int backoff_ms;
    bool running;  /* its script is in flight */
    bool retrying; /* failed before; the timer is a backoff */
    bool orphan;   /* ld_cache_free ran while it was running */
    bool second;   /* the delayed one */
    bool stale;    /* marks the entry stale instead (cache_stale.lua) */
    bool owed;     /* a first delete, counted in cache_mod.owed */
    /* A second delete waits for its first: it is due delay_ms after the
     * first one has been carried out, not after it was promised, so the
     * two never run together when both are late (Redis was down, or the
     * daemon restarted). */
    struct del *then;  /* first: the second delete waiting for it */
    struct del *after; /* second: the first one, while it waits */
    int64_t delay_ms;
    /* Its member in the due set (ld_cache_due.c): being handed over, or
     * taken over from a daemon that stopped; removed once done. */
    char *member;
    size_t member_len;
    LIST_ENTRY(del) link; /* every delete owed, until done */
    size_t key_len;
    char key[];
};

struct replay_state {
    size_t count;
    struct ld_dict *by_id; /* id -> struct del, while replaying */
};

struct cache_mod_state {
    const struct ld_ctx *ctx;
    bool inited;
    bool hooks_registered;
    struct ld_journal *journal;
    struct ld_dict *keys; /* user key -> struct ckey */
    /* User key -> how many first deletes of it are owed (uintptr_t):
     * acknowledged or replayed, not yet carried out. */
    struct ld_dict *owed;
    LIST_HEAD(, fetch) fetches;
    LIST_HEAD(, del) dels;
    struct event *tick_ev;
    /* Invalidations waiting for the fdatasync of this loop turn, and
     * those whose fdatasync runs on the worker now (fsync "always"; no
     * worker: the loop syncs itself). */
    struct ld_defer sync_defer;
    struct inv_q sync_q;
    struct inv_q sync_running;
    struct ld_fsync *syncer;
    /* Getters that wait or once waited and are not answered yet: a
     * waiter keeps its place under limits.max_waiters while a wake-up
     * refetches for it, so that newcomers cannot take it meanwhile. */
    long long n_waiters;
    uint64_t next_seq;
};

extern struct cache_mod_state cache_mod;

/* ---- small lists ----------------------------------------------------- */

static inline void
glist_init(struct glist *l)
{
    TAILQ_INIT(&l->q);
    l->n = 0;
}

static inline void
glist_push(struct glist *l, struct getter *g)
{
    LD_ASSERTF(g->on == NULL, "getter of slot %zu is on a list", g->slot);
    TAILQ_INSERT_TAIL(&l->q, g, link);
    g->on = l;
    l->n++;
}

static inline void
glist_remove(struct glist *l, struct getter *g)
{
    LD_ASSERTF(g->on == l, "getter of slot %zu is not on this list", g->slot);
    LD_ASSERT(l->n > 0);
    TAILQ_REMOVE(&l->q, g, link);
    g->on = NULL;
    l->n--;
}

static inline struct getter *
glist_pop(struct glist *l)
{
    struct getter *g = TAILQ_FIRST(&l->q);
    if (g != NULL) {
        glist_remove(l, g);
    }
    return g;
}

/* Merge SRC into DST, both in arrival order; SRC ends empty. */
static inline void
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

/* ---- ld_cache.c: helpers --------------------------------------------- */

/* What the write scripts (cache_fill, cache_release, cache_set) return,
 * named once: each script's header comment uses the same names. */
enum cache_write_rc {
    CACHE_WRITE_WRONG_TYPE = -1, /* data leased did not write, untouched */
    CACHE_WRITE_REFUSED = 0,     /* the lease given is not the current one */
    CACHE_WRITE_DONE = 1,        /* stored, released, set */
    CACHE_WRITE_MOVED = 2,       /* the version is not if_version */
};

/* A write script's result: RC, and the VERSION that cache_set and
 * cache_fill answer beside it (the one stored, or the current one when
 * nothing was; -1 from a script that answers RC alone). */
struct cache_write_res {
    long long rc;
    long long version;
};

/* The largest if_version and version: 2^53, where a JSON number stops
 * being an exact integer. Versions are Redis' clock in microseconds (about
 * 2^50.6 now) or one above the previous version: see cache_shape.lua. */
#define CACHE_VERSION_MAX (1LL << 53)

/* Why a write script's reply is not a result: the error code, its message
 * and (stolen by whoever answers with it) extra fields of the error. */
struct cache_write_err {
    int code;
    char msg[512];
    json_t *extra;
};

/* False, with ERR filled in, when REPLY (to OP on KEY) is not a result
 * the caller can act on: Redis was unavailable or refused the write, the
 * script failed, or the key holds data leased did not write. Else RES is
 * the result (an integer, or {rc, version}). */
bool cache_write_check(const redisReply *reply, const char *op,
                       const char *key, size_t klen,
                       struct cache_write_err *err,
                       struct cache_write_res *res);
/* The TTL a stored entry gets (nulls cache.null_ttl_ms, values TTL_MS
 * when TTL_GIVEN, else cache.ttl_ms), spread by cache.ttl_jitter. */
long long cache_entry_ttl(bool is_null, bool ttl_given, long long ttl_ms);
/* The write scripts' layout argument: "2" writes a value or a null alone
 * as a string (cache.layout 2, src/lua/lib/cache_text.lua), "1" as a
 * hash. */
const char *cache_layout_arg(void);
/* cache.set's write of one entry, TTL_MS already jittered, only over
 * version IF_VERSION when that is not negative; CB gets the script's
 * reply ({rc, version}: enum cache_write_rc; DONE as the bare version:
 * cache_write_check reads both). */
void cache_send_set(const char *key, size_t len, const char *value,
                    size_t value_len, bool is_null, long long ttl_ms,
                    long long if_version, ld_redis_cb *cb, void *arg);
/* The optional "if_version" of a write (0..CACHE_VERSION_MAX; -1 when
 * absent) from J, the field's value, NULL when absent; NULL, or the
 * bad_request text. */
const char *cache_if_version(const json_t *j, long long *if_version);

void cache_key_touched(const char *key, size_t len);
/* prefix "{" key "}" ":fill" in one buffer: the entry key is its first
 * *ENTRY_LEN bytes, the channel all of it. The buffer is malloc'd, or
 * the caller's of cache_names_size(LEN) bytes. */
char *cache_make_names(const char *key, size_t len, size_t *entry_len,
                       size_t *chan_len);
size_t cache_names_size(size_t len);
void cache_put_names(char *buf, const char *key, size_t len, size_t *entry_len,
                     size_t *chan_len);
void cache_set_timer(struct event *ev, uint64_t delay_us);
/* ld_stats' refresh of cache_invalidations_overdue_ms. */
void cache_refresh_overdue(void);
void cache_update_journal_stats(void);

/* ---- ld_cache_reply.c: answering getters ----------------------------- */

struct chunk *cache_chunk_of_json(json_t *obj);
/* A per-key result of cache.mget and cache.mset that failed:
 * {"ok":false,"error":{"code":CODE,"message":MSG,...EXTRA}} (EXTRA, when
 * not NULL, is stolen). */
json_t *cache_result_error(int code, json_t *extra, const char *msg);
void cache_cop_free(struct cop *op);
void cache_cop_link(struct cop *op);
void cache_cop_unlink(struct cop *op);
void cache_getter_done(struct getter *g);
void cache_getter_settle(struct getter *g, json_t *fields, int code,
                         const char *msg);
void cache_mget_finish(struct cop *op);
/* VERSION: of the value or null answered (versioned writes). */
void cache_settle_hit(struct getter *g, const char *v, size_t len,
                      uint64_t version);
/* JSON: the value as ld_near_get gives it. */
void cache_settle_near_hit(struct getter *g, const char *json, size_t len,
                           uint64_t version);
/* cache.get answered from the near cache at once, without a getter. */
void cache_reply_near_hit(struct ld_req *req, const char *json, size_t len,
                          uint64_t version);
void cache_settle_miss(struct getter *g, const char *lease);
void cache_settle_null(struct getter *g, uint64_t version);
void cache_settle_stale(struct getter *g, const char *v, size_t len,
                        const char *lease, uint64_t version);
void cache_settle_refresh(struct getter *g, const char *v, size_t len,
                          const char *lease, uint64_t version);

/* ---- ld_cache_get.c: keys, fetches, cache.get and cache.mget --------- */

void cache_ckey_arm(struct ckey *ck);
/* A delete of KEY was answered: its waiters take a fresh look (one that
 * parked while the delete was owed has no other wake-up to come). */
void cache_key_deleted(const char *key, size_t len);
void cache_ckey_maybe_free(struct ckey *ck);
/* At exit: the spare timers of dropped key records. */
void cache_ckey_spares_free(void);
void cache_op_get(struct ld_req *req);
void cache_op_mget(struct ld_req *req);
/* The most keys one cache.mget, or entries one cache.mset, may name. */
#define CACHE_MAX_KEYS 1000

/* ---- ld_cache_mset.c: cache.mset ----------------------------------- */

void cache_op_mset(struct ld_req *req);

/* ---- ld_cache_hot_op.c: cache.hot and the hot keys in /metrics ----- */

int cache_hot_init(void);

/* ---- ld_cache_inval.c: cache.invalidate, deletes, replay ------------- */

void cache_op_invalidate(struct ld_req *req);
/* An answered invalidation, its arrays with it. */
void cache_inv_free(struct inv *inv);
/* Whether a first delete of KEY is owed: what Redis and the near cache
 * hold for it is what an invalidation voided. */
bool cache_first_owed(const char *key, size_t len);
void cache_redis_state_cb(bool up, void *arg);
void cache_replay_one(const struct ld_journal_entry *e, void *arg);
void cache_sync_run(void *arg);
void cache_tick_cb(evutil_socket_t fd, short what, void *arg);
/* For ld_cache_due.c: the wall clock of due times; a delete taken over
 * from the due set, run now (not journaled); a delete handed over, done
 * here. */
int64_t cache_wall_ms(void);
void cache_del_take_over(const char *key, size_t len, bool stale, char *member,
                         size_t member_len);
void cache_del_handed(struct del *d);
/* ld_cache_due.c: listening for hand-overs; a member's delete was
 * carried out; the periodic look at the due set. */
void cache_due_init(void);
void cache_due_free(void);
void cache_due_done(const char *member, size_t len);
void cache_due_poll(void);

#endif
