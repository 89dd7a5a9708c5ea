#ifndef LD_REDIS_INT_H
#define LD_REDIS_INT_H

/* What ld_redis.c (the command queue) and ld_redis_slot.c (the
 * connections under it) share; no other module includes this. */

#include "ld_common.h"
#include "ld_conn.h"
#include "ld_defer.h"
#include "ld_lua.h"

#include <sys/queue.h>

#include <hiredis/hiredis.h>

struct event;
struct ld_redis_conn_hooks;

/* Not ld_redis.h: ld_redis.c includes this header, and the module graph
 * must stay a DAG. Enums are ints here for that reason. */
#define REDIS_SCRIPT_ONE(name) +1
#define REDIS_N_SCRIPTS (0 LD_LUA_SCRIPTS(REDIS_SCRIPT_ONE))

#define MAX_CONNS 64 /* per pool */
#define STACK_ARGS 32
#define MAX_WAITING 4096 /* commands awaiting a connection */

enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_HANDSHAKE, CONN_READY };

struct rconn;

struct rcmd {
    void (*cb)(redisReply *reply, void *arg);
    void *arg;
    struct rconn *conn;
    uint64_t sent_us;
    TAILQ_ENTRY(rcmd) link; /* connection FIFO, waiting or failure list */
    unsigned flags;         /* LD_REDIS_F_* */
    bool answered;          /* the callback has had UNKNOWN already */
    bool noscript;          /* resent as EVAL after NOSCRIPT */
    int fail_outcome;       /* on the failure list */
    char *fail_reason;
    int script; /* -1 unless an EVALSHA */
    int argc;   /* script: keys + args, kept for NOSCRIPT */
    char **argv;
    size_t *argvlen;
    bool internal; /* handshake step: cb gets the rconn */
    bool hook;     /* the step of ld_redis_conn_hooks */
    bool waiting;  /* on the list of those awaiting a conn */
    int pool;      /* while waiting */
    uint64_t route_hash;
    uint64_t wait_until_us; /* when waiting for a connection ends */
};

TAILQ_HEAD(rcmd_queue, rcmd);

struct rconn {
    int idx;
    struct ld_conn *conn; /* NULL once a set-aside one is closed */
    enum conn_state state;
    struct event *timeout_ev; /* set aside: the drain bound */
    struct rcmd_queue sent;   /* sent, awaiting replies, in send order */
    unsigned handshake_left;
    bool handshake_failed;
    uint64_t id;   /* its ld_conn_id, for pinned commands */
    int pool;      /* enum ld_redis_pool */
    bool draining; /* set aside after a timeout */
    bool closing;
    uint64_t drain_end_us;
    LIST_ENTRY(rconn) dlink; /* list of draining connections */
    char why[192];           /* why it is going down, for callbacks */
};

struct state_watcher {
    void (*fn)(bool up, void *arg);
    void *arg;
};

struct ld_redis_mod {
    const struct ld_ctx *ctx;
    struct rconn conns[2 * MAX_CONNS];
    int n_conns; /* the shared pool: conns[0, n_conns) */
    int n_lock;  /* the lock pool after it, once started */
    bool lock_ever_ready;
    LIST_HEAD(, rconn) draining;
    uint64_t next_id;
    char last_error[160]; /* of the latest failed connect */
    int n_ready;
    struct ld_conn_addr addr;
    char address[300];
    char shas[REDIS_N_SCRIPTS + 1][41];
    struct rcmd_queue failed; /* answered from the loop by fail_defer */
    struct ld_defer fail_defer;
    /* Commands issued while no connection was ready but one was being
     * established, in issue order; bounded by count and by
     * redis.timeout_ms from the issue. */
    struct rcmd_queue waiting;
    int n_waiting;
    struct event *wait_ev;
    bool known_down; /* the latest connect attempt failed */
    struct state_watcher watchers[8];
    int n_watchers;
    double rtt_us;
    bool freeing;
    bool have_addr; /* false in sentinel mode until a master is known */
    void (*doubt_fn)(const char *why, void *arg);
    void *doubt_arg;
    const struct ld_redis_conn_hooks *hooks;
};

extern struct ld_redis_mod redis_mod;
extern const char *const redis_script_bodies[];
extern const char *const redis_script_names[];

/* ld_redis.c */
void redis_set_ready(struct rconn *c, bool ready);
void redis_fail_sent(struct rconn *c, const char *why);
void redis_reply_cb(struct ld_conn *conn, redisReply *reply, void *owner);
int redis_send_argv(struct rconn *c, struct rcmd *cmd, int argc,
                    const char **argv, const size_t *argvlen);
void redis_call_cb(struct rcmd *cmd, redisReply *reply, int outcome,
                   const char *reason, uint64_t conn_id);
void redis_waiting_retry(void);
void redis_rcmd_free(struct rcmd *cmd);
void redis_doubt(const char *why);
void redis_hook_lost(uint64_t conn_id);

/* ld_redis_slot.c */
void redis_slot_init(struct rconn *c, int idx, int pool);
void redis_slot_start(struct rconn *c);
void redis_handshake_reply(struct rconn *c, redisReply *reply,
                           struct rcmd *cmd);
void redis_drain_close(struct rconn *d);

#endif
