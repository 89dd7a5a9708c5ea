#ifndef LD_LISTEN_H
#define LD_LISTEN_H

#include "ld_common.h"

struct ld_ctx;

struct ld_listener {
    struct evconnlistener *evl;
    bool is_unix;
    bool auth_required; /* TCP with auth_token set */
    char name[128];     /* path or host:port, for logs */
    int port;           /* TCP: the bound port */
};

/* Open the configured listeners, or adopt systemd's sockets when passed;
 * accepted connections become sessions. */
int ld_listen_init(const struct ld_ctx *ctx);
/* The bound TCP port (0: no TCP listener). */
int ld_listen_tcp_port(void);
/* Stop accepting (graceful stop); the Unix socket file is removed. */
void ld_listen_stop(void);

#endif
