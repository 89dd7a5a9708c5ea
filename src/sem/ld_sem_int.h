#ifndef LD_SEM_INT_H
#define LD_SEM_INT_H

/* Inside the semaphore module, shared by its files and by nothing else:
 *   ld_sem.c        ops, waiting, grants, session close, init and stop
 *   ld_sem_watch.c  the watchdog pass that renews session-bound grants
 *                   and checks fixed leases, rechecks when Redis may
 *                   have lost them, and grants held back meanwhile */

#include "ld_common.h"
#include "ld_lease.h"
#include "ld_lockwait.h"
#include "ld_redis.h"
#include "ld_util.h"

#include <sys/queue.h>

struct event;
struct ld_ctx;
struct ld_dict;
struct ld_req;
struct ld_session;

/* The Redis names of one semaphore: two keys in one hash slot and the
 * channel its releases are published on. */
struct sem_names {
    char *buf;
    const char *zset, *hash, *chan;
    size_t zset_len, hash_len, chan_len;
};

struct sem_grant;
struct sem_op;

/* The session-bound grants of one semaphore in this daemon, and the new
 * grants of it held back until checks of those have answered (a new
 * grant that counts fewer permits in Redis than these hold means Redis
 * lost some of them: their holders hear it first). */
struct sem_key {
    char *name; /* the zset's Redis name */
    size_t len;
    LIST_HEAD(, sem_grant) grants;
    unsigned checks;           /* checks of them out for HELD */
    TAILQ_HEAD(, sem_op) held; /* granted, answered once CHECKS is 0 */
};

/* A session's semaphore state (ld_session.sem_state). */
struct sem_sess {
    struct ld_session *sess;
    LIST_ENTRY(sem_sess) link;     /* every session's */
    LIST_HEAD(, sem_grant) grants; /* its session-bound grants */
    LIST_HEAD(, sem_op) ops;       /* its acquisitions in flight */
};

/* A session-bound grant this daemon gives back when the session ends, and
 * renews while it lives when it has no fixed lease. */
struct sem_grant {
    struct sem_sess *ss;
    struct sem_names n;
    char *key; /* the client's key, for events */
    char token[LD_TOKEN_LEN + 1];
    long long permits;
    bool watchdog;
    bool renewing;       /* a renewal or check is in flight */
    bool renew_failover; /* it was sent after the master changed */
    bool renew_recheck;  /* it was sent by a recheck */
    bool at_risk;        /* sem_at_risk sent, no renewal confirmed since */
    uint64_t renew_sent_ms;
    struct sem_key *sk;       /* its semaphore */
    struct sem_key *hold_key; /* a grant there waits for this check */
    bool gone; /* released or lost: freed once no renewal refers to it */
    uint64_t lease_end_ms;
    uint64_t granted_ms;  /* when its sem.acquire was sent (lock.list) */
    struct event *end_ev; /* the lease can no longer be vouched for */
    LIST_ENTRY(sem_grant) sess_link;
    LIST_ENTRY(sem_grant) key_link;
    TAILQ_ENTRY(sem_grant) all_link;
};

/* One sem.acquire on its way. */
struct sem_op {
    struct ld_req *req;  /* NULL once answered */
    struct sem_sess *ss; /* NULL once its session has closed */
    struct sem_names n;
    char token[LD_TOKEN_LEN + 1];
    char *key;
    long long limit, permits, lease_ms, wait_ms;
    long long available; /* as last seen */
    long long granted;   /* the lease of its grant, while held back */
    bool watchdog, detach;
    bool inflight;
    uint64_t sent_ms;
    struct ld_lockwait w;
    LIST_ENTRY(sem_op) link;
    TAILQ_ENTRY(sem_op) held_link; /* in sem_key.held */
};

struct sem_mod {
    const struct ld_ctx *ctx;
    struct ld_dict *by_token; /* token -> struct sem_grant */
    TAILQ_HEAD(, sem_grant) grants;
    LIST_HEAD(, sem_sess) sessions;
    struct ld_dict *keys;      /* zset name -> struct sem_key */
    struct ld_lease_pass pass; /* the watchdog pass and rechecks */
    long long pass_left;       /* grants the pass running still visits */
    bool stopping;
    bool freed;
};

extern struct sem_mod sem_mod;

/* ld_sem.c */
void sem_acq_finish(struct sem_op *op);
void sem_grant_drop(struct sem_grant *g, bool release);
struct sem_key *sem_key_find(const struct sem_names *n);
void sem_key_maybe_free(struct sem_key *k);
bool sem_bare(long long permits);
void sem_script(enum ld_script_id id, const struct sem_names *n, bool bare,
                int nargs, const char **args, const size_t *lens,
                ld_redis_cb *cb, void *arg);

/* ld_sem_watch.c */
void sem_grant_arm(struct sem_grant *g);
void sem_grant_lost(struct sem_grant *g, const char *reason, bool release);
bool sem_hold_grant(struct sem_op *op);
void sem_recheck_start(void);
void sem_watch_init(void);
void sem_watch_free(void);

#endif
