/*
 * JSON text on the hot path. Requests are nearly always one flat object
 * of short strings and integers, and replies the same: jansson's
 * general parser and dumper cost several times what these shapes need.
 * Whatever falls outside them goes to jansson, so its behaviour (and its
 * error messages) stay the reference.
 *
 * Functions of bytes only: no state, no I/O, and no knowledge of what the
 * protocol's fields mean.
 */
#include "ld_json.h"

#include "ld_util.h"

#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

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

/* A byte JSON takes as it is inside a string: printable ASCII other than
 * '"' and '\\'. */
#define PLAIN_BYTE(c) ((unsigned)(c)-0x20 < 0x60 && (c) != '"' && (c) != '\\')

/* The bytes at the start of P (LEN bytes), in whole 8-byte words, that
 * JSON takes as they are: printable ASCII other than '"' and '\\'. Each
 * word is tested at once (the "has a zero byte" trick of Hacker's
 * Delight, applied to the word and to it XORed with each special byte);
 * the word that holds an exception is left to the byte loop. Where SSE2
 * is there (every x86-64), 16 bytes at a time first, to the exact byte:
 * a large cached value is mostly such a run, and this scan was most of
 * the cost of a hit of 10 KB. */
static size_t
plain_words(const unsigned char *p, size_t len)
{
#define BYTES(b) (0x0101010101010101ull * (b))
#define HAS_ZERO(x) (((x)-BYTES(0x01)) & ~(x))
    size_t i = 0;
#ifdef __SSE2__
    const __m128i space = _mm_set1_epi8(0x20);
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i bslash = _mm_set1_epi8('\\');
    while (len - i >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
        /* Signed: bytes at or above 0x80 are below 0x20 too. */
        __m128i bad = _mm_or_si128(_mm_cmplt_epi8(v, space),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                                _mm_cmpeq_epi8(v, bslash)));
        unsigned mask = (unsigned)_mm_movemask_epi8(bad);
        if (mask != 0) {
            return i + (size_t)__builtin_ctz(mask);
        }
        i += 16;
    }
#endif
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

/* The escape of ASCII byte C at O, as jansson writes it; returns the
 * end. */
static char *
put_escape(char *o, unsigned c)
{
    static const char hex[] = "0123456789ABCDEF"; /* as jansson */
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
    return o;
}

size_t
ld_json_quote(char *out, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    char *o = out;
    size_t i = 0;

    *o++ = '"';
    while (i < len) {
        /* Copy the longest run that needs no escape in one go, found a
         * word at a time: a 10 KB value is mostly such a run. */
        size_t run = i + plain_words(p + i, len - i);
        while (run < len && PLAIN_BYTE(p[run])) {
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
        o = put_escape(o, c);
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
 * *LEN. False for anything that needs jansson. With SSE2 the run up to
 * the closing quote of a short string is found in one or two steps of 16
 * bytes; otherwise by words, then a byte at a time. */
static bool
scan_string(struct scan *s, const char **start, size_t *len)
{
    if (s->p >= s->end || *s->p != '"') {
        return false;
    }
    const unsigned char *b = ++s->p;
    const unsigned char *p = b;
    const unsigned char *end = s->end;
    while (p < end) {
        p += plain_words(p, (size_t)(end - p));
        while (p < end && PLAIN_BYTE(*p)) {
            p++;
        }
        if (p >= end) {
            break;
        }
        unsigned c = *p;
        if (c == '"') {
            *start = (const char *)b;
            *len = (size_t)(p - b);
            s->p = p + 1;
            return true;
        }
        if (c < 0x80) {
            return false; /* an escape or a control character */
        }
        size_t n = ld_utf8_seq(p, (size_t)(end - p));
        if (n == 0) {
            return false;
        }
        p += n;
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
 * followed by a fraction or an exponent, and not "-0" (which jansson
 * writes back as 0, and an id must come back as it was sent). */
static bool
scan_integer(struct scan *s, long long *out)
{
    bool neg = false;
    if (s->p < s->end && *s->p == '-') {
        neg = true;
        s->p++;
    }
    const unsigned char *d = s->p;
    long long v = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (s->p - d == 18) {
            return false; /* may not fit: json_loadb decides */
        }
        v = v * 10 + (*s->p - '0');
        s->p++;
    }
    size_t digits = (size_t)(s->p - d);
    if (digits == 0 || (digits > 1 && *d == '0') || (neg && v == 0)) {
        return false;
    }
    if (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E')) {
        return false;
    }
    *out = neg ? -v : v;
    return true;
}

/* One member's value into M; false for anything that needs jansson. */
static bool
scan_value(struct scan *s, const unsigned char *base, struct ld_jmember *m)
{
    if (s->p >= s->end) {
        return false;
    }
    const unsigned char *start = s->p;
    bool ok;
    switch (*s->p) {
    case '"': {
        const char *str;
        size_t len;
        if (!scan_string(s, &str, &len)) {
            return false;
        }
        m->kind = LD_JK_STR;
        m->s = (uint32_t)((const unsigned char *)str - base);
        m->len = (uint32_t)len;
        return true;
    }
    case 't':
        ok = scan_word(s, "true", 4);
        m->kind = LD_JK_TRUE;
        break;
    case 'f':
        ok = scan_word(s, "false", 5);
        m->kind = LD_JK_FALSE;
        break;
    case 'n':
        ok = scan_word(s, "null", 4);
        m->kind = LD_JK_NULL;
        break;
    default:
        ok = scan_integer(s, &m->i);
        m->kind = LD_JK_INT;
        break;
    }
    m->s = (uint32_t)(start - base);
    m->len = (uint32_t)(s->p - start);
    return ok;
}

const struct ld_jmember *
ld_json_member(const char *text, const struct ld_jmember *m, int n,
               const char *name, size_t len)
{
    for (int k = 0; k < n; k++) {
        /* The first byte before memcmp: most names differ there. */
        if (m[k].name_len == len && (len == 0 || text[m[k].name] == name[0]) &&
            memcmp(text + m[k].name, name, len) == 0) {
            return &m[k];
        }
    }
    return NULL;
}

/* One "key": value of an object into V (offsets from BASE). */
static bool
scan_member(struct scan *s, const unsigned char *base, struct ld_jmember *v)
{
    const char *key;
    size_t klen;
    skip_ws(s);
    if (!scan_string(s, &key, &klen)) {
        return false;
    }
    skip_ws(s);
    if (s->p >= s->end || *s->p++ != ':') {
        return false;
    }
    skip_ws(s);
    if (!scan_value(s, base, v)) {
        return false;
    }
    v->name = (uint32_t)((const unsigned char *)key - base);
    v->name_len = (uint32_t)klen;
    return true;
}

int
ld_json_flat_scan(const char *text, size_t len, struct ld_jmember *m, int max)
{
    const unsigned char *base = (const unsigned char *)text;
    struct scan s = {base, base + len};
    int n = 0;
    if (len > UINT32_MAX) {
        return -1;
    }
    skip_ws(&s);
    if (s.p >= s.end || *s.p++ != '{') {
        return -1;
    }
    skip_ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
    } else {
        for (;;) {
            struct ld_jmember v;
            if (!scan_member(&s, base, &v)) {
                return -1;
            }
            /* Like json_loadb: a repeated key keeps its place and takes
             * the later value. */
            const struct ld_jmember *same = ld_json_member(text, m, n,
                                                           text + v.name,
                                                           v.name_len);
            int k = same != NULL ? (int)(same - m) : n;
            if (k == n) {
                if (n == max) {
                    return -1;
                }
                n++;
            }
            m[k] = v;
            skip_ws(&s);
            if (s.p < s.end && *s.p == ',') {
                s.p++;
                continue;
            }
            if (s.p < s.end && *s.p == '}') {
                s.p++;
                break;
            }
            return -1;
        }
    }
    skip_ws(&s);
    return s.p == s.end ? n : -1;
}

json_t *
ld_json_flat_tree(const char *text, const struct ld_jmember *m, int n)
{
    json_t *obj = json_object();
    for (int k = 0; obj != NULL && k < n; k++) {
        json_t *v = NULL;
        switch (m[k].kind) {
        case LD_JK_STR:
            v = json_stringn_nocheck(text + m[k].s, m[k].len);
            break;
        case LD_JK_INT:
            v = json_integer(m[k].i);
            break;
        case LD_JK_TRUE:
            v = json_true();
            break;
        case LD_JK_FALSE:
            v = json_false();
            break;
        default:
            v = json_null();
            break;
        }
        if (json_object_setn_new_nocheck(obj, text + m[k].name, m[k].name_len,
                                         v) != 0) {
            json_decref(obj);
            obj = NULL;
        }
    }
    return obj;
}
