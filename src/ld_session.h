#ifndef LD_SESSION_H
#define LD_SESSION_H

#include "ld_common.h"

#include <jansson.h>

struct ld_listener;
struct ld_req;

/* One client connection. Feature modules keep their per-session state in
 * the slots below and drop it from their close hook. */
struct ld_session {
    uint64_t id;
    char name[40];            /* the session id string sent in hello */
    int fd;
    struct bufferevent *bev;
    struct ld_listener *listener;
    bool open;                /* false once closing has begun */
    bool authed;
    struct session_io *io;    /* framing state, private to ld_session.c */
    unsigned refs;            /* 1 while open + one per request in flight */
    long long pending;        /* requests awaiting their reply */
    char client[64];          /* from hello, for logs */
    void *lock_state;         /* owned by ld_lock */
    void *cache_state;        /* owned by ld_cache */
    struct ld_session *prev, *next;
};

/* Called once per session when it closes, before its requests are
 * dropped; modules release what the session held. */
typedef void ld_session_hook(struct ld_session *s);
void ld_session_on_close(ld_session_hook *fn);

struct ld_session *ld_session_new(int fd, struct ld_listener *l);

/* Send an unsolicited event (stolen) to the session, if still open. */
void ld_session_event(struct ld_session *s, json_t *event);

/* limits.max_output_bytes: the unsent reply bytes a session may owe. A
 * module about to build one reply larger than this should close the
 * session (ld_session_close) instead; a write that would pass it drops
 * the session's output and closes the session. */
size_t ld_session_output_limit(void);
/* Reply bytes the session owes and the client has not taken yet. */
size_t ld_session_output_bytes(const struct ld_session *s);
/* Before building a large reply of at least LEN bytes: false when nothing
 * more will be written to the session (its socket is gone, or its output
 * is over the limit), and when LEN would pass the limit, which then drops
 * the session's output and closes it as ld_session_write would. */
bool ld_session_output_room(struct ld_session *s, size_t len);

/* Write raw bytes (a whole response line). */
void ld_session_write(struct ld_session *s, const char *buf, size_t len);
/* The same for a line built in an evbuffer: its chains (references
 * included) move to the output without a copy; BUF ends empty. */
struct evbuffer;
void ld_session_write_buffer(struct ld_session *s, struct evbuffer *buf);

/* Begin closing: hooks run, the socket closes once output is flushed
 * (bounded), the struct is freed when the last request is answered. */
void ld_session_close(struct ld_session *s, const char *why);

/* A request of the session got its answer (or was dropped). */
void ld_session_req_done(struct ld_session *s);

void ld_session_ref(struct ld_session *s);
void ld_session_unref(struct ld_session *s);

/* Every open session, for shutdown and stats. */
struct ld_session *ld_session_first(void);
long long ld_session_count(void);

/* Closed sessions whose socket is still writing what they were owed (the
 * graceful stop waits for these, within its bound). */
long long ld_session_lingering(void);

/* Graceful stop: send {"event":"shutdown"} to every session and close it
 * once its output has drained. */
void ld_session_shutdown_all(void);

/* At exit, after the loop: close what is left and free module state. */
void ld_session_cleanup(void);

#endif
