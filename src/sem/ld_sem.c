/*
 * Semaphores: sem.acquire, sem.release, sem.info.
 *
 * Every acquisition is a grant of its own, under a new token, with a
 * lease: Redis keeps the grants of a semaphore in a sorted set scored by
 * lease end and their permits in a hash (src/lua/sem_*.lua), so a grant
 * whose holder vanished ends with its lease and the acquire script takes
 * it back. Session-bound grants are also given back at once when their
 * session ends, and renewed by ld_sem_watch.c while it lives. Waiting
 * acquisitions queue in ld_lockwait (FIFO per semaphore in this daemon,
 * only the head asks Redis, woken by the release channel or the next
 * lease end).
 */
#include "ld_sem.h"
#include "ld_sem_int.h"

#include "ld_admin.h"
#include "ld_assert.h"
#include "ld_cancel.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_dispatch.h"
#include "ld_evict.h"
#include "ld_features.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEM_LIMIT_MAX 1000000LL

struct sem_mod sem_mod;

/* ------------------------------------------------------------- names */

/* <lock.prefix>{KEY}:sem, <lock.prefix>{KEY}:sem:permits and the channel
 * <lock.prefix>{KEY}:sem:release: one hash slot, beside the lock of the
 * same key but never in its way. sem_release.lua makes the channel's name
 * from the first. */
static void
names_build(struct sem_names *n, const char *key, size_t len)
{
    static const char *const sufs[] = {":permits", ":release"};
    const char *names[3];
    size_t lens[3];
    n->buf = ld_lease_names(sem_mod.ctx->cfg->lock.prefix, key, len, ":sem",
                            sufs, 2, names, lens);
    n->zset = names[0];
    n->zset_len = lens[0];
    n->hash = names[1];
    n->hash_len = lens[1];
    n->chan = names[2];
    n->chan_len = lens[2];
}

/* Whether a grant of PERMITS writes no field in the permits hash: one
 * permit under lock.sem_layout 2. Its release and renewals are sent the
 * zset alone, and skip the hash (about 12k Redis instructions a pair). */
bool
sem_bare(long long permits)
{
    return permits == 1 && sem_mod.ctx->cfg->lock.sem_layout == 2;
}

/* Script ID on the semaphore N: KEYS are its zset and its hash, or the
 * zset alone when BARE (sem_bare). */
void
sem_script(enum ld_script_id id, const struct sem_names *n, bool bare,
           int nargs, const char **args, const size_t *lens, ld_redis_cb *cb,
           void *arg)
{
    int nkeys = bare ? 1 : 2;
    const char *argv[8] = {n->zset, n->hash};
    size_t argvlen[8] = {n->zset_len, n->hash_len};
    for (int i = 0; i < nargs && i < 6; i++) {
        argv[nkeys + i] = args[i];
        argvlen[nkeys + i] = lens[i];
    }
    ld_redis_script(id, n->zset, n->zset_len, nkeys, nkeys + nargs, argv,
                    argvlen, cb, arg);
}

static void
reply_wrong_type(struct ld_req *req)
{
    ld_reply_error(req, LD_E_WRONG_TYPE,
                   "the Redis keys of this semaphore hold data leased did "
                   "not write; nothing was changed");
}

/* -------------------------------------------------------- semaphores */

struct sem_key *
sem_key_find(const struct sem_names *n)
{
    return ld_dict_get(sem_mod.keys, n->zset, n->zset_len);
}

static struct sem_key *
key_get(const struct sem_names *n)
{
    struct sem_key *k = sem_key_find(n);
    if (k == NULL) {
        k = ld_xcalloc(1, sizeof(*k));
        k->name = ld_xmemdup(n->zset, n->zset_len);
        k->len = n->zset_len;
        LIST_INIT(&k->grants);
        TAILQ_INIT(&k->held);
        ld_dict_set(sem_mod.keys, k->name, k->len, k);
    }
    return k;
}

static void
key_free(struct sem_key *k)
{
    free(k->name);
    free(k);
}

/* Kept while it has grants, checks out or grants held back. */
void
sem_key_maybe_free(struct sem_key *k)
{
    if (!LIST_EMPTY(&k->grants) || k->checks > 0 || !TAILQ_EMPTY(&k->held)) {
        return;
    }
    ld_dict_del(sem_mod.keys, k->name, k->len);
    key_free(k);
}

/* ------------------------------------------------------------ grants */

/* A reply of sem_acquire or sem_release into V (at most MAX numbers), as
 * ld_lease_reply_ints reads it; but their commonest answers, a grant and
 * a release, come as a bare number (the permits available; the permits
 * released), which costs Redis less than a table: {1, X, LEASE_MS}. */
static int
sem_reply_ints(const redisReply *r, long long *v, int max, long long lease_ms)
{
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
        return ld_lease_reply_ints(r, v, max);
    }
    v[0] = 1;
    v[1] = r->integer;
    if (max > 2) {
        v[2] = lease_ms;
    }
    return max;
}

static void
release_on_reply(redisReply *r, void *arg)
{
    LD_UNUSED(arg);
    long long v[2];
    if (sem_reply_ints(r, v, 2, 0) == 2 && v[0] == 1) {
        ld_stats.sem_released++;
    }
}

/* Give back every permit of TOKEN, a grant of PERMITS made here; nobody
 * waits for the answer. */
static void
release_token(const struct sem_names *n, const char *token, long long permits)
{
    const char *args[] = {token};
    size_t lens[] = {LD_TOKEN_LEN};
    sem_script(LD_SCRIPT_sem_release, n, sem_bare(permits), 1, args, lens,
               release_on_reply, NULL);
}

static struct sem_grant *
grant_new(struct sem_sess *ss, struct sem_op *op, long long lease)
{
    /* A detached grant is Redis' alone: this daemon keeps none. */
    LD_ASSERT(ss != NULL && !op->detach && op->n.buf != NULL);
    struct sem_grant *g = ld_xcalloc(1, sizeof(*g));
    g->ss = ss;
    g->n = op->n; /* the names move to the grant */
    op->n.buf = NULL;
    memcpy(g->token, op->token, sizeof(g->token));
    g->key = op->key; /* so does the key */
    op->key = NULL;
    g->watchdog = op->watchdog;
    g->permits = op->permits;
    g->lease_end_ms = op->sent_ms + (uint64_t)lease;
    g->granted_ms = op->sent_ms;
    g->sk = key_get(&g->n);
    LIST_INSERT_HEAD(&g->sk->grants, g, key_link);
    LIST_INSERT_HEAD(&ss->grants, g, sess_link);
    TAILQ_INSERT_TAIL(&sem_mod.grants, g, all_link);
    ld_dict_set(sem_mod.by_token, g->token, LD_TOKEN_LEN, g);
    ld_stats.sem_holds++;
    sem_grant_arm(g);
    return g;
}

/* The grant is no longer this daemon's to keep: released by token, lost,
 * or its session ended (RELEASE: give its permits back now). */
void
sem_grant_drop(struct sem_grant *g, bool release)
{
    if (g->gone) {
        return;
    }
    g->gone = true;
    LD_ASSERT(g->sk != NULL && ld_stats.sem_holds > 0);
    if (release) {
        release_token(&g->n, g->token, g->permits);
    }
    if (g->ss != NULL) {
        LIST_REMOVE(g, sess_link);
        g->ss = NULL;
    }
    TAILQ_REMOVE(&sem_mod.grants, g, all_link);
    LIST_REMOVE(g, key_link);
    sem_key_maybe_free(g->sk);
    g->sk = NULL;
    ld_dict_del(sem_mod.by_token, g->token, LD_TOKEN_LEN);
    ld_stats.sem_holds--;
    if (g->end_ev != NULL) {
        event_free(g->end_ev);
        g->end_ev = NULL;
    }
    free(g->key);
    g->key = NULL;
    if (!g->renewing) {
        free(g->n.buf);
        free(g);
    }
}

/* ------------------------------------------------------------ sessions */

static struct sem_sess *
sess_get(struct ld_session *s)
{
    struct sem_sess *ss = s->sem_state;
    if (ss == NULL) {
        ss = ld_xcalloc(1, sizeof(*ss));
        ss->sess = s;
        LIST_INIT(&ss->grants);
        LIST_INIT(&ss->ops);
        LIST_INSERT_HEAD(&sem_mod.sessions, ss, link);
        s->sem_state = ss;
    }
    return ss;
}

static void
op_free(struct sem_op *op)
{
    if (op->ss != NULL) {
        LIST_REMOVE(op, link);
        op->ss = NULL;
    }
    free(op->n.buf);
    free(op->key);
    free(op);
}

static void
reply_false(struct sem_op *op)
{
    if (op->req == NULL) {
        return;
    }
    ld_reply_ok(op->req, json_pack("{s:b,s:I}", "acquired", 0, "available",
                                   (json_int_t)op->available));
    op->req = NULL;
}

/* Answer and drop the session's acquisitions; those still in flight are
 * freed by their reply, which gives back what it may grant. */
static void
sess_drop_ops(struct sem_sess *ss, int code, const char *msg)
{
    struct sem_op *op;
    while ((op = LIST_FIRST(&ss->ops)) != NULL) {
        LIST_REMOVE(op, link);
        op->ss = NULL;
        ld_lockwait_leave(&op->w);
        if (op->req != NULL) {
            if (code < 0) {
                reply_false(op);
            } else {
                ld_reply_error(op->req, code, "%s", msg);
                op->req = NULL;
            }
        }
        if (!op->inflight) {
            op_free(op);
        }
    }
}

static void
on_session_close(struct ld_session *s)
{
    struct sem_sess *ss = s->sem_state;
    if (ss == NULL) {
        return;
    }
    LD_ASSERT(ss->sess == s);
    s->sem_state = NULL;
    LIST_REMOVE(ss, link);
    sess_drop_ops(ss, -1, NULL);
    struct sem_grant *g;
    while ((g = LIST_FIRST(&ss->grants)) != NULL) {
        sem_grant_drop(g, true);
    }
    free(ss);
}

/* ------------------------------------------------------------ acquire */

/* Redis granted OP: answer it now, or once the checks of this daemon's
 * other grants of the semaphore have answered (sem_hold_grant). */
static void
acq_on_granted(struct sem_op *op, const long long *v)
{
    ld_stats.sem_acquired++;
    op->available = v[1];
    op->granted = v[2];
    if (sem_hold_grant(op)) {
        /* Its answer waits for those checks, as a request in flight. */
        op->inflight = true;
        return;
    }
    sem_acq_finish(op);
}

/* No permit free: answer OP false, or let it wait for a wake-up. */
static void
acq_on_taken(struct sem_op *op, const long long *v, bool queued)
{
    op->available = v[1];
    if (op->req == NULL) {
        op_free(op);
        return;
    }
    if (queued) {
        /* May answer and free OP through sem_expire. */
        ld_lockwait_done(&op->w, LD_LOCKWAIT_TAKEN, v[2]);
        return;
    }
    reply_false(op);
    op_free(op);
}

/* Wrong type, Redis unreachable or an error reply. */
static void
acq_on_failure(struct sem_op *op, const redisReply *r, int n,
               const long long *v, bool queued)
{
    if (r == NULL && ld_redis_outcome() != LD_REDIS_NOT_SENT) {
        /* It may have run: then a grant stands that nobody will use. */
        release_token(&op->n, op->token, op->permits);
    }
    if (op->req != NULL) {
        if (n >= 1 && v[0] == -1) {
            reply_wrong_type(op->req);
        } else {
            ld_lease_reply_failure(op->req, r, "sem.acquire");
        }
        op->req = NULL;
    }
    if (queued) {
        ld_lockwait_done(&op->w, LD_LOCKWAIT_FAILED, 0);
    }
    op_free(op);
}

static void
acq_on_reply(redisReply *r, void *arg)
{
    struct sem_op *op = arg;
    LD_ASSERT(op->inflight);
    op->inflight = false;
    if (sem_mod.freed) {
        free(op->n.buf);
        free(op->key);
        free(op);
        return;
    }
    long long v[3] = {0, 0, 0};
    int n = sem_reply_ints(r, v, 3, op->lease_ms);
    bool queued = op->w.q != NULL;
    if (n == 3 && v[0] == 1) {
        acq_on_granted(op, v);
    } else if (n == 3 && v[0] == 0) {
        acq_on_taken(op, v, queued);
    } else {
        acq_on_failure(op, r, n, v, queued);
    }
}

/* OP was granted (op->available, op->granted): answer it, or give the
 * grant back when nobody may use it any more. */
void
sem_acq_finish(struct sem_op *op)
{
    /* Its reply has come, and any check it waited for. */
    LD_ASSERT(!op->inflight);
    if (op->req == NULL || (op->ss == NULL && !op->detach) ||
        sem_mod.stopping) {
        /* Answered already (cancel, its session ended) or stopping:
         * nobody may use this grant, so it goes back. */
        release_token(&op->n, op->token, op->permits);
        if (op->req != NULL) {
            ld_reply_error(op->req, LD_E_SHUTTING_DOWN,
                           "the daemon is stopping");
            op->req = NULL;
        }
    } else {
        if (!op->detach) {
            grant_new(op->ss, op, op->granted);
        }
        ld_reply_ok(op->req,
                    json_pack("{s:b,s:s,s:I,s:I,s:I}", "acquired", 1, "token",
                              op->token, "permits", (json_int_t)op->permits,
                              "available", (json_int_t)op->available,
                              "lease_ms", (json_int_t)op->granted));
        op->req = NULL;
    }
    if (op->w.q != NULL) {
        ld_lockwait_done(&op->w, LD_LOCKWAIT_GRANTED, 0);
    }
    op_free(op);
}

static void
acq_send(struct sem_op *op)
{
    char lbuf[24], pbuf[24], tbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", op->limit);
    snprintf(pbuf, sizeof(pbuf), "%lld", op->permits);
    snprintf(tbuf, sizeof(tbuf), "%lld", op->lease_ms);
    const char *args[] = {lbuf, pbuf, tbuf, op->token};
    size_t lens[] = {strlen(lbuf), strlen(pbuf), strlen(tbuf), LD_TOKEN_LEN};
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    /* Layout 1 writes a field for every grant: daemons before layout 2
     * count a grant without one as none. */
    sem_script(sem_mod.ctx->cfg->lock.sem_layout == 2
                   ? LD_SCRIPT_sem_acquire
                   : LD_SCRIPT_sem_acquire_fields,
               &op->n, false, 4, args, lens, acq_on_reply, op);
}

static void
sem_try(struct ld_lockwait *w)
{
    struct sem_op *op = ld_container_of(w, struct sem_op, w);
    /* The queue asks only its head, and only once at a time. */
    LD_ASSERT(!op->inflight);
    acq_send(op);
}

static void
sem_expire(struct ld_lockwait *w, long long ttl_ms)
{
    LD_UNUSED(ttl_ms);
    struct sem_op *op = ld_container_of(w, struct sem_op, w);
    reply_false(op);
    if (!op->inflight) {
        op_free(op);
    }
}

static const struct ld_lockwait_fns sem_wait_fns = {sem_try, sem_expire};

static bool
sem_cancel(void *arg)
{
    struct sem_op *op = arg;
    return ld_lockwait_cancel(&op->w);
}

/* The fields of a sem.acquire. */
struct acq_args {
    const char *key;
    size_t klen;
    long long limit, permits, wait, ttl;
    bool has_ttl, detach;
};

/* Read and check A's fields, and whether a grant may be kept for REQ's
 * session; false once REQ has been answered with why not. */
static bool
acq_args_read(struct ld_req *req, struct acq_args *a)
{
    a->limit = a->wait = a->ttl = 0;
    a->permits = 1;
    a->has_ttl = a->detach = false;
    if (ld_req_key(req, "key", &a->key, &a->klen) != LD_OK ||
        ld_req_int(req, "limit", true, 1, SEM_LIMIT_MAX, &a->limit, NULL) !=
            LD_OK ||
        ld_req_int(req, "permits", false, 1, SEM_LIMIT_MAX, &a->permits,
                   NULL) != LD_OK ||
        ld_req_int(req, "wait_ms", false, -1, LD_WAIT_MS_MAX, &a->wait,
                   NULL) != LD_OK ||
        ld_req_int(req, "ttl_ms", false, 1, LD_TTL_MS_MAX, &a->ttl,
                   &a->has_ttl) != LD_OK ||
        ld_req_bool(req, "detach", &a->detach) != LD_OK) {
        return false;
    }
    if (a->permits > a->limit) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'permits' (%lld) is above 'limit' (%lld)",
                       a->permits, a->limit);
        return false;
    }
    if (a->detach && !a->has_ttl) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'ttl_ms' is required with detach (a "
                       "detached grant is never renewed)");
        return false;
    }
    if (sem_mod.stopping) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        return false;
    }
    if (!ld_req_session_open(req)) {
        /* Its close hook has run: nothing may be kept for it. */
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the session has ended");
        return false;
    }
    return true;
}

/* The acquisition A asks for, under a new token, in its session's list;
 * NULL once REQ has been answered with why not. */
static struct sem_op *
acq_op_new(struct ld_req *req, const struct acq_args *a)
{
    struct sem_op *op = ld_xcalloc(1, sizeof(*op));
    if (ld_token_new(op->token) != LD_OK) {
        free(op);
        ld_reply_error(req, LD_E_INTERNAL, "no random bytes for a token");
        return NULL;
    }
    struct sem_sess *ss = sess_get(req->sess);
    op->req = req;
    op->ss = ss;
    LIST_INSERT_HEAD(&ss->ops, op, link);
    names_build(&op->n, a->key, a->klen);
    op->key = ld_xstrndup(a->key, a->klen);
    op->limit = a->limit;
    op->permits = a->permits;
    op->wait_ms = a->wait;
    op->detach = a->detach;
    op->watchdog = !a->has_ttl;
    op->lease_ms = a->has_ttl ? a->ttl : sem_mod.ctx->cfg->lock.watchdog_ms;
    op->w.fns = &sem_wait_fns;
    return op;
}

static void
op_acquire(struct ld_req *req)
{
    struct acq_args a;
    if (!acq_args_read(req, &a) || ld_evict_refuse(req)) {
        return;
    }
    struct sem_op *op = acq_op_new(req, &a);
    if (op == NULL) {
        return;
    }
    if (a.wait == 0) {
        acq_send(op);
        return;
    }
    if (ld_lockwait_full()) {
        ld_reply_error(req, LD_E_BUSY,
                       "too many waiters (limits.max_waiters)");
        op->req = NULL;
        op_free(op);
        return;
    }
    ld_cancel_on(req, sem_cancel, op);
    ld_lockwait_join(&op->w, op->n.zset, op->n.zset_len, op->n.chan,
                     op->n.chan_len, ld_lockwait_left(a.wait, req->start_us),
                     false, 0);
}

/* ------------------------------------------------------- release, info */

struct sem_call {
    struct ld_req *req;
    struct sem_names n;
    char token[LD_TOKEN_LEN + 1];
};

static void
call_free(struct sem_call *c)
{
    free(c->n.buf);
    free(c);
}

static void
release_on_answer(redisReply *r, void *arg)
{
    struct sem_call *c = arg;
    long long v[2] = {0, 0};
    int n = sem_reply_ints(r, v, 2, 0);
    if (n == 2 && v[0] == 1) {
        ld_stats.sem_released++;
        struct sem_grant *g = sem_mod.freed
                                  ? NULL
                                  : ld_dict_get(sem_mod.by_token, c->token,
                                                LD_TOKEN_LEN);
        if (g != NULL && g->ss != NULL && g->ss->sess != c->req->sess) {
            /* Released by token from another session: its holder here
             * hears it as it would from a renewal. */
            sem_grant_lost(g, "expired", false);
        } else if (g != NULL) {
            sem_grant_drop(g, false);
        }
        ld_reply_ok(c->req, json_pack("{s:I}", "released", (json_int_t)v[1]));
    } else if (n >= 1 && v[0] == 0) {
        struct sem_grant *g = sem_mod.freed
                                  ? NULL
                                  : ld_dict_get(sem_mod.by_token, c->token,
                                                LD_TOKEN_LEN);
        if (g != NULL) {
            sem_grant_drop(g, false);
        }
        ld_reply_error_extra(c->req, LD_E_NOT_HELD,
                             json_pack("{s:s}", "reason", "absent"),
                             "this token holds no permit of the semaphore");
    } else if (n >= 1 && v[0] == -1) {
        reply_wrong_type(c->req);
    } else {
        ld_lease_reply_failure(c->req, r, "sem.release");
    }
    call_free(c);
}

static void
op_release(struct ld_req *req)
{
    const char *key, *token;
    size_t klen, tlen;
    if (ld_req_key(req, "key", &key, &klen) != LD_OK ||
        ld_req_str(req, "token", true, &token, &tlen, NULL) != LD_OK) {
        return;
    }
    if (tlen != LD_TOKEN_LEN) {
        ld_reply_error_extra(req, LD_E_NOT_HELD,
                             json_pack("{s:s}", "reason", "absent"),
                             "this token holds no permit of the semaphore");
        return;
    }
    struct sem_call *c = ld_xcalloc(1, sizeof(*c));
    c->req = req;
    memcpy(c->token, token, LD_TOKEN_LEN);
    names_build(&c->n, key, klen);
    /* A grant this daemon made knows whether it wrote a field; a token
     * from elsewhere has the script read the hash. */
    const struct sem_grant *g = sem_mod.freed
                                    ? NULL
                                    : ld_dict_get(sem_mod.by_token, c->token,
                                                  LD_TOKEN_LEN);
    bool bare = g != NULL && sem_bare(g->permits) &&
                g->n.zset_len == c->n.zset_len &&
                memcmp(g->n.zset, c->n.zset, c->n.zset_len) == 0;
    const char *args[] = {c->token};
    size_t lens[] = {LD_TOKEN_LEN};
    sem_script(LD_SCRIPT_sem_release, &c->n, bare, 1, args, lens,
               release_on_answer, c);
}

static void
info_on_reply(redisReply *r, void *arg)
{
    struct sem_call *c = arg;
    long long v[3] = {0, 0, 0};
    int n = ld_lease_reply_ints(r, v, 3);
    if (n == 3 && v[0] == 1) {
        ld_reply_ok(c->req,
                    json_pack("{s:I,s:I}", "available", (json_int_t)v[1],
                              "held", (json_int_t)v[2]));
    } else if (n >= 1 && v[0] == -1) {
        reply_wrong_type(c->req);
    } else {
        ld_lease_reply_failure(c->req, r, "sem.info");
    }
    call_free(c);
}

static void
op_info(struct ld_req *req)
{
    const char *key;
    size_t klen;
    long long limit = 0;
    if (ld_req_key(req, "key", &key, &klen) != LD_OK ||
        ld_req_int(req, "limit", true, 1, SEM_LIMIT_MAX, &limit, NULL) !=
            LD_OK) {
        return;
    }
    struct sem_call *c = ld_xcalloc(1, sizeof(*c));
    c->req = req;
    names_build(&c->n, key, klen);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", limit);
    const char *args[] = {lbuf};
    size_t lens[] = {strlen(lbuf)};
    sem_script(LD_SCRIPT_sem_info, &c->n, false, 1, args, lens, info_on_reply,
               c);
}

/* lock.list: the grants this daemon keeps (session-bound ones; a detached
 * grant is Redis' alone), mode "sem", count the permits, and waiters the
 * acquisitions of this daemon queued for the semaphore. */
static void
list_grants(struct ld_admin_list *l)
{
    uint64_t now = ld_now_ms();
    struct sem_grant *g;
    TAILQ_FOREACH(g, &sem_mod.grants, all_link)
    {
        if (g->gone || g->ss == NULL || g->key == NULL ||
            !ld_admin_list_wants(l, g->key, strlen(g->key))) {
            continue;
        }
        struct ld_admin_lock e = {
            .key = g->key,
            .key_len = strlen(g->key),
            .mode = "sem",
            .sess = g->ss->sess,
            .count = g->permits,
            .ttl_ms = g->lease_end_ms > now
                          ? (long long)(g->lease_end_ms - now)
                          : 0,
            .held_ms = now > g->granted_ms ? (long long)(now - g->granted_ms)
                                           : 0,
            .waiters = ld_lockwait_waiting(g->n.zset, g->n.zset_len),
        };
        if (!ld_admin_list_add(l, &e)) {
            return;
        }
    }
}

/* -------------------------------------------------------------- module */

int
ld_sem_init(const struct ld_ctx *ctx)
{
    sem_mod.ctx = ctx;
    sem_mod.by_token = ld_dict_new();
    sem_mod.keys = ld_dict_new();
    TAILQ_INIT(&sem_mod.grants);
    LIST_INIT(&sem_mod.sessions);
    sem_mod.stopping = false;
    sem_mod.freed = false;
    sem_watch_init();
    ld_session_on_close(on_session_close);
    ld_admin_add_lister(list_grants);
    static const struct ld_op sem_ops[] = {
        {"sem.acquire", op_acquire, LD_OP_WAITS},
        {"sem.release", op_release, 0},
        {"sem.info", op_info, 0},
    };
    if (ld_dispatch_register_ops(sem_ops, LD_ARRAY_LEN(sem_ops)) != LD_OK) {
        return LD_ERR;
    }
    ld_features_add("semaphore");
    return LD_OK;
}

void
ld_sem_shutdown(void)
{
    if (sem_mod.ctx == NULL || sem_mod.stopping) {
        return;
    }
    sem_mod.stopping = true;
    struct sem_sess *ss;
    LIST_FOREACH(ss, &sem_mod.sessions, link)
    {
        sess_drop_ops(ss, LD_E_SHUTTING_DOWN, "the daemon is stopping");
    }
    struct sem_grant *g;
    while ((g = TAILQ_FIRST(&sem_mod.grants)) != NULL) {
        sem_grant_drop(g, true);
    }
}

/* The master changed (Sentinel, Cluster): grants the next recheck finds
 * gone were lost to the failover. */
void
ld_sem_failover(void)
{
    ld_lease_pass_failover(&sem_mod.pass);
}

/* Grants still held back have no command out: they go with the module
 * (their sessions have answered them). */
static void
keys_free(void)
{
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, sem_mod.keys);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct sem_key *k = v;
        struct sem_op *op;
        while ((op = TAILQ_FIRST(&k->held)) != NULL) {
            TAILQ_REMOVE(&k->held, op, held_link);
            op_free(op);
        }
        key_free(k);
    }
    ld_dict_free(sem_mod.keys);
    sem_mod.keys = NULL;
}

void
ld_sem_free(void)
{
    if (sem_mod.ctx == NULL) {
        return;
    }
    struct sem_sess *ss;
    while ((ss = LIST_FIRST(&sem_mod.sessions)) != NULL) {
        LIST_REMOVE(ss, link);
        sess_drop_ops(ss, -1, NULL);
        struct sem_grant *g;
        while ((g = LIST_FIRST(&ss->grants)) != NULL) {
            sem_grant_drop(g, false);
        }
        ss->sess->sem_state = NULL;
        free(ss);
    }
    sem_watch_free();
    keys_free();
    ld_dict_free(sem_mod.by_token);
    sem_mod.by_token = NULL;
    sem_mod.freed = true;
    sem_mod.ctx = NULL;
}
