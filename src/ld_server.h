#ifndef LD_SERVER_H
#define LD_SERVER_H

#include "ld_common.h"

struct event_base;
struct ld_config;

/* TRANSITIONAL, deleted when the lock, cache, lockwait and pubsub modules
 * take the struct ld_ctx at init: they still read this copy of the process
 * state, which ld_server.c keeps in step with its ctx. Nothing new may use
 * it; the core modules read the ctx they were given. */
struct ld_server {
    struct event_base *base;
    struct ld_config *cfg;
    uint64_t start_ms;
    const char *instance;
    bool shutting_down;
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
