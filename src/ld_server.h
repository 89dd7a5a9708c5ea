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

struct ld_options {
    const char *conf_path;
    bool conf_explicit;          /* -c given: a missing file is an error */
    bool foreground;
};

/* Load the configuration (defaults when the default file is missing);
 * on error prints "file:line:col: message" to stderr. */
int ld_server_load_config(const struct ld_options *opt,
                          struct ld_config *cfg);

/* Run the daemon until it stops; returns the process exit status. */
int ld_server_run(const struct ld_options *opt, struct ld_config *cfg);

#endif
