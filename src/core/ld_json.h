#ifndef LD_JSON_H
#define LD_JSON_H

/* JSON text on the hot path: the few shapes nearly every request and
 * reply has, done by hand; jansson for everything else. */

#include "ld_common.h"

#include <jansson.h>

/* Length of the valid UTF-8 sequence at P (N bytes available), 0 when
 * invalid. */
size_t ld_utf8_seq(const unsigned char *p, size_t n);

/* Write S (LEN bytes) as a JSON string literal, quotes included, into
 * OUT, which must hold ld_json_quote_max(LEN) bytes; returns the bytes
 * written, or 0 when S is not valid UTF-8. The same text as jansson's,
 * without its per-character cost (large cached values go through this). */
size_t ld_json_quote(char *out, const char *s, size_t len);
#define ld_json_quote_max(len) ((len)*6 + 2)

/* V in decimal as jansson writes it, into OUT (LD_JSON_INT_MAX bytes);
 * returns the length (no NUL is written). */
#define LD_JSON_INT_MAX 20
size_t ld_json_format_int(char *out, json_int_t v);

/* One member of a flat object, as offsets into the scanned text (so that
 * the text may be copied after the scan). */
enum ld_jkind { LD_JK_STR, LD_JK_INT, LD_JK_TRUE, LD_JK_FALSE, LD_JK_NULL };
struct ld_jmember {
    uint32_t name, name_len; /* the name's bytes, between its quotes */
    uint32_t s, len;         /* a string's bytes, between its quotes; the
                                literal's text for the other kinds */
    long long i;             /* LD_JK_INT */
    unsigned char kind;
};

/* Scan TEXT (LEN bytes) when it is a flat object: members whose values
 * are strings without escapes, integers json_loadb would read as the
 * same integer, true, false or null. Returns the number of distinct
 * members written to M (at most MAX; a repeated name keeps its place and
 * takes the later value, as in json_loadb), or -1 for anything else,
 * valid or not: the caller then asks json_loadb, which also words the
 * errors. A string's bytes need no escaping to be written back. */
int ld_json_flat_scan(const char *text, size_t len, struct ld_jmember *m,
                      int max);

/* The member of M (N of them, scanned from TEXT) named NAME (LEN bytes),
 * NULL when none. */
const struct ld_jmember *ld_json_member(const char *text,
                                        const struct ld_jmember *m, int n,
                                        const char *name, size_t len);

/* The tree json_loadb makes of the scanned TEXT (N members in M); NULL
 * without memory. */
json_t *ld_json_flat_tree(const char *text, const struct ld_jmember *m, int n);

#endif
