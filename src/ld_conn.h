#ifndef LD_CONN_H
#define LD_CONN_H

#include "ld_common.h"

struct event_base;
struct ld_config;
struct redisAsyncContext;

/* What every Redis connection of the daemon shares, whoever owns it (the
 * command connections of ld_redis, the subscriber of ld_pubsub): where
 * it goes, how it is opened, how its retries back off, and the AUTH it
 * starts with. Owners keep their own queues and states on top.
 *
 * The address is a value the owner may replace at run time (a failover
 * names a new master); the next connect uses it. */
struct ld_conn_addr {
    char host[256];               /* or the Unix socket path */
    int port;
    bool is_unix;
};

/* "host:port" or an absolute Unix socket path. */
int ld_conn_parse_address(const char *addr, struct ld_conn_addr *out);

/* Open a connection to ADDR on BASE. This is the one place a transport
 * is made: TLS plugs in here. NULL, with the reason in ERR, when it
 * failed at once. The owner sets the connect and disconnect callbacks. */
struct redisAsyncContext *ld_conn_open(const struct ld_conn_addr *addr,
                                       struct event_base *base, char *err,
                                       size_t errlen);

/* Exponential backoff between attempts, with jitter so that many daemons
 * do not stampede a Redis that just came back. */
struct ld_backoff {
    int ms;
};
void ld_backoff_reset(struct ld_backoff *b);
/* The delay before the next attempt; doubles the next one, to a cap. */
int ld_backoff_next_ms(struct ld_backoff *b);

/* The AUTH command of CFG (ACL user and password, or password only) in
 * ARGV/ARGVLEN (room for 3); 0 when no password is set. */
int ld_conn_auth_argv(const struct ld_config *cfg, const char **argv,
                      size_t *argvlen);

#endif
