/* Locks: the Redis names of a lock, the records of what this daemon
 * holds (by session, owner and key, and by token), and the memo of the
 * highest fence handed out per lock. It owns a record's life and links
 * (ld_lock_int.h has its states); it must not send a command to Redis
 * but for giving a lost hold back (lk_rec_lost). */

#include "ld_lock_int.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- names */

static char *
put(char *p, const void *s, size_t len)
{
    memcpy(p, s, len);
    return p + len;
}

/* Redisson's prefixName: a name that carries a hash tag keeps it. */
static size_t
redisson_name(char *out, const char *prefix, const char *key, size_t len)
{
    char *p = out;
    p = put(p, prefix, strlen(prefix));
    if (memchr(key, '{', len) != NULL) {
        p = put(p, ":", 1);
        p = put(p, key, len);
    } else {
        p = put(p, ":{", 2);
        p = put(p, key, len);
        p = put(p, "}", 1);
    }
    *p = '\0';
    return (size_t)(p - out);
}

const char *
lk_mode_name(enum lk_mode mode)
{
    switch (mode) {
    case LK_MODE_READ:
        return "read";
    case LK_MODE_WRITE:
        return "write";
    default:
        return "plain";
    }
}

/* Redisson's names (lock.layout redisson). */
static void
names_redisson(struct lk_names *n, const char *key, size_t len)
{
    static const char chan_pfx[] = "redisson_lock__channel";
    static const char rwchan_pfx[] = "redisson_rwlock";
    static const char fence_pfx[] = "redisson_lock_token";
    size_t cap = (len + 1) + (sizeof(chan_pfx) + len + 4) +
                 2 * (sizeof(fence_pfx) + len + 4) + 7 +
                 (sizeof(rwchan_pfx) + len + 4) + (len + 3);
    char *p = n->buf = ld_xmalloc(cap);
    n->hash = p;
    n->hash_len = len;
    p = put(p, key, len);
    *p++ = '\0';
    n->chan = p;
    n->chan_len = redisson_name(p, chan_pfx, key, len);
    p += n->chan_len + 1;
    n->fence = p;
    n->fence_len = redisson_name(p, fence_pfx, key, len);
    p += n->fence_len + 1;
    /* Beside the fence counter: the lock hash may have no hash tag,
     * and in a cluster the marker must share the slot it hashes to. */
    n->forced = p;
    n->forced_len = n->fence_len + 7;
    p = put(p, n->fence, n->fence_len);
    p = put(p, ":forced", 7);
    *p++ = '\0';
    n->rwchan = p;
    n->rwchan_len = redisson_name(p, rwchan_pfx, key, len);
    p += n->rwchan_len + 1;
    /* RedissonReadLock's key prefix: the name, in braces unless it
     * carries a hash tag already (so it hashes with the name). */
    n->rwpfx = p;
    if (memchr(key, '{', len) != NULL) {
        p = put(p, key, len);
    } else {
        p = put(p, "{", 1);
        p = put(p, key, len);
        p = put(p, "}", 1);
    }
    n->rwpfx_len = (size_t)(p - n->rwpfx);
    *p = '\0';
}

/* leased's names: <lock.prefix>{KEY} and its fence, channel and marker
 * beside it, in one hash slot. */
static void
names_leased(struct lk_names *n, const char *key, size_t len)
{
    const struct ld_config *cfg = lock_mod.ctx->cfg;
    static const char *const sufs[] = {":fence", ":unlock", ":forced"};
    const char *names[4];
    size_t lens[4];
    n->buf = ld_lease_names(cfg->lock.prefix, key, len, "", sufs, 3, names,
                            lens);
    n->hash = names[0];
    n->hash_len = lens[0];
    n->fence = names[1];
    n->fence_len = lens[1];
    n->chan = names[2];
    n->chan_len = lens[2];
    n->forced = names[3];
    n->forced_len = lens[3];
    /* A read-write lock uses the plain lock's channel, and its
     * readers' lease keys start with the hash's name (same slot). */
    n->rwchan = n->chan;
    n->rwchan_len = n->chan_len;
    n->rwpfx = n->hash;
    n->rwpfx_len = n->hash_len;
}

void
lk_names_build_mode(struct lk_names *n, const char *key, size_t len,
                    enum lk_mode mode)
{
    memset(n, 0, sizeof(*n));
    if (lock_mod.ctx->cfg->lock.layout == LD_LAYOUT_REDISSON) {
        names_redisson(n, key, len);
    } else {
        names_leased(n, key, len);
    }
    n->mode = mode;
    if (mode != LK_MODE_PLAIN) {
        n->chan = n->rwchan;
        n->chan_len = n->rwchan_len;
    }
}

void
lk_names_build(struct lk_names *n, const char *key, size_t len)
{
    lk_names_build_mode(n, key, len, LK_MODE_PLAIN);
}

/* by_token is keyed by token and lock: the keys of a group lock share
 * one token. */
static char *
tok_key(const char *tok, const struct lk_names *n, size_t *len)
{
    *len = LD_TOKEN_LEN + n->hash_len;
    char *k = ld_xmalloc(*len);
    memcpy(k, tok, LD_TOKEN_LEN);
    memcpy(k + LD_TOKEN_LEN, n->hash, n->hash_len);
    return k;
}

static void
by_token_set(struct lk_rec *rec, bool on)
{
    size_t len;
    char *k = tok_key(rec->token, &rec->n, &len);
    if (on) {
        ld_dict_set(lock_mod.by_token, k, len, rec);
    } else {
        ld_dict_del(lock_mod.by_token, k, len);
    }
    free(k);
}

/* ---------------------------------------------------------- fence memo */

void
lk_fmemo_idle_unlink(struct lk_fmemo *fm)
{
    LD_ASSERT(fm->idle && fm->refs == 0 && lock_mod.idle_n > 0);
    TAILQ_REMOVE(&lock_mod.idle, fm, idle_link);
    fm->idle = false;
    lock_mod.idle_n--;
}

void
lk_fmemo_free(struct lk_fmemo *fm)
{
    free(fm->name);
    free(fm);
}

static struct lk_fmemo *
fmemo_get(const struct lk_names *n)
{
    struct lk_fmemo *fm = ld_dict_get(lock_mod.fences, n->hash, n->hash_len);
    if (fm == NULL) {
        fm = ld_xcalloc(1, sizeof(*fm));
        fm->name = ld_xmemdup(n->hash, n->hash_len);
        fm->len = n->hash_len;
        ld_dict_set(lock_mod.fences, fm->name, fm->len, fm);
    } else if (fm->idle) {
        lk_fmemo_idle_unlink(fm);
    }
    fm->refs++;
    return fm;
}

static void
fmemo_put(struct lk_fmemo *fm)
{
    LD_ASSERT(fm->refs > 0 && !fm->idle);
    if (--fm->refs > 0) {
        return;
    }
    if (lock_mod.fences == NULL) {
        /* The module was freed while this record waited for a reply. */
        lk_fmemo_free(fm);
        return;
    }
    fm->idle = true;
    TAILQ_INSERT_TAIL(&lock_mod.idle, fm, idle_link);
    lock_mod.idle_n++;
    while (lock_mod.idle_n > FENCE_IDLE_MAX) {
        struct lk_fmemo *old = TAILQ_FIRST(&lock_mod.idle);
        lk_fmemo_idle_unlink(old);
        ld_dict_del(lock_mod.fences, old->name, old->len);
        lk_fmemo_free(old);
    }
}

/* ------------------------------------------------------------- records */

static void
held_link(struct lk_rec *rec)
{
    if (rec->in_held) {
        return;
    }
    LD_ASSERT(rec->count > 0);
    TAILQ_INSERT_HEAD(&lock_mod.held, rec, held_entry);
    rec->in_held = true;
}

static void
held_unlink(struct lk_rec *rec)
{
    if (!rec->in_held) {
        return;
    }
    if (lock_mod.cursor == rec) {
        lock_mod.cursor = TAILQ_NEXT(rec, held_entry);
    }
    TAILQ_REMOVE(&lock_mod.held, rec, held_entry);
    rec->in_held = false;
}

char *
lk_dkey_build(const char *owner, size_t olen, const char *key, size_t klen,
              size_t *out_len)
{
    return lk_dkey_build_mode(owner, olen, key, klen, LK_MODE_PLAIN, out_len);
}

/* The two sides of a read-write lock are two records of one owner (a
 * writer may hold the read side too): the mode goes in the top bits of
 * the owner's length, which never reaches them (requests are far
 * shorter). */
char *
lk_dkey_build_mode(const char *owner, size_t olen, const char *key,
                   size_t klen, enum lk_mode mode, size_t *out_len)
{
    /* Owner length first, so that no (owner, key) pair can collide with
     * another whatever bytes they contain. */
    LD_ASSERT(olen < (size_t)1 << 30);
    uint32_t ol = (uint32_t)olen | ((uint32_t)mode << 30);
    size_t len = sizeof(ol) + olen + klen;
    char *d = ld_xmalloc(len);
    char *p = put(d, &ol, sizeof(ol));
    p = put(p, owner, olen);
    put(p, key, klen);
    *out_len = len;
    return d;
}

static void
rec_free(struct lk_rec *rec)
{
    LD_ASSERT(!rec->linked && rec->refs == 0 && rec->pending == 0);
    held_unlink(rec);
    if (rec->cap_ev != NULL) {
        event_free(rec->cap_ev);
    }
    LIST_REMOVE(rec, fm_link);
    if (rec->n.mode != LK_MODE_READ) {
        rec->fm->excl--;
    }
    fmemo_put(rec->fm);
    free(rec->n.buf);
    free(rec->dkey);
    free(rec->key);
    free(rec);
}

void
lk_rec_unlink(struct lk_rec *rec)
{
    if (!rec->linked) {
        return;
    }
    /* Linked means findable both ways, as this very record. */
    LD_ASSERT(lk_rec_by_token(rec->token, LD_TOKEN_LEN, &rec->n) == rec);
    LD_ASSERT(rec->ls == NULL ||
              ld_dict_get(rec->ls->recs, rec->dkey, rec->dkey_len) == rec);
    if (rec->ls != NULL) {
        ld_dict_del(rec->ls->recs, rec->dkey, rec->dkey_len);
    }
    by_token_set(rec, false);
    rec->linked = false;
}

static void
rec_settle(struct lk_rec *rec)
{
    if (rec->linked && rec->count == 0 && rec->pending == 0) {
        lk_rec_unlink(rec);
    }
    if (!rec->linked && rec->refs == 0) {
        rec_free(rec);
    }
}

void
lk_rec_unref(struct lk_rec *rec)
{
    LD_ASSERT(rec->refs > 0);
    rec->refs--;
    rec_settle(rec);
}

/* Move the hold count to N and keep the gauges, the list of held records
 * and the hold-time histogram in step. */
void
lk_rec_set_count(struct lk_rec *rec, long long n)
{
    long long was = rec->count;
    rec->count = n;
    if (was == 0 && n > 0) {
        ld_stats.locks_held++;
        rec->acquired_us = ld_now_us();
        rec->acquired_ms = ld_now_ms();
        held_link(rec);
    } else if (was > 0 && n == 0) {
        ld_stats.locks_held--;
        ld_stats_observe(LD_HISTO_LOCK_HOLD, ld_now_us() - rec->acquired_us);
        held_unlink(rec);
        rec->at_risk = false;
        if (rec->cap_ev != NULL) {
            evtimer_del(rec->cap_ev);
        }
        rec->cap_end_ms = 0;
    }
}

struct lk_rec *
lk_rec_new(struct lk_sess *ls, char *dkey, size_t dlen, const char *key,
           size_t klen, bool detached, enum lk_mode mode)
{
    struct lk_rec *rec = ld_xcalloc(1, sizeof(*rec));
    if (ld_token_new(rec->token) != LD_OK) {
        free(rec);
        return NULL;
    }
    rec->ls = ls;
    rec->dkey = dkey;
    rec->dkey_len = dlen;
    rec->key = ld_xstrndup(key, klen);
    rec->key_len = klen;
    rec->detached = detached;
    lk_names_build_mode(&rec->n, key, klen, mode);
    rec->fm = fmemo_get(&rec->n);
    LIST_INSERT_HEAD(&rec->fm->recs, rec, fm_link);
    if (mode != LK_MODE_READ) {
        rec->fm->excl++;
    }
    rec->linked = true;
    ld_dict_set(ls->recs, dkey, dlen, rec);
    by_token_set(rec, true);
    return rec;
}

/* The record that holds TOKEN for KEY's lock in this daemon, if any. */
struct lk_rec *
lk_rec_by_token(const char *tok, size_t len, const struct lk_names *n)
{
    if (len != LD_TOKEN_LEN) {
        return NULL;
    }
    size_t klen;
    char *k = tok_key(tok, n, &klen);
    struct lk_rec *rec = ld_dict_get(lock_mod.by_token, k, klen);
    free(k);
    return rec;
}

/* The lock is no longer this session's: tell it, and forget the hold.
 * RELEASE also deletes it in Redis (when the daemon itself gives it up,
 * so that waiters everywhere proceed at once). */
void
lk_rec_lost(struct lk_rec *rec, const char *reason, bool release)
{
    if (rec->ls != NULL) {
        json_t *ev = json_pack("{s:s,s:s%,s:s,s:s}", "event", "lock_lost",
                               "key", rec->key, rec->key_len, "token",
                               rec->token, "reason", reason);
        ld_session_event(rec->ls->sess, ev);
    }
    ld_stats.lock_lost++;
    log_info("lock lost reason=%s session=%s", reason,
             rec->ls != NULL ? rec->ls->sess->name : "-");
    if (release) {
        lk_rec_release_all(rec);
    }
    lk_rec_set_count(rec, 0);
}

/* Whether a new hold of REC's side rules out OTHER's hold of the same
 * lock: a reader shares it with readers, and with its own owner's writer
 * when it joined it (downgrade: REC's names carry that writer's token);
 * a plain lock and a writer share it with nobody. */
static bool
hold_excludes(const struct lk_rec *rec, const struct lk_rec *other)
{
    if (rec->n.mode != LK_MODE_READ) {
        return true;
    }
    if (other->n.mode == LK_MODE_READ) {
        return false;
    }
    return strcmp(other->token, rec->n.dg) != 0;
}

/* Redis has just granted REC a new hold (not a reentry). Every hold of
 * this daemon that it rules out is gone from Redis (lost with its data:
 * FLUSHALL, a restart without persistence, an eviction; or released by
 * token) although its record still counts it: its holder hears it now,
 * before the new holder's grant is answered. */
void
lk_rec_lost_to(struct lk_rec *rec)
{
    if (rec->n.mode == LK_MODE_READ && rec->fm->excl == 0) {
        return; /* readers only: a new reader rules none out */
    }
    struct lk_rec *o, *next;
    for (o = LIST_FIRST(&rec->fm->recs); o != NULL; o = next) {
        next = LIST_NEXT(o, fm_link);
        if (o == rec || o->count == 0 || !hold_excludes(rec, o)) {
            continue;
        }
        o->refs++;
        lk_rec_lost(o, "taken", false);
        lk_rec_unref(o);
    }
}

/* A new acquisition after a hold ended gets a new token: the old one may
 * still be in the hands of someone who must not be able to use it on
 * the new hold (an unlock by token, a reentry by token). */
int
lk_rec_retoken(struct lk_rec *rec)
{
    char tok[LD_TOKEN_LEN + 1];
    if (ld_token_new(tok) != LD_OK) {
        return LD_ERR;
    }
    lk_rec_set_token(rec, tok);
    rec->token_used = false;
    return LD_OK;
}

void
lk_rec_set_token(struct lk_rec *rec, const char *tok)
{
    if (rec->linked) {
        by_token_set(rec, false);
    }
    memcpy(rec->token, tok, LD_TOKEN_LEN + 1);
    if (rec->linked) {
        by_token_set(rec, true);
    }
}
