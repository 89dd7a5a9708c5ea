#ifndef LD_READER_H
#define LD_READER_H

#include "ld_common.h"

#include <hiredis/read.h>

/* hiredis' reader trusts the lengths it reads: an array header of two
 * billion elements makes it allocate 16 GB at once, and a bulk header of
 * any size makes it buffer until that many bytes have come. A broken
 * proxy or a hostile server must not take the daemon's memory that way,
 * so every reader of the daemon refuses a reply past these bounds (an
 * error of the reader, which the connection treats as a protocol error:
 * it closes, and what was sent on it fails). */
struct ld_reader_bounds {
    size_t max_bulk;        /* one string */
    long long max_elements; /* one array */
    size_t max_reply;       /* one reply: strings plus the replies */
    size_t used;            /* of the reply being read */
    char why[96];           /* the bound passed, "" if none */
};

/* The bounds the daemon's own replies never reach: one string up to
 * MAX_VALUE bytes (the largest value it accepts or hands out), one reply
 * up to twice that. */
void ld_reader_bounds_init(struct ld_reader_bounds *b, size_t max_value);

/* A reader held to B (which must outlive it). */
redisReader *ld_reader_new(struct ld_reader_bounds *b);

/* After the reader has handed out what is complete: false when the reply
 * still being received is already over the bounds (a bulk header too
 * large, bytes buffered past it), with the reason in B->why. */
bool ld_reader_within(redisReader *r, struct ld_reader_bounds *b);

#endif
