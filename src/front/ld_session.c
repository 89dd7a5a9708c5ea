/*
 * Client sessions: one per connection. Reads are framed into lines, each
 * line goes to the line handler the layer above gave at init (which makes
 * it a request); answers may come back in any order. A session's memory
 * outlives its socket until the last request in flight has been answered,
 * so feature modules never see a dangling session pointer inside a
 * request.
 *
 * This module owns the connections: sockets, their buffers and the
 * accounting of them, the open list and the close hooks. It must not
 * parse a line (the line handler does) nor touch a module's per-session
 * state (the slots of struct ld_session, which each module drops from its
 * close hook).
 *
 * A session's states:
 *
 *   READING    open, its socket read (sock_read_cb) and each read's lines
 *              dispatched, a bounded share per loop turn.
 *   BACKLOG    open, the turn's share used up: lines wait in the input
 *              buffer and reading stops; more_cb goes on in the next turn
 *              (-> READING, or stays BACKLOG).
 *   PAUSED     open, the output owed above the high mark (owed_output):
 *              neither dispatching nor reading; back to READING when it
 *              falls to the low mark (maybe_resume, from the output
 *              buffer's callback or an answer), or, when only the
 *              estimate keeps it there, for BLIND_REQUESTS more lines
 *              after GRACE_MS without an answer (grace_cb).
 *   OVER       a write would pass limits.max_output_bytes: its output is
 *              dropped, and more_cb closes it and drops its socket at once
 *              (-> RELEASED).
 *   LINGERING  closed (ld_session_close: EOF, an error, the HTTP guard,
 *              shutdown or a module): the close hooks ran and it left the
 *              open list, but its socket still writes what is queued and
 *              the answers owed (-> RELEASED when done, at a socket error,
 *              or at redis.timeout_ms + LINGER_EXTRA_MS: linger_cb).
 *   RELEASED   no socket (release_socket): the memory stays while a
 *              request in flight holds a reference, and is freed with the
 *              last one (ld_session_unref).
 *
 * ld_session_new makes a session READING, or none (one error line and
 * the close) at limits.max_clients or while the daemon stops.
 */
#include "ld_session.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_errcode.h"
#include "ld_frame.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

/* A client that stops reading its replies must not grow our memory without
 * bound (limits.max_output_bytes, as Redis' client output buffer limit).
 * Stopping to read is not enough, one read can carry a thousand requests:
 * above half of the limit the session's buffered lines wait unparsed, and
 * they are dispatched again once its output is down to a quarter, so one
 * reply landing near the mark does not toggle dispatch on every write. A
 * session whose output still passes the limit, from replies to requests
 * already dispatched, is closed.
 *
 * What counts against the marks is the output the session owes: what is
 * unsent plus, for each request in flight, the size of its recent
 * replies. Counting only what has arrived would let a thousand requests
 * for large values be dispatched before the first of their replies, all
 * of which Redis then sends and the daemon reads, to drop them. */
#define output_high(limit) ((limit) / 2)
#define output_low(limit) ((limit) / 4)

/* The work done for one session per loop turn is bounded, so that a client
 * pipelining thousands of requests, or a few huge ones, cannot hold up the
 * others: past either bound the rest of its lines wait for a later turn
 * (and reading waits with them, so its input does not grow meanwhile). */
#define TURN_MAX_LINES 64
#define TURN_MAX_BYTES (256u * 1024)

#define MAX_HOOKS 8

TAILQ_HEAD(session_list, ld_session);

/* A client that half-closes (shutdown(SHUT_WR), as `socat` and `nc -N`
 * do after the last request) still wants the answers to what it sent. At
 * EOF the session ends at once, as for any closed connection: its locks
 * are released and its waiters leave their queues. But the socket stays
 * open for writing until the requests already in flight are answered,
 * within this bound past redis.timeout_ms, which also caps what a crashed
 * client (indistinguishable from a half-closed one) keeps alive. */
#define LINGER_EXTRA_MS 2000

/* A reply line that carries a descriptor (SCM_RIGHTS) on its first byte:
 * it leaves by sendmsg once every byte before it has left, and what is
 * written after it waits in AFTER meanwhile, so replies keep their order
 * on the wire. */
struct fd_line {
    TAILQ_ENTRY(fd_line) link;
    int fd;
    struct evbuffer *after;
    size_t len;
    char line[];
};
TAILQ_HEAD(fd_line_list, fd_line);

struct session_io {
    struct ld_framer framer;
    struct fd_line_list fd_lines; /* oldest first */
    size_t n_fd_lines;
    size_t held;             /* bytes of FD_LINES, their AFTERs included */
    struct event *fd_ev;     /* the socket can take the next fd line */
    struct event *read_ev;   /* the socket, read here (see sock_read_cb) */
    struct event *linger_ev; /* bounds the writing after close */
    struct event *more_ev;   /* continue with buffered lines */
    struct event *grace_ev;  /* a paused estimate lets more through */
    unsigned grace;          /* lines still let through by it */
    uint64_t answered;       /* requests answered, ever */
    uint64_t grace_mark;     /* ANSWERED when GRACE_EV was armed */
    bool dirty;              /* on the flush list */
    bool reading;            /* READ_EV added */
    bool out_paused;         /* owed output over the high mark: no dispatch */
    size_t reply_est;        /* recent reply size: a decaying maximum */
    bool backlog;            /* complete lines left for a later turn */
    bool over_limit;         /* output passed the limit: dropped */
    bool seen_json;          /* a line opened a JSON object (HTTP guard) */
    struct ld_session *next_dirty;
    /* On the open list (session_mod.open) from creation to close: the
     * link is private, other modules walk the list with
     * ld_session_foreach. */
    TAILQ_ENTRY(ld_session) link;
};

/* Output is written the way Redis does it: replies produced while the
 * loop works through its ready events are appended to the session's
 * buffer, and one event activated by the first of them, which runs after
 * the events already queued, writes them straight to the socket. A write
 * event is registered only when the socket cannot take everything.
 * Letting the bufferevent schedule every write itself would cost two
 * epoll_ctl calls and a loop turn per reply. (A lower priority would not
 * do: libevent runs lower priorities only in a turn with nothing else to
 * do, which a busy daemon may never have.) */
static struct {
    const struct ld_ctx *ctx;
    const struct ld_session_handlers *handlers;
    struct session_list open; /* every open session */
    long long count;          /* length of OPEN */
    uint64_t next_id;
    ld_session_hook *close_hooks[MAX_HOOKS];
    size_t n_close_hooks;
    struct event *flush_ev;
    struct ld_session *dirty_head;
    struct ld_session **dirty_tail; /* &next_dirty of the last, or &head */
    long long lingering;            /* closed sessions still writing */
    size_t buffered; /* input and output of every session's socket */
} session_mod;

#define sessions_cfg() (session_mod.ctx->cfg)

static void flush_cb(evutil_socket_t fd, short what, void *arg);
static void fd_lines_send(struct ld_session *s);
static bool sock_is_unix(int fd);

int
ld_session_init(const struct ld_ctx *ctx,
                const struct ld_session_handlers *handlers)
{
    LD_ASSERT(handlers != NULL && handlers->line != NULL &&
              handlers->error_line != NULL);
    LD_ASSERTF(session_mod.count == 0 && session_mod.lingering == 0,
               "init with %lld sessions open, %lld lingering",
               session_mod.count, session_mod.lingering);
    memset(&session_mod, 0, sizeof(session_mod));
    session_mod.ctx = ctx;
    session_mod.handlers = handlers;
    session_mod.next_id = 1;
    session_mod.dirty_tail = &session_mod.dirty_head;
    TAILQ_INIT(&session_mod.open);
    session_mod.flush_ev = event_new(ctx->base, -1, 0, flush_cb, NULL);
    if (session_mod.flush_ev == NULL) {
        ld_oom(0);
    }
    return LD_OK;
}

static void
mark_dirty(struct ld_session *s)
{
    if (s->io->dirty) {
        return;
    }
    s->io->dirty = true;
    /* Sessions go out in the order they were first written to: an event
     * that must reach one client before another's reply (lock_lost
     * before the grant of the same lock) leaves first. */
    s->io->next_dirty = NULL;
    *session_mod.dirty_tail = s;
    session_mod.dirty_tail = &s->io->next_dirty;
    ld_session_ref(s);
    event_active(session_mod.flush_ev, EV_WRITE, 0);
}

static void
flush_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    struct ld_session *list = session_mod.dirty_head;
    session_mod.dirty_head = NULL;
    session_mod.dirty_tail = &session_mod.dirty_head;
    while (list != NULL) {
        struct ld_session *s = list;
        list = s->io->next_dirty;
        s->io->dirty = false;
        struct evbuffer *out = s->bev != NULL ? bufferevent_get_output(s->bev)
                                              : NULL;
        if (s->open && out != NULL && evbuffer_get_length(out) > 0) {
            /* A socket bufferevent keeps the front of its output frozen
             * so only it drains it; it unfreezes the same way for its
             * own writes. */
            evbuffer_unfreeze(out, 1);
            int n = evbuffer_write(out, s->fd);
            evbuffer_freeze(out, 1);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != EINTR) {
                ld_session_close(s, strerror(errno));
            } else if (evbuffer_get_length(out) > 0) {
                /* The socket is full: let the bufferevent finish. */
                bufferevent_enable(s->bev, EV_WRITE);
            } else {
                fd_lines_send(s);
            }
        }
        ld_session_unref(s);
    }
}

size_t
ld_session_output_limit(void)
{
    return (size_t)sessions_cfg()->limits.max_output_bytes;
}

size_t
ld_session_output_bytes(const struct ld_session *s)
{
    if (s->bev == NULL) {
        return 0;
    }
    return evbuffer_get_length(bufferevent_get_output(s->bev)) + s->io->held;
}

/* The output the session owes (see output_high). Before its first reply
 * a request in flight counts as a share of the high mark, so that no more
 * than BLIND_REQUESTS are dispatched before one reply shows what they
 * cost: those could still pass the limit together, while a pipelining
 * client only waits for one round trip at its start. The request a reply
 * is being written for still counts as pending: a slight over-estimate.
 *
 * Requests that wait (a lock behind its holder, a read behind a fill)
 * owe little and may stay in flight for long, so a pause that only the
 * estimate makes, with the output itself under the low mark, lets
 * BLIND_REQUESTS more through after GRACE_MS in which none of the
 * session's requests was answered: a session with a thousand waiting
 * requests is slowed, never stuck behind them, while one whose replies
 * are still arriving waits for them. */
#define BLIND_REQUESTS 16
#define GRACE_MS 10

static size_t
owed_output(const struct ld_session *s)
{
    size_t pending = s->pending > 0 ? (size_t)s->pending : 0;
    size_t est = s->io->reply_est;
    if (est == 0) {
        est = output_high(ld_session_output_limit()) / BLIND_REQUESTS;
    }
    return ld_session_output_bytes(s) + pending * est;
}

/* Paused dispatch resumes once the owed output is down to the low mark,
 * from the next loop turn (this runs inside a write or an answer). */
static void
maybe_resume(struct ld_session *s)
{
    if (s->io->out_paused && s->open &&
        owed_output(s) <= output_low(ld_session_output_limit())) {
        s->io->out_paused = false;
        event_active(s->io->more_ev, EV_TIMEOUT, 0);
    }
}

/* Reading follows from the session's state, whatever changed it. */
static void
update_reading(struct ld_session *s)
{
    if (s->bev == NULL || !s->open) {
        return;
    }
    bool want = !s->io->out_paused && !s->io->backlog && !s->io->over_limit;
    if (want == s->io->reading) {
        return;
    }
    s->io->reading = want;
    if (want) {
        event_add(s->io->read_ev, NULL);
    } else {
        event_del(s->io->read_ev);
    }
}

/* limits.max_memory_bytes counts what the sessions' buffers hold: both
 * directions of every socket, lingering ones included, followed through
 * the buffers' own callbacks so that no path that adds or drains bytes
 * is missed. */
static void
account(const struct evbuffer_cb_info *info)
{
    session_mod.buffered += info->n_added;
    LD_ASSERT(session_mod.buffered >= info->n_deleted);
    session_mod.buffered -= info->n_deleted;
    ld_stats.session_buffer_bytes = (long long)session_mod.buffered;
}

static void
input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    LD_UNUSED(buf);
    LD_UNUSED(arg);
    account(info);
}

size_t
ld_session_buffered_bytes(void)
{
    return session_mod.buffered;
}

/* Output drains from flush_cb, from the bufferevent's own writes and from
 * whatever else may take bytes off the buffer: watching the buffer itself
 * resumes a paused session however its output got under the low mark
 * (one write can drain more than the whole high mark). */
static void
output_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    LD_UNUSED(buf);
    struct ld_session *s = arg;
    account(info);
    if (info->n_deleted > 0) {
        maybe_resume(s);
    }
}

void
ld_session_on_close(ld_session_hook *fn)
{
    LD_ASSERTF(session_mod.n_close_hooks < MAX_HOOKS,
               "more than %d close hooks", MAX_HOOKS);
    session_mod.close_hooks[session_mod.n_close_hooks++] = fn;
}

struct ld_session *
ld_session_first(void)
{
    return TAILQ_FIRST(&session_mod.open);
}

struct ld_session *
ld_session_next(const struct ld_session *s)
{
    LD_ASSERT(s->open);
    return TAILQ_NEXT(s, io->link);
}

void
ld_session_foreach(ld_session_visit *fn, void *arg)
{
    struct ld_session *next;
    for (struct ld_session *s = TAILQ_FIRST(&session_mod.open); s != NULL;
         s = next) {
        /* FN may close S, which unlinks it, so the step is taken first;
         * closing any other session would leave NEXT stale. */
        next = TAILQ_NEXT(s, io->link);
        if (next != NULL) {
            ld_session_ref(next);
        }
        fn(s, arg);
        if (next != NULL) {
            LD_ASSERTF(next->open,
                       "session %s closed by a visit to "
                       "another",
                       next->name);
            ld_session_unref(next);
        }
    }
}

long long
ld_session_count(void)
{
    return session_mod.count;
}

void
ld_session_ref(struct ld_session *s)
{
    LD_ASSERTF(s->refs > 0, "ref of freed session %s", s->name);
    s->refs++;
}

void
ld_session_unref(struct ld_session *s)
{
    LD_ASSERTF(s->refs > 0, "unref of freed session %s", s->name);
    if (--s->refs == 0) {
        /* The last reference: closed, unlinked, nothing owed, no
         * socket and off the flush list (which holds a reference). */
        LD_ASSERT(!s->open && s->pending == 0 && s->bev == NULL &&
                  !s->io->dirty);
        event_free(s->io->read_ev);
        event_free(s->io->linger_ev);
        event_free(s->io->more_ev);
        event_free(s->io->grace_ev);
        if (s->io->fd_ev != NULL) {
            event_free(s->io->fd_ev);
        }
        LD_ASSERT(TAILQ_EMPTY(&s->io->fd_lines));
        free(s->io);
        free(s);
    }
}

static void output_cb(struct evbuffer *buf,
                      const struct evbuffer_cb_info *info, void *arg);
static void fd_lines_drop(struct ld_session *s);
static void fd_lines_send(struct ld_session *s);
static void input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info,
                     void *arg);

/* After close: the socket is kept (holding a reference) only to write
 * what is queued and the answers still owed; this drops it. */
static void
release_socket(struct ld_session *s)
{
    if (s->bev == NULL) {
        return;
    }
    LD_ASSERT(!s->open && session_mod.lingering > 0);
    fd_lines_drop(s);
    struct evbuffer *in = bufferevent_get_input(s->bev);
    struct evbuffer *out = bufferevent_get_output(s->bev);
    evbuffer_remove_cb(out, output_cb, s);
    evbuffer_remove_cb(in, input_cb, s);
    size_t gone = evbuffer_get_length(in) + evbuffer_get_length(out);
    LD_ASSERT(session_mod.buffered >= gone);
    session_mod.buffered -= gone;
    ld_stats.session_buffer_bytes = (long long)session_mod.buffered;
    bufferevent_free(s->bev);
    s->bev = NULL;
    event_del(s->io->linger_ev);
    session_mod.lingering--;
    ld_session_unref(s);
}

long long
ld_session_lingering(void)
{
    return session_mod.lingering;
}

static bool
closed_and_done(struct ld_session *s)
{
    return !s->open && s->bev != NULL && s->pending == 0 &&
           TAILQ_EMPTY(&s->io->fd_lines) &&
           evbuffer_get_length(bufferevent_get_output(s->bev)) == 0;
}

void
ld_session_req_begin(struct ld_session *s)
{
    LD_ASSERT(s->open);
    s->pending++;
    ld_stats.requests_pending++;
    ld_session_ref(s);
}

void
ld_session_req_done(struct ld_session *s)
{
    LD_ASSERTF(s->pending > 0, "session %s: answer with none pending",
               s->name);
    s->pending--;
    ld_stats.requests_pending--;
    s->io->answered++;
    if (s->bev != NULL) {
        maybe_resume(s);
    }
    if (closed_and_done(s)) {
        /* Not from here: the module answering may still be working on
         * this session's state. */
        event_active(s->io->linger_ev, EV_TIMEOUT, 0);
    }
    ld_session_unref(s);
}

static void
linger_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    release_socket(arg);
}

static void
closed_write_cb(struct bufferevent *bev, void *arg)
{
    LD_UNUSED(bev);
    struct ld_session *s = arg;
    fd_lines_send(s);
    if (closed_and_done(s)) {
        release_socket(s);
    }
}

static void
closed_event_cb(struct bufferevent *bev, short what, void *arg)
{
    LD_UNUSED(bev);
    LD_UNUSED(what);
    release_socket(arg);
}

void
ld_session_close(struct ld_session *s, const char *why)
{
    if (!s->open) {
        return;
    }
    s->open = false;
    log_debug("session closed session=%s reason=%s pending=%lld", s->name, why,
              s->pending);

    for (size_t i = 0; i < session_mod.n_close_hooks; i++) {
        session_mod.close_hooks[i](s);
    }

    LD_ASSERT(session_mod.count > 0);
    TAILQ_REMOVE(&session_mod.open, s, io->link);
    session_mod.count--;
    ld_stats.sessions = session_mod.count;

    if (s->bev != NULL) {
        /* What is queued (the shutdown event, the last replies) and the
         * answers still owed go out, within a bound; the socket keeps
         * the session's memory alive meanwhile. */
        event_del(s->io->read_ev);
        ld_session_ref(s);
        session_mod.lingering++;
        if (closed_and_done(s)) {
            release_socket(s);
        } else {
            struct timeval tv = ld_tv_ms(sessions_cfg()->redis.timeout_ms +
                                         LINGER_EXTRA_MS);
            bufferevent_setwatermark(s->bev, EV_WRITE, 0, 0);
            bufferevent_setcb(s->bev, NULL, closed_write_cb, closed_event_cb,
                              s);
            bufferevent_enable(s->bev, EV_WRITE);
            event_add(s->io->linger_ev, &tv);
        }
    }
    ld_session_unref(s);
}

/* The client has not taken LEN bytes of replies and more are coming: what
 * is queued is dropped and the session ends, from the next loop turn so
 * that the module writing the reply is not cut short. */
static void
output_over_limit(struct ld_session *s, size_t len)
{
    struct evbuffer *out = bufferevent_get_output(s->bev);
    log_warn("session over the output limit, closing session=%s "
             "unsent=%zu limit=%zu (limits.max_output_bytes)",
             s->name, len, ld_session_output_limit());
    s->io->over_limit = true;
    evbuffer_unfreeze(out, 1);
    evbuffer_drain(out, evbuffer_get_length(out));
    evbuffer_freeze(out, 1);
    update_reading(s);
    if (s->open) {
        event_active(s->io->more_ev, EV_TIMEOUT, 0);
    } else {
        /* Already closed: only the lingering socket is left to drop. */
        event_active(s->io->linger_ev, EV_TIMEOUT, 0);
    }
}

bool
ld_session_output_room(struct ld_session *s, size_t len)
{
    if (s->bev == NULL || s->io->over_limit) {
        return false;
    }
    size_t total = evbuffer_get_length(bufferevent_get_output(s->bev)) + len;
    if (total > ld_session_output_limit()) {
        output_over_limit(s, total);
        return false;
    }
    return true;
}

/* Every reply line goes through here, bytes or a built buffer alike, so
 * the output limit and the pause of dispatching hold whichever way a
 * module writes. BUF is NULL for bytes. */
static void
write_out(struct ld_session *s, const char *bytes, struct evbuffer *buf,
          size_t len)
{
    if (s->bev == NULL || s->io->over_limit) {
        if (buf != NULL) {
            evbuffer_drain(buf, evbuffer_get_length(buf));
        }
        return;
    }
    struct evbuffer *out = bufferevent_get_output(s->bev);
    size_t total = evbuffer_get_length(out) + s->io->held + len;
    size_t limit = ld_session_output_limit();
    if (total > limit) {
        if (buf != NULL) {
            evbuffer_drain(buf, evbuffer_get_length(buf));
        }
        output_over_limit(s, total);
        return;
    }
    bool behind = !TAILQ_EMPTY(&s->io->fd_lines);
    /* Behind a line still waiting to carry its descriptor, it waits in
     * that line's AFTER. */
    struct evbuffer *to =
        behind ? TAILQ_LAST(&s->io->fd_lines, fd_line_list)->after : out;
    if (buf != NULL) {
        evbuffer_add_buffer(to, buf);
    } else {
        evbuffer_add(to, bytes, len);
    }
    if (behind) {
        s->io->held += len;
    }
    if (s->open) {
        if (!behind) {
            mark_dirty(s);
        }
        if (len >= s->io->reply_est) {
            s->io->reply_est = len;
        } else {
            s->io->reply_est -= s->io->reply_est / 8;
        }
        if (owed_output(s) > output_high(limit) && !s->io->out_paused) {
            s->io->out_paused = true;
            update_reading(s);
        }
    }
}

void
ld_session_write(struct ld_session *s, const char *buf, size_t len)
{
    write_out(s, buf, NULL, len);
}

void
ld_session_write_buffer(struct ld_session *s, struct evbuffer *buf)
{
    write_out(s, NULL, buf, evbuffer_get_length(buf));
}

/* ---- reply lines that carry a descriptor ----------------------------- */

static void
fd_line_pop(struct ld_session *s, struct fd_line *l)
{
    TAILQ_REMOVE(&s->io->fd_lines, l, link);
    s->io->n_fd_lines--;
    LD_ASSERT(s->io->held >= l->len + evbuffer_get_length(l->after));
    s->io->held -= l->len + evbuffer_get_length(l->after);
    if (l->fd >= 0) {
        close(l->fd);
    }
    evbuffer_free(l->after);
    free(l);
}

static void
fd_lines_drop(struct ld_session *s)
{
    struct fd_line *l;
    while ((l = TAILQ_FIRST(&s->io->fd_lines)) != NULL) {
        fd_line_pop(s, l);
    }
    if (s->io->fd_ev != NULL) {
        event_del(s->io->fd_ev);
    }
}

/* The socket failed with ERR: nothing more goes out, the session ends. */
static void
fd_lines_fail(struct ld_session *s, int err)
{
    log_debug("descriptor not sent session=%s error=\"%s\"", s->name,
              strerror(err));
    ld_session_ref(s);
    fd_lines_drop(s);
    ld_session_close(s, strerror(err));
    ld_session_unref(s);
}

static void
fd_ev_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    fd_lines_send(arg);
}

/* The first fd line leaves once the output before it has: its first
 * bytes by sendmsg with the descriptor, whatever the socket did not take
 * and the lines written after it through the output as usual. */
/* Sends L's line with its descriptor in one sendmsg: the descriptor goes
 * with the line's first byte. */
static ssize_t
fd_line_sendmsg(int fd, struct fd_line *l)
{
    union {
        struct cmsghdr h;
        char room[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = l->line, .iov_len = l->len};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.room,
                         .msg_controllen = sizeof(ctl.room)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &l->fd, sizeof(int));
    return sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* fd_ev_cb comes back to fd_lines_send once the socket takes more. */
static void
fd_lines_wait(struct ld_session *s)
{
    if (s->io->fd_ev == NULL) {
        s->io->fd_ev = event_new(session_mod.ctx->base, s->fd, EV_WRITE,
                                 fd_ev_cb, s);
        if (s->io->fd_ev == NULL) {
            ld_oom(0);
        }
    }
    event_add(s->io->fd_ev, NULL);
}

/* The descriptor went with the first byte; the rest of the line and what
 * followed it join the output, in order. */
static void
fd_line_sent(struct ld_session *s, struct fd_line *l, size_t sent,
             struct evbuffer *out)
{
    size_t rest = l->len - sent;
    s->io->held -= rest + evbuffer_get_length(l->after);
    struct evbuffer *after = l->after;
    l->after = evbuffer_new();
    if (l->after == NULL) {
        ld_oom(0);
    }
    l->len = sent;
    if (rest > 0) {
        evbuffer_add(out, l->line + sent, rest);
    }
    evbuffer_add_buffer(out, after);
    evbuffer_free(after);
    fd_line_pop(s, l);
}

static void
fd_lines_send(struct ld_session *s)
{
    struct fd_line *l;
    while (s->bev != NULL && !s->io->over_limit &&
           (l = TAILQ_FIRST(&s->io->fd_lines)) != NULL) {
        struct evbuffer *out = bufferevent_get_output(s->bev);
        if (evbuffer_get_length(out) > 0) {
            /* write_cb or flush_cb comes back here once it is empty. */
            bufferevent_enable(s->bev, EV_WRITE);
            return;
        }
        ssize_t n = fd_line_sendmsg(s->fd, l);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                fd_lines_wait(s);
                return;
            }
            fd_lines_fail(s, errno);
            return;
        }
        fd_line_sent(s, l, (size_t)n, out);
        if (evbuffer_get_length(out) > 0) {
            mark_dirty(s);
        }
    }
}

size_t
ld_session_fd_lines(const struct ld_session *s)
{
    return s->io->n_fd_lines;
}

bool
ld_session_is_unix(const struct ld_session *s)
{
    return s->fd >= 0 && sock_is_unix(s->fd);
}

void
ld_session_write_fd(struct ld_session *s, const char *line, size_t len, int fd)
{
    if (s->bev == NULL || s->io->over_limit || len == 0) {
        close(fd);
        return;
    }
    struct evbuffer *out = bufferevent_get_output(s->bev);
    size_t total = evbuffer_get_length(out) + s->io->held + len;
    if (total > ld_session_output_limit()) {
        close(fd);
        output_over_limit(s, total);
        return;
    }
    struct fd_line *l = ld_xmalloc(sizeof(*l) + len);
    l->fd = fd;
    l->after = evbuffer_new();
    if (l->after == NULL) {
        ld_oom(0);
    }
    l->len = len;
    memcpy(l->line, line, len);
    /* Behind an fd line still waiting, it waits for that one. */
    bool first = TAILQ_EMPTY(&s->io->fd_lines);
    TAILQ_INSERT_TAIL(&s->io->fd_lines, l, link);
    s->io->n_fd_lines++;
    s->io->held += len;
    if (first) {
        /* What flush_cb would write this turn goes first, now. */
        if (evbuffer_get_length(out) > 0) {
            evbuffer_unfreeze(out, 1);
            int n = evbuffer_write(out, s->fd);
            evbuffer_freeze(out, 1);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != EINTR) {
                fd_lines_fail(s, errno);
                return;
            }
        }
        fd_lines_send(s);
    }
}

void
ld_session_event(struct ld_session *s, json_t *event)
{
    if (s->open) {
        char *line = json_dumps(event, JSON_COMPACT);
        if (line != NULL) {
            ld_session_write(s, line, strlen(line));
            ld_session_write(s, "\n", 1);
            free(line);
        }
    }
    json_decref(event);
}

static void
reply_bare_error(struct ld_session *s, int code, const char *msg)
{
    size_t len = 0;
    ld_stats_count_error(code);
    char *line = session_mod.handlers->error_line(code, msg, &len);
    ld_session_write(s, line, len);
    free(line);
}

/* Operators reach the daemon through its Unix socket, which its file
 * mode and group already restrict; TCP needs listen.admin_token. */
static bool
sock_is_unix(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    return getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
           ss.ss_family == AF_UNIX;
}

/* Describe the peer of FD for a log line. */
static void
peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN];

    snprintf(buf, len, "unknown");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        return;
    }
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%d", host, ntohs(a->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%d", host, ntohs(a->sin6_port));
    } else if (ss.ss_family == AF_UNIX) {
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
            snprintf(buf, len, "unix:pid=%d,uid=%u", (int)cred.pid,
                     (unsigned)cred.uid);
        } else {
            snprintf(buf, len, "unix");
        }
    }
}

/* A web page can make a browser send an HTTP request to any port on the
 * loopback interface, with a body the page chooses; its lines would run
 * as requests. HTTP starts with a request line and headers, among them
 * Host:, which no client of this protocol sends, so such a line (or the
 * first bytes of an over-long one: a URL may be megabytes long) before
 * the session's first JSON object ends the connection, as Redis does. */
static bool
looks_like_http(const char *line, size_t len)
{
    static const char *const methods[] = {
        "GET ",     "POST ",  "PUT ",     "HEAD ",  "DELETE ",
        "OPTIONS ", "PATCH ", "CONNECT ", "TRACE ",
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(methods); i++) {
        size_t n = strlen(methods[i]);
        if (len >= n && memcmp(line, methods[i], n) == 0) {
            return true;
        }
    }
    return len >= 5 && strncasecmp(line, "host:", 5) == 0;
}

static bool
opens_object(const char *line, size_t len)
{
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) {
        i++;
    }
    return i < len && line[i] == '{';
}

/* The guard over the lines (or heads of over-long lines) a session sends
 * before its first JSON object: true when it closed the session. An HTTP
 * body comes only after the headers, so it never gets that far. */
static bool
http_guard_closes(struct ld_session *s, const char *line, size_t len)
{
    if (s->io->seen_json) {
        return false;
    }
    if (looks_like_http(line, len)) {
        char peer[96];
        peer_name(s->fd, peer, sizeof(peer));
        log_warn("HTTP request on a leased socket, closing "
                 "(cross-protocol request?) session=%s "
                 "listener=%s peer=%s",
                 s->name, s->listener, peer);
        ld_session_close(s, "http");
        return true;
    }
    s->io->seen_json = opens_object(line, len);
    return false;
}

/* Whether the requests the session has in flight owe enough output to
 * pause its dispatching (see output_high): true when it paused, then
 * armed to let a few more through after GRACE_MS if only the estimate
 * made it (see BLIND_REQUESTS). */
static bool
owes_enough(struct ld_session *s)
{
    size_t limit = ld_session_output_limit();
    if (owed_output(s) <= output_high(limit)) {
        return false;
    }
    bool out_low = ld_session_output_bytes(s) <= output_low(limit);
    if (s->io->grace > 0 && out_low) {
        s->io->grace--;
        return false;
    }
    s->io->out_paused = true;
    if (out_low) {
        struct timeval tv = ld_tv_ms(GRACE_MS);
        s->io->grace_mark = s->io->answered;
        evtimer_add(s->io->grace_ev, &tv);
    }
    return true;
}

/* Whether this turn's share of the session's work is used up (LINES
 * lines and BYTES bytes framed): true when it is, with what is left in
 * the input buffer and the LEFT bytes of the read for a later turn. */
static bool
turn_used_up(struct ld_session *s, size_t lines, size_t bytes, size_t left)
{
    if (lines < TURN_MAX_LINES && bytes < TURN_MAX_BYTES) {
        return false;
    }
    if (evbuffer_get_length(bufferevent_get_input(s->bev)) > 0 || left > 0) {
        s->io->backlog = true;
        event_active(s->io->more_ev, EV_TIMEOUT, 0);
    }
    return true;
}

/* A line over limits.max_request_bytes is answered too_large, once: false
 * when, sent before the first JSON object, it closed the session. */
static bool
take_too_large(struct ld_session *s, size_t *bytes)
{
    char msg[96];
    if (http_guard_closes(s, s->io->framer.head, s->io->framer.head_len)) {
        return false;
    }
    *bytes += (size_t)sessions_cfg()->limits.max_request_bytes;
    ld_stats.requests++;
    snprintf(msg, sizeof(msg), "request line over %lld bytes",
             sessions_cfg()->limits.max_request_bytes);
    reply_bare_error(s, LD_E_TOO_LARGE, msg);
    return true;
}

/* A whole line goes to the line handler: false when, sent before the
 * first JSON object, it closed the session instead. LINE is freed if
 * OWNED. */
static bool
take_line(struct ld_session *s, char *line, size_t len, bool owned)
{
    bool closes = http_guard_closes(s, line, len);
    if (!closes) {
        ld_stats.requests++;
        session_mod.handlers->line(s, line, len);
    }
    if (owned) {
        free(line);
    }
    return !closes;
}

/* Frame and dispatch buffered lines, then those of FRESH (LEN bytes just
 * read, or none), within the bound of one turn; what is left of FRESH is
 * kept in the session's input buffer. */
static void
process_input(struct ld_session *s, char *fresh, size_t fresh_len)
{
    struct evbuffer *in = bufferevent_get_input(s->bev);
    size_t pos = 0;
    size_t lines = 0;
    size_t bytes = 0;

    /* A handler may close the session (or the daemon may begin stopping)
     * while we are still draining lines of this read. */
    ld_session_ref(s);
    s->io->backlog = false;
    while (s->open && !s->io->out_paused && !s->io->over_limit) {
        if (owes_enough(s) || turn_used_up(s, lines, bytes, fresh_len - pos)) {
            break;
        }
        char *line = NULL;
        size_t len = 0;
        bool owned = false;
        s->io->framer.max_bytes =
            (size_t)sessions_cfg()->limits.max_request_bytes;
        enum ld_frame_result r = ld_frame_take(&s->io->framer, in, fresh,
                                               fresh_len, &pos, &line, &len,
                                               &owned);
        if (r == LD_FRAME_NEED_MORE) {
            break;
        }
        lines++;
        if (r == LD_FRAME_TOO_LARGE) {
            if (!take_too_large(s, &bytes)) {
                break;
            }
            continue;
        }
        bytes += len;
        if (!take_line(s, line, len, owned)) {
            break;
        }
    }
    if (s->open && s->bev != NULL) {
        ld_frame_keep(&s->io->framer, in, fresh, fresh_len, &pos);
    }
    update_reading(s);
    ld_session_unref(s);
}

/* Client sockets are read here rather than by their bufferevent, which
 * asks the kernel with ioctl(FIONREAD) how much there is before every
 * read: one system call per request for nothing. One read of at most
 * READ_BYTES goes into a buffer shared by every session, whose whole
 * lines are dispatched from where they lie (ld_frame_take); only a line
 * cut by the end of the read, or lines left for a later turn, are copied
 * to the session's input buffer. A full read leaves the socket readable,
 * so the rest comes in the next loop turn, after the other sessions. The
 * shared buffer is free again when process_input returns: lines are
 * handed to the handler, which copies what it keeps, and reads never
 * nest. */
#define READ_BYTES (64u * 1024)

static void
sock_read_cb(evutil_socket_t fd, short what, void *arg)
{
    static char buf[READ_BYTES];
#ifdef LD_DEBUG
    static bool busy;
#endif
    struct ld_session *s = arg;
    LD_UNUSED(what);
    LD_ASSERT(s->open && s->bev != NULL);
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
#ifdef LD_DEBUG
        LD_ASSERT(!busy);
        busy = true;
#endif
        process_input(s, buf, (size_t)n);
#ifdef LD_DEBUG
        busy = false;
#endif
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return;
    }
    /* Reading is on only while no whole line waits in the input buffer
     * (update_reading), so every request sent before the end was read
     * and dispatched already; its answers still go out (the socket
     * lingers for writing, see ld_session_close). */
    ld_session_close(s, n == 0 ? "eof" : strerror(errno));
}

static void
more_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct ld_session *s = arg;
    if (!s->open || s->bev == NULL) {
        return;
    }
    if (s->io->over_limit) {
        ld_session_ref(s);
        ld_session_close(s, "output over limits.max_output_bytes");
        /* Nothing more is written to this client: drop the socket now
         * rather than lingering for the answers still owed. */
        if (s->bev != NULL) {
            release_socket(s);
        }
        ld_session_unref(s);
        return;
    }
    process_input(s, NULL, 0);
}

static void
grace_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct ld_session *s = arg;
    if (!s->open || s->bev == NULL || !s->io->out_paused) {
        return;
    }
    if (s->io->answered != s->io->grace_mark) {
        /* Answers are coming: they resume it (maybe_resume). */
        struct timeval tv = ld_tv_ms(GRACE_MS);
        s->io->grace_mark = s->io->answered;
        evtimer_add(s->io->grace_ev, &tv);
        return;
    }
    s->io->grace = BLIND_REQUESTS;
    s->io->out_paused = false;
    process_input(s, NULL, 0);
}

static void
write_cb(struct bufferevent *bev, void *arg)
{
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0) {
        /* Back to writing from flush_cb (see mark_dirty). */
        bufferevent_disable(bev, EV_WRITE);
        fd_lines_send(arg);
    }
}

static void
event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct ld_session *s = arg;
    LD_UNUSED(bev);
    if (what & BEV_EVENT_EOF) {
        ld_session_close(s, "eof");
    } else if (what & BEV_EVENT_ERROR) {
        ld_session_close(s, strerror(EVUTIL_SOCKET_ERROR()));
    }
}

/* One line and goodbye: the socket is fresh, so this small write does
 * not block in practice; if it would, the client just sees the close. */
static void
refuse(int fd)
{
    const struct ld_ctx *ctx = session_mod.ctx;
    size_t len = 0;
    int code = ctx->shutting_down || ctx->draining ? LD_E_SHUTTING_DOWN
                                                   : LD_E_BUSY;
    const char *msg = code == LD_E_BUSY
                          ? "too many clients (limits.max_clients)"
                      : ctx->draining
                          ? "the daemon is draining before it stops: "
                            "connect to another instance"
                          : "the daemon is stopping";
    char *line = session_mod.handlers->error_line(code, msg, &len);
    ssize_t w = write(fd, line, len);
    LD_UNUSED(w);
    free(line);
    ld_stats_count_error(code);
    ld_stats.connections_rejected++;
    close(fd);
}

/* The events of session S on FD. */
static struct session_io *
io_new(struct ld_session *s, int fd)
{
    struct event_base *base = session_mod.ctx->base;
    struct session_io *io = ld_xcalloc(1, sizeof(*io));

    io->read_ev = event_new(base, fd, EV_READ | EV_PERSIST, sock_read_cb, s);
    io->linger_ev = evtimer_new(base, linger_cb, s);
    io->more_ev = event_new(base, -1, 0, more_cb, s);
    io->grace_ev = evtimer_new(base, grace_cb, s);
    TAILQ_INIT(&io->fd_lines);
    if (io->read_ev == NULL || io->linger_ev == NULL || io->more_ev == NULL ||
        io->grace_ev == NULL) {
        ld_oom(0);
    }
    return io;
}

/* The socket's buffers become the session's: counted (account), written
 * to by flush_cb, read into by sock_read_cb, which starts now. */
static void
io_start(struct ld_session *s)
{
    struct bufferevent *bev = s->bev;

    bufferevent_setcb(bev, NULL, write_cb, event_cb, s);
    evbuffer_add_cb(bufferevent_get_output(bev), output_cb, s);
    evbuffer_add_cb(bufferevent_get_input(bev), input_cb, s);
    /* A new bufferevent has writing enabled; flush_cb writes instead,
     * and sock_read_cb reads. */
    bufferevent_disable(bev, EV_WRITE);
    /* Its input buffer is the session's, added to by sock_read_cb: the
     * bufferevent froze its end to be the only one adding to it, and it
     * never reads. */
    evbuffer_unfreeze(bufferevent_get_input(bev), 0);
    event_add(s->io->read_ev, NULL);
    s->io->reading = true;
}

struct ld_session *
ld_session_new(int fd, bool auth_required, const char *listener)
{
    const struct ld_ctx *ctx = session_mod.ctx;
    if (session_mod.count >= ctx->cfg->limits.max_clients ||
        ctx->shutting_down || ctx->draining) {
        refuse(fd);
        return NULL;
    }

    struct ld_session *s = ld_xcalloc(1, sizeof(*s));
    s->bev = bufferevent_socket_new(ctx->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (s->bev == NULL) {
        ld_oom(0);
    }
    s->io = io_new(s, fd);
    s->id = session_mod.next_id++;
    snprintf(s->name, sizeof(s->name), "%s-%llu", ctx->instance,
             (unsigned long long)s->id);
    snprintf(s->listener, sizeof(s->listener), "%s",
             listener != NULL ? listener : "-");
    s->fd = fd;
    s->open = true;
    s->authed = !auth_required;
    s->admin = sock_is_unix(fd);
    s->refs = 1;

    TAILQ_INSERT_HEAD(&session_mod.open, s, io->link);
    session_mod.count++;
    ld_stats.sessions = session_mod.count;
    ld_stats.connections_accepted++;

    io_start(s);
    log_debug("session opened session=%s listener=%s", s->name, s->listener);
    return s;
}

static void
shutdown_one(struct ld_session *s, void *arg)
{
    LD_UNUSED(arg);
    json_t *ev = json_pack("{s:s}", "event", "shutdown");
    ld_session_event(s, ev);
    ld_session_close(s, "shutdown");
}

void
ld_session_shutdown_all(void)
{
    ld_session_foreach(shutdown_one, NULL);
    LD_ASSERT(session_mod.count == 0 && TAILQ_EMPTY(&session_mod.open));
}

void
ld_session_cleanup(void)
{
    if (session_mod.ctx == NULL) {
        return; /* never initialised (start-up failed early) */
    }
    ld_session_shutdown_all();
    flush_cb(-1, 0, NULL);
    if (session_mod.flush_ev != NULL) {
        event_free(session_mod.flush_ev);
        session_mod.flush_ev = NULL;
    }
}
