#ifndef LD_SERVER_H
#define LD_SERVER_H

#include "ld_common.h"

struct event_base;
struct ld_config;
struct ld_ctx;

struct ld_options {
    const char *conf_path;
    bool conf_explicit; /* -c given: a missing file is an error */
    bool foreground;
};

/* Load the configuration (defaults when the default file is missing);
 * on error prints "file:line:col: message" to stderr. */
int ld_server_load_config(const struct ld_options *opt, struct ld_config *cfg);

/* Initialise every module with CTX and connect their callbacks, opening
 * no socket (the daemon's start, and harnesses that drive sessions
 * without listeners). */
int ld_server_wire(const struct ld_ctx *ctx);

/* Run the daemon until it stops; returns the process exit status. */
int ld_server_run(const struct ld_options *opt, struct ld_config *cfg);

#endif
