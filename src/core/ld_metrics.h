#ifndef LD_METRICS_H
#define LD_METRICS_H

#include "ld_common.h"

struct event_base;

/* Prometheus text at http://metrics.listen/metrics (libevent's evhttp).
 * LISTEN "" disables. Port 0 binds a free port; *BOUND_PORT gets it. */
int ld_metrics_start(struct event_base *base, const char *listen,
                     int *bound_port);
void ld_metrics_stop(void);

/* What GET /readyz asks: NULL when ready, else the one-word reason it
 * answers 503 with. Without it /readyz answers as /livez does. */
typedef const char *ld_metrics_ready_fn(void);
void ld_metrics_set_ready(ld_metrics_ready_fn *fn);

#endif
