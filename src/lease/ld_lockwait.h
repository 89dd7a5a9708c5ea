#ifndef LD_LOCKWAIT_H
#define LD_LOCKWAIT_H

#include "ld_common.h"
#include "ld_pubsub.h"

#include <sys/queue.h>

/* Lock waiters of this daemon, one FIFO queue per lock. Internal to the
 * lock module: ld_lock_acq.c embeds a struct ld_lockwait in every waiting
 * request, decides how one attempt is made and how a request is answered;
 * this module decides when the queue head tries again.
 *
 * Only the head of a queue ever talks to Redis. It retries when the
 * subscription to the lock's unlock channel is confirmed (which closes the
 * race between its failed try and the subscription), when an unlock
 * message arrives, and when the holder's lease should have run out. After
 * a grant the next head tries once at once. A release therefore costs a
 * constant number of Redis calls however many requests wait. */

struct event;
struct ld_ctx;
struct ld_lockwait_q;

struct ld_lockwait_fns;

struct ld_lockwait {
    const struct ld_lockwait_fns *fns; /* NULL: ld_lockwait_set_handlers' */
    struct ld_lockwait_q *q;           /* NULL when not queued */
    TAILQ_ENTRY(ld_lockwait) link;     /* in q's waiters, oldest first */
    struct event *deadline_ev;         /* NULL when waiting without limit */
    bool trying;                       /* an attempt is in flight */
    bool timed_out;                    /* the deadline passed */
    uint64_t since_ms;                 /* when it joined its queue */
};

enum ld_lockwait_result {
    LD_LOCKWAIT_GRANTED, /* the attempt acquired the lock */
    LD_LOCKWAIT_TAKEN,   /* another holder has it; PTTL is its lease */
    LD_LOCKWAIT_FAILED   /* the request was answered with an error */
};

/* Make one attempt for W; its outcome must come back through
 * ld_lockwait_done. Called with W->trying already set. */
typedef void ld_lockwait_try_fn(struct ld_lockwait *w);
/* W's deadline passed without a grant; W has left its queue. TTL_MS is the
 * holder's remaining lease as last seen, -1 when unknown. */
typedef void ld_lockwait_expire_fn(struct ld_lockwait *w, long long ttl_ms);

/* A waiter of another kind (a semaphore acquisition) brings its own
 * handlers in W->fns; its queues are told apart by their route. */
struct ld_lockwait_fns {
    ld_lockwait_try_fn *try_fn;
    ld_lockwait_expire_fn *expire_fn;
};

/* How a queue hears of unlocks: ld_pubsub's functions, unless a test
 * hands in its own. */
typedef struct ld_pubsub_sub *ld_lockwait_sub_fn(const char *chan, size_t len,
                                                 ld_pubsub_cb *cb, void *arg);
typedef void ld_lockwait_unsub_fn(struct ld_pubsub_sub *sub);

/* Reads ctx->base and ctx->cfg (live). The handlers must be set before
 * the first join. */
int ld_lockwait_init(const struct ld_ctx *ctx);
void ld_lockwait_set_handlers(ld_lockwait_try_fn *try_fn,
                              ld_lockwait_expire_fn *expire_fn);
void ld_lockwait_set_channel(ld_lockwait_sub_fn *sub_fn,
                             ld_lockwait_unsub_fn *unsub_fn);
/* lock.redlock: the queues of lock waiters (those with the default
 * handlers) subscribe with SUB_FN (the instances'), others as above. */
void ld_lockwait_set_lock_channel(ld_lockwait_sub_fn *sub_fn);
/* Drops every queue; waiters must have left already. */
void ld_lockwait_free(void);

/* True when limits.max_waiters requests wait already (in all queues, and
 * rate.acquire's waiting on their timers): a new waiter is then refused. */
bool ld_lockwait_full(void);

/* What is left of a wait of WAIT_MS (-1: no end) for a request that
 * started at START_US (ld_now_us): -1, or 0 and up, for
 * ld_lockwait_join. */
long long ld_lockwait_left(long long wait_ms, uint64_t start_us);

/* True when requests of this daemon wait for the lock whose Redis key is
 * ROUTE (a reader that only tries once does not get ahead of them). */
bool ld_lockwait_queued(const char *route, size_t route_len);
/* How many requests of this daemon wait for that lock (lock.list). */
long long ld_lockwait_waiting(const char *route, size_t route_len);

/* Queue W (zeroed by the caller) behind the other waiters for the lock
 * whose Redis key is ROUTE and whose unlock channel is CHAN. WAIT_MS is
 * how much longer W may wait (-1: no limit). TRIED says W has just failed
 * an attempt that saw the holder's lease PTTL. When W is the only waiter
 * and has not tried, it tries now. */
void ld_lockwait_join(struct ld_lockwait *w, const char *route,
                      size_t route_len, const char *chan, size_t chan_len,
                      long long wait_ms, bool tried, long long pttl);

/* The outcome of W's attempt. GRANTED and FAILED take W out of its queue;
 * TAKEN keeps it waiting, unless its deadline passed meanwhile: then W
 * leaves and the expire function is called for it. */
void ld_lockwait_done(struct ld_lockwait *w, enum ld_lockwait_result res,
                      long long pttl);

/* A cancel op ends W's wait: W leaves its queue and its expire function
 * is called at once, also while its attempt is in flight (the owner then
 * gives back what that attempt may still grant). False when W is not
 * queued. */
bool ld_lockwait_cancel(struct ld_lockwait *w);

/* Take W out of its queue without any callback (its session closed, or the
 * daemon stops). An attempt of W still in flight is W's owner's to
 * finish; the queue carries on without it. */
void ld_lockwait_leave(struct ld_lockwait *w);

#endif
