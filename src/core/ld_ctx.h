#ifndef LD_CTX_H
#define LD_CTX_H

#include "ld_common.h"

struct event_base;
struct ld_config;

/* What every module is given at init, instead of reaching for a global:
 * one signature for all, int ld_X_init(const struct ld_ctx *ctx). The
 * struct belongs to ld_server.c, which alone writes it; modules keep the
 * pointer and read the fields each time, so a reload (which points CFG
 * at the new configuration) and the start of a shutdown reach them. */
struct ld_ctx {
    struct event_base *base;
    const struct ld_config *cfg; /* the live configuration */
    const char *instance;        /* random id of this daemon run */
    uint64_t start_ms;           /* monotonic, at start */
    bool shutting_down;          /* no new work is taken */
    bool draining; /* SIGTERM: open sessions served, new ones refused */
};

#endif
