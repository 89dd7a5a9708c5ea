/* The fault-injecting proxy of faultproxy.h: one thread, one poll loop.
 * Every connection is a pair (client side, upstream side) with a queue of
 * chunks each way; the mode decides which sockets are read, which queues
 * are written, and which bytes are thrown away. Settings live under one
 * mutex and are copied at the top of every pass, so a change made by the
 * test applies before the next byte moves. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "faultproxy.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#ifndef LIST_FOREACH_SAFE
#define LIST_FOREACH_SAFE(var, head, field, tvar)                             \
    for ((var) = LIST_FIRST(head);                                            \
         (var) != NULL && ((tvar) = LIST_NEXT(var, field), 1);                \
         (var) = (tvar))
#endif

/* A queue stops its source being read past this (the kernel's buffers
 * then push back on the sender, as a slow link would). */
#define FP_QUEUE_CAP (4 * 1024 * 1024)
#define FP_READ_CHUNK 65536
#define FP_TRICKLE_TICK_MS 10
#define FP_MAX_CONNS 512

enum { FP_CLIENT = 0, FP_UPSTREAM = 1 };
/* Queue index = the side it is written to: q[FP_CLIENT] holds replies. */

struct fp_chunk {
    TAILQ_ENTRY(fp_chunk) link;
    uint64_t due_ms;
    size_t len, off;
    char data[];
};
TAILQ_HEAD(fp_chunkq, fp_chunk);

struct fp_queue {
    struct fp_chunkq chunks;
    size_t bytes;
};

struct fp_conn {
    LIST_ENTRY(fp_conn) link;
    int fd[2];
    struct fp_queue q[2];
    bool eof[2];          /* side I sent EOF; stop reading it */
    bool tainted;         /* bytes were lost: reset when the loss ends */
    bool subscriber;      /* it sent a SUBSCRIBE of some kind */
    long cut_left;        /* reply bytes before the cut; -1: none */
    uint64_t trickle_at;  /* next trickle tick */
    size_t trickle_spent; /* bytes sent in this tick */
};
LIST_HEAD(fp_connlist, fp_conn);

struct fp_settings {
    enum fp_mode mode;
    int latency_ms;
    int trickle;
    long cut;       /* armed cut, -1: none */
    bool reset_all; /* one shot */
    bool only_subscribers;
    bool only_commands;
    bool stop;
};

struct fp {
    int lfd;
    int port;
    int upstream_port;
    struct in_addr upstream_addr;
    int wake[2];
    pthread_t thread;
    pthread_mutex_t mu;
    struct fp_settings set; /* under mu */
    struct fp_connlist conns;
    enum fp_mode last_mode;
    atomic_long accepted, resets, live, bytes_down, bytes_up;
};

static uint64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void
rst_close(int fd)
{
    struct linger lg = {1, 0};
    if (fd < 0) {
        return;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

static void
queue_clear(struct fp_queue *q)
{
    struct fp_chunk *c;
    while ((c = TAILQ_FIRST(&q->chunks)) != NULL) {
        TAILQ_REMOVE(&q->chunks, c, link);
        free(c);
    }
    q->bytes = 0;
}

static void
conn_free(struct fp *p, struct fp_conn *c, bool rst)
{
    for (int i = 0; i < 2; i++) {
        if (rst) {
            rst_close(c->fd[i]);
        } else if (c->fd[i] >= 0) {
            close(c->fd[i]);
        }
        queue_clear(&c->q[i]);
    }
    if (rst) {
        atomic_fetch_add(&p->resets, 1);
    }
    atomic_fetch_sub(&p->live, 1);
    LIST_REMOVE(c, link);
    free(c);
}

static int
connect_upstream(struct in_addr addr, int port)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) {
        return -1;
    }
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr = addr;
    sa.sin_port = htons((uint16_t)port);
    /* Loopback, or a link that is up (fp_start_at): connect completes or
     * is refused at once. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_nonblock(fd);
    return fd;
}

static void
do_accept(struct fp *p, const struct fp_settings *s)
{
    for (;;) {
        int one = 1;
        int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            return;
        }
        atomic_fetch_add(&p->accepted, 1);
        if (s->mode == FP_REFUSE || atomic_load(&p->live) >= FP_MAX_CONNS) {
            rst_close(fd);
            atomic_fetch_add(&p->resets, 1);
            continue;
        }
        int up = connect_upstream(p->upstream_addr, p->upstream_port);
        if (up < 0) {
            rst_close(fd);
            atomic_fetch_add(&p->resets, 1);
            continue;
        }
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct fp_conn *c = calloc(1, sizeof *c);
        if (c == NULL) {
            abort();
        }
        c->fd[FP_CLIENT] = fd;
        c->fd[FP_UPSTREAM] = up;
        TAILQ_INIT(&c->q[0].chunks);
        TAILQ_INIT(&c->q[1].chunks);
        c->cut_left = -1;
        /* A connection opened into a blackhole has lost its handshake. */
        c->tainted = s->mode == FP_BLACKHOLE;
        LIST_INSERT_HEAD(&p->conns, c, link);
        atomic_fetch_add(&p->live, 1);
    }
}

static bool
lossy(enum fp_mode m)
{
    return m == FP_BLACKHOLE || m == FP_DROP_UP || m == FP_DROP_DOWN;
}

/* Whether the faults apply to C. */
static bool
in_scope(const struct fp_conn *c, const struct fp_settings *s)
{
    if (s->only_subscribers) {
        return c->subscriber;
    }
    return !s->only_commands || !c->subscriber;
}

static enum fp_mode
conn_mode(const struct fp_conn *c, const struct fp_settings *s)
{
    return in_scope(c, s) ? s->mode : FP_PASS;
}

/* Whether bytes travelling towards side TO are lost in mode M. */
static bool
loses(enum fp_mode m, int to)
{
    return m == FP_BLACKHOLE || (m == FP_DROP_UP && to == FP_UPSTREAM) ||
           (m == FP_DROP_DOWN && to == FP_CLIENT);
}

/* Read side FROM into the queue towards the other side. Returns false
 * when the pair is to be closed. */
static bool
do_read(struct fp *p, struct fp_conn *c, int from, const struct fp_settings *s)
{
    int to = 1 - from;
    char buf[FP_READ_CHUNK];
    ssize_t n = read(c->fd[from], buf, sizeof buf);
    if (n < 0) {
        return errno == EAGAIN || errno == EINTR;
    }
    if (n == 0) {
        c->eof[from] = true;
        return true;
    }
    if (from == FP_CLIENT && !c->subscriber &&
        memmem(buf, (size_t)n, "SUBSCRIBE", 9) != NULL) {
        c->subscriber = true;
    }
    if (from == FP_CLIENT) {
        atomic_fetch_add(&p->bytes_up, n);
    }
    if (loses(conn_mode(c, s), to)) {
        c->tainted = true;
        return true;
    }
    struct fp_chunk *ch = malloc(sizeof *ch + (size_t)n);
    if (ch == NULL) {
        abort();
    }
    ch->due_ms = now_ms() + (in_scope(c, s) ? (uint64_t)s->latency_ms : 0);
    ch->len = (size_t)n;
    ch->off = 0;
    memcpy(ch->data, buf, (size_t)n);
    TAILQ_INSERT_TAIL(&c->q[to].chunks, ch, link);
    c->q[to].bytes += (size_t)n;
    return true;
}

/* How many bytes side TO may take now (0: none yet). */
static size_t
write_allowance(struct fp_conn *c, int to, const struct fp_settings *s,
                uint64_t now)
{
    struct fp_chunk *ch = TAILQ_FIRST(&c->q[to].chunks);
    size_t n;
    if (ch == NULL || conn_mode(c, s) == FP_STALL || ch->due_ms > now) {
        return 0;
    }
    n = ch->len - ch->off;
    if (to == FP_CLIENT && s->trickle > 0 && in_scope(c, s)) {
        if (now >= c->trickle_at) {
            c->trickle_at = now + FP_TRICKLE_TICK_MS;
            c->trickle_spent = 0;
        }
        size_t left = (size_t)s->trickle > c->trickle_spent
                          ? (size_t)s->trickle - c->trickle_spent
                          : 0;
        n = n < left ? n : left;
    }
    if (to == FP_CLIENT && c->cut_left >= 0 && (long)n > c->cut_left) {
        n = (size_t)c->cut_left;
    }
    return n;
}

/* Write what is due towards side TO. Returns false when the pair is to be
 * closed (write error, or the cut reached). */
static bool
do_write(struct fp *p, struct fp_conn *c, int to, const struct fp_settings *s)
{
    uint64_t now = now_ms();
    for (;;) {
        size_t n = write_allowance(c, to, s, now);
        if (to == FP_CLIENT && c->cut_left == 0) {
            return false;
        }
        if (n == 0) {
            return true;
        }
        struct fp_chunk *ch = TAILQ_FIRST(&c->q[to].chunks);
        ssize_t w = send(c->fd[to], ch->data + ch->off, n, MSG_NOSIGNAL);
        if (w < 0) {
            return errno == EAGAIN || errno == EINTR;
        }
        ch->off += (size_t)w;
        c->q[to].bytes -= (size_t)w;
        if (to == FP_CLIENT) {
            atomic_fetch_add(&p->bytes_down, w);
            if (s->trickle > 0) {
                c->trickle_spent += (size_t)w;
            }
            if (c->cut_left >= 0) {
                c->cut_left -= w;
            }
        }
        if (ch->off == ch->len) {
            TAILQ_REMOVE(&c->q[to].chunks, ch, link);
            free(ch);
        }
        if ((size_t)w < n) {
            return true;
        }
    }
}

/* Apply what changed since the last pass: the cut, a reset of all, the
 * end of a lossy mode, queues lost on entering one. */
static void
apply_settings(struct fp *p, struct fp_settings *s)
{
    struct fp_conn *c, *tmp;
    if (s->reset_all) {
        while ((c = LIST_FIRST(&p->conns)) != NULL) {
            conn_free(p, c, true);
        }
    }
    if (s->cut >= 0) {
        LIST_FOREACH(c, &p->conns, link)
        {
            c->cut_left = s->cut;
        }
    }
    if (lossy(p->last_mode) && !lossy(s->mode)) {
        LIST_FOREACH_SAFE(c, &p->conns, link, tmp)
        {
            if (c->tainted) {
                conn_free(p, c, true);
            }
        }
    }
    LIST_FOREACH(c, &p->conns, link)
    {
        for (int to = 0; to < 2; to++) {
            if (loses(conn_mode(c, s), to) && c->q[to].bytes > 0) {
                queue_clear(&c->q[to]);
                c->tainted = true;
            }
        }
    }
    p->last_mode = s->mode;
}

/* The next moment a queued chunk becomes writable, as a poll timeout. */
static int
next_timeout(struct fp *p, const struct fp_settings *s, uint64_t now)
{
    uint64_t at = UINT64_MAX;
    struct fp_conn *c;
    LIST_FOREACH(c, &p->conns, link)
    {
        if (conn_mode(c, s) == FP_STALL) {
            continue;
        }
        for (int to = 0; to < 2; to++) {
            struct fp_chunk *ch = TAILQ_FIRST(&c->q[to].chunks);
            if (ch == NULL) {
                continue;
            }
            uint64_t due = ch->due_ms;
            if (to == FP_CLIENT && s->trickle > 0 && in_scope(c, s) &&
                c->trickle_at > due) {
                due = c->trickle_at;
            }
            if (due < at) {
                at = due;
            }
        }
    }
    if (at == UINT64_MAX) {
        return -1;
    }
    return at <= now ? 0 : (int)(at - now);
}

static void *
fp_loop(void *arg)
{
    struct fp *p = arg;
    struct pollfd pfd[2 + 2 * FP_MAX_CONNS];
    struct fp_conn *cs[FP_MAX_CONNS];

    for (;;) {
        struct fp_settings s;
        struct fp_conn *c, *tmp;
        int n = 0, nc = 0;
        uint64_t now;

        pthread_mutex_lock(&p->mu);
        s = p->set;
        p->set.cut = -1;
        p->set.reset_all = false;
        pthread_mutex_unlock(&p->mu);
        if (s.stop) {
            break;
        }
        apply_settings(p, &s);

        /* Flush what is due first, so the timeout below sees the rest. */
        LIST_FOREACH_SAFE(c, &p->conns, link, tmp)
        {
            bool ok = true;
            for (int to = 0; to < 2 && ok; to++) {
                ok = c->fd[to] >= 0 && do_write(p, c, to, &s);
            }
            /* A side that ended and whose bytes are all delivered ends
             * the pair. */
            for (int from = 0; from < 2 && ok; from++) {
                if (c->eof[from] && c->q[1 - from].bytes == 0) {
                    ok = false;
                }
            }
            if (!ok) {
                bool cut = c->cut_left == 0;
                conn_free(p, c, cut);
                if (cut) {
                    /* One cut: the other connections carry on. */
                    struct fp_conn *o;
                    LIST_FOREACH(o, &p->conns, link)
                    {
                        o->cut_left = -1;
                    }
                }
            }
        }

        now = now_ms();
        pfd[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
        LIST_FOREACH(c, &p->conns, link)
        {
            for (int side = 0; side < 2; side++) {
                short ev = 0;
                int other = 1 - side;
                if (conn_mode(c, &s) != FP_STALL && !c->eof[side] &&
                    c->q[other].bytes < FP_QUEUE_CAP) {
                    ev |= POLLIN;
                }
                /* Only a write that met a full socket waits for POLLOUT;
                 * latency and trickle wait for the timeout. */
                if (write_allowance(c, side, &s, now) > 0) {
                    ev |= POLLOUT;
                }
                /* An fd with no events is left out: a hung-up peer would
                 * otherwise wake poll at once, again and again. */
                pfd[n++] = (struct pollfd){.fd = ev != 0 ? c->fd[side] : -1,
                                           .events = ev};
            }
            cs[nc++] = c;
        }
        if (poll(pfd, (nfds_t)n, next_timeout(p, &s, now)) < 0) {
            continue;
        }
        if (pfd[0].revents & POLLIN) {
            char b[64];
            while (read(p->wake[0], b, sizeof b) > 0) {
            }
        }
        if (pfd[1].revents & POLLIN) {
            do_accept(p, &s);
        }
        for (int i = 0; i < nc; i++) {
            bool ok = true;
            c = cs[i];
            for (int side = 0; side < 2 && ok; side++) {
                short re = pfd[2 + 2 * i + side].revents;
                if (re & (POLLIN | POLLHUP | POLLERR)) {
                    if (pfd[2 + 2 * i + side].events & POLLIN) {
                        ok = do_read(p, c, side, &s);
                    } else if (re & POLLERR) {
                        ok = false;
                    }
                }
            }
            if (!ok) {
                conn_free(p, c, true);
            }
        }
    }
    return NULL;
}

static void
wake(struct fp *p)
{
    char b = 1;

    /* A full pipe (EAGAIN) already holds a wake-up for the poll loop, so a
     * failed write loses nothing; the test keeps -Werror=unused-result
     * (glibc's warn_unused_result under _FORTIFY_SOURCE) quiet. */
    if (write(p->wake[1], &b, 1) < 0) {
        return;
    }
}

struct fp *
fp_start(int upstream_port)
{
    return fp_start_at("127.0.0.1", 0, "127.0.0.1", upstream_port);
}

struct fp *
fp_start_at(const char *listen_ip, int listen_port, const char *upstream_ip,
            int upstream_port)
{
    struct fp *p = calloc(1, sizeof *p);
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int one = 1;

    if (p == NULL) {
        return NULL;
    }
    p->upstream_port = upstream_port;
    if (inet_pton(AF_INET, upstream_ip, &p->upstream_addr) != 1) {
        free(p);
        return NULL;
    }
    p->set.cut = -1;
    LIST_INIT(&p->conns);
    pthread_mutex_init(&p->mu, NULL);
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (p->lfd < 0 || pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        goto fail;
    }
    (void)setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)listen_port);
    if (inet_pton(AF_INET, listen_ip, &sa.sin_addr) != 1 ||
        bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(p->lfd, 128) != 0 ||
        getsockname(p->lfd, (struct sockaddr *)&sa, &len) != 0) {
        goto fail;
    }
    p->port = ntohs(sa.sin_port);
    if (pthread_create(&p->thread, NULL, fp_loop, p) != 0) {
        goto fail;
    }
    return p;
fail:
    if (p->lfd >= 0) {
        close(p->lfd);
    }
    free(p);
    return NULL;
}

void
fp_stop(struct fp *p)
{
    struct fp_conn *c;
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->set.stop = true;
    pthread_mutex_unlock(&p->mu);
    wake(p);
    pthread_join(p->thread, NULL);
    while ((c = LIST_FIRST(&p->conns)) != NULL) {
        conn_free(p, c, false);
    }
    close(p->lfd);
    close(p->wake[0]);
    close(p->wake[1]);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int
fp_port(const struct fp *p)
{
    return p->port;
}

#define FP_SETTER(body)                                                       \
    do {                                                                      \
        pthread_mutex_lock(&p->mu);                                           \
        body;                                                                 \
        pthread_mutex_unlock(&p->mu);                                         \
        wake(p);                                                              \
    } while (0)

void
fp_set_mode(struct fp *p, enum fp_mode mode)
{
    FP_SETTER(p->set.mode = mode);
}

void
fp_set_latency(struct fp *p, int latency_ms)
{
    FP_SETTER(p->set.latency_ms = latency_ms);
}

void
fp_set_trickle(struct fp *p, int bytes)
{
    FP_SETTER(p->set.trickle = bytes);
}

void
fp_cut_replies_after(struct fp *p, long bytes)
{
    FP_SETTER(p->set.cut = bytes);
}

void
fp_only_subscribers(struct fp *p, bool only)
{
    FP_SETTER(p->set.only_subscribers = only);
}

void
fp_only_commands(struct fp *p, bool only)
{
    FP_SETTER(p->set.only_commands = only);
}

void
fp_reset_all(struct fp *p)
{
    FP_SETTER(p->set.reset_all = true);
}

long
fp_accepted(struct fp *p)
{
    return atomic_load(&p->accepted);
}

long
fp_resets(struct fp *p)
{
    return atomic_load(&p->resets);
}

long
fp_live(struct fp *p)
{
    return atomic_load(&p->live);
}

long
fp_bytes_down(struct fp *p)
{
    return atomic_load(&p->bytes_down);
}

long
fp_bytes_up(struct fp *p)
{
    return atomic_load(&p->bytes_up);
}

bool
fp_wait_accepted(struct fp *p, long n, int timeout_ms)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    while (fp_accepted(p) < n) {
        if (now_ms() >= end) {
            return false;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return true;
}
