/*
 * NDJSON framing. Kept free of sockets so that split reads, several lines
 * per read, CRLF and over-long lines can be tested from raw bytes.
 *
 * This module owns the framer's state (struct ld_framer) and nothing
 * else: it must not touch sockets, sessions or JSON, and a line is
 * handed out as bytes for the session to do with as it will.
 */
#include "ld_frame.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* Is byte N-1 of IN a \r? */
static bool
ends_with_cr(struct evbuffer *in, size_t n)
{
    struct evbuffer_ptr p;
    char c = 0;
    if (n == 0 || evbuffer_ptr_set(in, &p, n - 1, EVBUFFER_PTR_SET) != 0 ||
        evbuffer_copyout_from(in, &p, &c, 1) != 1) {
        return false;
    }
    return c == '\r';
}

/* Keep the first bytes of an over-long line before they are dropped. */
static void
keep_head(struct ld_framer *f, const char *p, size_t len)
{
    f->head_len = len < sizeof(f->head) ? len : sizeof(f->head);
    memcpy(f->head, p, f->head_len);
}

static void
keep_head_in(struct ld_framer *f, struct evbuffer *in)
{
    ev_ssize_t n = evbuffer_copyout(in, f->head, sizeof(f->head));
    f->head_len = n > 0 ? (size_t)n : 0;
}

/* Where the first \n of IN's AVAIL bytes is (pos -1: none). The search
 * resumes where the last one stopped: a long line arriving in small reads
 * would otherwise be rescanned from its start on every read. */
static struct evbuffer_ptr
find_newline(struct ld_framer *f, struct evbuffer *in, size_t avail)
{
    struct evbuffer_ptr nl = {.pos = -1};

    if (f->scanned > avail) {
        f->scanned = 0;
    }
    if (f->scanned < avail) {
        /* (Nothing to search, and no position to start from, when no byte
         * came since the last search.) */
        struct evbuffer_ptr start;
        evbuffer_ptr_set(in, &start, f->scanned, EVBUFFER_PTR_SET);
        nl = evbuffer_search(in, "\n", 1, &start);
    }
    f->scanned = nl.pos < 0 ? avail : 0;
    return nl;
}

/* IN's AVAIL bytes hold no \n: the start of a line, which waits for more
 * unless it is over the limit already. */
static enum ld_frame_result
unended_line(struct ld_framer *f, struct evbuffer *in, size_t avail)
{
    /* The terminator does not count against the limit: a line of exactly
     * max_bytes may still be waiting for the \n of its \r\n. */
    if (avail > f->max_bytes + 1 ||
        (avail == f->max_bytes + 1 && !ends_with_cr(in, avail))) {
        /* Report now rather than buffering the whole line. */
        keep_head_in(f, in);
        evbuffer_drain(in, avail);
        f->scanned = 0;
        f->discarding = true;
        return LD_FRAME_TOO_LARGE;
    }
    return LD_FRAME_NEED_MORE;
}

/* The line of IN's first N bytes, which a \n follows. */
static enum ld_frame_result
ended_line(struct ld_framer *f, struct evbuffer *in, size_t n, char **line,
           size_t *len)
{
    if (n > f->max_bytes && (n > f->max_bytes + 1 || !ends_with_cr(in, n))) {
        keep_head_in(f, in);
        evbuffer_drain(in, n + 1);
        return LD_FRAME_TOO_LARGE;
    }
    char *buf = malloc(n + 1);
    if (buf == NULL) {
        return LD_FRAME_NEED_MORE;
    }
    evbuffer_remove(in, buf, n);
    evbuffer_drain(in, 1);
    if (n > 0 && buf[n - 1] == '\r') {
        n--;
    }
    buf[n] = '\0';
    *line = buf;
    *len = n;
    return LD_FRAME_LINE;
}

enum ld_frame_result
ld_frame_next(struct ld_framer *f, struct evbuffer *in, char **line,
              size_t *len)
{
    for (;;) {
        size_t avail = evbuffer_get_length(in);
        if (avail == 0) {
            return LD_FRAME_NEED_MORE;
        }
        struct evbuffer_ptr nl = find_newline(f, in, avail);
        if (f->discarding) {
            if (nl.pos < 0) {
                evbuffer_drain(in, avail);
                f->scanned = 0;
                return LD_FRAME_NEED_MORE;
            }
            evbuffer_drain(in, (size_t)nl.pos + 1);
            f->discarding = false;
            continue;
        }
        if (nl.pos < 0) {
            return unended_line(f, in, avail);
        }
        return ended_line(f, in, (size_t)nl.pos, line, len);
    }
}

/* Bytes of BUF (all of them, or up to its first \n included) move
 * to the end of IN. */
static void
move_to_newline(struct evbuffer *in, const char *buf, size_t len, size_t *pos)
{
    const char *p = buf + *pos;
    const char *nl = memchr(p, '\n', len - *pos);
    size_t n = nl != NULL ? (size_t)(nl - p) + 1 : len - *pos;
    evbuffer_add(in, p, n);
    *pos += n;
}

/* BUF's AVAIL bytes at P hold no \n: the start of a line, which goes to
 * IN (empty) to wait for the next read, unless it is over the limit
 * already. */
static enum ld_frame_result
unended_in_place(struct ld_framer *f, struct evbuffer *in, const char *p,
                 size_t avail)
{
    if (avail > f->max_bytes + 1 ||
        (avail == f->max_bytes + 1 && p[avail - 1] != '\r')) {
        keep_head(f, p, avail);
        f->discarding = true;
        return LD_FRAME_TOO_LARGE;
    }
    evbuffer_add(in, p, avail);
    f->scanned = avail;
    return LD_FRAME_NEED_MORE;
}

/* The line of the N bytes at P, which a \n follows: NUL-terminated where
 * it lies. */
static enum ld_frame_result
ended_in_place(struct ld_framer *f, char *p, size_t n, char **line,
               size_t *llen, bool *owned)
{
    if (n > f->max_bytes && (n > f->max_bytes + 1 || p[n - 1] != '\r')) {
        keep_head(f, p, n);
        return LD_FRAME_TOO_LARGE;
    }
    if (n > 0 && p[n - 1] == '\r') {
        n--;
    }
    p[n] = '\0';
    *line = p;
    *llen = n;
    *owned = false;
    return LD_FRAME_LINE;
}

enum ld_frame_result
ld_frame_take(struct ld_framer *f, struct evbuffer *in, char *buf, size_t len,
              size_t *pos, char **line, size_t *llen, bool *owned)
{
    for (;;) {
        if (evbuffer_get_length(in) > 0) {
            enum ld_frame_result r = ld_frame_next(f, in, line, llen);
            if (r != LD_FRAME_NEED_MORE) {
                *owned = true;
                return r;
            }
            if (*pos >= len) {
                return LD_FRAME_NEED_MORE;
            }
            if (evbuffer_get_length(in) > 0) {
                /* The end of the kept line is in BUF: only it goes
                 * through IN, the lines after it are framed in place. */
                move_to_newline(in, buf, len, pos);
            }
            continue;
        }
        if (*pos >= len) {
            return LD_FRAME_NEED_MORE;
        }
        char *p = buf + *pos;
        size_t avail = len - *pos;
        char *nl = memchr(p, '\n', avail);
        if (f->discarding) {
            if (nl == NULL) {
                *pos = len;
                return LD_FRAME_NEED_MORE;
            }
            *pos += (size_t)(nl - p) + 1;
            f->discarding = false;
            continue;
        }
        if (nl == NULL) {
            *pos = len;
            return unended_in_place(f, in, p, avail);
        }
        size_t n = (size_t)(nl - p);
        *pos += n + 1;
        return ended_in_place(f, p, n, line, llen, owned);
    }
}

void
ld_frame_keep(struct ld_framer *f, struct evbuffer *in, const char *buf,
              size_t len, size_t *pos)
{
    if (*pos >= len) {
        return;
    }
    if (evbuffer_get_length(in) == 0) {
        f->scanned = 0;
    }
    evbuffer_add(in, buf + *pos, len - *pos);
    *pos = len;
}
