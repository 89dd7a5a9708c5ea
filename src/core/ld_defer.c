/* Work finished on a later turn of the loop (ld_defer.h): one event per
 * ld_defer, made active by a kick. It owns that event only: the queued work
 * is its owner's, and it must never run the owner's function inside the kick. */
#include "ld_defer.h"

#include "ld_mem.h"

#include <event2/event.h>

static void
trampoline(evutil_socket_t fd, short what, void *arg)
{
    struct ld_defer *d = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    d->fn(d->arg);
}

void
ld_defer_init(struct ld_defer *d, struct event_base *base,
              void (*fn)(void *arg), void *arg)
{
    d->fn = fn;
    d->arg = arg;
    d->ev = event_new(base, -1, 0, trampoline, d);
    if (d->ev == NULL) {
        ld_oom_in("event_new");
    }
}

void
ld_defer_kick(struct ld_defer *d)
{
    /* An event already active stays queued once: no double run. */
    event_active(d->ev, EV_TIMEOUT, 0);
}

void
ld_defer_free(struct ld_defer *d)
{
    if (d->ev != NULL) {
        event_free(d->ev);
        d->ev = NULL;
    }
}
