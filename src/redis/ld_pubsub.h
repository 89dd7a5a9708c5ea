#ifndef LD_PUBSUB_H
#define LD_PUBSUB_H

#include "ld_common.h"

struct ld_ctx;

/* One subscriber connection per daemon to the Redis of redis.* (one per
 * master in cluster mode), and one per independent instance added with
 * ld_pubsub_add_backend (lock.redlock). Channels are subscribed while at
 * least one local subscription wants them and unsubscribed after. */

#define LD_PUBSUB_MAX_BACKENDS 16

enum ld_pubsub_event {
    LD_PUBSUB_SUBSCRIBED, /* Redis confirmed the subscription (again after a
                             reconnect): messages from now on will arrive */
    LD_PUBSUB_MESSAGE,    /* a message was published on the channel */
    LD_PUBSUB_LOST        /* the subscriber connection broke: messages may
                             have been missed; SUBSCRIBED follows once it is
                             back */
};

typedef void ld_pubsub_cb(enum ld_pubsub_event ev, const char *msg, size_t len,
                          void *arg);

struct ld_pubsub_sub;

/* Callbacks are never called from inside subscribe/unsubscribe; a callback
 * may unsubscribe its own or any other subscription. */
struct ld_pubsub_sub *ld_pubsub_subscribe(const char *channel, size_t len,
                                          ld_pubsub_cb *cb, void *arg);
/* The same on backend BACKEND (0: redis.*, the one above). */
struct ld_pubsub_sub *ld_pubsub_subscribe_at(int backend, const char *channel,
                                             size_t len, ld_pubsub_cb *cb,
                                             void *arg);
/* One subscription to CHANNEL on each of the N BACKENDS, heard as one:
 *   MESSAGE     from whichever backend delivers it first; the copies of
 *               the same payload from the other backends are dropped
 *               (a publisher sends each message, with a payload of its
 *               own, to several of them);
 *   SUBSCRIBED  once QUORUM of them are subscribed, and again when one
 *               lost comes back while a quorum is (it may have missed
 *               a message published on fewer than a quorum);
 *   LOST        when one of them is lost.
 * Ended with ld_pubsub_unsubscribe. */
struct ld_pubsub_sub *ld_pubsub_subscribe_group(const int *backends, int n,
                                                int quorum,
                                                const char *channel,
                                                size_t len, ld_pubsub_cb *cb,
                                                void *arg);
void ld_pubsub_unsubscribe(struct ld_pubsub_sub *sub);

int ld_pubsub_init(const struct ld_ctx *ctx);
/* A subscriber backend at ADDRESS ("host:port" or a socket path), with a
 * connection of its own; after init, before start. Its number (1..), or
 * LD_ERR. */
int ld_pubsub_add_backend(const char *address);
/* Connects, unless in sentinel mode no master is known yet. */
void ld_pubsub_start(void);
/* Sentinel mode: subscribe at the master at ADDR from now on (the first
 * call connects; later ones move the connection, and every subscription
 * hears LOST, then SUBSCRIBED again there). */
struct ld_conn_addr;
void ld_pubsub_set_address(const struct ld_conn_addr *addr);
void ld_pubsub_free(void);

#endif
