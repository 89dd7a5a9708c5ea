/* libleased's side of the shared near cache (leased/near.h): the
 * descriptor near.map sends, the mapping, the lookups leased_cache_get
 * tries first, and the near.hits reports that tell the daemon about them.
 * The segment's bytes are read by lib/near.c. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "client_int.h"
#include "leased/near.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

void
lc_fds_clear(struct leased_conn *c)
{
    for (size_t i = 0; i < c->nfds; i++) {
        close(c->fds[i]);
    }
    c->nfds = 0;
}

/* recv, by recvmsg: a descriptor the daemon sends (near.map) rides on a
 * reply's first byte, and a read without room for control data would
 * lose it (the kernel closes it). Descriptors are queued for the call
 * that asked; any beyond the queue are closed. */
ssize_t
lc_recv_fds(struct leased_conn *c, char *buf, size_t len)
{
    union {
        struct cmsghdr hdr;
        char space[CMSG_SPACE(sizeof(int) * LC_MAX_FDS)];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh;
    struct cmsghdr *cm;
    ssize_t n;

    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.space;
    mh.msg_controllen = sizeof ctl.space;
    n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
        return n;
    }
    for (cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
        size_t nfd;

        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (c->nfds < LC_MAX_FDS) {
                c->fds[c->nfds++] = fd;
            } else {
                close(fd);
            }
        }
    }
    return n;
}

static uint64_t
mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void
lc_near_unmap(struct leased_conn *c)
{
    if (c->near_map != NULL) {
        munmap((void *)c->near_map, c->near_len);
        c->near_map = NULL;
        c->near_len = 0;
    }
}

/* Sends near.hits with what was counted since the last report, without
 * waiting: its id is not in flight, so its reply is dropped when it
 * comes, and the caller's request goes right behind it. */
void
lc_near_report(struct leased_conn *c, long long deadline)
{
    json_t *req;
    char *text;
    size_t n;

    if (c->broken || c->fd < 0 ||
        (c->near_hits == 0 && c->near_fallbacks == 0)) {
        return;
    }
    c->near_report_at_ms = lc_now_ms();
    req = json_pack("{s:s,s:I,s:I}", "op", "near.hits", "hits",
                    (json_int_t)c->near_hits, "fallbacks",
                    (json_int_t)c->near_fallbacks);
    if (req == NULL) {
        return;
    }
    if (lc_encode_req(req, ++c->next_id, &text, &n, NULL) == LEASED_OK) {
        if (lc_send_all(c, text, n, deadline, NULL) == LEASED_OK) {
            c->near_hits = 0;
            c->near_fallbacks = 0;
        }
        free(text);
    }
    json_decref(req);
}

/* Before a request: a report when a second has passed since the last one
 * or enough hits wait. */
void
lc_near_report_due(struct leased_conn *c, long long deadline)
{
    if (c->near_hits + c->near_fallbacks == 0) {
        return;
    }
    if (c->near_hits >= LC_NEAR_REPORT_HITS ||
        lc_now_ms() - c->near_report_at_ms >= LC_NEAR_REPORT_MS) {
        lc_near_report(c, deadline);
    }
}

/* Asks for the segment: its descriptor (the first that came with the
 * reply; any other is closed) and the size and layout announced. */
static int
near_map_call(struct leased_conn *c, int *fd, long long *bytes,
              long long *layout, struct leased_error *err)
{
    json_t *reply;
    int rc;

    /* A descriptor left by an abandoned (timed-out) near.map. */
    lc_fds_clear(c);
    rc = lc_call_new(c, json_pack("{s:s}", "op", "near.map"), 0, &reply, err);
    if (rc != LEASED_OK) {
        json_decref(reply);
        lc_fds_clear(c);
        return rc;
    }
    *bytes = lc_int_or(reply, "bytes", -1);
    *layout = lc_int_or(reply, "layout", -1);
    json_decref(reply);
    if (c->nfds == 0) {
        return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                          "near.map answered without a descriptor");
    }
    *fd = c->fds[0];
    memmove(c->fds, c->fds + 1, (c->nfds - 1) * sizeof c->fds[0]);
    c->nfds--;
    lc_fds_clear(c);
    return LEASED_OK;
}

/* Maps FD (closing it) in place of the segment mapped before, once it is
 * a segment this library reads of the size the daemon announced. */
static int
near_map_fd(struct leased_conn *c, int fd, long long bytes, long long layout,
            struct leased_error *err)
{
    struct stat st;
    void *m;
    int e;

    if (layout != LEASED_NEAR_LAYOUT) {
        close(fd);
        return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                          "near.map: layout %lld is not one this library "
                          "reads",
                          layout);
    }
    if (fstat(fd, &st) != 0 || st.st_size <= 0 ||
        (bytes >= 0 && (long long)st.st_size != bytes)) {
        close(fd);
        return lc_set_err(err, LEASED_E_PROTOCOL, 0,
                          "near.map: the descriptor is not a segment of the "
                          "size announced");
    }
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        return lc_set_err(err, LEASED_E_IO, e, "mmap of the segment: %s",
                          strerror(e));
    }
    lc_near_unmap(c);
    c->near_map = m;
    c->near_len = (size_t)st.st_size;
    return LEASED_OK;
}

int
leased_near_map(struct leased_conn *c, struct leased_error *err)
{
    long long bytes, layout;
    int rc, fd = -1;

    lc_clear_err(err);
    if (c == NULL) {
        return lc_set_err(err, LEASED_E_INVALID, 0, "no connection");
    }
    if (!c->is_unix) {
        return lc_set_err(err, LEASED_E_INVALID, 0,
                          "the shared near cache is mapped over a Unix "
                          "socket only");
    }
    c->near_map_at_ms = lc_now_ms();
    rc = near_map_call(c, &fd, &bytes, &layout, err);
    if (rc != LEASED_OK) {
        return rc;
    }
    return near_map_fd(c, fd, bytes, layout, err);
}

/* Whether a segment is mapped, mapping it on first use when the daemon
 * offers one over this Unix socket. A failed mapping is not tried again
 * on this connection: the socket path works without it. */
static bool
near_ready(struct leased_conn *c)
{
    if (c->near_map != NULL) {
        return true;
    }
    if (c->near_failed || !c->near_offered || !c->is_unix || c->broken) {
        return false;
    }
    if (leased_near_map(c, NULL) != LEASED_OK) {
        c->near_failed = true;
        return false;
    }
    return true;
}

/* The buffer a lookup copies into: on the stack, and on the heap for a
 * value larger than that. */
struct near_buf {
    char *p;
    size_t cap;
    char small[1024];
};

static bool
near_buf_grow(struct near_buf *b, size_t cap)
{
    char *nb = malloc(cap);

    if (nb == NULL) {
        return false;
    }
    if (b->p != b->small) {
        free(b->p);
    }
    b->p = nb;
    b->cap = cap;
    return true;
}

/* KEY in the segment, looked up again with a buffer large enough for its
 * value, or in the daemon's new segment once a reload or a restart
 * closed this one. */
static enum leased_near_result
near_lookup(struct leased_conn *c, const char *key, struct near_buf *b,
            struct leased_near_value *v)
{
    enum leased_near_result r = LEASED_NEAR_FALLBACK;
    size_t klen = strlen(key);

    for (int tries = 0; tries < 4; tries++) {
        r = leased_near_lookup(c->near_map, c->near_len, key, klen, mono_ns(),
                               b->p, b->cap, v);
        if (r == LEASED_NEAR_TOO_SMALL) {
            if (!near_buf_grow(b, v->vlen + 1)) {
                break;
            }
            continue;
        }
        if (r == LEASED_NEAR_CLOSED_SEG &&
            lc_now_ms() - c->near_map_at_ms >= LC_NEAR_REMAP_MS) {
            if (leased_near_map(c, NULL) != LEASED_OK) {
                lc_near_unmap(c);
                c->near_failed = true;
                break;
            }
            continue;
        }
        break;
    }
    return r;
}

/* A hit's value into OUT, as the socket path would give it; a copy that
 * fails turns the hit into a fallback. */
static enum leased_near_result
near_copy_out(enum leased_near_result r, const struct near_buf *b,
              const struct leased_near_value *v,
              struct leased_cache_result *out)
{
    if (r != LEASED_NEAR_HIT || out == NULL) {
        return r;
    }
    if (!v->null) {
        out->value = malloc(v->vlen + 1);
        if (out->value == NULL) {
            return LEASED_NEAR_FALLBACK;
        }
        memcpy(out->value, b->p, v->vlen);
        out->value[v->vlen] = '\0';
        out->value_len = v->vlen;
    }
    out->hit = true;
    out->is_null = v->null != 0;
    return r;
}

bool
leased_near_get(struct leased_conn *c, const char *key,
                struct leased_cache_result *out)
{
    enum leased_near_result r;
    struct leased_near_value v;
    struct near_buf b;

    if (out != NULL) {
        memset(out, 0, sizeof *out);
    }
    if (c == NULL || key == NULL || !near_ready(c)) {
        return false;
    }
    b.p = b.small;
    b.cap = sizeof b.small;
    r = near_copy_out(near_lookup(c, key, &b, &v), &b, &v, out);
    if (b.p != b.small) {
        free(b.p);
    }
    /* Counted for near.hits, the daemon's view of the shared reads. */
    if (r != LEASED_NEAR_HIT) {
        c->near_fallbacks++;
        c->near_fallbacks_total++;
        return false;
    }
    c->near_hits++;
    c->near_hits_total++;
    return true;
}

void
leased_near_info(const struct leased_conn *c, struct leased_near_info *out)
{
    memset(out, 0, sizeof *out);
    if (c != NULL) {
        out->mapped = c->near_map != NULL;
        out->bytes = c->near_len;
        out->hits = c->near_hits_total;
        out->fallbacks = c->near_fallbacks_total;
    }
}
