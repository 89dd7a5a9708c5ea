#ifndef LD_PUBSUB_H
#define LD_PUBSUB_H

#include "ld_common.h"

struct ld_ctx;

/* One subscriber connection per daemon. Channels are subscribed while at
 * least one local subscription wants them and unsubscribed after. */

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
void ld_pubsub_unsubscribe(struct ld_pubsub_sub *sub);

int ld_pubsub_init(const struct ld_ctx *ctx);
/* Connects, unless in sentinel mode no master is known yet. */
void ld_pubsub_start(void);
/* Sentinel mode: subscribe at the master at ADDR from now on (the first
 * call connects; later ones move the connection, and every subscription
 * hears LOST, then SUBSCRIBED again there). */
struct ld_conn_addr;
void ld_pubsub_set_address(const struct ld_conn_addr *addr);
void ld_pubsub_free(void);

#endif
