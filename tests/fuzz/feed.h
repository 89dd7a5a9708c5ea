#ifndef FUZZ_FEED_H
#define FUZZ_FEED_H

/* What the fuzz targets that play a client share: a session on one end
 * of a socketpair, and an input's bytes fed to it in pieces, so that
 * every way of splitting a line across reads is tried. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Turns the daemon's loop once and reads what the session answered. */
typedef void fuzz_turn_fn(int client);

/* A new session on one end of a non-blocking socketpair; the other end
 * goes to *CLIENT. false when the session refused (nothing is left open). */
bool fuzz_session_open(int *client);

/* Sends DATA to CLIENT in pieces of 1..PIECE bytes drawn from a generator
 * seeded by PIECE (0: all at once), turning the loop after each piece.
 * A full socket is resolved by turning the loop, never by blocking: the
 * session stops reading while its work per turn is bounded or its output
 * is high. Gives up after STALLS turns without progress (the session
 * closed, or no longer reads at all). */
void fuzz_feed(int client, const uint8_t *data, size_t len, unsigned piece,
               fuzz_turn_fn *turn, unsigned stalls);

#endif
