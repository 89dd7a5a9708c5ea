/*
 * Client sessions: one per connection. Reads are framed into lines, each
 * line becomes a request handed to dispatch; answers may come back in any
 * order. A session's memory outlives its socket until the last request in
 * flight has been answered, so feature modules never see a dangling
 * session pointer inside a request.
 */
#include "ld_session.h"

#include "ld_conf.h"
#include "ld_dispatch.h"
#include "ld_frame.h"
#include "ld_listen.h"
#include "ld_log.h"
#include "ld_proto.h"
#include "ld_server.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

/* A client that stops reading its replies must not grow our memory without
 * bound: past this much unsent output we stop reading its requests. */
#define OUTPUT_HIGH_BYTES (4u * 1024 * 1024)
#define OUTPUT_LOW_BYTES (1u * 1024 * 1024)

#define MAX_HOOKS 8

static struct ld_session *sessions;
static long long session_count;
static uint64_t next_session_id = 1;
static ld_session_hook *close_hooks[MAX_HOOKS];
static size_t n_close_hooks;

/* A client that half-closes (shutdown(SHUT_WR), as `socat` and `nc -N`
 * do after the last request) still wants the answers to what it sent. At
 * EOF the session ends at once, as for any closed connection: its locks
 * are released and its waiters leave their queues. But the socket stays
 * open for writing until the requests already in flight are answered,
 * within this bound past redis.timeout_ms, which also caps what a crashed
 * client (indistinguishable from a half-closed one) keeps alive. */
#define LINGER_EXTRA_MS 2000

struct session_io {
    struct ld_framer framer;
    struct event *linger_ev;   /* bounds the writing after close */
    bool dirty;                /* on the flush list */
    struct ld_session *next_dirty;
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
static struct event *flush_ev;
static struct ld_session *dirty_head;
static long long lingering;    /* closed sessions still writing */

static void
mark_dirty(struct ld_session *s)
{
    if (s->io->dirty) {
        return;
    }
    s->io->dirty = true;
    s->io->next_dirty = dirty_head;
    dirty_head = s;
    ld_session_ref(s);
    if (flush_ev == NULL) {
        return;
    }
    event_active(flush_ev, EV_WRITE, 0);
}

static void
flush_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    struct ld_session *list = dirty_head;
    dirty_head = NULL;
    while (list != NULL) {
        struct ld_session *s = list;
        list = s->io->next_dirty;
        s->io->dirty = false;
        struct evbuffer *out =
            s->bev != NULL ? bufferevent_get_output(s->bev) : NULL;
        if (s->open && out != NULL && evbuffer_get_length(out) > 0) {
            /* A socket bufferevent keeps the front of its output frozen
             * so only it drains it; it unfreezes the same way for its
             * own writes. */
            evbuffer_unfreeze(out, 1);
            int n = evbuffer_write(out, bufferevent_getfd(s->bev));
            evbuffer_freeze(out, 1);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != EINTR) {
                ld_session_close(s, strerror(errno));
            } else if (evbuffer_get_length(out) > 0) {
                /* The socket is full: let the bufferevent finish. */
                bufferevent_enable(s->bev, EV_WRITE);
            }
        }
        ld_session_unref(s);
    }
}

void
ld_session_on_close(ld_session_hook *fn)
{
    if (n_close_hooks < MAX_HOOKS) {
        close_hooks[n_close_hooks++] = fn;
    }
}

struct ld_session *
ld_session_first(void)
{
    return sessions;
}

long long
ld_session_count(void)
{
    return session_count;
}

void
ld_session_ref(struct ld_session *s)
{
    s->refs++;
}

void
ld_session_unref(struct ld_session *s)
{
    if (--s->refs == 0) {
        event_free(s->io->linger_ev);
        free(s->io);
        free(s);
    }
}

/* After close: the socket is kept (holding a reference) only to write
 * what is queued and the answers still owed; this drops it. */
static void
release_socket(struct ld_session *s)
{
    if (s->bev == NULL) {
        return;
    }
    bufferevent_free(s->bev);
    s->bev = NULL;
    event_del(s->io->linger_ev);
    lingering--;
    ld_session_unref(s);
}

long long
ld_session_lingering(void)
{
    return lingering;
}

static bool
closed_and_done(struct ld_session *s)
{
    return !s->open && s->bev != NULL && s->pending == 0 &&
           evbuffer_get_length(bufferevent_get_output(s->bev)) == 0;
}

void
ld_session_req_done(struct ld_session *s)
{
    s->pending--;
    ld_stats.requests_pending--;
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
    log_debug("session closed session=%s reason=%s pending=%lld", s->name,
              why, s->pending);

    for (size_t i = 0; i < n_close_hooks; i++) {
        close_hooks[i](s);
    }

    if (s->prev != NULL) {
        s->prev->next = s->next;
    } else {
        sessions = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    }
    session_count--;
    ld_stats.sessions = session_count;

    if (s->bev != NULL) {
        /* What is queued (the shutdown event, the last replies) and the
         * answers still owed go out, within a bound; the socket keeps
         * the session's memory alive meanwhile. */
        bufferevent_disable(s->bev, EV_READ);
        ld_session_ref(s);
        lingering++;
        if (closed_and_done(s)) {
            release_socket(s);
        } else {
            long long ms = ld_srv.cfg->redis.timeout_ms + LINGER_EXTRA_MS;
            struct timeval tv = {(time_t)(ms / 1000),
                                 (suseconds_t)(ms % 1000) * 1000};
            bufferevent_setwatermark(s->bev, EV_WRITE, 0, 0);
            bufferevent_setcb(s->bev, NULL, closed_write_cb,
                              closed_event_cb, s);
            bufferevent_enable(s->bev, EV_WRITE);
            event_add(s->io->linger_ev, &tv);
        }
    }
    ld_session_unref(s);
}

void
ld_session_write(struct ld_session *s, const char *buf, size_t len)
{
    if (s->bev == NULL) {
        return;
    }
    struct evbuffer *out = bufferevent_get_output(s->bev);
    evbuffer_add(out, buf, len);
    if (s->open) {
        mark_dirty(s);
        if (evbuffer_get_length(out) > OUTPUT_HIGH_BYTES) {
            bufferevent_disable(s->bev, EV_READ);
        }
    }
}

void
ld_session_write_buffer(struct ld_session *s, struct evbuffer *buf)
{
    if (s->bev == NULL) {
        evbuffer_drain(buf, evbuffer_get_length(buf));
        return;
    }
    struct evbuffer *out = bufferevent_get_output(s->bev);
    evbuffer_add_buffer(out, buf);
    if (s->open) {
        mark_dirty(s);
        if (evbuffer_get_length(out) > OUTPUT_HIGH_BYTES) {
            bufferevent_disable(s->bev, EV_READ);
        }
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
reply_bare_error(struct ld_session *s, json_t *id, int code, const char *msg)
{
    size_t len = 0;
    ld_stats_count_error(code);
    char *line = ld_proto_error_line(id, code, NULL, msg, &len);
    if (line != NULL) {
        ld_session_write(s, line, len);
        free(line);
    }
}

static void
handle_line(struct ld_session *s, const char *line, size_t len)
{
    json_t *body = NULL;
    json_t *id = NULL;
    char msg[256];

    ld_stats.requests++;
    if (ld_proto_parse(line, len, &body, &id, msg, sizeof(msg)) != LD_OK) {
        reply_bare_error(s, id, LD_E_BAD_REQUEST, msg);
        if (id != NULL) {
            json_decref(id);
        }
        return;
    }

    struct ld_req *req = calloc(1, sizeof(*req));
    if (req == NULL) {
        reply_bare_error(s, id, LD_E_INTERNAL, "out of memory");
        json_decref(body);
        if (id != NULL) {
            json_decref(id);
        }
        return;
    }
    req->sess = s;
    req->id = id;
    req->body = body;
    req->op = json_string_value(json_object_get(body, "op"));
    req->start_us = ld_now_us();
    s->pending++;
    ld_stats.requests_pending++;
    ld_session_ref(s);
    ld_dispatch(req);
}

static void
read_cb(struct bufferevent *bev, void *arg)
{
    struct ld_session *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);

    /* A handler may close the session (or the daemon may begin stopping)
     * while we are still draining lines of this read. */
    ld_session_ref(s);
    while (s->open) {
        char *line = NULL;
        size_t len = 0;
        s->io->framer.max_bytes =
            (size_t)ld_srv.cfg->limits.max_request_bytes;
        enum ld_frame_result r = ld_frame_next(&s->io->framer, in, &line,
                                               &len);
        if (r == LD_FRAME_NEED_MORE) {
            break;
        }
        if (r == LD_FRAME_TOO_LARGE) {
            char msg[96];
            ld_stats.requests++;
            snprintf(msg, sizeof(msg), "request line over %lld bytes",
                     ld_srv.cfg->limits.max_request_bytes);
            reply_bare_error(s, NULL, LD_E_TOO_LARGE, msg);
            continue;
        }
        handle_line(s, line, len);
        free(line);
    }
    ld_session_unref(s);
}

static void
write_cb(struct bufferevent *bev, void *arg)
{
    struct ld_session *s = arg;
    size_t left = evbuffer_get_length(bufferevent_get_output(bev));
    if (left == 0) {
        /* Back to writing from flush_cb (see mark_dirty). */
        bufferevent_disable(bev, EV_WRITE);
    }
    if (s->open && left <= OUTPUT_LOW_BYTES) {
        bufferevent_enable(bev, EV_READ);
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

struct ld_session *
ld_session_new(int fd, struct ld_listener *l)
{
    if (session_count >= ld_srv.cfg->limits.max_clients ||
        ld_srv.shutting_down) {
        /* One line and goodbye: the socket is fresh, so this small write
         * does not block in practice; if it would, the client just sees
         * the close. */
        size_t len = 0;
        int code = ld_srv.shutting_down ? LD_E_SHUTTING_DOWN : LD_E_BUSY;
        char *line = ld_proto_error_line(
            NULL, code, NULL,
            code == LD_E_BUSY ? "too many clients (limits.max_clients)"
                              : "the daemon is stopping",
            &len);
        if (line != NULL) {
            ssize_t w = write(fd, line, len);
            LD_UNUSED(w);
            free(line);
        }
        ld_stats_count_error(code);
        ld_stats.connections_rejected++;
        close(fd);
        return NULL;
    }

    struct ld_session *s = calloc(1, sizeof(*s));
    struct session_io *io = calloc(1, sizeof(*io));
    struct bufferevent *bev = bufferevent_socket_new(
        ld_srv.base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (io != NULL) {
        io->linger_ev = evtimer_new(ld_srv.base, linger_cb, s);
    }
    if (s == NULL || io == NULL || bev == NULL || io->linger_ev == NULL) {
        if (io != NULL && io->linger_ev != NULL) {
            event_free(io->linger_ev);
        }
        free(s);
        free(io);
        if (bev != NULL) {
            bufferevent_free(bev);
        } else {
            close(fd);
        }
        log_error("session allocation failed");
        return NULL;
    }
    s->id = next_session_id++;
    snprintf(s->name, sizeof(s->name), "%s-%llu", ld_srv.instance,
             (unsigned long long)s->id);
    s->fd = fd;
    s->bev = bev;
    s->io = io;
    s->listener = l;
    s->open = true;
    s->authed = (l == NULL || !l->auth_required);
    s->refs = 1;

    s->next = sessions;
    if (sessions != NULL) {
        sessions->prev = s;
    }
    sessions = s;
    session_count++;
    ld_stats.sessions = session_count;
    ld_stats.connections_accepted++;

    if (flush_ev == NULL) {
        flush_ev = event_new(ld_srv.base, -1, 0, flush_cb, NULL);
    }
    bufferevent_setcb(bev, read_cb, write_cb, event_cb, s);
    bufferevent_setwatermark(bev, EV_WRITE, OUTPUT_LOW_BYTES, 0);
    /* A new bufferevent has writing enabled; flush_cb writes instead. */
    bufferevent_disable(bev, EV_WRITE);
    bufferevent_enable(bev, EV_READ);
    log_debug("session opened session=%s listener=%s", s->name,
              l != NULL ? l->name : "-");
    return s;
}

void
ld_session_shutdown_all(void)
{
    while (sessions != NULL) {
        struct ld_session *s = sessions;
        json_t *ev = json_pack("{s:s}", "event", "shutdown");
        ld_session_event(s, ev);
        ld_session_close(s, "shutdown");
    }
}

void
ld_session_cleanup(void)
{
    ld_session_shutdown_all();
    flush_cb(-1, 0, NULL);
    if (flush_ev != NULL) {
        event_free(flush_ev);
        flush_ev = NULL;
    }
}
