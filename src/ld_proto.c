/*
 * Requests and replies: NDJSON lines to request objects, field checks that
 * name the offending field, and the one place replies are serialised.
 */
#include "ld_proto.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_mem.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    const struct ld_ctx *ctx;
    ld_proto_route *route; /* where requests go: dispatch */
} proto_mod;

int
ld_proto_init(const struct ld_ctx *ctx, ld_proto_route *route)
{
    proto_mod.ctx = ctx;
    proto_mod.route = route;
    return LD_OK;
}

void
ld_proto_free(void)
{
    proto_mod.route = NULL;
}

int
ld_proto_parse(const char *line, size_t len, json_t **out, json_t **id_out,
               char *msg, size_t msglen)
{
    json_error_t jerr;
    *out = NULL;
    *id_out = NULL;

    /* JSON has no place for a raw NUL byte, between tokens or inside a
     * string (where \u0000 is the way to write one). */
    const char *nul = memchr(line, '\0', len);
    if (nul != NULL) {
        snprintf(msg, msglen, "invalid JSON at column %zu: NUL byte",
                 (size_t)(nul - line) + 1);
        return LD_ERR;
    }
    /* Values are binary-safe, so \u0000 is allowed in strings; the
     * fields that name things (op, keys, tokens) refuse it below and in
     * the field accessors. */
    json_t *obj = json_loadb(line, len, JSON_ALLOW_NUL, &jerr);
    if (obj == NULL) {
        snprintf(msg, msglen, "invalid JSON at column %d: %s", jerr.column,
                 jerr.text);
        return LD_ERR;
    }
    if (!json_is_object(obj)) {
        json_decref(obj);
        snprintf(msg, msglen, "request must be a JSON object");
        return LD_ERR;
    }
    json_t *id = json_object_get(obj, "id");
    if (id != NULL) {
        if (json_is_object(id) || json_is_array(id)) {
            json_decref(obj);
            snprintf(msg, msglen, "field 'id' must be a scalar");
            return LD_ERR;
        }
        *id_out = json_incref(id);
    }
    json_t *op = json_object_get(obj, "op");
    if (op == NULL) {
        json_decref(obj);
        snprintf(msg, msglen, "missing field 'op'");
        return LD_ERR;
    }
    if (!json_is_string(op) ||
        strlen(json_string_value(op)) != json_string_length(op)) {
        snprintf(msg, msglen, "field 'op' must be a string%s",
                 json_is_string(op) ? " without NUL" : "");
        json_decref(obj);
        return LD_ERR;
    }
    *out = obj;
    return LD_OK;
}

static size_t utf8_seq(const unsigned char *p, size_t n);

/* The longest prefix of S (LEN bytes) that is valid UTF-8. */
static size_t
utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq(p + i, len - i);
        if (n == 0) {
            break;
        }
        i += n;
    }
    return i;
}

static char *
dump_line(json_t *obj, size_t *len)
{
    char *s = json_dumps(obj, JSON_COMPACT);
    if (s == NULL) {
        return NULL;
    }
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (line == NULL) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    *len = n + 1;
    return line;
}

char *
ld_proto_ok_line(json_t *id, json_t *fields, size_t *len)
{
    json_t *obj = json_object();
    if (id != NULL) {
        json_object_set(obj, "id", id);
    }
    json_object_set_new(obj, "ok", json_true());
    if (fields != NULL) {
        json_object_update(obj, fields);
        json_decref(fields);
    }
    char *line = dump_line(obj, len);
    json_decref(obj);
    return line;
}

char *
ld_proto_error_line(json_t *id, int code, json_t *extra, const char *message,
                    size_t *len)
{
    json_t *obj = json_object();
    json_t *err = json_object();
    if (id != NULL) {
        json_object_set(obj, "id", id);
    }
    json_object_set_new(obj, "ok", json_false());
    json_object_set_new(err, "code", json_string(ld_errcode_name(code)));
    /* The message may quote client input cut at a byte limit, possibly
     * inside a character: keep what is valid up to there. */
    json_t *m = json_stringn(message,
                             utf8_valid_prefix(message, strlen(message)));
    if (m == NULL) {
        m = json_string("(message not valid UTF-8)");
    }
    json_object_set_new(err, "message", m);
    if (extra != NULL) {
        json_object_update(err, extra);
        json_decref(extra);
    }
    json_object_set_new(obj, "error", err);
    char *line = dump_line(obj, len);
    json_decref(obj);
    return line;
}

/* The one place a request ends; ld_proto_on_line is the one place it
 * begins. */
static void
req_free(struct ld_req *req)
{
    if (req->id != NULL) {
        json_decref(req->id);
    }
    if (req->body != NULL) {
        json_decref(req->body);
    }
    struct ld_session *s = req->sess;
    free(req);
    if (s != NULL) {
        ld_session_req_done(s);
    }
}

static void
send_line(struct ld_req *req, char *line, size_t len)
{
    if (line != NULL) {
        /* Also after the session ended: a half-closed client still
         * reads the answers to what it sent (see ld_session.c). */
        if (req->sess != NULL) {
            ld_session_write(req->sess, line, len);
        }
        free(line);
    }
    req_free(req);
}

char *
ld_proto_bare_error_line(int code, const char *message, size_t *len)
{
    char *line = ld_proto_error_line(NULL, code, NULL, message, len);
    if (line == NULL) {
        ld_oom(0);
    }
    return line;
}

static void
reply_bare_error(struct ld_session *s, json_t *id, int code, const char *msg)
{
    size_t len = 0;
    ld_stats_count_error(code);
    char *line = ld_proto_error_line(id, code, NULL, msg, &len);
    if (line != NULL) {
        ld_session_write(s, line, len);
        free(line);
    }
}

void
ld_proto_on_line(struct ld_session *s, const char *line, size_t len)
{
    json_t *body = NULL;
    json_t *id = NULL;
    char msg[256];

    LD_ASSERT(proto_mod.route != NULL);
    if (ld_proto_parse(line, len, &body, &id, msg, sizeof(msg)) != LD_OK) {
        reply_bare_error(s, id, LD_E_BAD_REQUEST, msg);
        if (id != NULL) {
            json_decref(id);
        }
        return;
    }

    struct ld_req *req = ld_xcalloc(1, sizeof(*req));
    req->sess = s;
    req->id = id;
    req->body = body;
    req->op = json_string_value(json_object_get(body, "op"));
    req->start_us = ld_now_us();
    ld_session_req_begin(s);
    proto_mod.route(req);
}

/* Length of the valid UTF-8 sequence starting at P (at most N bytes
 * available), 0 when invalid: no overlong forms, no surrogates, nothing
 * above U+10FFFF, as RFC 3629 and jansson require. */
static size_t
utf8_seq(const unsigned char *p, size_t n)
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

size_t
ld_json_quote(char *out, const char *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF"; /* as jansson */
    const unsigned char *p = (const unsigned char *)s;
    char *o = out;
    size_t i = 0;

    *o++ = '"';
    while (i < len) {
        /* Copy the longest run that needs no escape in one go. */
        size_t run = i;
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
            size_t n = utf8_seq(p + i, len - i);
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

int
ld_reply_ok_hit(struct ld_req *req, const char *v, size_t len)
{
    return ld_reply_ok_hit_ex(req, v, len, NULL);
}

int
ld_reply_ok_hit_ex(struct ld_req *req, const char *v, size_t len,
                   const char *extra)
{
    static const char mid[] = "\"ok\":true,\"hit\":true,\"value\":";
    char *idtext = NULL;
    size_t idlen = 0;
    /* A large value for a client that is not taking its replies (or is
     * gone) is not worth quoting: the line would be dropped. */
    if (req->sess != NULL && !ld_session_output_room(req->sess, len)) {
        req_free(req);
        return LD_OK;
    }
    if (req->id != NULL) {
        idtext = json_dumps(req->id, JSON_ENCODE_ANY | JSON_COMPACT);
        if (idtext == NULL) {
            return LD_ERR;
        }
        idlen = strlen(idtext);
    }
    size_t xlen = extra != NULL ? strlen(extra) : 0;
    size_t cap = 8 + idlen + sizeof(mid) + ld_json_quote_max(len) + xlen + 3;
    char *line = malloc(cap);
    if (line == NULL) {
        free(idtext);
        return LD_ERR;
    }
    char *o = line;
    *o++ = '{';
    if (idtext != NULL) {
        memcpy(o, "\"id\":", 5);
        o += 5;
        memcpy(o, idtext, idlen);
        o += idlen;
        *o++ = ',';
        free(idtext);
    }
    memcpy(o, mid, sizeof(mid) - 1);
    o += sizeof(mid) - 1;
    size_t q = ld_json_quote(o, v, len);
    if (q == 0) {
        free(line);
        return LD_ERR;
    }
    o += q;
    if (xlen > 0) {
        memcpy(o, extra, xlen);
        o += xlen;
    }
    *o++ = '}';
    *o++ = '\n';
    send_line(req, line, (size_t)(o - line));
    return LD_OK;
}

void
ld_reply_buffer(struct ld_req *req, struct evbuffer *buf)
{
    if (req->sess != NULL) {
        ld_session_write_buffer(req->sess, buf);
    }
    req_free(req);
}

void
ld_reply_ok(struct ld_req *req, json_t *fields)
{
    size_t len = 0;
    char *line = ld_proto_ok_line(req->id, fields, &len);
    send_line(req, line, len);
}

static void
reply_error_v(struct ld_req *req, int code, json_t *extra, const char *fmt,
              va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    ld_stats_count_error(code);
    size_t len = 0;
    char *line = ld_proto_error_line(req->id, code, extra, msg, &len);
    send_line(req, line, len);
}

void
ld_reply_error(struct ld_req *req, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(req, code, NULL, fmt, ap);
    va_end(ap);
}

void
ld_reply_error_extra(struct ld_req *req, int code, json_t *extra,
                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_error_v(req, code, extra, fmt, ap);
    va_end(ap);
}

bool
ld_req_session_open(const struct ld_req *req)
{
    return req->sess != NULL && req->sess->open;
}

bool
ld_key_valid(const char *key, size_t len)
{
    /* Keys become parts of Redis key names and of log lines: unlike
     * values they may not hold NUL. */
    return len > 0 &&
           (long long)len <= proto_mod.ctx->cfg->limits.max_key_bytes &&
           memchr(key, '\0', len) == NULL;
}

static int
bad_field(struct ld_req *req, const char *field, const char *what)
{
    ld_reply_error(req, LD_E_BAD_REQUEST, "field '%s' %s", field, what);
    return LD_ERR;
}

int
ld_req_key(struct ld_req *req, const char *field, const char **key,
           size_t *len)
{
    json_t *v = json_object_get(req->body, field);
    if (v == NULL || json_is_null(v)) {
        return bad_field(req, field, "is required");
    }
    if (!json_is_string(v)) {
        return bad_field(req, field, "must be a string");
    }
    size_t n = json_string_length(v);
    if (n == 0) {
        return bad_field(req, field, "must not be empty");
    }
    if ((long long)n > proto_mod.ctx->cfg->limits.max_key_bytes) {
        char what[96];
        snprintf(what, sizeof(what), "is longer than %lld bytes",
                 proto_mod.ctx->cfg->limits.max_key_bytes);
        return bad_field(req, field, what);
    }
    if (memchr(json_string_value(v), '\0', n) != NULL) {
        return bad_field(req, field, "must not contain NUL (\\u0000)");
    }
    *key = json_string_value(v);
    *len = n;
    return LD_OK;
}

int
ld_req_str(struct ld_req *req, const char *field, bool required,
           const char **s, size_t *len, bool *present)
{
    json_t *v = json_object_get(req->body, field);
    if (present != NULL) {
        *present = false;
    }
    if (v == NULL || json_is_null(v)) {
        if (required) {
            return bad_field(req, field, "is required");
        }
        return LD_OK;
    }
    if (!json_is_string(v)) {
        return bad_field(req, field, "must be a string");
    }
    /* Names and tokens, not values (those are read apart, with their
     * length): NUL would cut them short wherever they are used as C
     * strings. */
    if (memchr(json_string_value(v), '\0', json_string_length(v)) != NULL) {
        return bad_field(req, field, "must not contain NUL (\\u0000)");
    }
    *s = json_string_value(v);
    if (len != NULL) {
        *len = json_string_length(v);
    }
    if (present != NULL) {
        *present = true;
    }
    return LD_OK;
}

int
ld_req_int(struct ld_req *req, const char *field, bool required, long long min,
           long long max, long long *out, bool *present)
{
    json_t *v = json_object_get(req->body, field);
    if (present != NULL) {
        *present = false;
    }
    if (v == NULL || json_is_null(v)) {
        if (required) {
            return bad_field(req, field, "is required");
        }
        return LD_OK;
    }
    if (!json_is_integer(v)) {
        return bad_field(req, field, "must be an integer");
    }
    long long n = json_integer_value(v);
    if (n < min || n > max) {
        char what[96];
        snprintf(what, sizeof(what), "must be between %lld and %lld", min,
                 max);
        return bad_field(req, field, what);
    }
    *out = n;
    if (present != NULL) {
        *present = true;
    }
    return LD_OK;
}

int
ld_req_bool(struct ld_req *req, const char *field, bool *out)
{
    json_t *v = json_object_get(req->body, field);
    if (v == NULL || json_is_null(v)) {
        return LD_OK;
    }
    if (!json_is_boolean(v)) {
        return bad_field(req, field, "must be true or false");
    }
    *out = json_is_true(v);
    return LD_OK;
}

int
ld_req_keys(struct ld_req *req, const char *field, size_t max, json_t **arr)
{
    json_t *v = json_object_get(req->body, field);
    if (v == NULL || json_is_null(v)) {
        return bad_field(req, field, "is required");
    }
    if (!json_is_array(v)) {
        return bad_field(req, field, "must be an array of strings");
    }
    size_t n = json_array_size(v);
    if (n == 0) {
        return bad_field(req, field, "must not be empty");
    }
    if (n > max) {
        char what[64];
        snprintf(what, sizeof(what), "has more than %zu keys", max);
        return bad_field(req, field, what);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(v, i);
        if (!json_is_string(k)) {
            return bad_field(req, field, "must be an array of strings");
        }
        if (!ld_key_valid(json_string_value(k), json_string_length(k))) {
            return bad_field(req, field, "holds an empty or over-long key");
        }
    }
    *arr = v;
    return LD_OK;
}
