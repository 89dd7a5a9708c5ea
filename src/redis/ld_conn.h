#ifndef LD_CONN_H
#define LD_CONN_H

#include "ld_common.h"

#include <hiredis/hiredis.h>

struct ld_config;
struct ld_ctx;

/* The one Redis connection core. Every connection of the daemon (the
 * command connections of ld_redis, its lock pool, the subscriber of
 * ld_pubsub) is a struct ld_conn: it connects (TCP or Unix socket) within
 * redis.timeout_ms, backs off with jitter between attempts, runs the
 * handshake (AUTH, SELECT for command connections, CLIENT SETNAME
 * leased:<instance>:<role>, and in sentinel mode ROLE, so that a
 * connection to a server that is no longer the master never takes
 * commands), checks that an idle connection still
 * answers (PING), notices a reply owed for longer than redis.timeout_ms,
 * and tears down. Its owner hears of it through struct ld_conn_ops and
 * keeps its own queues on top.
 *
 * The bytes travel over a libevent bufferevent (made in one place, where
 * TLS plugs in): commands are formatted straight into its output buffer
 * and those of one loop turn leave in one write; replies are read from
 * the socket into hiredis' reader (redisReader), hiredis' only use. */

/* Where a connection goes. The owner may point a connection at a new
 * address at run time (a failover names a new master). */
struct ld_conn_addr {
    char host[256]; /* or the Unix socket path */
    int port;
    bool is_unix;
};

/* "host:port" or an absolute Unix socket path. */
int ld_conn_parse_address(const char *addr, struct ld_conn_addr *out);

enum ld_conn_role {
    LD_CONN_ROLE_CMD,          /* shared command connections */
    LD_CONN_ROLE_LOCK,         /* the lock pool */
    LD_CONN_ROLE_SUB,          /* the subscriber */
    LD_CONN_ROLE_SENTINEL,     /* asks a Sentinel for the master */
    LD_CONN_ROLE_SENTINEL_SUB, /* hears a Sentinel's +switch-master */
    LD_CONN_ROLE_TRACK         /* hears the near cache's invalidations */
};

enum ld_conn_state {
    LD_CONN_DOWN,
    LD_CONN_CONNECTING,
    LD_CONN_HANDSHAKE,
    LD_CONN_READY
};

struct ld_conn;

/* Calls to the owner. None is made from inside ld_conn_send; a callback
 * may send, close the connection or change its address. */
struct ld_conn_ops {
    /* The handshake is done: the owner's commands may go. */
    void (*on_ready)(struct ld_conn *c, void *owner);
    /* The connection went down (WAS_READY) or an attempt failed: no reply
     * owed to the owner will come. WHY is for logs and callers. Unless
     * the owner called ld_conn_no_retry, the next attempt is scheduled. */
    void (*on_down)(struct ld_conn *c, bool was_ready, const char *why,
                    void *owner);
    /* The answer to the owner's oldest command (command roles). */
    void (*on_reply)(struct ld_conn *c, redisReply *reply, void *owner);
    /* What Redis pushes on a subscriber connection: (un)subscribe
     * confirmations and messages. */
    void (*on_push)(struct ld_conn *c, redisReply *reply, void *owner);
    /* A reply has been owed for redis.timeout_ms without progress. NULL:
     * the connection is closed. */
    void (*on_stall)(struct ld_conn *c, void *owner);
};

/* A connection to ADDR (copied) in ROLE. It starts with ld_conn_start. */
struct ld_conn *ld_conn_new(const struct ld_ctx *ctx,
                            const struct ld_conn_addr *addr,
                            enum ld_conn_role role,
                            const struct ld_conn_ops *ops, void *owner);
/* Close without calls to the owner and free. Safe from the owner's
 * callbacks (the memory goes when the callback returns). */
void ld_conn_free(struct ld_conn *c);

void ld_conn_start(struct ld_conn *c);
/* Hand the connection to another owner (a command connection set aside
 * keeps its transport for late answers). */
void ld_conn_set_owner(struct ld_conn *c, const struct ld_conn_ops *ops,
                       void *owner);
/* After the next down, stay down. */
void ld_conn_no_retry(struct ld_conn *c);
/* Go to ADDR from now on: an open connection is closed (the owner hears
 * on_down) and the next attempt goes there at once. */
void ld_conn_set_addr(struct ld_conn *c, const struct ld_conn_addr *addr);
/* Take the connection down now with WHY (on_down follows at once). */
void ld_conn_close(struct ld_conn *c, const char *why);

/* Append a command to the output; it leaves with the loop turn's write.
 * On a command connection its reply comes back through on_reply, in
 * send order. LD_ERR when the connection has no transport. */
int ld_conn_send(struct ld_conn *c, int argc, const char **argv,
                 const size_t *argvlen);

enum ld_conn_state ld_conn_state(const struct ld_conn *c);
/* Changes with every transport, so a command can be pinned to one. */
uint64_t ld_conn_id(const struct ld_conn *c);
/* Of the latest failure ("" if none). */
const char *ld_conn_last_error(const struct ld_conn *c);
/* The peer's address as "host:port" or the path. */
const char *ld_conn_address(const struct ld_conn *c);

/* Idle time after which a ready connection is PINGed (tests shorten
 * it). */
void ld_conn_set_ping_idle_ms(struct ld_conn *c, int ms);

/* Exponential backoff between attempts, with jitter so that many daemons
 * do not stampede a Redis that just came back. */
struct ld_backoff {
    int ms;
};
void ld_backoff_reset(struct ld_backoff *b);
/* The delay before the next attempt; doubles the next one, to a cap. */
int ld_backoff_next_ms(struct ld_backoff *b);

/* The AUTH command of CFG (ACL user and password, or password only) in
 * ARGV/ARGVLEN (room for 3) for a connection in ROLE (the Sentinels have
 * credentials of their own); 0 when no password is set. */
int ld_conn_auth_argv(const struct ld_config *cfg, enum ld_conn_role role,
                      const char **argv, size_t *argvlen);

#endif
