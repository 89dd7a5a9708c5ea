/*
 * The fdatasync worker. The thread touches nothing of the daemon but the
 * job it is handed (a descriptor and a function) and the result it hands
 * back; every other piece of state stays with the loop, so the rest of
 * the daemon remains single-threaded.
 *
 * It owns the thread and its one job slot.
 */
#include "ld_fsync.h"

#include "ld_assert.h"
#include "ld_log.h"
#include "ld_mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

struct ld_fsync {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Guarded by mu. */
    bool have_job;
    bool job_done;
    bool stop;
    int fd;
    int (*fn)(int);
    int rc, err;
    /* Loop side only. */
    int efd;
    struct event *ev;
    bool busy;
    ld_fsync_done_fn *done;
    void *arg;
};

static void *
worker(void *p)
{
    struct ld_fsync *s = p;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->have_job && !s->stop) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->stop) {
            break;
        }
        int fd = s->fd;
        int (*fn)(int) = s->fn;
        pthread_mutex_unlock(&s->mu);
        int rc = fn(fd);
        int err = rc != 0 ? errno : 0;
        pthread_mutex_lock(&s->mu);
        s->have_job = false;
        s->job_done = true;
        s->rc = rc;
        s->err = err;
        uint64_t one = 1;
        /* An eventfd write of 1 cannot block or come up short here: the
         * loop reads it before it hands over the next job. */
        if (write(s->efd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
            abort();
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void
done_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(what);
    struct ld_fsync *s = arg;
    uint64_t n;
    if (read(fd, &n, sizeof(n)) != (ssize_t)sizeof(n)) {
        return; /* spurious: nothing was written */
    }
    pthread_mutex_lock(&s->mu);
    bool done = s->job_done;
    int rc = s->rc, err = s->err;
    s->job_done = false;
    pthread_mutex_unlock(&s->mu);
    if (!done || !s->busy) {
        return;
    }
    s->busy = false;
    s->done(rc, err, s->arg);
}

struct ld_fsync *
ld_fsync_new(struct event_base *base)
{
    struct ld_fsync *s = ld_xcalloc(1, sizeof(*s));
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        log_error("cannot make the journal sync eventfd: %s", strerror(errno));
        free(s);
        return NULL;
    }
    s->ev = event_new(base, s->efd, EV_READ | EV_PERSIST, done_cb, s);
    if (s->ev == NULL || event_add(s->ev, NULL) != 0) {
        log_error("cannot watch the journal sync eventfd");
        goto fail;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = pthread_create(&s->thread, NULL, worker, s);
    if (rc != 0) {
        log_error("cannot start the journal sync thread: %s", strerror(rc));
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        goto fail;
    }
    return s;
fail:
    if (s->ev != NULL) {
        event_free(s->ev);
    }
    close(s->efd);
    free(s);
    return NULL;
}

void
ld_fsync_free(struct ld_fsync *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    /* A sync in progress finishes first: the descriptor stays valid
     * until the caller closes it after this returns. */
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    event_free(s->ev);
    close(s->efd);
    free(s);
}

void
ld_fsync_run(struct ld_fsync *s, int fd, int (*fn)(int),
             ld_fsync_done_fn *done, void *arg)
{
    LD_ASSERT(!s->busy);
    s->busy = true;
    s->done = done;
    s->arg = arg;
    pthread_mutex_lock(&s->mu);
    s->fd = fd;
    s->fn = fn;
    s->have_job = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

bool
ld_fsync_busy(const struct ld_fsync *s)
{
    return s->busy;
}
