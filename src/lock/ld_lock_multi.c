/* Locks on several keys at once: lock, unlock and extend with "keys".
 *
 * A group is one record per key (struct lk_rec, flagged group) under one
 * token, so renewal, max_hold, lock_lost, lock.info and session close
 * treat each of its keys like any other lock, and a key found lost is
 * reported alone while the others stay held.
 *
 * The keys are taken one at a time with the single-key acquire script,
 * in the order of their Redis names: in Redis Cluster they may live on
 * different nodes, and two groups that overlap meet at their first common
 * key. No step waits: an attempt that finds a key held gives back every
 * key it took before it waits or answers, so a waiting group holds
 * nothing, and no two groups can each hold what the other waits for.
 * A waiting group queues on the key that stopped it (ld_lockwait.c) and
 * retries from its first key when that key is released or its lease
 * ends. This file owns the groups (struct lk_grp); the records of their
 * keys are ld_lock_rec.c's, and it must not renew or time them. */

#include "ld_lock_int.h"

#include "ld_assert.h"
#include "ld_cancel.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_redlock.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MULTI_KEYS_MAX 64

/* A group request: the lock op and the records it takes, or an unlock or
 * extend and the outcomes of its parts (one command per key). */
struct lk_grp {
    unsigned refs;        /* the request's op and its parts */
    struct lk_op *op;     /* the request's op; NULL once freed */
    size_t n;             /* lock: records */
    struct lk_rec **recs; /* lock: in Redis name order */
    size_t next;          /* lock: the key being taken */
    size_t qkey;          /* lock: the key whose queue it waits in */
    unsigned gb_out;      /* lock: give-backs not answered yet */
    bool answer_false;    /* lock: "acquired":false once they are */
    long long false_ttl;  /* lock: its ttl_ms */
    size_t left;          /* unlock, extend: parts not settled */
    long long count;      /* unlock: highest hold count left */
    long long lease_ms;   /* extend: shortest lease set */
    bool unknown;         /* a part may or may not have happened */
    bool failed;          /* a part did not happen */
    json_t *wrong;        /* keys that hold other data */
    json_t *absent;       /* keys with no lock */
    json_t *other;        /* keys held by someone else */
    char *why;            /* the first failure's reason */
};

bool
lk_multi_asked(const struct ld_req *req)
{
    return ld_req_has(req, "keys");
}

static struct lk_grp *
grp_new(struct lk_op *op)
{
    struct lk_grp *g = ld_xcalloc(1, sizeof(*g));
    g->refs = 1;
    g->op = op;
    op->grp = g;
    g->wrong = json_array();
    g->absent = json_array();
    g->other = json_array();
    return g;
}

/* The lock request is over: its records are settled like a single
 * lock's (a give-back still on its way holds its own). */
static void
grp_drop_recs(struct lk_grp *g)
{
    for (size_t i = 0; i < g->n; i++) {
        struct lk_rec *rec = g->recs[i];
        LD_ASSERT(rec->pending > 0);
        rec->pending--;
        lk_rec_unref(rec);
    }
    g->n = 0;
}

static void
grp_unref(struct lk_grp *g)
{
    LD_ASSERT(g->refs > 0);
    if (--g->refs > 0) {
        return;
    }
    grp_drop_recs(g);
    free(g->recs);
    json_decref(g->wrong);
    json_decref(g->absent);
    json_decref(g->other);
    free(g->why);
    free(g);
}

void
lk_multi_op_free(struct lk_op *op)
{
    struct lk_grp *g = op->grp;
    if (g == NULL) {
        return;
    }
    op->grp = NULL;
    if (g->op == op) {
        g->op = NULL;
        grp_drop_recs(g);
    }
    grp_unref(g);
}

/* Answers REQ and returns LD_ERR when "key" or "token" come with
 * "keys", or when a key is named twice. */
static int
check_fields(struct ld_req *req, const char *opname)
{
    if (ld_req_has(req, "key")) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "fields 'key' and 'keys' exclude each other");
        return LD_ERR;
    }
    if (strcmp(opname, "lock") == 0 && ld_req_has(req, "token")) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'token' does not go with 'keys': a group "
                       "is not reentrant");
        return LD_ERR;
    }
    return LD_OK;
}

static int
check_unique(struct ld_req *req, json_t *keys)
{
    size_t n = json_array_size(keys);
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(keys, i);
        for (size_t j = i + 1; j < n; j++) {
            if (json_equal(a, json_array_get(keys, j))) {
                ld_reply_error(req, LD_E_BAD_REQUEST,
                               "field 'keys' names '%s' twice",
                               json_string_value(a));
                return LD_ERR;
            }
        }
    }
    return LD_OK;
}

/* ---------------------------------------------------------------- lock */

static void grp_step(struct lk_op *op);

static void give_back_send(struct lk_op *op);

static void
give_back_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct lk_op *op = arg;
    event_free(op->undo_ev);
    op->undo_ev = NULL;
    give_back_send(op);
}

/* A give-back that got no answer is sent again every redis.timeout_ms
 * until the key's lease has ended anyway (kept in OP->lease_ms, a
 * time): a retry is harmless, the token being this attempt's alone. */
static void
give_back_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    op->inflight = false;
    struct lk_grp *g = op->grp;
    if (g != NULL && !op->answered_early) {
        op->answered_early = true;
        LD_ASSERT(g->gb_out > 0);
        if (--g->gb_out == 0 && g->answer_false) {
            g->answer_false = false;
            if (g->op != NULL) {
                lk_acq_reply_false(g->op, g->false_ttl);
                lk_op_free(g->op);
            }
        }
    }
    long long v[2] = {0, 0};
    int n = ld_lease_reply_ints(r, v, 2);
    if (!lock_mod.freed && n >= 1 && v[0] == LD_LOCK_RELEASED) {
        ld_stats.lock_released++;
    }
    if (r != NULL || lock_mod.freed || lock_mod.stopping ||
        (long long)ld_now_ms() >= op->lease_ms) {
        lk_op_free(op);
        return;
    }
    lk_op_undo_later(op, give_back_on_timer);
}

static void
give_back_send(struct lk_op *op)
{
    op->inflight = true;
    lk_release_send(0, 0, &op->rec->n, op->field, op->field_len, true,
                    give_back_on_reply, op);
}

/* Give back every key of G before key UPTO. */
static void
grp_give_back(struct lk_grp *g, size_t upto)
{
    for (size_t i = 0; i < upto && i < g->n; i++) {
        struct lk_rec *rec = g->recs[i];
        if (rec->count == 0) {
            continue;
        }
        if (!lock_mod.freed) {
            struct lk_op *op = lk_op_new(LK_RELEASE, NULL, rec);
            op->field = ld_xstrndup(rec->token, LD_TOKEN_LEN);
            op->field_len = LD_TOKEN_LEN;
            op->lease_ms = (long long)rec->lease_end_ms;
            op->grp = g;
            g->refs++;
            g->gb_out++;
            give_back_send(op);
        }
        lk_rec_set_count(rec, 0);
    }
}

/* A new attempt takes its keys under a new token, so that a give-back
 * of an earlier attempt still on its way can never release them. */
static int
grp_retoken(struct lk_grp *g)
{
    char tok[LD_TOKEN_LEN + 1];
    if (ld_token_new(tok) != LD_OK) {
        return LD_ERR;
    }
    for (size_t i = 0; i < g->n; i++) {
        lk_rec_set_token(g->recs[i], tok);
    }
    return LD_OK;
}

static void
grp_granted(struct lk_op *op, struct lk_rec *rec, const long long v[4])
{
    lk_rec_lost_to(rec);
    lk_rec_set_count(rec, v[1]);
    rec->fence = v[2];
    if (v[2] > rec->fm->fence) {
        rec->fm->fence = v[2];
    }
    /* max_hold counts from when the acquisition was sent. */
    rec->acquired_ms = op->sent_ms;
    rec->watchdog = op->watchdog;
    rec->lease_end_ms = op->sent_ms +
                        (uint64_t)(v[3] >= 0 ? v[3] : op->lease_ms);
    lk_rec_cap_update(rec);
    lk_rec_arm_cap(rec);
    ld_stats.lock_acquired++;
}

static void
grp_reply_granted(struct lk_op *op)
{
    struct lk_grp *g = op->grp;
    json_t *fences = json_object();
    uint64_t now = ld_now_ms();
    uint64_t end = UINT64_MAX;
    for (size_t i = 0; i < g->n; i++) {
        struct lk_rec *rec = g->recs[i];
        json_object_setn_new(fences, rec->key, rec->key_len,
                             json_integer(rec->fence));
        if (rec->lease_end_ms < end) {
            end = rec->lease_end_ms;
        }
    }
    if (op->wait_ms != 0) {
        ld_stats_observe(LD_HISTO_LOCK_WAIT, ld_now_us() - op->req->start_us);
    }
    /* The first key's lease ends first: that is the group's. */
    long long lease = end > now ? (long long)(end - now) : 0;
    ld_reply_ok(op->req, json_pack("{s:b,s:s,s:o,s:I}", "acquired", 1, "token",
                                   g->recs[0]->token, "fences", fences,
                                   "lease_ms", (json_int_t)lease));
    op->req = NULL;
}

/* A cancel answers the group as if its wait had run out; an attempt
 * still on its way gives back what it takes (grp_acq_on_reply). */
static bool
grp_cancel(void *arg)
{
    struct lk_op *op = arg;
    return ld_lockwait_cancel(&op->w);
}

/* The attempt found key J held with lease PTTL: wait in J's queue, or
 * answer. Everything taken has been given back. */
static void
grp_wait(struct lk_op *op, size_t j, long long pttl, bool queued)
{
    struct lk_grp *g = op->grp;
    struct lk_rec *rec = g->recs[j];
    bool timed_out = queued && op->w.timed_out;
    if (queued && g->qkey == j && !timed_out) {
        ld_lockwait_done(&op->w, LD_LOCKWAIT_TAKEN, pttl);
        return;
    }
    if (queued) {
        /* Its time is up or another key stopped it: the queue it was in
         * moves on. */
        ld_lockwait_done(&op->w, LD_LOCKWAIT_FAILED, 0);
    }
    long long left = -1;
    if (op->wait_ms > 0) {
        long long waited = (long long)((ld_now_us() - op->req->start_us) /
                                       1000);
        left = op->wait_ms - waited;
    }
    if (op->wait_ms == 0 || timed_out || (op->wait_ms > 0 && left <= 0) ||
        rec->ls == NULL || lock_mod.stopping) {
        if (g->gb_out > 0) {
            /* Answered once Redis has the keys back, as Redisson's
             * MultiLock does: "acquired":false means none is held. */
            lk_op_wait_unlink(op);
            g->answer_false = true;
            g->false_ttl = pttl;
            return;
        }
        lk_acq_reply_false(op, pttl);
        lk_op_free(op);
        return;
    }
    if (op->ls == NULL) {
        if (lk_acq_refused_full(op)) {
            return;
        }
        lk_op_wait_add(op, rec->ls);
    }
    g->qkey = j;
    ld_cancel_on(op->req, grp_cancel, op);
    ld_lockwait_join(&op->w, rec->n.hash, rec->n.hash_len, rec->n.chan,
                     rec->n.chan_len, left, true, pttl);
}

/* Redis granted the group's next key, REC. */
static void
grp_on_granted(struct lk_op *op, struct lk_rec *rec, const long long *v,
               bool queued)
{
    struct lk_grp *g = op->grp;
    grp_granted(op, rec, v);
    g->next++;
    if (op->req == NULL ||
        (!rec->detached && (rec->ls == NULL || lock_mod.stopping))) {
        /* Answered already (its deadline passed, its session closed) or
         * the daemon stops: nothing of it may stay held. */
        grp_give_back(g, g->next);
        if (op->req != NULL && lock_mod.stopping) {
            ld_reply_error(op->req, LD_E_SHUTTING_DOWN,
                           "the daemon is stopping");
            op->req = NULL;
        }
        lk_acq_reply_false(op, -1);
        lk_op_drop(op);
        return;
    }
    if (g->next < g->n) {
        grp_step(op);
        return;
    }
    lk_op_wait_end(op, queued, LD_LOCKWAIT_GRANTED);
    grp_reply_granted(op);
    lk_op_free(op);
}

/* The group's next key is held for PTTL ms more: the keys taken go back
 * and the group waits for that one, or is answered. */
static void
grp_on_taken(struct lk_op *op, long long pttl, bool queued)
{
    struct lk_grp *g = op->grp;
    ld_stats.lock_contended++;
    grp_give_back(g, g->next);
    if (op->req == NULL) {
        lk_op_drop(op);
        return;
    }
    grp_wait(op, g->next, pttl, queued);
}

/* Wrong type, Redis unreachable or an error reply: the keys taken go
 * back, and the one whose answer never came (REC) is undone like a
 * single lock's. */
static void
grp_on_failure(struct lk_op *op, struct lk_rec *rec, const redisReply *r,
               int n, const long long *v, bool queued)
{
    if (r == NULL && rec->count == 0 && !lock_mod.stopping) {
        lk_acq_undo_unanswered(rec);
    }
    grp_give_back(op->grp, op->grp->next);
    if (op->req != NULL) {
        /* The answer names the key that failed. */
        free(op->key);
        op->key = ld_xstrndup(rec->key, rec->key_len);
        op->key_len = rec->key_len;
    }
    lk_acq_failed(op, r, n, v, queued);
}

static void
grp_acq_on_reply(redisReply *r, void *arg)
{
    long long v[4];
    int n;
    struct lk_op *op = lk_acq_reply_open(arg, r, v, &n);
    if (op == NULL) {
        return;
    }
    struct lk_grp *g = op->grp;
    struct lk_rec *rec = g->recs[g->next];
    bool queued = op->w.q != NULL;
    if (n >= 4 && v[0] == LD_LOCK_GRANTED) {
        grp_on_granted(op, rec, v, queued);
    } else if (n >= 2 && v[0] == LD_LOCK_TAKEN) {
        grp_on_taken(op, v[1], queued);
    } else {
        grp_on_failure(op, rec, r, n, v, queued);
    }
}

static void
grp_step(struct lk_op *op)
{
    struct lk_grp *g = op->grp;
    struct lk_rec *rec = g->recs[g->next];
    long long max = lock_mod.ctx->cfg->lock.max_hold_ms;
    op->lease_ms = op->lease_asked;
    if (op->watchdog && max > 0 && op->lease_ms > max) {
        op->lease_ms = max;
    }
    char lbuf[24], fbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", op->lease_ms);
    snprintf(fbuf, sizeof(fbuf), "%lld", rec->fm->fence);
    const char *args[] = {rec->n.hash, rec->n.fence, lbuf, rec->token, fbuf};
    size_t lens[] = {rec->n.hash_len, rec->n.fence_len, strlen(lbuf),
                     LD_TOKEN_LEN, strlen(fbuf)};
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    lk_script(LD_SCRIPT_lock_acquire, &rec->n, 2, 5, args, lens,
              grp_acq_on_reply, op);
}

/* A waiting group's turn (ld_lockwait): a new attempt from the first key. */
void
lk_multi_try(struct lk_op *op)
{
    op->grp->next = 0;
    if (grp_retoken(op->grp) != LD_OK) {
        log_error("no random bytes for a lock token");
    }
    grp_step(op);
}

struct ent {
    const char *key;
    size_t len;
    struct lk_names n;
};

static int
ent_cmp(const void *a, const void *b)
{
    const struct lk_names *x = &((const struct ent *)a)->n;
    const struct lk_names *y = &((const struct ent *)b)->n;
    size_t m = x->hash_len < y->hash_len ? x->hash_len : y->hash_len;
    int c = memcmp(x->hash, y->hash, m);
    if (c != 0) {
        return c;
    }
    return x->hash_len < y->hash_len ? -1 : x->hash_len > y->hash_len;
}

/* The keys in Redis name order; answers REQ and returns NULL when this
 * owner already has a record for one of them. */
static struct ent *
sorted_keys(struct ld_req *req, json_t *keys, const char *owner, size_t olen)
{
    size_t n = json_array_size(keys);
    struct ent *e = ld_xcalloc(n, sizeof(*e));
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, i);
        e[i].key = json_string_value(k);
        e[i].len = json_string_length(k);
        lk_names_build(&e[i].n, e[i].key, e[i].len);
    }
    qsort(e, n, sizeof(*e), ent_cmp);
    struct lk_sess *ls = lk_sess_get(req->sess, false);
    for (size_t i = 0; ls != NULL && i < n; i++) {
        size_t dlen;
        char *d = lk_dkey_build(owner, olen, e[i].key, e[i].len, &dlen);
        bool have = ld_dict_get(ls->recs, d, dlen) != NULL;
        free(d);
        if (have) {
            ld_reply_error(req, LD_E_BAD_REQUEST,
                           "this owner holds or is taking lock '%.*s' "
                           "already (a group is not reentrant)",
                           (int)e[i].len, e[i].key);
            for (size_t j = 0; j < n; j++) {
                free(e[j].n.buf);
            }
            free(e);
            return NULL;
        }
    }
    return e;
}

/* The fields of a lock request with "keys". */
struct multi_args {
    json_t *keys;
    struct lk_lock_opts o;
};

/* Read and check A's fields, and whether a group may be granted now;
 * false once REQ has been answered with why not. */
static bool
multi_args_read(struct ld_req *req, struct multi_args *a)
{
    a->keys = NULL;
    if (check_fields(req, "lock") != LD_OK ||
        ld_req_keys(req, "keys", MULTI_KEYS_MAX, &a->keys) != LD_OK ||
        check_unique(req, a->keys) != LD_OK ||
        !lk_lock_opts_read(req, &a->o)) {
        return false;
    }
    if (!lock_mod.redlock && lock_mod.ctx->cfg->lock.wait_replicas > 0 &&
        !lock_mod.stopping) {
        /* Each key's grant would need its own WAIT, on its own node (a
         * stopping daemon says that first). */
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'keys' is not available with "
                       "lock.wait_replicas");
        return false;
    }
    return lk_lock_may_grant(req, a->o.detach, a->o.has_ttl);
}

/* One record per key of E (N of them, in Redis name order) for group G,
 * all under token TOK; E's names are freed. Returns false when a record
 * could not be made. */
static bool
grp_recs_new(struct lk_grp *g, struct lk_sess *ls, struct ent *e, size_t n,
             const struct multi_args *a, const char *tok)
{
    g->recs = ld_xcalloc(n, sizeof(*g->recs));
    for (size_t i = 0; i < n; i++) {
        size_t dlen;
        char *d = lk_dkey_build(a->o.owner, a->o.olen, e[i].key, e[i].len,
                                &dlen);
        struct lk_rec *rec = lk_rec_new(ls, d, dlen, e[i].key, e[i].len,
                                        a->o.detach, LK_MODE_PLAIN);
        free(e[i].n.buf);
        if (rec == NULL) {
            /* Only its own token can fail; the group's is made. */
            free(d);
            continue;
        }
        lk_rec_set_token(rec, tok);
        rec->group = true;
        rec->token_used = true;
        rec->refs++;
        rec->pending++;
        g->recs[g->n++] = rec;
    }
    return g->n == n;
}

void
lk_multi_lock(struct ld_req *req)
{
    struct multi_args a;
    if (!multi_args_read(req, &a)) {
        return;
    }
    struct ent *e = sorted_keys(req, a.keys, a.o.owner, a.o.olen);
    if (e == NULL) {
        return;
    }
    size_t n = json_array_size(a.keys);
    char tok[LD_TOKEN_LEN + 1];
    if (ld_token_new(tok) != LD_OK) {
        for (size_t i = 0; i < n; i++) {
            free(e[i].n.buf);
        }
        free(e);
        ld_reply_error(req, LD_E_INTERNAL, "no random bytes for a token");
        return;
    }
    struct lk_sess *ls = lk_sess_get(req->sess, true);
    struct lk_op *op = lk_op_new(LK_ACQ, req, NULL);
    struct lk_grp *g = grp_new(op);
    bool made = grp_recs_new(g, ls, e, n, &a, tok);
    free(e);
    if (!made) {
        ld_reply_error(req, LD_E_INTERNAL, "no random bytes for a token");
        op->req = NULL;
        lk_op_free(op);
        return;
    }
    lk_op_asked(op, &a.o);
    grp_step(op);
}

/* ------------------------------------------------------ unlock, extend */

static void
grp_answer(struct lk_grp *g)
{
    struct lk_op *op = g->op;
    if (op == NULL) {
        return;
    }
    struct ld_req *req = op->req;
    op->req = NULL;
    bool unlock = op->kind == LK_UNLOCK;
    size_t nwrong = json_array_size(g->wrong);
    size_t nabsent = json_array_size(g->absent);
    size_t nother = json_array_size(g->other);
    if (req == NULL) {
        /* Answered already (the daemon is stopping). */
    } else if (g->unknown) {
        ld_reply_error_extra(req, LD_E_REDIS_UNAVAILABLE,
                             json_pack("{s:s}", "outcome", "unknown"),
                             "redis did not answer for every key: %s",
                             g->why != NULL ? g->why : "");
    } else if (g->failed) {
        ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                       "redis failed for a key: %s",
                       g->why != NULL ? g->why : "");
    } else if (nwrong > 0) {
        ld_reply_error(req, LD_E_WRONG_TYPE,
                       "the redis key of lock '%s' holds data that is not "
                       "a lock",
                       json_string_value(json_array_get(g->wrong, 0)));
    } else if (nabsent + nother > 0) {
        json_t *not_held = json_array();
        json_array_extend(not_held, g->other);
        json_array_extend(not_held, g->absent);
        ld_reply_error_extra(req, LD_E_NOT_HELD,
                             json_pack("{s:s,s:o}", "reason",
                                       nother > 0 ? "other" : "absent", "keys",
                                       not_held),
                             "%zu of the group's locks are not held by it%s",
                             nabsent + nother,
                             unlock ? " (the others were released)" : "");
    } else if (unlock) {
        lk_idem_done(op, g->count == 0, g->count, 0);
        const struct ld_field f[] = {LD_BOOL("released", g->count == 0),
                                     LD_INT("count", g->count)};
        ld_reply_ok_fields(req, f, LD_ARRAY_LEN(f));
    } else {
        ld_reply_ok(req,
                    json_pack("{s:I}", "lease_ms", (json_int_t)g->lease_ms));
    }
    lk_op_free(op);
}

/* SUB's outcome is known (or will never be to the client). */
static void
part_done(struct lk_op *sub)
{
    if (sub->answered_early) {
        return;
    }
    sub->answered_early = true;
    struct lk_grp *g = sub->grp;
    LD_ASSERT(g->left > 0);
    if (--g->left == 0) {
        grp_answer(g);
    }
}

static void
part_failed(struct lk_op *sub, bool unknown)
{
    struct lk_grp *g = sub->grp;
    if (g->why == NULL) {
        g->why = ld_xstrdup(lk_failure_reason());
    }
    if (unknown) {
        g->unknown = true;
    } else {
        g->failed = true;
    }
}

/* Like unlock_on_reply and extend_on_reply for one key of a group: called
 * once with the answer or with UNKNOWN, then once more with the late
 * answer or LOST. */
/* The outcome of SUB is not known yet (UNKNOWN: its late answer or LOST
 * follows), it is lost, or the module has gone: true once SUB has been
 * dealt with. */
static bool
part_unsettled(struct lk_op *sub, enum ld_redis_outcome o)
{
    if (o == LD_REDIS_UNKNOWN) {
        part_failed(sub, true);
        part_done(sub);
        return true;
    }
    if (lock_mod.freed) {
        part_done(sub);
        lk_op_free(sub);
        return true;
    }
    if (o == LD_REDIS_LOST) {
        part_failed(sub, true);
        part_done(sub);
        if (sub->kind == LK_UNLOCK) {
            lk_unlock_recheck(sub);
        } else {
            lk_op_free(sub);
        }
        return true;
    }
    return false;
}

/* What Redis answered (V, N of them) for one key of a group's unlock or
 * extend: the key's record and the group's answer follow it. */
static void
part_settle(struct lk_op *sub, const long long *v, int n)
{
    struct lk_grp *g = sub->grp;
    bool unlock = sub->kind == LK_UNLOCK;
    struct lk_rec *rec = lk_op_live_rec(sub);
    json_t *key = json_stringn(sub->key, sub->key_len);
    if (unlock && n >= 2 &&
        (v[0] == LD_LOCK_RELEASED || v[0] == LD_LOCK_KEPT)) {
        if (v[0] == LD_LOCK_RELEASED) {
            ld_stats.lock_released++;
        }
        if (rec != NULL) {
            lk_unlock_settle(sub, rec, v[1]);
        }
        if (v[1] > g->count) {
            g->count = v[1];
        }
    } else if (!unlock && n >= 3 && v[0] == LD_LOCK_HELD) {
        if (rec != NULL) {
            lk_rec_set_count(rec, v[2]);
            if (v[1] >= 0) {
                rec->lease_end_ms = sub->sent_ms + (uint64_t)v[1];
            }
            lk_rec_arm_cap(rec); /* as extend_on_reply */
        }
        if (g->lease_ms < 0 || sub->lease_ms < g->lease_ms) {
            g->lease_ms = sub->lease_ms;
        }
    } else if (n >= 1 && (v[0] == LD_LOCK_ABSENT || v[0] == LD_LOCK_OTHER)) {
        lk_rec_forget_stale(sub, rec, v[0]);
        json_array_append(v[0] == LD_LOCK_OTHER ? g->other : g->absent, key);
    } else if (n >= 1 && v[0] == LD_LOCK_WRONG_TYPE) {
        json_array_append(g->wrong, key);
    } else {
        part_failed(sub, false);
    }
    json_decref(key);
}

static void
part_on_reply(redisReply *r, void *arg)
{
    struct lk_op *sub = arg;
    enum ld_redis_outcome o = lk_outcome();
    if (part_unsettled(sub, o)) {
        return;
    }
    long long v[3] = {0, 0, 0};
    int n = ld_lease_reply_ints(r, v, 3);
    part_settle(sub, v, n);
    if (o == LD_REDIS_LATE) {
        lk_op_log_late(sub, n, v);
    }
    part_done(sub);
    lk_op_free(sub);
}

/* Send one key's part of a group's unlock or extend (TTL: the lease an
 * extend sets). */
static void
part_send(struct lk_op *sub, long long ttl)
{
    const struct lk_names *nm = lk_op_names(sub);
    size_t flen;
    const char *field = lk_op_field(sub, &flen);
    sub->sent_ms = ld_now_ms();
    sub->inflight = true;
    if (sub->kind == LK_UNLOCK) {
        lk_release_send(LD_REDIS_F_LATE, 0, nm, field, flen, false,
                        part_on_reply, sub);
        return;
    }
    sub->lease_ms = lk_rec_cap_clip(sub->rec, ttl);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", sub->lease_ms);
    const char *args[] = {nm->hash, field, lbuf};
    size_t lens[] = {nm->hash_len, flen, strlen(lbuf)};
    lk_script_ex(LD_REDIS_F_LATE, 0, LD_SCRIPT_lock_extend, nm, 1, 3, args,
                 lens, part_on_reply, sub);
}

/* A group's request id is remembered under its token: the one given, or
 * the one its owner holds the first key under. */
static bool
multi_idem_start(struct lk_op *op, struct ld_req *req, struct lk_target *t,
                 json_t *keys, const struct lk_rid *rid)
{
    if (t->has_token) {
        return lk_idem_start(op, t->token, t->token_len, rid);
    }
    json_t *k = json_array_get(keys, 0);
    t->key = json_string_value(k);
    t->key_len = json_string_length(k);
    struct lk_op *probe = lk_target_op(LK_INFO, req, t);
    probe->req = NULL;
    bool done = probe->rec != NULL &&
                lk_idem_start(op, probe->rec->token, LD_TOKEN_LEN, rid);
    lk_op_free(probe);
    return done;
}

static void
grp_parts(struct ld_req *req, enum lk_kind kind, long long ttl)
{
    json_t *keys = NULL;
    struct lk_target t;
    memset(&t, 0, sizeof(t));
    t.owner = "";
    t.token = "";
    bool has_owner = false;
    if (check_fields(req, kind == LK_UNLOCK ? "unlock" : "extend") != LD_OK ||
        ld_req_keys(req, "keys", MULTI_KEYS_MAX, &keys) != LD_OK ||
        check_unique(req, keys) != LD_OK ||
        ld_req_str(req, "owner", false, &t.owner, &t.owner_len, &has_owner) !=
            LD_OK ||
        ld_req_str(req, "token", false, &t.token, &t.token_len,
                   &t.has_token) != LD_OK) {
        return;
    }
    if (t.has_token && !lk_token_check(req, t.token, t.token_len)) {
        return;
    }
    struct lk_rid rid = {NULL, 0, false};
    if (kind == LK_UNLOCK && lk_idem_parse(req, &rid) != LD_OK) {
        return;
    }
    struct lk_op *op = lk_op_new(kind, req, NULL);
    if (rid.has && multi_idem_start(op, req, &t, keys, &rid)) {
        lk_op_free(op);
        return;
    }
    struct lk_grp *g = grp_new(op);
    size_t n = json_array_size(keys);
    g->left = n;
    g->lease_ms = -1;
    /* Every part is out before the first answer can come back. */
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, i);
        t.key = json_string_value(k);
        t.key_len = json_string_length(k);
        struct lk_op *sub = lk_target_op(kind, req, &t);
        sub->req = NULL;
        sub->grp = g;
        g->refs++;
        part_send(sub, ttl);
    }
}

void
lk_multi_unlock(struct ld_req *req)
{
    grp_parts(req, LK_UNLOCK, 0);
}

void
lk_multi_extend(struct ld_req *req, long long ttl)
{
    grp_parts(req, LK_EXTEND, ttl);
}
