#ifndef LD_ORDER_UTIL_H
#define LD_ORDER_UTIL_H

/* Raw connections to the daemon's Unix socket, to see on the wire in
 * which order lines reach two clients: one holder's event and another
 * session's reply (static inline, so a program that does not use one
 * does not warn). */

#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct raw {
    int fd;
    char buf[65536];
    size_t len;
};

static inline void
raw_open(struct raw *c, const char *path)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    ck_assert_uint_lt(n, sizeof sa.sun_path);
    memcpy(sa.sun_path, path, n + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(c->fd, 0);
    ck_assert_int_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    c->len = 0;
}

static inline void
raw_send(struct raw *c, const char *line)
{
    size_t n = strlen(line);
    ck_assert_int_eq(write(c->fd, line, n), (ssize_t)n);
}

/* A whole line already read, as JSON, or NULL. */
static inline json_t *
raw_take(struct raw *c)
{
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl == NULL) {
        return NULL;
    }
    size_t n = (size_t)(nl - c->buf);
    json_t *j = json_loadb(c->buf, n, 0, NULL);
    memmove(c->buf, nl + 1, c->len - n - 1);
    c->len -= n + 1;
    return j;
}

/* Whatever C has to read now (false at EOF or when full). */
static inline bool
raw_fill(struct raw *c)
{
    if (c->len == sizeof c->buf) {
        return false;
    }
    ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
    if (got <= 0) {
        return false;
    }
    c->len += (size_t)got;
    return true;
}

/* The next line as JSON, or NULL after TIMEOUT_MS. */
static inline json_t *
raw_line(struct raw *c, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    for (;;) {
        json_t *j = raw_take(c);
        if (j != NULL) {
            return j;
        }
        long long left = deadline - h_now_ms();
        if (left <= 0) {
            return NULL;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int rc = poll(&p, 1, (int)left);
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0 || !raw_fill(c)) {
            return NULL;
        }
    }
}

/* What raw_race saw: B's reply, A's event, and when each was read. */
struct race {
    json_t *reply;     /* B's reply (a line without "event") */
    json_t *ev;        /* A's event EVENT for the key */
    long long t_reply; /* h_now_ms() when read */
    long long t_ev;
    int round_reply; /* the poll round each was read in */
    int round_ev;
};

/* Whether J is the event NAME for KEY. */
static inline bool
raw_is_event(const json_t *j, const char *name, const char *key)
{
    return jstr(j, "event") != NULL && strcmp(jstr(j, "event"), name) == 0 &&
           jstr(j, "key") != NULL && strcmp(jstr(j, "key"), key) == 0;
}

/* Make REDIS lose every hold (FLUSHALL) and refuse scripts (an ACL),
 * then drop the daemon's connections so that its reconnect starts a
 * recheck: its check of KEY is refused while the connection stays up.
 * Waits on C for AT_RISK for KEY (the refusal seen; LOST for KEY before
 * it fails the test), then lets scripts run again. */
static inline void
recheck_refused(struct h_redis *redis, struct h_conn *c, const char *at_risk,
                const char *lost, const char *key)
{
    json_t *ev;
    h_r_do(redis, "FLUSHALL");
    h_r_do(redis, "ACL SETUSER default -eval -evalsha -eval_ro -evalsha_ro");
    h_r_do(redis, "CLIENT KILL TYPE normal SKIPME yes");
    long long deadline = h_now_ms() + 10000;
    bool refused = false;
    while (!refused &&
           (ev = h_event(c, (int)(deadline - h_now_ms()))) != NULL) {
        ck_assert_msg(!raw_is_event(ev, lost, key),
                      "%s for %s while Redis refused its check", lost, key);
        refused = raw_is_event(ev, at_risk, key);
        json_decref(ev);
    }
    ck_assert_msg(refused, "no %s for %s: its check was not refused", at_risk,
                  key);
    h_r_do(redis, "ACL SETUSER default +@all");
}

/* Send LINE on B, then read A and B as lines reach them until B's reply
 * and A's EVENT for KEY have both come, or TIMEOUT_MS has passed. Each
 * round reads what poll says is there, A's socket first: an event that
 * reached A no later than B's reply is read in the same round or an
 * earlier one. Other lines on A are dropped. */
static inline void
raw_race(struct raw *a, struct raw *b, const char *line, const char *event,
         const char *key, int timeout_ms, struct race *out)
{
    memset(out, 0, sizeof *out);
    raw_send(b, line);
    long long deadline = h_now_ms() + timeout_ms;
    for (int round = 0;; round++) {
        json_t *j;
        while (out->ev == NULL && (j = raw_take(a)) != NULL) {
            if (raw_is_event(j, event, key)) {
                out->ev = j;
                out->t_ev = h_now_ms();
                out->round_ev = round;
            } else {
                json_decref(j);
            }
        }
        while (out->reply == NULL && (j = raw_take(b)) != NULL) {
            if (jstr(j, "event") == NULL) {
                out->reply = j;
                out->t_reply = h_now_ms();
                out->round_reply = round;
            } else {
                json_decref(j);
            }
        }
        long long left = deadline - h_now_ms();
        if ((out->ev != NULL && out->reply != NULL) || left <= 0) {
            return;
        }
        struct pollfd p[2] = {{.fd = a->fd, .events = POLLIN},
                              {.fd = b->fd, .events = POLLIN}};
        int rc = poll(p, 2, (int)left);
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0) {
            return;
        }
        if ((p[0].revents & POLLIN) != 0 && !raw_fill(a)) {
            return;
        }
        if ((p[1].revents & POLLIN) != 0 && !raw_fill(b)) {
            return;
        }
    }
}

/* Assert that B was granted (a reply with "acquired":true) and that A's
 * event came before or with it. */
static inline void
raw_race_assert(const struct race *r, const char *what)
{
    ck_assert_msg(r->reply != NULL, "%s: no reply to the new holder", what);
    ck_assert_msg(jtrue(r->reply, "acquired"), "%s: not granted: %s", what,
                  h_dump(r->reply));
    ck_assert_msg(r->ev != NULL,
                  "%s: the holder heard nothing although another session "
                  "was granted",
                  what);
    ck_assert_msg(r->round_ev <= r->round_reply,
                  "%s: the holder heard of its loss %lld ms after another "
                  "session was granted",
                  what, r->t_ev - r->t_reply);
}

static inline void
raw_race_free(struct race *r)
{
    json_decref(r->reply);
    json_decref(r->ev);
}

/* Send LINE on C and insist on "acquired":true within 5 s, as long as a
 * plain reply may take in every test program that includes this. */
static inline void
raw_must(struct raw *c, const char *line)
{
    raw_send(c, line);
    json_t *r = raw_line(c, 5000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "%s: %s", line,
                  r != NULL ? h_dump(r) : "no reply");
    json_decref(r);
}

#endif
