#ifndef LD_SESSION_H
#define LD_SESSION_H

#include "ld_common.h"

#include <jansson.h>
#include <sys/queue.h>

struct ld_ctx;
struct ld_req;

/* One client connection. Feature modules keep their per-session state in
 * the slots below and drop it from their close hook. */
struct ld_session {
    uint64_t id;
    char name[40]; /* the session id string sent in hello */
    int fd;
    struct bufferevent *bev;
    char listener[128]; /* name of the listener it came from, logs */
    bool open;          /* false once closing has begun */
    bool authed;
    /* May run operator ops: Unix socket, or hello's admin_token. */
    bool admin;
    struct session_io *io; /* framing state, private to ld_session.c */
    unsigned refs;         /* 1 while open + one per request in flight */
    long long pending;     /* requests awaiting their reply */
    char client[64];       /* from hello, for logs */
    void *lock_state;      /* owned by ld_lock */
    void *cache_state;     /* owned by ld_cache */
    void *sem_state;       /* owned by ld_sem */
    /* Its waiting requests a cancel op may end (ld_cancel.h). */
    LIST_HEAD(, ld_req) cancellable;
    void *ns_state; /* owned by ld_ns */
};

/* What the layer above gives the sessions at init, so that they need not
 * include it: LINE gets every complete request line (the session keeps
 * LINE's bytes; the handler copies what it keeps; it starts each request
 * with ld_session_req_begin); ERROR_LINE builds the protocol's error line
 * (newline included, caller frees) for what the session answers itself:
 * a refused connection, a line over the size limit. */
struct ld_session_handlers {
    void (*line)(struct ld_session *s, const char *line, size_t len);
    char *(*error_line)(int code, const char *message, size_t *len);
};

/* HANDLERS must outlive the sessions. */
int ld_session_init(const struct ld_ctx *ctx,
                    const struct ld_session_handlers *handlers);

/* Called once per session when it closes, before its requests are
 * dropped; modules release what the session held. */
typedef void ld_session_hook(struct ld_session *s);
void ld_session_on_close(ld_session_hook *fn);

/* A session for the accepted socket FD (NULL when it is refused: at
 * limits.max_clients or while stopping, with one error line). */
struct ld_session *ld_session_new(int fd, bool auth_required,
                                  const char *listener);

/* Send an unsolicited event (stolen) to the session, if still open. */
void ld_session_event(struct ld_session *s, json_t *event);

/* limits.max_output_bytes: the unsent reply bytes a session may owe. A
 * module about to build one reply larger than this should close the
 * session (ld_session_close) instead; a write that would pass it drops
 * the session's output and closes the session. */
size_t ld_session_output_limit(void);
/* Bytes held in the buffers of every session's socket (input not yet
 * framed, output not yet written), for limits.max_memory_bytes. */
size_t ld_session_buffered_bytes(void);
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

/* Write LINE (a whole reply line) with the descriptor FD attached to its
 * first byte (SCM_RIGHTS), after every byte written to the session before
 * it; lines written after it follow it. FD is handed over (closed once
 * sent, or when the session ends first). A Unix socket only. */
void ld_session_write_fd(struct ld_session *s, const char *line, size_t len,
                         int fd);
/* Lines with a descriptor still waiting to leave. */
size_t ld_session_fd_lines(const struct ld_session *s);
/* Did S come over a Unix socket? */
bool ld_session_is_unix(const struct ld_session *s);

/* Begin closing: hooks run, the socket closes once output is flushed
 * (bounded), the struct is freed when the last request is answered. */
void ld_session_close(struct ld_session *s, const char *why);

/* A request of the (open) session begins: it counts as pending and holds
 * a reference until ld_session_req_done, when it got its answer (or was
 * dropped). */
void ld_session_req_begin(struct ld_session *s);
void ld_session_req_done(struct ld_session *s);

void ld_session_ref(struct ld_session *s);
void ld_session_unref(struct ld_session *s);

/* Visit every open session. FN may close the session it is given, not
 * another one. */
typedef void ld_session_visit(struct ld_session *s, void *arg);
void ld_session_foreach(ld_session_visit *fn, void *arg);
/* The same by steps, for loops that cannot take a callback: the first
 * open session and the one after S (which must be open), or NULL. */
struct ld_session *ld_session_first(void);
struct ld_session *ld_session_next(const struct ld_session *s);
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
