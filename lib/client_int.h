/* What lib/client.c and lib/client_near.c share: the connection and the
 * helpers each calls in the other. None of it is public: the functions
 * are hidden in libleased.so, and their lc_ prefix keeps them apart from
 * the names of a program that links libleased.a. */

#ifndef LEASED_CLIENT_INT_H
#define LEASED_CLIENT_INT_H

#include "leased/client.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

/* Descriptors kept from the daemon's bytes until claimed; only near.map
 * sends one, so a few is plenty. */
#define LC_MAX_FDS 4
/* The shared near cache: a CLOSED segment is mapped again at most this
 * often, and hits are reported at most this often or every so many. */
#define LC_NEAR_REMAP_MS 1000
#define LC_NEAR_REPORT_MS 1000
#define LC_NEAR_REPORT_HITS 1000

struct lc_reply;
struct lc_event;

struct leased_conn {
    int fd;
    char *target;
    char *client;
    char *auth;
    bool hello;
    int timeout_ms;
    int connect_timeout_ms;

    /* Set once the connection failed; every later call repeats it. */
    bool broken;
    int broken_code;
    int broken_errno;
    char broken_msg[200];

    char *rbuf;
    size_t rlen, rcap;

    uint64_t next_id;
    uint64_t *inflight; /* ids sent and not yet collected, in order */
    size_t ninflight, capinflight;
    struct lc_reply *replies; /* replies of in-flight ids, any order */

    struct lc_event *ev_head, *ev_tail;
    leased_event_fn *cb;
    void *cb_arg;
    bool in_callback;

    char session[128];

    /* Descriptors that came with the daemon's bytes (SCM_RIGHTS), oldest
     * first, until a near.map call takes one. */
    int fds[LC_MAX_FDS];
    size_t nfds;

    /* The shared near cache segment (leased/near.h). */
    bool is_unix;
    bool near_offered; /* hello listed shared_near */
    bool near_failed;  /* mapping failed once: never again here */
    const unsigned char *near_map;
    size_t near_len;
    long long near_map_at_ms; /* the last near.map (a CLOSED re-map waits) */
    uint64_t near_hits, near_fallbacks;             /* not yet reported */
    uint64_t near_hits_total, near_fallbacks_total; /* since connect */
    long long near_report_at_ms;
};

#pragma GCC visibility push(hidden)

/* lib/client.c */
int lc_set_err(struct leased_error *err, int code, int sys_errno,
               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void lc_clear_err(struct leased_error *err);
long long lc_now_ms(void);
int lc_call_new(struct leased_conn *c, json_t *req, long long wait_ms,
                json_t **reply, struct leased_error *err);
long long lc_int_or(json_t *obj, const char *field, long long dflt);
int lc_encode_req(json_t *req, uint64_t id, char **text, size_t *len,
                  struct leased_error *err);
int lc_send_all(struct leased_conn *c, const char *buf, size_t len,
                long long deadline, struct leased_error *err);

/* lib/client_near.c */
void lc_fds_clear(struct leased_conn *c);
ssize_t lc_recv_fds(struct leased_conn *c, char *buf, size_t len);
void lc_near_unmap(struct leased_conn *c);
void lc_near_report(struct leased_conn *c, long long deadline);
void lc_near_report_due(struct leased_conn *c, long long deadline);

#pragma GCC visibility pop

#endif
