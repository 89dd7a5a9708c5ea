/* libleased: see leased/client.h for the contract.
 *
 * One connection is one socket plus three pieces of state: the bytes read
 * but not yet split into lines, the replies that arrived for requests
 * other than the one being waited for, and the events not yet handed out.
 * Every wait goes through conn_read, which splits lines and sorts each
 * into replies or events, so an event that arrives in the middle of a
 * lock call is never lost and never mistaken for its reply.
 *
 * The file owns that connection state and nothing else: no global
 * state besides constant tables, no signal handler, no output on stdout
 * or stderr (every failure goes back to the caller in a struct
 * leased_error), and no SIGPIPE (sends use MSG_NOSIGNAL), so that it can
 * live inside any program. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "client_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <jansson.h>

/* A reply line larger than this is not something the daemon sends; stop
 * before it eats the process's memory. */
#define LC_MAX_LINE (256u * 1024 * 1024)
#define LC_READ_CHUNK 65536

struct lc_reply {
    uint64_t id;
    json_t *msg;
    struct lc_reply *next;
};

struct lc_event {
    struct leased_event ev;
    struct lc_event *next;
};

/* --- errors ------------------------------------------------------------- */

static const struct {
    int code;
    const char *name;
} lc_codes[] = {
    {LEASED_OK, "ok"},
    {LEASED_E_BAD_REQUEST, "bad_request"},
    {LEASED_E_UNKNOWN_OP, "unknown_op"},
    {LEASED_E_TOO_LARGE, "too_large"},
    {LEASED_E_UNAUTHORIZED, "unauthorized"},
    {LEASED_E_NOT_HELD, "not_held"},
    {LEASED_E_REDIS_UNAVAILABLE, "redis_unavailable"},
    {LEASED_E_BUSY, "busy"},
    {LEASED_E_WRONG_TYPE, "wrong_type"},
    {LEASED_E_SHUTTING_DOWN, "shutting_down"},
    {LEASED_E_INTERNAL, "internal"},
    {LEASED_E_CONNECT, "connect"},
    {LEASED_E_IO, "io"},
    {LEASED_E_TIMEOUT, "timeout"},
    {LEASED_E_PROTOCOL, "protocol"},
    {LEASED_E_INVALID, "invalid"},
    {LEASED_E_NOMEM, "nomem"},
};

const char *
leased_strerror(int code)
{
    for (size_t i = 0; i < sizeof lc_codes / sizeof lc_codes[0]; i++) {
        if (lc_codes[i].code == code) {
            return lc_codes[i].name;
        }
    }
    return "unknown";
}

/* The wire names only: client-side names never come from the daemon. */
static int
code_from_name(const char *name)
{
    for (size_t i = 1; i < sizeof lc_codes / sizeof lc_codes[0]; i++) {
        if (lc_codes[i].code >= LEASED_E_CONNECT) {
            break;
        }
        if (strcmp(lc_codes[i].name, name) == 0) {
            return lc_codes[i].code;
        }
    }
    return -1;
}

int
lc_set_err(struct leased_error *err, int code, int sys_errno, const char *fmt,
           ...)
{
    va_list ap;

    if (err != NULL) {
        err->code = code;
        err->sys_errno = sys_errno;
        err->reason[0] = '\0';
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

void
lc_clear_err(struct leased_error *err)
{
    if (err != NULL) {
        memset(err, 0, sizeof *err);
    }
}

static int
nomem(struct leased_error *err)
{
    return lc_set_err(err, LEASED_E_NOMEM, ENOMEM, "out of memory");
}

/* --- time --------------------------------------------------------------- */

long long
lc_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1: no deadline. */
static long long
deadline_after(long long timeout_ms)
{
    return timeout_ms < 0 ? -1 : lc_now_ms() + timeout_ms;
}

/* Milliseconds left for poll(): -1 for none, 0 when past. */
static int
ms_left(long long deadline)
{
    long long left;

    if (deadline < 0) {
        return -1;
    }
    left = deadline - lc_now_ms();
    if (left <= 0) {
        return 0;
    }
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* The timeout of a call that asks the daemon to wait WAIT_MS. */
static long long
call_timeout(const struct leased_conn *c, long long wait_ms)
{
    if (c->timeout_ms < 0 || wait_ms < 0) {
        return -1;
    }
    return (long long)c->timeout_ms + wait_ms;
}

/* --- connection state --------------------------------------------------- */

static void
conn_break(struct leased_conn *c, int code, int sys_errno, const char *why)
{
    if (c->broken) {
        return;
    }
    c->broken = true;
    c->broken_code = code;
    c->broken_errno = sys_errno;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", why);
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
}

static int
broken_err(const struct leased_conn *c, struct leased_error *err)
{
    return lc_set_err(err, c->broken_code, c->broken_errno, "%s",
                      c->broken_msg);
}

static bool
inflight_has(const struct leased_conn *c, uint64_t id)
{
    for (size_t i = 0; i < c->ninflight; i++) {
        if (c->inflight[i] == id) {
            return true;
        }
    }
    return false;
}

static int
inflight_add(struct leased_conn *c, uint64_t id)
{
    if (c->ninflight == c->capinflight) {
        size_t ncap = c->capinflight != 0 ? c->capinflight * 2 : 8;
        uint64_t *n = realloc(c->inflight, ncap * sizeof *n);

        if (n == NULL) {
            return -1;
        }
        c->inflight = n;
        c->capinflight = ncap;
    }
    c->inflight[c->ninflight++] = id;
    return 0;
}

static void
inflight_remove(struct leased_conn *c, uint64_t id)
{
    for (size_t i = 0; i < c->ninflight; i++) {
        if (c->inflight[i] == id) {
            memmove(c->inflight + i, c->inflight + i + 1,
                    (c->ninflight - i - 1) * sizeof *c->inflight);
            c->ninflight--;
            return;
        }
    }
}

static bool
reply_buffered(const struct leased_conn *c, uint64_t id)
{
    for (const struct lc_reply *r = c->replies; r != NULL; r = r->next) {
        if (r->id == id) {
            return true;
        }
    }
    return false;
}

static json_t *
reply_take(struct leased_conn *c, uint64_t id)
{
    for (struct lc_reply **pp = &c->replies; *pp != NULL; pp = &(*pp)->next) {
        struct lc_reply *r = *pp;

        if (r->id == id) {
            json_t *msg = r->msg;

            *pp = r->next;
            free(r);
            return msg;
        }
    }
    return NULL;
}

static void
replies_clear(struct leased_conn *c)
{
    while (c->replies != NULL) {
        struct lc_reply *r = c->replies;

        c->replies = r->next;
        json_decref(r->msg);
        free(r);
    }
    c->ninflight = 0;
}

/* Only the library's own ids are taken as ours: unsigned integers. */
static bool
reply_id(json_t *msg, uint64_t *id)
{
    json_t *v = json_object_get(msg, "id");

    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        return false;
    }
    *id = (uint64_t)json_integer_value(v);
    return true;
}

static void
on_reply(struct leased_conn *c, json_t *msg)
{
    struct lc_reply *r;
    uint64_t id;

    if (!reply_id(msg, &id)) {
        /* Only a line the daemon could not read (bad JSON, too large, or
         * the busy line of a refused connection) is answered without its
         * id. The daemon answers such lines as it reads them, so the
         * oldest request still unanswered is the best match; a blocking
         * caller has only one. */
        bool found = false;

        for (size_t i = 0; i < c->ninflight; i++) {
            if (!reply_buffered(c, c->inflight[i])) {
                id = c->inflight[i];
                found = true;
                break;
            }
        }
        if (!found) {
            json_decref(msg);
            return;
        }
    } else if (!inflight_has(c, id) || reply_buffered(c, id)) {
        /* A reply to an abandoned (timed-out) request. */
        json_decref(msg);
        return;
    }
    r = malloc(sizeof *r);
    if (r == NULL) {
        json_decref(msg);
        return;
    }
    r->id = id;
    r->msg = msg;
    r->next = c->replies;
    c->replies = r;
}

static char *
dup_str(json_t *v)
{
    const char *s = json_string_value(v);

    return s != NULL ? strdup(s) : NULL;
}

static enum leased_event_type
event_type(const char *name)
{
    static const struct {
        const char *name;
        enum leased_event_type type;
    } known[] = {
        {"sem_lost", LEASED_EV_SEM_LOST},
        {"lock_at_risk", LEASED_EV_LOCK_AT_RISK},
        {"lock_safe", LEASED_EV_LOCK_SAFE},
        {"sem_at_risk", LEASED_EV_SEM_AT_RISK},
        {"sem_safe", LEASED_EV_SEM_SAFE},
    };

    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(name, known[i].name) == 0) {
            return known[i].type;
        }
    }
    return LEASED_EV_OTHER;
}

/* -1 when absent, so that 0 stays a value the daemon sent. */
static long long
int_or_none(json_t *v)
{
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static void
on_event(struct leased_conn *c, json_t *msg)
{
    struct lc_event *e = calloc(1, sizeof *e);
    const char *name = json_string_value(json_object_get(msg, "event"));

    if (e == NULL) {
        json_decref(msg);
        return;
    }
    if (strcmp(name, "lock_lost") == 0) {
        e->ev.type = LEASED_EV_LOCK_LOST;
    } else if (strcmp(name, "shutdown") == 0) {
        e->ev.type = LEASED_EV_SHUTDOWN;
    } else {
        e->ev.type = event_type(name);
    }
    e->ev.name = strdup(name);
    e->ev.key = dup_str(json_object_get(msg, "key"));
    e->ev.token = dup_str(json_object_get(msg, "token"));
    e->ev.reason = dup_str(json_object_get(msg, "reason"));
    e->ev.lease_left_ms = int_or_none(json_object_get(msg, "lease_left_ms"));
    e->ev.lease_ms = int_or_none(json_object_get(msg, "lease_ms"));
    json_decref(msg);
    if (c->ev_tail != NULL) {
        c->ev_tail->next = e;
    } else {
        c->ev_head = e;
    }
    c->ev_tail = e;
}

static void
on_line(struct leased_conn *c, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *msg;

    if (len > 0 && line[len - 1] == '\r') {
        len--;
    }
    if (len == 0) {
        return;
    }
    msg = json_loadb(line, len, 0, &jerr);
    if (!json_is_object(msg)) {
        char why[200];

        snprintf(why, sizeof why,
                 "the daemon sent a line that is not a "
                 "JSON object (%.100s)",
                 msg != NULL ? "not an object" : jerr.text);
        json_decref(msg);
        conn_break(c, LEASED_E_PROTOCOL, 0, why);
        return;
    }
    if (json_is_string(json_object_get(msg, "event")) &&
        json_object_get(msg, "ok") == NULL) {
        on_event(c, msg);
    } else {
        on_reply(c, msg);
    }
}

static void
split_lines(struct leased_conn *c)
{
    size_t start = 0;

    while (!c->broken) {
        char *nl = memchr(c->rbuf + start, '\n', c->rlen - start);
        size_t end;

        if (nl == NULL) {
            break;
        }
        end = (size_t)(nl - c->rbuf);
        on_line(c, c->rbuf + start, end - start);
        start = end + 1;
    }
    if (start > 0 && start <= c->rlen) {
        memmove(c->rbuf, c->rbuf + start, c->rlen - start);
        c->rlen -= start;
    }
}

static void
deliver_events(struct leased_conn *c)
{
    if (c->in_callback) {
        return;
    }
    while (c->cb != NULL && c->ev_head != NULL) {
        struct lc_event *e = c->ev_head;

        c->ev_head = e->next;
        if (c->ev_head == NULL) {
            c->ev_tail = NULL;
        }
        c->in_callback = true;
        c->cb(c, &e->ev, c->cb_arg);
        c->in_callback = false;
        leased_event_clear(&e->ev);
        free(e);
    }
}

/* One recv of what is there (the socket is non-blocking). Returns 1 when
 * bytes came, 0 when none were ready, -1 when the connection ended. */
static int
read_ready(struct leased_conn *c)
{
    ssize_t n;

    if (c->rcap - c->rlen < LC_READ_CHUNK) {
        size_t ncap = c->rcap != 0 ? c->rcap * 2 : 2 * LC_READ_CHUNK;
        char *nb;

        if (ncap > LC_MAX_LINE + LC_READ_CHUNK) {
            conn_break(c, LEASED_E_PROTOCOL, 0,
                       "the daemon sent a line over 256 MiB");
            return -1;
        }
        nb = realloc(c->rbuf, ncap);
        if (nb == NULL) {
            conn_break(c, LEASED_E_NOMEM, ENOMEM, "out of memory");
            return -1;
        }
        c->rbuf = nb;
        c->rcap = ncap;
    }
    n = lc_recv_fds(c, c->rbuf + c->rlen, c->rcap - c->rlen);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            return 0;
        }
        {
            char why[200];
            int e = errno;

            snprintf(why, sizeof why, "read from the daemon: %s", strerror(e));
            conn_break(c, LEASED_E_IO, e, why);
        }
        return -1;
    }
    if (n == 0) {
        /* A last line without its newline still counts. */
        split_lines(c);
        if (!c->broken && c->rlen > 0) {
            on_line(c, c->rbuf, c->rlen);
            c->rlen = 0;
        }
        conn_break(c, LEASED_E_IO, 0, "the daemon closed the connection");
        return -1;
    }
    c->rlen += (size_t)n;
    split_lines(c);
    return c->broken ? -1 : 1;
}

/* Wait until DEADLINE (-1: none) for bytes, read them, sort the lines,
 * hand events to the callback. Returns 1 when something was read, 0 on
 * timeout, -1 when the connection ended (what came before is kept). */
static int
conn_read(struct leased_conn *c, long long deadline)
{
    int rc;

    /* Events read while sending wait here for the callback. */
    deliver_events(c);
    for (;;) {
        struct pollfd pfd;
        int pr;

        if (c->broken) {
            return -1;
        }
        pfd.fd = c->fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        pr = poll(&pfd, 1, ms_left(deadline));
        if (pr < 0) {
            if (errno == EINTR) {
                if (deadline >= 0 && ms_left(deadline) == 0) {
                    return 0;
                }
                continue;
            }
            conn_break(c, LEASED_E_IO, errno, "poll failed");
            return -1;
        }
        if (pr == 0) {
            return 0;
        }
        rc = read_ready(c);
        deliver_events(c);
        if (rc != 0) {
            return rc;
        }
        if (deadline >= 0 && ms_left(deadline) == 0) {
            return 0;
        }
    }
}

/* Wait until DEADLINE for room to write, reading what the daemon sends
 * meanwhile. *WRITABLE says whether a send may go now (false after a
 * signal or when only bytes to read came). */
static int
send_poll(struct leased_conn *c, long long deadline, bool *writable,
          struct leased_error *err)
{
    struct pollfd pfd;
    int pr;

    *writable = false;
    if (c->broken) {
        return broken_err(c, err);
    }
    pfd.fd = c->fd;
    pfd.events = POLLIN | POLLOUT;
    pfd.revents = 0;
    pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0) {
        if (errno == EINTR) {
            return LEASED_OK;
        }
        conn_break(c, LEASED_E_IO, errno, "poll failed");
        return broken_err(c, err);
    }
    if (pr == 0) {
        return lc_set_err(err, LEASED_E_TIMEOUT, 0,
                          "timed out sending a request");
    }
    if ((pfd.revents & POLLIN) && read_ready(c) < 0) {
        return broken_err(c, err);
    }
    *writable = (pfd.revents & (POLLOUT | POLLERR | POLLHUP)) != 0;
    return LEASED_OK;
}

/* A send failed with errno E: the connection is over. */
static int
send_failed(struct leased_conn *c, int e, struct leased_error *err)
{
    char why[200];

    /* A daemon that refused the connection wrote one busy line before
     * closing; read it so the caller learns why. */
    while (read_ready(c) > 0) {
    }
    snprintf(why, sizeof why, "write to the daemon: %s", strerror(e));
    conn_break(c, LEASED_E_IO, e, why);
    return broken_err(c, err);
}

/* Send all of BUF before DEADLINE, reading meanwhile so that a daemon
 * that waits for us to drain its replies cannot deadlock a large send. */
int
lc_send_all(struct leased_conn *c, const char *buf, size_t len,
            long long deadline, struct leased_error *err)
{
    size_t off = 0;

    while (off < len) {
        bool writable;
        ssize_t n;
        int rc = send_poll(c, deadline, &writable, err);

        if (rc != LEASED_OK) {
            return rc;
        }
        if (!writable) {
            continue;
        }
        n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            int e = errno;

            if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) {
                continue;
            }
            return send_failed(c, e, err);
        }
        off += (size_t)n;
    }
    return LEASED_OK;
}

/* --- requests ----------------------------------------------------------- */

/* REQ with ID added, as one line: *TEXT (malloc'd) of *LEN bytes, the
 * newline included. */
int
lc_encode_req(json_t *req, uint64_t id, char **text, size_t *len,
              struct leased_error *err)
{
    json_t *msg = json_copy(req);
    char *s, *t;
    size_t n;

    if (msg == NULL) {
        return nomem(err);
    }
    if (json_object_set_new(msg, "id", json_integer((json_int_t)id)) < 0) {
        json_decref(msg);
        return nomem(err);
    }
    s = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    if (s == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0,
                          "the request cannot be encoded as JSON");
    }
    n = strlen(s);
    t = realloc(s, n + 2);
    if (t == NULL) {
        free(s);
        return nomem(err);
    }
    t[n++] = '\n';
    t[n] = '\0';
    *text = t;
    *len = n;
    return LEASED_OK;
}

/* Copy REQ, give it a fresh id, send it. The id counts as in flight. */
static int
send_req(struct leased_conn *c, json_t *req, uint64_t *id_out,
         long long deadline, struct leased_error *err)
{
    char *text = NULL;
    size_t n = 0;
    uint64_t id;
    int rc;

    if (!json_is_object(req)) {
        return lc_set_err(err, LEASED_E_INVALID, 0,
                          "a request must be a JSON object");
    }
    if (c->broken) {
        return broken_err(c, err);
    }
    lc_near_report_due(c, deadline);
    id = ++c->next_id;
    rc = lc_encode_req(req, id, &text, &n, err);
    if (rc != LEASED_OK) {
        return rc;
    }
    if (inflight_add(c, id) < 0) {
        free(text);
        return nomem(err);
    }
    rc = lc_send_all(c, text, n, deadline, err);
    free(text);
    if (rc != LEASED_OK && !reply_buffered(c, id)) {
        inflight_remove(c, id);
        return rc;
    }
    *id_out = id;
    return LEASED_OK;
}

/* The error of an ok:false reply (or LEASED_OK). */
static int
reply_status(json_t *reply, struct leased_error *err)
{
    json_t *e, *code, *msg, *reason;
    int ec;

    if (json_is_true(json_object_get(reply, "ok"))) {
        return LEASED_OK;
    }
    if (!json_is_false(json_object_get(reply, "ok"))) {
        return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                          "reply without a boolean \"ok\"");
    }
    e = json_object_get(reply, "error");
    code = json_object_get(e, "code");
    msg = json_object_get(e, "message");
    if (!json_is_string(code)) {
        return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                          "error reply without a code");
    }
    ec = code_from_name(json_string_value(code));
    if (ec < 0) {
        return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                          "unknown error code %s: %s", json_string_value(code),
                          json_is_string(msg) ? json_string_value(msg) : "");
    }
    lc_set_err(err, ec, 0, "%s",
               json_is_string(msg) ? json_string_value(msg)
                                   : json_string_value(code));
    reason = json_object_get(e, "reason");
    if (err != NULL && json_is_string(reason)) {
        snprintf(err->reason, sizeof err->reason, "%s",
                 json_string_value(reason));
    }
    return ec;
}

/* Wait for the reply to ID until DEADLINE. On timeout the id stays in
 * flight when KEEP, else it is abandoned (its late reply dropped). */
static int
wait_reply(struct leased_conn *c, uint64_t id, long long deadline, bool keep,
           json_t **reply, struct leased_error *err)
{
    for (;;) {
        json_t *msg = reply_take(c, id);
        int rc;

        if (msg != NULL) {
            inflight_remove(c, id);
            json_object_del(msg, "id");
            *reply = msg;
            return LEASED_OK;
        }
        if (c->broken) {
            inflight_remove(c, id);
            return broken_err(c, err);
        }
        rc = conn_read(c, deadline);
        if (rc == 0 && !reply_buffered(c, id)) {
            if (!keep) {
                inflight_remove(c, id);
            }
            return lc_set_err(err, LEASED_E_TIMEOUT, 0,
                              "no reply from the daemon in time");
        }
    }
}

/* Send REQ and wait for its reply; LEASED_OK only for an ok reply. *REPLY
 * gets the reply whenever one came. */
static int
call(struct leased_conn *c, json_t *req, long long wait_ms, json_t **reply,
     struct leased_error *err)
{
    long long deadline = deadline_after(call_timeout(c, wait_ms));
    uint64_t id;
    int rc;

    *reply = NULL;
    lc_clear_err(err);
    if (c == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no connection");
    }
    rc = send_req(c, req, &id, deadline, err);
    if (rc != LEASED_OK) {
        return rc;
    }
    rc = wait_reply(c, id, deadline, false, reply, err);
    if (rc != LEASED_OK) {
        return rc;
    }
    return reply_status(*reply, err);
}

/* call() for a request built here (REQ stolen; NULL means building it
 * ran out of memory or met a string that is not UTF-8). */
int
lc_call_new(struct leased_conn *c, json_t *req, long long wait_ms,
            json_t **reply, struct leased_error *err)
{
    int rc;

    *reply = NULL;
    if (req == NULL) {
        lc_clear_err(err);
        return lc_set_err(err, LEASED_E_INVALID, 0,
                          "a string argument is not valid UTF-8 "
                          "(or out of memory)");
    }
    rc = call(c, req, wait_ms, reply, err);
    json_decref(req);
    return rc;
}

int
leased_call_json(struct leased_conn *c, json_t *req, long long wait_ms,
                 json_t **reply, struct leased_error *err)
{
    json_t *r = NULL;
    int rc = call(c, req, wait_ms, &r, err);

    if (reply != NULL) {
        *reply = r;
    } else {
        json_decref(r);
    }
    return rc;
}

int
leased_call_raw(struct leased_conn *c, const char *request, long long wait_ms,
                char **reply, struct leased_error *err)
{
    json_error_t jerr;
    json_t *req, *r = NULL;
    int rc;

    if (reply != NULL) {
        *reply = NULL;
    }
    lc_clear_err(err);
    if (request == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no request");
    }
    req = json_loads(request, JSON_DECODE_ANY, &jerr);
    if (!json_is_object(req)) {
        json_decref(req);
        return lc_set_err(err, LEASED_E_INVALID, 0,
                          "the request is not a JSON object: %s",
                          req != NULL ? "other JSON value" : jerr.text);
    }
    rc = call(c, req, wait_ms, &r, err);
    json_decref(req);
    if (r != NULL && reply != NULL) {
        *reply = json_dumps(r, JSON_COMPACT);
        if (*reply == NULL) {
            json_decref(r);
            return nomem(err);
        }
    }
    json_decref(r);
    return rc;
}

int
leased_send(struct leased_conn *c, json_t *req, uint64_t *id,
            struct leased_error *err)
{
    uint64_t tmp;

    lc_clear_err(err);
    if (c == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no connection");
    }
    return send_req(c, req, id != NULL ? id : &tmp,
                    deadline_after(c->timeout_ms), err);
}

int
leased_wait_reply(struct leased_conn *c, uint64_t id, int timeout_ms,
                  json_t **reply, struct leased_error *err)
{
    json_t *r = NULL;
    int rc;

    lc_clear_err(err);
    if (reply != NULL) {
        *reply = NULL;
    }
    if (c == NULL || !inflight_has(c, id)) {
        return lc_set_err(err, LEASED_E_INVALID, 0,
                          "no request with id %llu in flight",
                          (unsigned long long)id);
    }
    rc = wait_reply(c, id, deadline_after(timeout_ms), true, &r, err);
    if (rc != LEASED_OK) {
        return rc;
    }
    rc = reply_status(r, err);
    if (reply != NULL) {
        *reply = r;
    } else {
        json_decref(r);
    }
    return rc;
}

/* --- connecting --------------------------------------------------------- */

void
leased_options_init(struct leased_options *opt)
{
    memset(opt, 0, sizeof *opt);
}

/* Is TARGET "host:port"? A path wins whenever there is a '/'. */
static bool
split_hostport(const char *target, char *host, size_t hostlen, char *port,
               size_t portlen)
{
    const char *colon = strrchr(target, ':');
    const char *h = target;
    size_t hl;

    if (strchr(target, '/') != NULL || colon == NULL || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
        strlen(colon + 1) >= portlen) {
        return false;
    }
    hl = (size_t)(colon - target);
    if (hl >= 2 && target[0] == '[' && target[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= hostlen) {
        return false;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, portlen, "%s", colon + 1);
    return true;
}

/* Finish a non-blocking connect by DEADLINE. Returns 0 or an errno. */
static int
connect_wait(int fd, const struct sockaddr *sa, socklen_t len,
             long long deadline)
{
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    int pr;

    if (connect(fd, sa, len) == 0) {
        return 0;
    }
    if (errno != EINPROGRESS && errno != EINTR && errno != EAGAIN) {
        return errno;
    }
    if (errno == EAGAIN) {
        /* A Unix socket whose backlog is full. */
        return EAGAIN;
    }
    do {
        pr = poll(&pfd, 1, ms_left(deadline));
    } while (pr < 0 && errno == EINTR);
    if (pr < 0) {
        return errno;
    }
    if (pr == 0) {
        return ETIMEDOUT;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) {
        return errno;
    }
    return soerr;
}

/* What to check when the daemon cannot be reached (errno E), for the
 * message of LEASED_E_CONNECT: the caller is rarely the one who set up
 * the socket. */
static const char *
connect_hint(int e, bool tcp)
{
    if (e == EACCES || e == EPERM) {
        return "is this user in the socket's group (listen.unix_group)?";
    }
    if (tcp) {
        return "is leased running and listening there (listen.tcp)?";
    }
    return "is leased running, and is the path (or $LEASED_SOCKET) its "
           "listen.unix?";
}

static int
open_unix(const char *path, long long deadline, int *fd_out,
          struct leased_error *err)
{
    struct sockaddr_un sa;
    int fd, e;

    if (strlen(path) >= sizeof sa.sun_path) {
        return lc_set_err(err, LEASED_E_CONNECT, ENAMETOOLONG,
                          "socket path too long: %s", path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        e = errno;
        return lc_set_err(err, LEASED_E_CONNECT, e, "socket: %s", strerror(e));
    }
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    e = connect_wait(fd, (struct sockaddr *)&sa, sizeof sa, deadline);
    if (e != 0) {
        close(fd);
        return lc_set_err(err, LEASED_E_CONNECT, e, "connect to %s: %s; %s",
                          path, strerror(e), connect_hint(e, false));
    }
    *fd_out = fd;
    return LEASED_OK;
}

static int
open_tcp(const char *target, const char *host, const char *port,
         long long deadline, int *fd_out, struct leased_error *err)
{
    struct addrinfo hints, *res = NULL;
    int gai, e = ECONNREFUSED;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) {
        return lc_set_err(err, LEASED_E_CONNECT, 0, "resolve %s: %s", target,
                          gai_strerror(gai));
    }
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int one = 1;
        int fd = socket(ai->ai_family,
                        ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol);

        if (fd < 0) {
            e = errno;
            continue;
        }
        e = connect_wait(fd, ai->ai_addr, ai->ai_addrlen, deadline);
        if (e == 0) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            freeaddrinfo(res);
            *fd_out = fd;
            return LEASED_OK;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return lc_set_err(err, LEASED_E_CONNECT, e, "connect to %s: %s; %s",
                      target, strerror(e), connect_hint(e, true));
}

static int
conn_open(struct leased_conn *c, struct leased_error *err)
{
    char host[256], port[16];
    int cto = c->connect_timeout_ms != 0 ? c->connect_timeout_ms
                                         : c->timeout_ms;
    long long deadline = deadline_after(cto);
    int fd = -1, rc;

    /* A new session: the old one's segment is no longer its own (its
     * namespace, its features may differ). */
    lc_near_unmap(c);
    c->near_offered = false;
    c->near_failed = false;
    c->near_map_at_ms = 0;
    lc_fds_clear(c);
    c->is_unix = !split_hostport(c->target, host, sizeof host, port,
                                 sizeof port);
    if (!c->is_unix) {
        rc = open_tcp(c->target, host, port, deadline, &fd, err);
    } else {
        rc = open_unix(c->target, deadline, &fd, err);
    }
    if (rc != LEASED_OK) {
        return rc;
    }
    c->fd = fd;
    c->broken = false;
    c->rlen = 0;
    c->session[0] = '\0';
    if (c->hello || c->client != NULL || c->auth != NULL) {
        rc = leased_hello(c, c->client, c->auth, NULL, err);
        if (rc != LEASED_OK) {
            conn_break(c, LEASED_E_IO, 0, "hello failed");
            return rc;
        }
    }
    return LEASED_OK;
}

static void
conn_free(struct leased_conn *c)
{
    if (c->fd >= 0) {
        lc_near_report(c, deadline_after(c->timeout_ms));
        close(c->fd);
    }
    lc_near_unmap(c);
    lc_fds_clear(c);
    replies_clear(c);
    while (c->ev_head != NULL) {
        struct lc_event *e = c->ev_head;

        c->ev_head = e->next;
        leased_event_clear(&e->ev);
        free(e);
    }
    free(c->inflight);
    free(c->rbuf);
    free(c->target);
    free(c->client);
    free(c->auth);
    free(c);
}

struct leased_conn *
leased_connect(const char *target, const struct leased_options *opt,
               struct leased_error *err)
{
    struct leased_conn *c;

    lc_clear_err(err);
    if (target == NULL || *target == '\0') {
        target = getenv("LEASED_SOCKET");
        if (target == NULL || *target == '\0') {
            target = LEASED_DEFAULT_SOCKET;
        }
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        nomem(err);
        return NULL;
    }
    c->fd = -1;
    c->target = strdup(target);
    c->timeout_ms = LEASED_DEFAULT_TIMEOUT_MS;
    if (opt != NULL) {
        if (opt->timeout_ms != 0) {
            c->timeout_ms = opt->timeout_ms;
        }
        c->connect_timeout_ms = opt->connect_timeout_ms;
        c->hello = opt->hello;
        c->client = opt->client != NULL ? strdup(opt->client) : NULL;
        c->auth = opt->auth != NULL ? strdup(opt->auth) : NULL;
    }
    if (c->target == NULL ||
        (opt != NULL && opt->client != NULL && c->client == NULL) ||
        (opt != NULL && opt->auth != NULL && c->auth == NULL)) {
        conn_free(c);
        nomem(err);
        return NULL;
    }
    if (conn_open(c, err) != LEASED_OK) {
        conn_free(c);
        return NULL;
    }
    return c;
}

void
leased_close(struct leased_conn *c)
{
    if (c != NULL) {
        conn_free(c);
    }
}

int
leased_reconnect(struct leased_conn *c, struct leased_error *err)
{
    lc_clear_err(err);
    if (c == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no connection");
    }
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    replies_clear(c);
    c->rlen = 0;
    c->broken = false;
    if (conn_open(c, err) != LEASED_OK) {
        if (!c->broken) {
            conn_break(c, err != NULL ? err->code : LEASED_E_CONNECT,
                       err != NULL ? err->sys_errno : 0, "reconnect failed");
        }
        return err != NULL ? err->code : LEASED_E_CONNECT;
    }
    return LEASED_OK;
}

int
leased_fd(const struct leased_conn *c)
{
    return c != NULL && !c->broken ? c->fd : -1;
}

const char *
leased_session(const struct leased_conn *c)
{
    return c != NULL && c->session[0] != '\0' ? c->session : NULL;
}

void
leased_set_timeout(struct leased_conn *c, int timeout_ms)
{
    if (c != NULL) {
        c->timeout_ms = timeout_ms != 0 ? timeout_ms
                                        : LEASED_DEFAULT_TIMEOUT_MS;
    }
}

void
leased_free(void *p)
{
    free(p);
}

/* --- events ------------------------------------------------------------- */

void
leased_event_clear(struct leased_event *ev)
{
    if (ev == NULL) {
        return;
    }
    free(ev->name);
    free(ev->key);
    free(ev->token);
    free(ev->reason);
    memset(ev, 0, sizeof *ev);
}

void
leased_set_event_callback(struct leased_conn *c, leased_event_fn *fn,
                          void *arg)
{
    if (c == NULL) {
        return;
    }
    c->cb = fn;
    c->cb_arg = arg;
    deliver_events(c);
}

int
leased_next_event(struct leased_conn *c, int timeout_ms,
                  struct leased_event *ev, struct leased_error *err)
{
    long long deadline = deadline_after(timeout_ms);

    lc_clear_err(err);
    if (c == NULL || ev == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no connection or event");
    }
    memset(ev, 0, sizeof *ev);
    for (;;) {
        if (c->ev_head != NULL) {
            struct lc_event *e = c->ev_head;

            c->ev_head = e->next;
            if (c->ev_head == NULL) {
                c->ev_tail = NULL;
            }
            *ev = e->ev;
            free(e);
            return LEASED_OK;
        }
        if (c->broken) {
            return broken_err(c, err);
        }
        if (conn_read(c, deadline) == 0) {
            if (c->ev_head != NULL) {
                continue;
            }
            return lc_set_err(err, LEASED_E_TIMEOUT, 0, "no event in time");
        }
    }
}

int
leased_dispatch(struct leased_conn *c, int timeout_ms,
                struct leased_error *err)
{
    int rc;

    lc_clear_err(err);
    if (c == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no connection");
    }
    if (c->broken) {
        return broken_err(c, err);
    }
    rc = conn_read(c, deadline_after(timeout_ms));
    if (rc > 0) {
        return LEASED_OK;
    }
    if (rc == 0) {
        return lc_set_err(err, LEASED_E_TIMEOUT, 0, "nothing read in time");
    }
    return broken_err(c, err);
}

/* --- reply fields ------------------------------------------------------- */

long long
lc_int_or(json_t *obj, const char *field, long long dflt)
{
    json_t *v = json_object_get(obj, field);

    return json_is_integer(v) ? (long long)json_integer_value(v) : dflt;
}

static bool
bool_field(json_t *obj, const char *field, bool *out)
{
    json_t *v = json_object_get(obj, field);

    if (!json_is_boolean(v)) {
        return false;
    }
    *out = json_is_true(v);
    return true;
}

static int
missing(struct leased_error *err, const char *op, const char *field)
{
    return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                      "%s reply without a valid \"%s\"", op, field);
}

/* Add the optional string field NAME when S is set. */
static int
add_str(json_t *req, const char *name, const char *s)
{
    json_t *v;

    if (req == NULL || s == NULL) {
        return 0;
    }
    v = json_string(s);
    if (v == NULL) {
        return -1;
    }
    return json_object_set_new(req, name, v);
}

/* The request {"op":OP,"key":KEY}, or NULL when KEY is not UTF-8. */
static json_t *
key_req(const char *op, const char *key)
{
    json_t *req = json_object(), *k = key != NULL ? json_string(key) : NULL;

    if (req == NULL || k == NULL) {
        json_decref(req);
        json_decref(k);
        return NULL;
    }
    json_object_set_new(req, "op", json_string(op));
    json_object_set_new(req, "key", k);
    return req;
}

/* --- session ops -------------------------------------------------------- */

int
leased_ping(struct leased_conn *c, struct leased_error *err)
{
    json_t *reply;
    int rc = lc_call_new(c, json_pack("{s:s}", "op", "ping"), 0, &reply, err);

    json_decref(reply);
    return rc;
}

int
leased_hello(struct leased_conn *c, const char *client, const char *auth,
             struct leased_hello_info *info, struct leased_error *err)
{
    json_t *req = json_pack("{s:s}", "op", "hello"), *reply;
    const char *s;
    int rc;

    if (add_str(req, "client", client) < 0 || add_str(req, "auth", auth) < 0) {
        json_decref(req);
        req = NULL;
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        json_t *features = json_object_get(reply, "features"), *f;
        size_t i;

        s = json_string_value(json_object_get(reply, "session"));
        snprintf(c->session, sizeof c->session, "%s", s != NULL ? s : "");
        c->near_offered = false;
        json_array_foreach(features, i, f)
        {
            if (json_is_string(f) &&
                strcmp(json_string_value(f), "shared_near") == 0) {
                c->near_offered = true;
            }
        }
        if (info != NULL) {
            memset(info, 0, sizeof *info);
            s = json_string_value(json_object_get(reply, "server"));
            snprintf(info->server, sizeof info->server, "%s",
                     s != NULL ? s : "");
            s = json_string_value(json_object_get(reply, "version"));
            snprintf(info->version, sizeof info->version, "%s",
                     s != NULL ? s : "");
            info->protocol = (int)lc_int_or(reply, "protocol", 0);
            snprintf(info->session, sizeof info->session, "%s", c->session);
        }
    }
    json_decref(reply);
    return rc;
}

int
leased_stats(struct leased_conn *c, json_t **stats, struct leased_error *err)
{
    json_t *reply, *st;
    int rc = lc_call_new(c, json_pack("{s:s}", "op", "stats"), 0, &reply, err);

    if (stats != NULL) {
        *stats = NULL;
    }
    if (rc == LEASED_OK) {
        st = json_object_get(reply, "stats");
        if (!json_is_object(st)) {
            rc = missing(err, "stats", "stats");
        } else if (stats != NULL) {
            *stats = json_incref(st);
        }
    }
    json_decref(reply);
    return rc;
}

int
leased_stats_text(struct leased_conn *c, char **json_text,
                  struct leased_error *err)
{
    json_t *st = NULL;
    int rc = leased_stats(c, &st, err);

    if (json_text != NULL) {
        *json_text = NULL;
    }
    if (rc == LEASED_OK && json_text != NULL) {
        *json_text = json_dumps(st, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (*json_text == NULL) {
            rc = nomem(err);
        }
    }
    json_decref(st);
    return rc;
}

/* --- locks and semaphores ----------------------------------------------- */

/* The lease fields a lock and a semaphore request share; 0 and false are
 * left out, so the daemon's defaults apply. */
static void
add_lease_args(json_t *req, long long ttl_ms, long long wait_ms, bool detach)
{
    if (req == NULL) {
        return;
    }
    if (ttl_ms != 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    if (wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    if (detach) {
        json_object_set_new(req, "detach", json_true());
    }
}

/* Whether an answer to OP acquired the lease (*ACQUIRED) and, when it
 * did, its token into TOKEN (SIZE bytes); an answer without either is a
 * protocol error. */
static int
reply_acquired(json_t *reply, const char *op, bool *acquired, char *token,
               size_t size, struct leased_error *err)
{
    const char *tok;

    if (!bool_field(reply, "acquired", acquired)) {
        return missing(err, op, "acquired");
    }
    if (!*acquired) {
        return LEASED_OK;
    }
    tok = json_string_value(json_object_get(reply, "token"));
    if (tok == NULL || *tok == '\0' || strlen(tok) >= size) {
        return missing(err, op, "token");
    }
    snprintf(token, size, "%s", tok);
    return LEASED_OK;
}

/* {"op":OP,"keys":[KEYS...]}: lock, unlock or extend of a group. */
static json_t *
keys_req(const char *op, const char *const *keys, size_t n)
{
    json_t *req = json_object(), *arr = json_array();

    if (req == NULL || arr == NULL ||
        json_object_set_new(req, "keys", arr) < 0) {
        json_decref(req);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *k = keys[i] != NULL ? json_string(keys[i]) : NULL;
        if (k == NULL || json_array_append_new(arr, k) < 0) {
            json_decref(req);
            return NULL;
        }
    }
    json_object_set_new(req, "op", json_string(op));
    return req;
}

static int lock_req(struct leased_conn *c, json_t *req,
                    const struct leased_lock_args *args,
                    struct leased_lock_result *out, const char *const *keys,
                    size_t n, long long *fences, struct leased_error *err);

int
leased_lock(struct leased_conn *c, const char *key,
            const struct leased_lock_args *args,
            struct leased_lock_result *out, struct leased_error *err)
{
    return lock_req(c, key_req("lock", key), args, out, NULL, 0, NULL, err);
}

int
leased_lock_keys(struct leased_conn *c, const char *const *keys, size_t n,
                 const struct leased_lock_args *args,
                 struct leased_lock_result *out, long long *fences,
                 struct leased_error *err)
{
    return lock_req(c, keys_req("lock", keys, n), args, out, keys, n, fences,
                    err);
}

/* A group's answer: the fence of each of KEYS into FENCES. */
static bool
group_fences(json_t *reply, const char *const *keys, size_t n,
             long long *fences)
{
    json_t *f = json_object_get(reply, "fences");

    if (!json_is_object(f)) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_object_get(f, keys[i]);
        if (!json_is_integer(v)) {
            return false;
        }
        if (fences != NULL) {
            fences[i] = (long long)json_integer_value(v);
        }
    }
    return true;
}

/* REQ (stolen) with the fields of ARGS; NULL when a string is not valid. */
static json_t *
lock_args_req(json_t *req, const struct leased_lock_args *args)
{
    if (add_str(req, "owner", args->owner) < 0 ||
        add_str(req, "token", args->token) < 0 ||
        add_str(req, "mode", args->mode) < 0) {
        json_decref(req);
        return NULL;
    }
    add_lease_args(req, args->ttl_ms, args->wait_ms, args->detach);
    return req;
}

/* An ok answer to lock into RES: the lease taken, or how long the holder
 * keeps it. KEYS (N, FENCES) as for lock_req. */
static int
lock_reply(json_t *reply, struct leased_lock_result *res,
           const char *const *keys, size_t n, long long *fences,
           struct leased_error *err)
{
    int rc = reply_acquired(reply, "lock", &res->acquired, res->token,
                            sizeof res->token, err);

    if (rc != LEASED_OK) {
        return rc;
    }
    if (!res->acquired) {
        res->ttl_ms = lc_int_or(reply, "ttl_ms", -1);
        return LEASED_OK;
    }
    res->count = lc_int_or(reply, "count", -1);
    res->fence = lc_int_or(reply, "fence", -1);
    res->lease_ms = lc_int_or(reply, "lease_ms", -1);
    if (keys == NULL) {
        return LEASED_OK;
    }
    if (!group_fences(reply, keys, n, fences)) {
        return missing(err, "lock", "fences");
    }
    res->count = 1;
    return LEASED_OK;
}

/* lock with REQ (stolen) naming one key, or the N KEYS of a group. */
static int
lock_req(struct leased_conn *c, json_t *req,
         const struct leased_lock_args *args, struct leased_lock_result *out,
         const char *const *keys, size_t n, long long *fences,
         struct leased_error *err)
{
    struct leased_lock_args none = {0};
    json_t *reply;
    struct leased_lock_result res;
    int rc;

    if (args == NULL) {
        args = &none;
    }
    memset(&res, 0, sizeof res);
    res.ttl_ms = -1;
    rc = lc_call_new(c, lock_args_req(req, args), args->wait_ms, &reply, err);
    if (rc == LEASED_OK) {
        rc = lock_reply(reply, &res, keys, n, fences, err);
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

/* {"op":OP,"key":KEY} plus owner/token and mode, for unlock, extend,
 * lock.info. */
static json_t *
holder_req_mode(const char *op, const char *key, const char *mode,
                const char *owner, const char *token)
{
    json_t *req = key_req(op, key);

    if (add_str(req, "owner", owner) < 0 || add_str(req, "token", token) < 0 ||
        add_str(req, "mode", mode) < 0) {
        json_decref(req);
        return NULL;
    }
    return req;
}

static json_t *
holder_req(const char *op, const char *key, const char *owner,
           const char *token)
{
    return holder_req_mode(op, key, NULL, owner, token);
}

static int unlock_req(struct leased_conn *c, json_t *req,
                      struct leased_unlock_result *out,
                      struct leased_error *err);

int
leased_unlock(struct leased_conn *c, const char *key, const char *owner,
              const char *token, struct leased_unlock_result *out,
              struct leased_error *err)
{
    return unlock_req(c, holder_req("unlock", key, owner, token), out, err);
}

int
leased_unlock_mode(struct leased_conn *c, const char *key, const char *mode,
                   const char *owner, const char *token,
                   struct leased_unlock_result *out, struct leased_error *err)
{
    return unlock_req(c, holder_req_mode("unlock", key, mode, owner, token),
                      out, err);
}

int
leased_unlock_rid(struct leased_conn *c, const char *key, const char *mode,
                  const char *owner, const char *token, const char *request_id,
                  struct leased_unlock_result *out, struct leased_error *err)
{
    json_t *req = holder_req_mode("unlock", key, mode, owner, token);
    if (req != NULL && add_str(req, "request_id", request_id) < 0) {
        json_decref(req);
        req = NULL;
    }
    return unlock_req(c, req, out, err);
}

/* REQ (may be NULL) plus owner/token; NULL when one is not valid. */
static json_t *
add_holder(json_t *req, const char *owner, const char *token)
{
    if (add_str(req, "owner", owner) < 0 || add_str(req, "token", token) < 0) {
        json_decref(req);
        return NULL;
    }
    return req;
}

int
leased_unlock_keys(struct leased_conn *c, const char *const *keys, size_t n,
                   const char *owner, const char *token,
                   struct leased_unlock_result *out, struct leased_error *err)
{
    return unlock_req(c, add_holder(keys_req("unlock", keys, n), owner, token),
                      out, err);
}

int
leased_unlock_keys_rid(struct leased_conn *c, const char *const *keys,
                       size_t n, const char *owner, const char *token,
                       const char *request_id,
                       struct leased_unlock_result *out,
                       struct leased_error *err)
{
    json_t *req = add_holder(keys_req("unlock", keys, n), owner, token);
    if (req != NULL && add_str(req, "request_id", request_id) < 0) {
        json_decref(req);
        req = NULL;
    }
    return unlock_req(c, req, out, err);
}

static int
unlock_req(struct leased_conn *c, json_t *req,
           struct leased_unlock_result *out, struct leased_error *err)
{
    json_t *reply;
    struct leased_unlock_result res = {false, -1};
    int rc = lc_call_new(c, req, 0, &reply, err);

    if (rc == LEASED_OK) {
        if (!bool_field(reply, "released", &res.released)) {
            rc = missing(err, "unlock", "released");
        }
        res.count = lc_int_or(reply, "count", -1);
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

static int extend_req(struct leased_conn *c, json_t *req, long long ttl_ms,
                      long long *lease_ms, struct leased_error *err);

int
leased_extend(struct leased_conn *c, const char *key, const char *owner,
              const char *token, long long ttl_ms, long long *lease_ms,
              struct leased_error *err)
{
    return extend_req(c, holder_req("extend", key, owner, token), ttl_ms,
                      lease_ms, err);
}

int
leased_extend_mode(struct leased_conn *c, const char *key, const char *mode,
                   const char *owner, const char *token, long long ttl_ms,
                   long long *lease_ms, struct leased_error *err)
{
    return extend_req(c, holder_req_mode("extend", key, mode, owner, token),
                      ttl_ms, lease_ms, err);
}

int
leased_extend_keys(struct leased_conn *c, const char *const *keys, size_t n,
                   const char *owner, const char *token, long long ttl_ms,
                   long long *lease_ms, struct leased_error *err)
{
    return extend_req(c, add_holder(keys_req("extend", keys, n), owner, token),
                      ttl_ms, lease_ms, err);
}

static int
extend_req(struct leased_conn *c, json_t *req, long long ttl_ms,
           long long *lease_ms, struct leased_error *err)
{
    json_t *reply;
    int rc;

    if (req != NULL) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (lease_ms != NULL) {
        *lease_ms = rc == LEASED_OK ? lc_int_or(reply, "lease_ms", -1) : -1;
    }
    json_decref(reply);
    return rc;
}

int
leased_lock_info(struct leased_conn *c, const char *key, const char *owner,
                 const char *token, struct leased_lock_info *out,
                 struct leased_error *err)
{
    return leased_lock_info_mode(c, key, NULL, owner, token, out, err);
}

int
leased_lock_info_mode(struct leased_conn *c, const char *key, const char *mode,
                      const char *owner, const char *token,
                      struct leased_lock_info *out, struct leased_error *err)
{
    json_t *reply;
    struct leased_lock_info res = {false, -1, false, -1, ""};
    int rc = lc_call_new(c,
                         holder_req_mode("lock.info", key, mode, owner, token),
                         0, &reply, err);

    if (rc == LEASED_OK) {
        if (!bool_field(reply, "locked", &res.locked)) {
            rc = missing(err, "lock.info", "locked");
        }
        res.ttl_ms = lc_int_or(reply, "ttl_ms", -1);
        bool_field(reply, "mine", &res.mine);
        res.count = lc_int_or(reply, "count", -1);
        const char *m = json_string_value(json_object_get(reply, "mode"));
        if (m != NULL && strlen(m) < sizeof(res.mode)) {
            strcpy(res.mode, m);
        }
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

/* --- semaphores --------------------------------------------------------- */

/* An ok answer to sem.acquire into RES. */
static int
sem_reply(json_t *reply, struct leased_sem_result *res,
          struct leased_error *err)
{
    int rc;

    res->available = lc_int_or(reply, "available", -1);
    rc = reply_acquired(reply, "sem.acquire", &res->acquired, res->token,
                        sizeof res->token, err);
    if (rc != LEASED_OK || !res->acquired) {
        return rc;
    }
    res->permits = lc_int_or(reply, "permits", -1);
    res->lease_ms = lc_int_or(reply, "lease_ms", -1);
    return LEASED_OK;
}

int
leased_sem_acquire(struct leased_conn *c, const char *key, long long limit,
                   const struct leased_sem_args *args,
                   struct leased_sem_result *out, struct leased_error *err)
{
    struct leased_sem_args none = {0};
    json_t *req = key_req("sem.acquire", key), *reply;
    struct leased_sem_result res;
    int rc;

    if (args == NULL) {
        args = &none;
    }
    memset(&res, 0, sizeof res);
    if (req != NULL) {
        json_object_set_new(req, "limit", json_integer(limit));
    }
    if (req != NULL && args->permits != 0) {
        json_object_set_new(req, "permits", json_integer(args->permits));
    }
    add_lease_args(req, args->ttl_ms, args->wait_ms, args->detach);
    rc = lc_call_new(c, req, args->wait_ms, &reply, err);
    if (rc == LEASED_OK) {
        rc = sem_reply(reply, &res, err);
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

/* --- rate limiter -------------------------------------------------------- */

int
leased_rate_acquire(struct leased_conn *c, const char *key, long long rate,
                    long long per_ms, const struct leased_rate_args *args,
                    struct leased_rate_result *out, struct leased_error *err)
{
    struct leased_rate_args none = {0};
    json_t *req = key_req("rate.acquire", key), *reply;
    struct leased_rate_result res = {false, -1};
    int rc;

    if (args == NULL) {
        args = &none;
    }
    if (req != NULL) {
        json_object_set_new(req, "rate", json_integer(rate));
        json_object_set_new(req, "per_ms", json_integer(per_ms));
        if (args->burst != 0) {
            json_object_set_new(req, "burst", json_integer(args->burst));
        }
        if (args->permits != 0) {
            json_object_set_new(req, "permits", json_integer(args->permits));
        }
        if (args->wait_ms != 0) {
            json_object_set_new(req, "wait_ms", json_integer(args->wait_ms));
        }
    }
    rc = lc_call_new(c, req, args->wait_ms, &reply, err);
    if (rc == LEASED_OK) {
        json_t *a = json_object_get(reply, "acquired");
        json_t *r = json_object_get(reply, "retry_after_ms");
        if (!json_is_boolean(a)) {
            rc = missing(err, "rate.acquire", "acquired");
        } else if (!json_is_integer(r)) {
            rc = missing(err, "rate.acquire", "retry_after_ms");
        } else {
            res.acquired = json_is_true(a);
            res.retry_after_ms = (long long)json_integer_value(r);
        }
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

int
leased_sem_release(struct leased_conn *c, const char *key, const char *token,
                   long long *released, struct leased_error *err)
{
    json_t *req = key_req("sem.release", key), *reply;
    int rc;

    if (add_str(req, "token", token) < 0) {
        json_decref(req);
        req = NULL;
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK &&
        !json_is_integer(json_object_get(reply, "released"))) {
        rc = missing(err, "sem.release", "released");
    }
    if (released != NULL) {
        *released = rc == LEASED_OK ? lc_int_or(reply, "released", 0) : 0;
    }
    json_decref(reply);
    return rc;
}

int
leased_sem_info(struct leased_conn *c, const char *key, long long limit,
                struct leased_sem_info *out, struct leased_error *err)
{
    json_t *req = key_req("sem.info", key), *reply;
    struct leased_sem_info res = {-1, -1};
    int rc;

    if (req != NULL) {
        json_object_set_new(req, "limit", json_integer(limit));
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        res.available = lc_int_or(reply, "available", -1);
        res.held = lc_int_or(reply, "held", -1);
        if (res.available < 0 || res.held < 0) {
            rc = missing(err, "sem.info", "held");
        }
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

/* --- cancelling a wait ---------------------------------------------------- */

int
leased_cancel(struct leased_conn *c, uint64_t id, bool *cancelled,
              struct leased_error *err)
{
    json_t *req = json_pack("{s:s,s:I}", "op", "cancel", "target",
                            (json_int_t)id),
           *reply;
    bool done = false;
    int rc = lc_call_new(c, req, 0, &reply, err);

    if (rc == LEASED_OK && !bool_field(reply, "cancelled", &done)) {
        rc = missing(err, "cancel", "cancelled");
    }
    if (cancelled != NULL) {
        *cancelled = done;
    }
    json_decref(reply);
    return rc;
}

/* --- cache -------------------------------------------------------------- */

void
leased_cache_result_free(struct leased_cache_result *r)
{
    if (r != NULL) {
        free(r->error_message);
        free(r->value);
        free(r->lease);
        memset(r, 0, sizeof *r);
    }
}

/* One cache.get result object (also an element of cache.mget's). */
static int
parse_get(json_t *obj, struct leased_cache_result *out,
          struct leased_error *err)
{
    json_t *v;

    memset(out, 0, sizeof *out);
    if (json_is_false(json_object_get(obj, "ok"))) {
        /* One key of a cache.mget failed on its own. */
        struct leased_error kerr;

        out->error = reply_status(obj, &kerr);
        out->error_message = strdup(kerr.message);
        return out->error_message != NULL ? LEASED_OK : nomem(err);
    }
    if (!json_is_object(obj) || !bool_field(obj, "hit", &out->hit)) {
        return missing(err, "cache.get", "hit");
    }
    if (out->hit) {
        out->version = lc_int_or(obj, "version", 0);
        v = json_object_get(obj, "value");
        if (json_is_null(v)) {
            out->is_null = true;
            return LEASED_OK;
        }
        if (!json_is_string(v)) {
            return missing(err, "cache.get", "value");
        }
        out->value_len = json_string_length(v);
        out->value = malloc(out->value_len + 1);
        if (out->value == NULL) {
            return nomem(err);
        }
        memcpy(out->value, json_string_value(v), out->value_len + 1);
        return LEASED_OK;
    }
    v = json_object_get(obj, "lease");
    if (json_is_string(v)) {
        out->lease = strdup(json_string_value(v));
        if (out->lease == NULL) {
            return nomem(err);
        }
    }
    return LEASED_OK;
}

static void
add_wait_lease(json_t *req, long long wait_ms, bool lease)
{
    if (req == NULL) {
        return;
    }
    if (wait_ms != LEASED_UNSET) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    if (!lease) {
        json_object_set_new(req, "lease", json_false());
    }
}

/* How long a cache read may make the daemon wait before it answers. */
static long long
get_wait(long long wait_ms, bool lease)
{
    if (!lease) {
        return 0;
    }
    /* Unknown: the daemon's cache.wait_ms (3 s by default) applies. */
    if (wait_ms == LEASED_UNSET) {
        return 10000;
    }
    return wait_ms < 0 ? 0 : wait_ms;
}

int
leased_cache_get(struct leased_conn *c, const char *key, long long wait_ms,
                 bool lease, struct leased_cache_result *out,
                 struct leased_error *err)
{
    json_t *req = key_req("cache.get", key), *reply;
    struct leased_cache_result tmp;
    int rc;

    if (out == NULL) {
        out = &tmp;
    }
    memset(out, 0, sizeof *out);
    /* A hit in the shared segment is what the daemon would answer from
     * its near cache, without the round trip. */
    if (c != NULL && key != NULL && leased_near_get(c, key, out)) {
        json_decref(req);
        lc_clear_err(err);
        if (out == &tmp) {
            leased_cache_result_free(out);
        }
        return LEASED_OK;
    }
    add_wait_lease(req, wait_ms, lease);
    rc = lc_call_new(c, req, get_wait(wait_ms, lease), &reply, err);
    if (rc == LEASED_OK) {
        rc = parse_get(reply, out, err);
    }
    if (rc != LEASED_OK || out == &tmp) {
        leased_cache_result_free(out);
    }
    json_decref(reply);
    return rc;
}

/* VALUE as a JSON value: a string of VALUE_LEN bytes, or null. */
static json_t *
value_json(const char *value, size_t value_len)
{
    if (value == NULL) {
        return json_null();
    }
    if (value_len == (size_t)-1) {
        value_len = strlen(value);
    }
    return json_stringn(value, value_len);
}

int
leased_cache_fill(struct leased_conn *c, const char *key, const char *lease,
                  const char *value, size_t value_len, long long ttl_ms,
                  bool *stored, struct leased_error *err)
{
    json_t *req = key_req("cache.fill", key), *reply, *v;
    int rc;

    if (stored != NULL) {
        *stored = false;
    }
    v = value_json(value, value_len);
    if (req == NULL || v == NULL || lease == NULL ||
        add_str(req, "lease", lease) < 0) {
        json_decref(req);
        json_decref(v);
        req = NULL;
    } else {
        json_object_set_new(req, "value", v);
        if (ttl_ms != 0) {
            json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
        }
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        bool s;

        if (!bool_field(reply, "stored", &s)) {
            rc = missing(err, "cache.fill", "stored");
        } else if (stored != NULL) {
            *stored = s;
        }
    }
    json_decref(reply);
    return rc;
}

int
leased_cache_release(struct leased_conn *c, const char *key, const char *lease,
                     bool *released, struct leased_error *err)
{
    json_t *req = key_req("cache.release", key), *reply;
    int rc;

    if (released != NULL) {
        *released = false;
    }
    if (lease == NULL || add_str(req, "lease", lease) < 0) {
        json_decref(req);
        req = NULL;
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        bool r;

        if (!bool_field(reply, "released", &r)) {
            rc = missing(err, "cache.release", "released");
        } else if (released != NULL) {
            *released = r;
        }
    }
    json_decref(reply);
    return rc;
}

int
leased_cache_set(struct leased_conn *c, const char *key, const char *value,
                 size_t value_len, long long ttl_ms, struct leased_error *err)
{
    json_t *req = key_req("cache.set", key), *reply;
    json_t *v = value_json(value, value_len);
    int rc;

    if (req == NULL || v == NULL) {
        json_decref(req);
        json_decref(v);
        req = NULL;
    } else {
        json_object_set_new(req, "value", v);
        if (ttl_ms != 0) {
            json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
        }
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    json_decref(reply);
    return rc;
}

/* A write of cache.set or cache.fill (REQ, stolen) over IF_VERSION, and
 * what it answered. */
static int
versioned_write(struct leased_conn *c, const char *op, json_t *req,
                long long if_version, bool *stored, long long *version,
                struct leased_error *err)
{
    json_t *reply;
    int rc;

    if (stored != NULL) {
        *stored = false;
    }
    if (version != NULL) {
        *version = 0;
    }
    if (req != NULL && if_version != LEASED_UNSET &&
        json_object_set_new(req, "if_version", json_integer(if_version)) < 0) {
        json_decref(req);
        req = NULL;
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        bool s;

        if (!bool_field(reply, "stored", &s)) {
            rc = missing(err, op, "stored");
        } else {
            if (stored != NULL) {
                *stored = s;
            }
            if (version != NULL) {
                *version = lc_int_or(reply, "version", 0);
            }
        }
    }
    json_decref(reply);
    return rc;
}

/* REQ of OP for KEY with VALUE and TTL_MS, or NULL. */
static json_t *
value_req(const char *op, const char *key, const char *value, size_t value_len,
          long long ttl_ms)
{
    json_t *req = key_req(op, key);
    json_t *v = value_json(value, value_len);

    if (req == NULL || v == NULL) {
        json_decref(req);
        json_decref(v);
        return NULL;
    }
    json_object_set_new(req, "value", v);
    if (ttl_ms != 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    return req;
}

int
leased_cache_set_if(struct leased_conn *c, const char *key, const char *value,
                    size_t value_len, long long ttl_ms, long long if_version,
                    bool *stored, long long *version, struct leased_error *err)
{
    return versioned_write(c, "cache.set",
                           value_req("cache.set", key, value, value_len,
                                     ttl_ms),
                           if_version, stored, version, err);
}

int
leased_cache_fill_if(struct leased_conn *c, const char *key, const char *lease,
                     const char *value, size_t value_len, long long ttl_ms,
                     long long if_version, bool *stored, long long *version,
                     struct leased_error *err)
{
    json_t *req = value_req("cache.fill", key, value, value_len, ttl_ms);

    if (req != NULL && (lease == NULL || add_str(req, "lease", lease) < 0)) {
        json_decref(req);
        req = NULL;
    }
    return versioned_write(c, "cache.fill", req, if_version, stored, version,
                           err);
}

/* A JSON array of NKEYS strings, or NULL. */
static json_t *
keys_array(const char *const *keys, size_t nkeys)
{
    json_t *arr = json_array();

    for (size_t i = 0; arr != NULL && i < nkeys; i++) {
        json_t *k = keys[i] != NULL ? json_string(keys[i]) : NULL;

        if (k == NULL || json_array_append_new(arr, k) < 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

int
leased_cache_invalidate(struct leased_conn *c, const char *const *keys,
                        size_t nkeys, long long delay_ms,
                        struct leased_invalidate_result *out,
                        struct leased_error *err)
{
    struct leased_invalidate_result res = {0, 0, false};
    json_t *req, *reply;
    int rc;

    if (keys == NULL || nkeys == 0) {
        lc_clear_err(err);
        return lc_set_err(err, LEASED_E_INVALID, 0, "no keys to invalidate");
    }
    if (nkeys == 1) {
        req = key_req("cache.invalidate", keys[0]);
    } else {
        json_t *arr = keys_array(keys, nkeys);

        req = arr != NULL ? json_pack("{s:s,s:o}", "op", "cache.invalidate",
                                      "keys", arr)
                          : NULL;
    }
    if (req != NULL && delay_ms != LEASED_UNSET) {
        json_object_set_new(req, "delay_ms", json_integer(delay_ms));
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        res.deleted = lc_int_or(reply, "deleted", -1);
        res.pending = lc_int_or(reply, "pending", -1);
        bool_field(reply, "queued", &res.queued);
        if (res.deleted < 0) {
            rc = missing(err, "cache.invalidate", "deleted");
        }
    }
    json_decref(reply);
    if (out != NULL) {
        *out = res;
    }
    return rc;
}

void
leased_mset_result_free(struct leased_mset_result *r)
{
    if (r != NULL) {
        free(r->error_message);
        r->error_message = NULL;
    }
}

/* The entries of a cache.mset as a JSON array, or NULL. */
static json_t *
mset_entries(const struct leased_mset_entry *entries, size_t n)
{
    json_t *arr = json_array();

    for (size_t i = 0; arr != NULL && i < n; i++) {
        const struct leased_mset_entry *e = &entries[i];
        json_t *v = value_json(e->value, e->value_len);
        json_t *o = e->key != NULL && v != NULL
                        ? json_pack("{s:s,s:o}", "key", e->key, "value", v)
                        : NULL;

        if (o == NULL) {
            json_decref(v);
            json_decref(arr);
            return NULL;
        }
        if (e->ttl_ms != 0) {
            json_object_set_new(o, "ttl_ms", json_integer(e->ttl_ms));
        }
        if (json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* Each refused entry's error into RESULTS; on a failure none is kept, so
 * the caller has nothing to free. */
static int
mset_errors(json_t *res, size_t n, struct leased_mset_result *results,
            struct leased_error *err)
{
    int rc = LEASED_OK;

    for (size_t i = 0; rc == LEASED_OK && i < n; i++) {
        json_t *r = json_array_get(res, i);

        if (json_is_false(json_object_get(r, "ok"))) {
            struct leased_error kerr;

            results[i].error = reply_status(r, &kerr);
            results[i].error_message = strdup(kerr.message);
            if (results[i].error_message == NULL) {
                rc = nomem(err);
            }
        }
    }
    if (rc != LEASED_OK) {
        for (size_t i = 0; i < n; i++) {
            leased_mset_result_free(&results[i]);
            results[i].error = LEASED_OK;
        }
    }
    return rc;
}

/* A cache.mset reply of N entries into STORED and RESULTS. */
static int
mset_parse(json_t *reply, size_t n, size_t *stored,
           struct leased_mset_result *results, struct leased_error *err)
{
    long long s = lc_int_or(reply, "stored", -1);
    json_t *res = json_object_get(reply, "results");

    if (s < 0) {
        return missing(err, "cache.mset", "stored");
    }
    if (!json_is_array(res) || json_array_size(res) != n) {
        return missing(err, "cache.mset", "results");
    }
    if (stored != NULL) {
        *stored = (size_t)s;
    }
    return results != NULL ? mset_errors(res, n, results, err) : LEASED_OK;
}

int
leased_cache_mset(struct leased_conn *c,
                  const struct leased_mset_entry *entries, size_t n,
                  size_t *stored, struct leased_mset_result *results,
                  struct leased_error *err)
{
    json_t *arr, *req = NULL, *reply;
    int rc;

    if (stored != NULL) {
        *stored = 0;
    }
    if (entries == NULL || n == 0) {
        lc_clear_err(err);
        return lc_set_err(err, LEASED_E_INVALID, 0, "no entries to store");
    }
    if (results != NULL) {
        memset(results, 0, n * sizeof *results);
    }
    arr = mset_entries(entries, n);
    if (arr != NULL) {
        req = json_pack("{s:s,s:o}", "op", "cache.mset", "entries", arr);
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        rc = mset_parse(reply, n, stored, results, err);
    }
    json_decref(reply);
    return rc;
}

/* --- Bloom filters ------------------------------------------------------ */

int
leased_bloom_create(struct leased_conn *c, const char *filter,
                    long long capacity, double error_rate, bool *created,
                    struct leased_error *err)
{
    json_t *f = filter != NULL ? json_string(filter) : NULL, *reply;
    json_t *req = f != NULL ? json_pack("{s:s,s:o,s:I,s:f}", "op",
                                        "bloom.create", "filter", f,
                                        "capacity", (json_int_t)capacity,
                                        "error_rate", error_rate)
                            : NULL;
    bool made = false;
    int rc = lc_call_new(c, req, 0, &reply, err);

    if (rc == LEASED_OK && !bool_field(reply, "created", &made)) {
        rc = missing(err, "bloom.create", "created");
    }
    json_decref(reply);
    if (created != NULL) {
        *created = made;
    }
    return rc;
}

/* bloom.add or bloom.check (OP) of NKEYS KEYS: FIELD's booleans into OUT
 * (may be NULL). */
static int
bloom_keys(struct leased_conn *c, const char *op, const char *field,
           const char *filter, const char *const *keys, size_t nkeys,
           bool *out, struct leased_error *err)
{
    json_t *req = NULL, *reply;
    json_t *f = filter != NULL ? json_string(filter) : NULL;
    json_t *arr = keys != NULL && nkeys > 0 ? keys_array(keys, nkeys) : NULL;
    int rc;

    if (out != NULL && nkeys > 0) {
        memset(out, 0, nkeys * sizeof(*out));
    }
    if (keys == NULL || nkeys == 0) {
        json_decref(f);
        lc_clear_err(err);
        return lc_set_err(err, LEASED_E_INVALID, 0, "no keys");
    }
    if (f != NULL && arr != NULL) {
        req = json_pack("{s:s,s:o,s:o}", "op", op, "filter", f, "keys", arr);
    } else {
        json_decref(f);
        json_decref(arr);
    }
    rc = lc_call_new(c, req, 0, &reply, err);
    if (rc == LEASED_OK) {
        json_t *a = json_object_get(reply, field);
        if (!json_is_array(a) || json_array_size(a) != nkeys) {
            rc = missing(err, op, field);
        } else if (out != NULL) {
            for (size_t i = 0; i < nkeys; i++) {
                out[i] = json_is_true(json_array_get(a, i));
            }
        }
    }
    json_decref(reply);
    return rc;
}

int
leased_bloom_add(struct leased_conn *c, const char *filter,
                 const char *const *keys, size_t nkeys, bool *added,
                 struct leased_error *err)
{
    return bloom_keys(c, "bloom.add", "added", filter, keys, nkeys, added,
                      err);
}

int
leased_bloom_check(struct leased_conn *c, const char *filter,
                   const char *const *keys, size_t nkeys, bool *maybe,
                   struct leased_error *err)
{
    return bloom_keys(c, "bloom.check", "maybe", filter, keys, nkeys, maybe,
                      err);
}

int
leased_cache_get_bloom(struct leased_conn *c, const char *key,
                       const char *filter, long long wait_ms, bool lease,
                       struct leased_cache_result *out, bool *ruled_out,
                       struct leased_error *err)
{
    json_t *req = key_req("cache.get", key), *reply;
    struct leased_cache_result tmp;
    bool ruled = false;
    int rc;

    if (out == NULL) {
        out = &tmp;
    }
    memset(out, 0, sizeof *out);
    add_wait_lease(req, wait_ms, lease);
    if (req != NULL && (filter == NULL || add_str(req, "bloom", filter) < 0)) {
        json_decref(req);
        req = NULL;
    }
    rc = lc_call_new(c, req, get_wait(wait_ms, lease), &reply, err);
    if (rc == LEASED_OK) {
        rc = parse_get(reply, out, err);
        bool_field(reply, "bloom", &ruled);
    }
    if (rc != LEASED_OK || out == &tmp) {
        leased_cache_result_free(out);
    }
    json_decref(reply);
    if (ruled_out != NULL) {
        *ruled_out = rc == LEASED_OK && ruled;
    }
    return rc;
}

int
leased_cache_mget(struct leased_conn *c, const char *const *keys, size_t nkeys,
                  long long wait_ms, bool lease,
                  struct leased_cache_result *results,
                  struct leased_error *err)
{
    json_t *arr, *req = NULL, *reply, *res;
    int rc;

    if (results == NULL || keys == NULL || nkeys == 0) {
        lc_clear_err(err);
        return lc_set_err(err, LEASED_E_INVALID, 0, "no keys or no results");
    }
    memset(results, 0, nkeys * sizeof *results);
    arr = keys_array(keys, nkeys);
    if (arr != NULL) {
        req = json_pack("{s:s,s:o}", "op", "cache.mget", "keys", arr);
    }
    add_wait_lease(req, wait_ms, lease);
    rc = lc_call_new(c, req, get_wait(wait_ms, lease), &reply, err);
    if (rc == LEASED_OK) {
        res = json_object_get(reply, "results");
        if (!json_is_array(res) || json_array_size(res) != nkeys) {
            rc = missing(err, "cache.mget", "results");
        }
        for (size_t i = 0; rc == LEASED_OK && i < nkeys; i++) {
            rc = parse_get(json_array_get(res, i), &results[i], err);
        }
        if (rc != LEASED_OK) {
            for (size_t i = 0; i < nkeys; i++) {
                leased_cache_result_free(&results[i]);
            }
        }
    }
    json_decref(reply);
    return rc;
}
