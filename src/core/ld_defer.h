#ifndef LD_DEFER_H
#define LD_DEFER_H

#include "ld_common.h"

struct event;
struct event_base;

/* The one way to finish work on a later turn of the loop: a module queues
 * items on its own list, kicks its ld_defer, and FN drains the list. A
 * callback is then never re-entered from inside the call that queued the
 * work, and one busy producer cannot hold the loop: whatever FN leaves
 * queued waits for the next kick. */
struct ld_defer {
    struct event *ev;
    void (*fn)(void *arg);
    void *arg;
};

void ld_defer_init(struct ld_defer *d, struct event_base *base,
                   void (*fn)(void *arg), void *arg);
/* Run FN once on a coming turn; kicks before it runs are one. */
void ld_defer_kick(struct ld_defer *d);
void ld_defer_free(struct ld_defer *d);

#endif
