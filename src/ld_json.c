/*
 * JSON text on the hot path. Requests are nearly always one flat object
 * of short strings and integers, and replies the same: jansson's
 * general parser and dumper cost several times what these shapes need.
 * Whatever falls outside them goes to jansson, so its behaviour (and its
 * error messages) stay the reference.
 */
#include "ld_json.h"

#include "ld_util.h"

#include <string.h>

/* Length of the valid UTF-8 sequence starting at P (at most N bytes
 * available), 0 when invalid: no overlong forms, no surrogates, nothing
 * above U+10FFFF, as RFC 3629 and jansson require. */
size_t
ld_utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t want;
    unsigned min;
    unsigned cp;
    if (c < 0x80) {
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        want = 2;
        min = 0x80;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        want = 3;
        min = 0x800;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        want = 4;
        min = 0x10000;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < want) {
        return 0;
    }
    for (size_t i = 1; i < want; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        return 0;
    }
    return want;
}

/* The bytes at the start of P (LEN bytes), in whole 8-byte words, that
 * JSON takes as they are: printable ASCII other than '"' and '\\'. Each
 * word is tested at once (the "has a zero byte" trick of Hacker's
 * Delight, applied to the word and to it XORed with each special byte);
 * the word that holds an exception is left to the byte loop. */
static size_t
plain_words(const unsigned char *p, size_t len)
{
#define BYTES(b) (0x0101010101010101ull * (b))
#define HAS_ZERO(x) (((x)-BYTES(0x01)) & ~(x))
    size_t i = 0;
    while (len - i >= 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        /* Below 0x20, at or above 0x80 (the high bit), '"' or '\\'. */
        uint64_t bad = ((w - BYTES(0x20)) & ~w) | w |
                       HAS_ZERO(w ^ BYTES('"')) | HAS_ZERO(w ^ BYTES('\\'));
        if ((bad & BYTES(0x80)) != 0) {
            break;
        }
        i += 8;
    }
    return i;
#undef HAS_ZERO
#undef BYTES
}

size_t
ld_json_quote(char *out, const char *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF"; /* as jansson */
    const unsigned char *p = (const unsigned char *)s;
    char *o = out;
    size_t i = 0;

    *o++ = '"';
    while (i < len) {
        /* Copy the longest run that needs no escape in one go, found a
         * word at a time: a 10 KB value is mostly such a run. */
        size_t run = i + plain_words(p + i, len - i);
        while (run < len && p[run] >= 0x20 && p[run] < 0x80 && p[run] != '"' &&
               p[run] != '\\') {
            run++;
        }
        if (run > i) {
            memcpy(o, p + i, run - i);
            o += run - i;
            i = run;
            continue;
        }
        unsigned c = p[i];
        if (c >= 0x80) {
            size_t n = ld_utf8_seq(p + i, len - i);
            if (n == 0) {
                return 0;
            }
            memcpy(o, p + i, n);
            o += n;
            i += n;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
            break;
        }
        i++;
    }
    *o++ = '"';
    return (size_t)(o - out);
}

size_t
ld_json_format_int(char *out, json_int_t v)
{
    char buf[LD_LL_STR_MAX];
    size_t n = ld_ll_to_str(buf, (long long)v);
    memcpy(out, buf, n);
    return n;
}

/* ---- the flat-object scanner ------------------------------------------- */

struct scan {
    const unsigned char *p, *end;
};

static void
skip_ws(struct scan *s)
{
    while (s->p < s->end &&
           (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) {
        s->p++;
    }
}

/* A string without escapes; its bytes (between the quotes) in *START and
 * *LEN. False for anything that needs jansson. */
static bool
scan_string(struct scan *s, const char **start, size_t *len)
{
    if (s->p >= s->end || *s->p != '"') {
        return false;
    }
    const unsigned char *b = ++s->p;
    while (s->p < s->end) {
        unsigned c = *s->p;
        if (c == '"') {
            *start = (const char *)b;
            *len = (size_t)(s->p - b);
            s->p++;
            return true;
        }
        if (c == '\\' || c < 0x20) {
            return false;
        }
        if (c < 0x80) {
            s->p++;
        } else {
            size_t n = ld_utf8_seq(s->p, (size_t)(s->end - s->p));
            if (n == 0) {
                return false;
            }
            s->p += n;
        }
    }
    return false;
}

static bool
scan_word(struct scan *s, const char *w, size_t n)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0) {
        return false;
    }
    s->p += n;
    return true;
}

/* -?(0|[1-9][0-9]*) of at most 18 digits (so it cannot overflow), not
 * followed by a fraction or an exponent. */
static json_t *
scan_integer(struct scan *s)
{
    bool neg = false;
    if (s->p < s->end && *s->p == '-') {
        neg = true;
        s->p++;
    }
    const unsigned char *d = s->p;
    json_int_t v = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (s->p - d == 18) {
            return NULL; /* may not fit: json_loadb decides */
        }
        v = v * 10 + (*s->p - '0');
        s->p++;
    }
    size_t digits = (size_t)(s->p - d);
    if (digits == 0 || digits > 18 || (digits > 1 && *d == '0')) {
        return NULL;
    }
    if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E')) {
        return NULL;
    }
    return json_integer(neg ? -v : v);
}

static json_t *
scan_value(struct scan *s)
{
    if (s->p >= s->end) {
        return NULL;
    }
    const char *str;
    size_t len;
    switch (*s->p) {
    case '"':
        return scan_string(s, &str, &len) ? json_stringn_nocheck(str, len)
                                          : NULL;
    case 't':
        return scan_word(s, "true", 4) ? json_true() : NULL;
    case 'f':
        return scan_word(s, "false", 5) ? json_false() : NULL;
    case 'n':
        return scan_word(s, "null", 4) ? json_null() : NULL;
    default:
        return scan_integer(s);
    }
}

json_t *
ld_json_flat_parse(const char *text, size_t len)
{
    struct scan s = {(const unsigned char *)text,
                     (const unsigned char *)text + len};
    skip_ws(&s);
    if (s.p >= s.end || *s.p++ != '{') {
        return NULL;
    }
    json_t *obj = json_object();
    if (obj == NULL) {
        return NULL;
    }
    skip_ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
    } else {
        for (;;) {
            const char *key;
            size_t klen;
            skip_ws(&s);
            if (!scan_string(&s, &key, &klen)) {
                goto other;
            }
            skip_ws(&s);
            if (s.p >= s.end || *s.p++ != ':') {
                goto other;
            }
            skip_ws(&s);
            json_t *v = scan_value(&s);
            if (v == NULL) {
                goto other;
            }
            /* Like json_loadb: a repeated key keeps its place and takes
             * the later value. */
            if (json_object_setn_new_nocheck(obj, key, klen, v) != 0) {
                goto other;
            }
            skip_ws(&s);
            if (s.p < s.end && *s.p == ',') {
                s.p++;
                continue;
            }
            if (s.p < s.end && *s.p == '}') {
                s.p++;
                break;
            }
            goto other;
        }
    }
    skip_ws(&s);
    if (s.p == s.end) {
        return obj;
    }
other:
    json_decref(obj);
    return NULL;
}
