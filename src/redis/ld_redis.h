#ifndef LD_REDIS_H
#define LD_REDIS_H

#include "ld_common.h"
#include "ld_lua.h"

#include <hiredis/hiredis.h>

struct ld_conn_addr;
struct ld_ctx;

/* The Redis backend: per Redis server (a node), redis.connections
 * pipelined command connections shared by every session. Commands from all sessions are appended to the chosen
 * connection's output buffer and leave in one write per loop iteration,
 * which is the auto-pipelining the daemon's throughput rests on. Commands
 * with the same route go to the same connection, so their effects keep the
 * order in which they were issued. */

/* Script ids, one per file in src/lua/ (LD_SCRIPT_lock_acquire, ...). */
enum ld_script_id {
#define LD_SCRIPT_ENUM(name) LD_SCRIPT_##name,
    LD_LUA_SCRIPTS(LD_SCRIPT_ENUM)
#undef LD_SCRIPT_ENUM
        LD_SCRIPT__COUNT
};

/* REPLY is NULL when the command got no answer: no connection was ready,
 * redis.timeout_ms passed, or the connection broke (the command may then
 * have run or not; ld_redis_outcome tells which). Redis errors arrive as
 * REDIS_REPLY_ERROR replies. The reply is freed after the callback
 * returns. The callback is never called from inside ld_redis_command/
 * ld_redis_script. */
typedef void ld_redis_cb(redisReply *reply, void *arg);

/* What a callback is being told. Valid only inside the callback. */
enum ld_redis_outcome {
    LD_REDIS_ANSWERED, /* REPLY is Redis' answer (maybe an error reply) */
    LD_REDIS_NOT_SENT, /* never left the daemon: nothing changed */
    LD_REDIS_UNKNOWN,  /* sent, no answer in time: it may have run */
    LD_REDIS_LATE,     /* the late answer after UNKNOWN (LD_REDIS_F_LATE) */
    LD_REDIS_LOST      /* sent, and no answer will come: it may have run */
};
enum ld_redis_outcome ld_redis_outcome(void);

/* Why REPLY is NULL or an error, for logs and error messages ("timed out
 * after 1000 ms", "no connection (last error: Connection refused)", the
 * error text of Redis). "" when the command was answered normally. Valid
 * only inside the callback. */
const char *ld_redis_failure_reason(void);

/* The connection the command went on (0: none), for
 * ld_redis_opts.pin. Valid only inside the callback. */
uint64_t ld_redis_conn_id(void);

/* A command that got no answer within redis.timeout_ms is answered with
 * LD_REDIS_UNKNOWN at once, but its connection is not closed then: it is
 * set aside (no new commands, except pinned ones) and kept for up to
 * LD_REDIS_DRAIN_FACTOR times redis.timeout_ms so that Redis' late
 * answers still arrive. With LD_REDIS_F_LATE the callback is then called a
 * second time, exactly once: LD_REDIS_LATE with the reply, or
 * LD_REDIS_LOST (NULL) when the connection was given up or broke. Without
 * the flag the late answer is dropped. A command with the flag that goes
 * on a connection which breaks before it was answered gets one call,
 * LD_REDIS_LOST. A write whose callback sees UNKNOWN or LOST must not be
 * reported as "nothing changed"; writes of the cache may use this the
 * same way as the locks. */
#define LD_REDIS_F_LATE 1u
#define LD_REDIS_DRAIN_FACTOR 10

/* Which set of connections a command uses. LD_REDIS_POOL_LOCK is a second
 * set of redis.connections connections, opened on first use, for the lock
 * scripts while lock.wait_replicas is set: WAIT blocks the connection it
 * is sent on until the replicas confirm or its timeout passes, and WAIT
 * only counts the writes of its own connection, so a grant and its WAIT
 * go together on one of these and never hold up the shared ones. */
/* The most connections of a pool (redis.connections is at most this). */
#define LD_REDIS_CONNS_MAX 64

enum ld_redis_pool { LD_REDIS_POOL_SHARED, LD_REDIS_POOL_LOCK };

struct ld_redis_opts {
    unsigned flags; /* LD_REDIS_F_* */
    enum ld_redis_pool pool;
    /* Non-zero: send on this connection (from ld_redis_conn_id) only,
     * after every command sent on it before, also when it has been set
     * aside after a timeout. When it is gone the command is answered
     * LD_REDIS_NOT_SENT. */
    uint64_t pin;
    int instance;        /* 0: the backend of redis.* routed by key; k:
                            instance k (ld_redis_add_instance) */
    unsigned timeout_ms; /* 0: redis.timeout_ms; else this, for this
                            command (from its issue; a shorter one answers
                            UNKNOWN without setting the connection aside) */
};

int ld_redis_init(const struct ld_ctx *ctx);
void ld_redis_free(void);

/* Start connecting (called once at start). */
void ld_redis_start(void);

bool ld_redis_ready(void);

/* Independent instances beside the backend of redis.* (lock.redlock).
 * Added before ld_redis_start(); each gets its own connections
 * (redis.connections of them), the same handshake (AUTH, SELECT,
 * TLS when redis.tls.enabled), scripts, timeouts, outcomes. Returns the
 * instance number, 1..N (LD_ERR: a bad address, too many, or too late). */
int ld_redis_add_instance(const char *address);

/* Whether instance K (0 = the main backend) has a ready connection. */
bool ld_redis_instance_ready(int k);

/* Up/down notifications per instance (like ld_redis_on_state). */
typedef void ld_redis_instance_state_fn(int k, bool up, void *arg);
void ld_redis_on_instance_state(ld_redis_instance_state_fn *fn, void *arg);

/* Commands sent and not yet answered, over all connections (the graceful
 * stop waits for this to reach zero, within a bound). */
long long ld_redis_outstanding(void);

/* Send a command. ROUTE (usually the Redis key) picks the connection. */
void ld_redis_command(const char *route, size_t route_len, int argc,
                      const char **argv, const size_t *argvlen,
                      ld_redis_cb *cb, void *arg);

/* Run a script by EVALSHA (EVAL after NOSCRIPT). ARGV holds NKEYS keys
 * followed by the script's arguments (ARGC in all). */
void ld_redis_script(enum ld_script_id script, const char *route,
                     size_t route_len, int nkeys, int argc, const char **argv,
                     const size_t *argvlen, ld_redis_cb *cb, void *arg);

/* The same with options (OPTS may be NULL). */
void ld_redis_command_ex(const struct ld_redis_opts *opts, const char *route,
                         size_t route_len, int argc, const char **argv,
                         const size_t *argvlen, ld_redis_cb *cb, void *arg);
void ld_redis_script_ex(const struct ld_redis_opts *opts,
                        enum ld_script_id script, const char *route,
                        size_t route_len, int nkeys, int argc,
                        const char **argv, const size_t *argvlen,
                        ld_redis_cb *cb, void *arg);

/* Notified when the backend becomes usable (first connection ready after
 * none was) and when it becomes unusable (no connection ready). */
typedef void ld_redis_state_fn(bool up, void *arg);
void ld_redis_on_state(ld_redis_state_fn *fn, void *arg);

/* Host/port/path of the address in use (the master, in sentinel mode;
 * "" while none is known), for logs and stats. */
const char *ld_redis_address(void);

/* Sentinel mode: the master is at ADDR (TEXT as "host:port") from now
 * on. The first call starts the connections; later ones move every
 * connection there (what was sent on the old one is answered as lost:
 * it may have run). */
void ld_redis_set_address(const struct ld_conn_addr *addr, const char *text);

/* Called when the master is in doubt: a ready connection was lost, an
 * attempt failed (a handshake that found a replica included), or Redis
 * answered READONLY or LOADING. One watcher (the Sentinel follower). */
typedef void ld_redis_doubt_fn(const char *why, void *arg);
void ld_redis_on_doubt(ld_redis_doubt_fn *fn, void *arg);

/* Cluster mode (redis.mode: cluster). */
bool ld_redis_is_cluster(void);
/* Ask the cluster for its slot map again soon (rate-limited). */
void ld_redis_cluster_refresh(void);
/* The slot map was refreshed; CHANGED when it differs (or a MOVED moved
 * a slot). One watcher (the subscriber, which moves its channels where
 * their slots now live). */
typedef void ld_redis_map_fn(bool changed, void *arg);
void ld_redis_on_map(ld_redis_map_fn *fn, void *arg);
/* Cluster mode: a master's slots were taken over by another node (a
 * failover, forced or not). Called before the state watchers hear "up",
 * which makes the lock module check every lock held. One watcher. */
typedef void ld_redis_failover_fn(void *arg);
void ld_redis_on_failover(ld_redis_failover_fn *fn, void *arg);
/* Where commands routed by ROUTE go now: the master of its slot in
 * cluster mode, the one server otherwise. LD_ERR: not known yet. */
int ld_redis_route_address(const char *route, size_t route_len,
                           struct ld_conn_addr *addr, char *text, size_t len);

/* Watches the shared command connections for the near cache's client
 * tracking. HANDSHAKE may add one command (ARGV, at most MAX arguments,
 * valid during the call; returns the count, 0 for none) as the last step
 * of a connection's handshake, after the scripts: the connection takes no
 * traffic before it is answered, and REPLY hears that answer (a Redis
 * error there does not fail the handshake). LOST hears that a connection
 * whose handshake had begun is gone, or set aside after a stall; its id
 * is never used again. One watcher; any call may be NULL. */
struct ld_redis_conn_hooks {
    int (*handshake)(uint64_t conn_id, const char **argv, size_t *argvlen,
                     int max, void *arg);
    void (*reply)(uint64_t conn_id, const redisReply *reply, void *arg);
    void (*lost)(uint64_t conn_id, void *arg);
    /* Cluster mode: the slot map was refreshed, as ld_redis_on_map, and
     * FAILOVER as ld_redis_on_failover (before the watchers of those). */
    void (*map)(bool changed, bool failover, void *arg);
    void *arg;
};
void ld_redis_set_conn_hooks(const struct ld_redis_conn_hooks *hooks);
/* The server connection CONN_ID goes to (cluster mode: its node), in
 * ADDR and as "host:port" in TEXT. LD_ERR: no such connection. */
int ld_redis_conn_address(uint64_t conn_id, struct ld_conn_addr *addr,
                          char *text, size_t len);

/* "host:port" or an absolute Unix socket path. */
int ld_redis_parse_address(const char *addr, char *host, size_t hostlen,
                           int *port, bool *is_unix);

/* Helpers for reply checks. */
bool ld_reply_is_error(const redisReply *r, const char *prefix);
/* An error reply of a Redis that is up but cannot serve the command now
 * (loading, busy, a replica, no replica in sync, out of memory, unable to
 * persist, a slot elsewhere): the caller answers redis_unavailable, as for
 * a Redis it cannot reach, never "wrong type" or "internal". A script
 * that meets one raises it. */
bool ld_reply_is_unavailable(const redisReply *r);

/* The connection of the shared pool (0 .. LD_REDIS_CONNS_MAX - 1) that
 * the commands routed by ROUTE take while it is up: those of one route
 * keep their order, and so do commands of several routes sent as one,
 * routed by one of them (lock_renew_many). */
unsigned ld_redis_route_lane(const char *route, size_t len);

#endif
