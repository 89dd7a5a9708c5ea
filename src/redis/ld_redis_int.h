#ifndef LD_REDIS_INT_H
#define LD_REDIS_INT_H

/* What ld_redis.c (the command queue), ld_redis_slot.c (the connections
 * under it) and ld_cluster.c (the slot map of cluster mode) share; no
 * other module includes this. */

#include "ld_common.h"
#include "ld_conn.h"
#include "ld_defer.h"
#include "ld_lua.h"
#include "ld_redis.h"

#include <sys/queue.h>

#include <hiredis/hiredis.h>

struct event;
struct ld_redis_conn_hooks;

#define REDIS_SCRIPT_ONE(name) +1
#define REDIS_N_SCRIPTS (0 LD_LUA_SCRIPTS(REDIS_SCRIPT_ONE))
/* The batch script (ld_redis_batch.c) comes after the files' scripts. */
#define REDIS_BATCH_SCRIPT REDIS_N_SCRIPTS

#define MAX_CONNS LD_REDIS_CONNS_MAX /* per pool */
#define STACK_ARGS 32
#define MAX_WAITING 4096 /* commands awaiting a connection */

enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_HANDSHAKE, CONN_READY };

struct rconn;

struct rnode;

struct rbatch;

/* What only some commands need (cluster mode, a timeout of their own),
 * kept apart so that the common command stays small. */
struct rcmd_x {
    struct event *timeout_ev; /* only with a timeout_ms of its own */
    /* Cluster mode: the route key's slot, a node a redirection named
     * (ASK: after ASKING), how often it was redirected or retried. */
    struct rnode *target;
    uint64_t issued_us;
    uint64_t retry_at_us;
    unsigned slot;
    int redirects;
    int tries;
    bool asking;
    bool retrying; /* on the retry list (TRYAGAIN, CLUSTERDOWN) */
};

struct rcmd {
    void (*cb)(redisReply *reply, void *arg);
    void *arg;
    struct rconn *conn;
    uint64_t sent_us;
    TAILQ_ENTRY(rcmd) link; /* connection FIFO, waiting or failure list */
    char *fail_reason;
    char **argv;
    size_t *argvlen;
    struct rcmd_x *x; /* NULL unless needed */
    uint64_t route_hash;
    uint64_t wait_until_us; /* when waiting for a connection ends */
    unsigned flags;         /* LD_REDIS_F_* */
    int script;             /* -1 unless an EVALSHA */
    int argc;               /* script: keys + args, kept for NOSCRIPT */
    unsigned timeout_ms;    /* ld_redis_opts.timeout_ms, 0: redis's */
    /* Small: the records are kept for reuse (redis_cmd_new), but a
     * burst past the spares allocates one per command. */
    int16_t instance; /* ld_redis_opts.instance, <= MAX_INSTANCES */
    enum ld_redis_pool pool;
    uint8_t fail_outcome; /* on the failure list */
    bool answered;        /* the callback has had UNKNOWN already */
    bool noscript;        /* resent as EVAL after NOSCRIPT */
    bool internal;        /* handshake step: cb gets the rconn */
    bool hook;            /* the step of ld_redis_conn_hooks */
    bool waiting;         /* on the list of those awaiting a conn */
    /* A script's kept arguments (ARGV points here) when they fit, so
     * that they need no block of their own; last, as a reused record is
     * cleared up to here only. */
    union {
        char bytes[256];
        void *align;
    } keep;
};

TAILQ_HEAD(rcmd_queue, rcmd);

struct rconn {
    int idx;
    struct rnode *node;
    struct ld_conn *conn; /* NULL once a set-aside one is closed */
    enum conn_state state;
    struct event *timeout_ev; /* set aside: the drain bound */
    struct rcmd_queue sent;   /* sent, awaiting replies, in send order */
    unsigned handshake_left;
    bool handshake_failed;
    uint64_t id; /* its ld_conn_id, for pinned commands */
    enum ld_redis_pool pool;
    bool draining; /* set aside after a timeout */
    bool closing;
    uint64_t drain_end_us;
    LIST_ENTRY(rconn) dlink; /* list of draining connections */
    char why[192];           /* why it is going down, for callbacks */
    struct rbatch *batch;    /* scripts held for one batch this turn */
};

/* One Redis server and the connections to it: the one of standalone or
 * sentinel mode, an instance of lock.redlock. Commands that find none of
 * its connections ready while one is being established wait in its
 * queue. */
struct rnode {
    int instance; /* 0: the backend of redis.*; k: instance k; -1: the
                     queue of cluster commands awaiting a slot map */
    bool is_master, was_master; /* cluster: in the latest and last map */
    struct ld_conn_addr addr;
    char address[300];
    bool have_addr; /* false in sentinel mode until a master is known */
    bool started;
    struct rconn *conns; /* the shared pool, then the lock pool */
    int n_conns;         /* the shared pool: conns[0, n_conns) */
    int n_lock;          /* the lock pool after it, once started */
    bool lock_ever_ready;
    int n_ready;          /* of the shared pool */
    bool known_down;      /* the latest connect attempt failed */
    char last_error[160]; /* of the latest failed connect */
    char shas[REDIS_N_SCRIPTS + 1][41];
    uint64_t reload_us; /* when a NOSCRIPT last reloaded every script */
    /* Commands issued while no connection was ready but one was being
     * established, in issue order; bounded by count and by their
     * timeout from the issue. */
    struct rcmd_queue waiting;
    int n_waiting;
    struct event *wait_ev;
    uint64_t wait_at_us; /* when wait_ev fires; 0: not armed */
};

struct state_watcher {
    void (*fn)(bool up, void *arg);
    void *arg;
};

struct inst_watcher {
    void (*fn)(int k, bool up, void *arg);
    void *arg;
};

#define MAX_INSTANCES 16

struct ld_redis_mod {
    const struct ld_ctx *ctx;
    /* Every node; an instance k >= 1 is inst[k]. */
    struct rnode **nodes;
    int n_nodes;
    struct rnode *inst[MAX_INSTANCES + 1];
    int n_inst;
    int n_conns; /* redis.connections, per node and pool */
    LIST_HEAD(, rconn) draining;
    uint64_t next_id;
    struct rcmd_queue failed; /* answered from the loop by fail_defer */
    struct ld_defer fail_defer;
    struct state_watcher watchers[8];
    int n_watchers;
    struct inst_watcher inst_watchers[8];
    int n_inst_watchers;
    double rtt_us;
    bool freeing;
    bool started;
    void (*doubt_fn)(const char *why, void *arg);
    void *doubt_arg;
    /* Cluster mode (ld_cluster.c). */
    bool cluster;
    char label[300];      /* ld_redis_address() */
    struct rnode **slots; /* the master of each slot; NULL before a map */
    bool have_map;
    struct rnode *unmapped;
    struct event *refresh_ev;
    bool refreshing, refresh_again, refresh_wanted;
    uint64_t last_refresh_ms;
    int refresh_turn;
    char *cluster_bodies[REDIS_N_SCRIPTS]; /* PUBLISH made SPUBLISH */
    struct rcmd_queue retry;
    int n_retry;
    struct event *retry_ev;
    void (*map_fn)(bool changed, void *arg);
    void *map_arg;
    void (*failover_fn)(void *arg);
    void *failover_arg;
    const struct ld_redis_conn_hooks *hooks;
};

extern struct ld_redis_mod redis_mod;
extern const char *const redis_script_bodies[];
/* The body of script I as node N gets it (SPUBLISH on a cluster). */
const char *redis_script_body(const struct rnode *n, int i);
extern const char *const redis_script_names[];

/* ld_redis.c */
void redis_set_ready(struct rconn *c, bool ready);
void redis_conn_up(struct rconn *c);
void redis_fail_sent(struct rconn *c, const char *why);
void redis_reply_cb(struct ld_conn *conn, redisReply *reply, void *owner);
int redis_send_argv(struct rconn *c, struct rcmd *cmd, int argc,
                    const char **argv, const size_t *argvlen);
int redis_script_load(struct rconn *c, int i, int script, const char *arg);
void redis_call_cb(struct rcmd *cmd, redisReply *reply,
                   enum ld_redis_outcome outcome, const char *reason,
                   uint64_t conn_id);
void redis_waiting_retry(struct rnode *n);
struct rcmd *redis_cmd_new(void);
void redis_rcmd_free(struct rcmd *cmd);
struct rcmd_x *redis_cmd_x(struct rcmd *cmd);
void redis_doubt(const struct rnode *n, const char *why);
struct rnode *redis_node_new(int instance, const struct ld_conn_addr *addr,
                             const char *text);
void redis_node_start(struct rnode *n);
void redis_route(struct rcmd *cmd);
void redis_send_to(struct rnode *n, int argc, const char **argv,
                   const size_t *argvlen,
                   void (*cb)(redisReply *reply, void *arg), void *arg);
void redis_fail_later(struct rcmd *cmd, enum ld_redis_outcome outcome,
                      const char *reason);
uint64_t redis_cmd_timeout_us(const struct rcmd *cmd);
void redis_map_changed(bool changed, bool failover);

int redis_send_script(struct rconn *c, struct rcmd *cmd);
void redis_timeout_arm(struct rcmd *cmd);

/* ld_redis_batch.c */
int redis_batch_init(void);
void redis_batch_free(void);
const char *redis_batch_body(void);
bool redis_batch_add(struct rconn *c, struct rcmd *cmd, uint64_t pin);
void redis_batch_flush_conn(struct rconn *c);
void redis_batch_drop(struct rconn *c, const char *why);
bool redis_batch_owns(const struct rcmd *cmd);
void redis_batch_release(struct rcmd *cmd);
long long redis_batch_pending(void);

/* ld_cluster.c */
int redis_cluster_init(void);
void redis_cluster_free(void);
struct rnode *redis_cluster_node(unsigned slot);
bool redis_cluster_redirect(struct rcmd *cmd, const redisReply *reply);
void redis_cluster_refresh_soon(const char *why);
void redis_cluster_node_up(struct rnode *n);
void redis_hook_lost(uint64_t conn_id);

/* ld_redis_slot.c */
void redis_slot_init(struct rnode *n, struct rconn *c, int idx,
                     enum ld_redis_pool pool);
void redis_slot_start(struct rconn *c);
void redis_handshake_reply(struct rconn *c, redisReply *reply,
                           struct rcmd *cmd);
void redis_drain_close(struct rconn *d);

#endif
