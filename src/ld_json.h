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

/* TEXT (LEN bytes) when it is a flat object (fields of strings without
 * escapes, integers, true, false, null): the tree json_loadb would
 * build from it. NULL for anything else, valid or not: the caller then
 * asks json_loadb, which also words the errors. */
json_t *ld_json_flat_parse(const char *text, size_t len);

#endif
