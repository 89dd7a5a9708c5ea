#ifndef LD_SERVER_H
#define LD_SERVER_H

#include "ld_common.h"

struct event_base;
struct ld_config;

/* Process state, in one place. */
struct ld_server {
    struct event_base *base;
    struct ld_config *cfg;       /* live configuration (reload updates it) */
    const char *conf_path;
    uint64_t start_ms;
    char instance[17];           /* random id of this daemon run */
    bool shutting_down;
    int tcp_port;                /* bound TCP port (useful with port 0) */
};

extern struct ld_server ld_srv;

#endif
