#ifndef LD_FSYNC_H
#define LD_FSYNC_H

#include "ld_common.h"

/* One worker thread that makes a file durable for the event loop: the
 * loop hands it a descriptor, goes on serving everyone else while the
 * disk works, and hears back through an eventfd in its own loop
 * iteration. One sync at a time; a caller that has more to sync waits
 * for the answer and hands over the next group then (group commit). */

struct event_base;
struct ld_fsync;

/* Called in the loop with the sync function's result and errno. */
typedef void ld_fsync_done_fn(int rc, int err, void *arg);

/* NULL (logged) when the thread or the eventfd cannot be made. */
struct ld_fsync *ld_fsync_new(struct event_base *base);

/* Waits for a sync still running; its callback is not called. */
void ld_fsync_free(struct ld_fsync *s);

/* Run FN(FD) on the thread, then DONE(rc, errno, ARG) in the loop. FD
 * must stay open until then. Only while none is running. */
void ld_fsync_run(struct ld_fsync *s, int fd, int (*fn)(int),
                  ld_fsync_done_fn *done, void *arg);

bool ld_fsync_busy(const struct ld_fsync *s);

#endif
