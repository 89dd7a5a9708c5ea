#ifndef LD_FRAME_H
#define LD_FRAME_H

#include "ld_common.h"

struct evbuffer;

/* NDJSON framing over an input buffer, a pure function of its bytes:
 * returns the next complete line, or says the line was over the limit (and
 * arranges to skip it up to its newline), or that more bytes are needed. */

enum ld_frame_result {
    LD_FRAME_NEED_MORE,
    LD_FRAME_LINE,     /* *LINE (malloc'd, NUL-terminated, without the
                            \n or \r\n) and *LEN set */
    LD_FRAME_TOO_LARGE /* one over-long line reported (once per line),
                          its first bytes in the framer's head */
};

#define LD_FRAME_HEAD_BYTES 16

struct ld_framer {
    size_t max_bytes;
    bool discarding; /* inside an over-long line: drop until \n */
    size_t scanned;  /* leading bytes already known to hold no \n */
    /* The first bytes of the last over-long line, for whoever must know
     * what kind of line it was (the HTTP guard) though it is dropped. */
    char head[LD_FRAME_HEAD_BYTES];
    size_t head_len;
};

enum ld_frame_result ld_frame_next(struct ld_framer *f, struct evbuffer *in,
                                   char **line, size_t *len);

/* The same for the bytes of a read, BUF[*POS..LEN), which follow what IN
 * kept of earlier reads: a line wholly inside BUF is returned in place,
 * NUL-terminated there (BUF is written to), with *OWNED false; a line that
 * began in IN is malloc'd as above, *OWNED true. *POS moves past what was
 * framed; at LD_FRAME_NEED_MORE all of BUF has gone to IN or was skipped.
 * Most reads hold whole lines, which then cost neither a copy nor an
 * allocation. */
enum ld_frame_result ld_frame_take(struct ld_framer *f, struct evbuffer *in,
                                   char *buf, size_t len, size_t *pos,
                                   char **line, size_t *llen, bool *owned);
/* Stopping before NEED_MORE: the rest of BUF goes to IN for later. */
void ld_frame_keep(struct ld_framer *f, struct evbuffer *in, const char *buf,
                   size_t len, size_t *pos);

#endif
