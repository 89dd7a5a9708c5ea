#ifndef LD_LISTEN_H
#define LD_LISTEN_H

#include "ld_common.h"

struct event_base;
struct ld_config;

struct ld_listener {
    struct evconnlistener *evl;
    bool is_unix;
    bool auth_required;     /* TCP with auth_token set */
    char name[128];         /* path or host:port, for logs */
    int port;               /* TCP: the bound port */
};

/* Open the configured listeners, or adopt systemd's sockets when passed. */
int ld_listen_start(struct event_base *base, const struct ld_config *cfg);
/* Stop accepting (graceful stop); the Unix socket file is removed. */
void ld_listen_stop(void);

#endif
