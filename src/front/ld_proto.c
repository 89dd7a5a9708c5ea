/*
 * Requests and replies: NDJSON lines to request objects, field checks that
 * name the offending field, and the one place replies are serialised.
 *
 * This module owns the request records (struct ld_req) from the line to
 * the answer. It must not route a request (it hands each to the route
 * given at init: dispatch) nor write to a socket but through the session
 * module.
 */
#include "ld_proto.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_json.h"
#include "ld_mem.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

/* A request record is made and dropped for every request: ended ones are
 * kept for the next, up to REQ_SPARE of them, which costs a fraction of a
 * malloc and a free. Each has room for the members and the copy of a
 * flat request: at least REQ_ROOM_MIN bytes (a usual request fits), and
 * a record grown past REQ_ROOM_SPARE for a long line is not kept. */
#define REQ_SPARE 256
#if defined(__SANITIZE_ADDRESS__)
/* Under AddressSanitizer every record is freed: a use after the answer
 * (of the record, or of the request's text kept in it) is then reported
 * instead of reading the next request's. */
#define REQ_REUSE false
#else
#define REQ_REUSE true
#endif
#define REQ_ROOM_MIN 320
#define REQ_ROOM_SPARE 4096
/* Members of a request read without a tree; more go to jansson. */
#define REQ_MEMBERS_MAX 16

static struct {
    const struct ld_ctx *ctx;
    ld_proto_route *route; /* where requests go: dispatch */
    struct ld_req *spare[REQ_SPARE];
    size_t n_spare;
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
    while (proto_mod.n_spare > 0) {
        free(proto_mod.spare[--proto_mod.n_spare]);
    }
}

/* The checks every request passes, whichever way it was parsed. */
static int
check_op(bool present, bool is_string, bool has_nul, char *msg, size_t msglen)
{
    if (!present) {
        snprintf(msg, msglen, "missing field 'op'");
        return LD_ERR;
    }
    if (!is_string || has_nul) {
        snprintf(msg, msglen, "field 'op' must be a string%s",
                 is_string ? " without NUL" : "");
        return LD_ERR;
    }
    return LD_OK;
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
    if (check_op(op != NULL, json_is_string(op),
                 json_is_string(op) &&
                     strlen(json_string_value(op)) != json_string_length(op),
                 msg, msglen) != LD_OK) {
        json_decref(obj);
        return LD_ERR;
    }
    *out = obj;
    return LD_OK;
}

/* The longest prefix of S (LEN bytes) that is valid UTF-8. */
static size_t
utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t n = ld_utf8_seq(p + i, len - i);
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

/* A reply line being written by hand, for the flat objects that almost
 * every reply is (jansson's dumper costs several times more per field). */
struct line_buf {
    char *p;
    size_t len, cap;
    bool heap; /* P was allocated; else it is the caller's (stack) */
};

static char *
line_room(struct line_buf *b, size_t need)
{
    if (b->cap - b->len < need) {
        size_t cap = b->cap;
        while (cap - b->len < need) {
            cap = cap * 2;
        }
        if (b->heap) {
            b->p = ld_xrealloc(b->p, cap);
        } else {
            char *p = ld_xmalloc(cap);
            memcpy(p, b->p, b->len);
            b->p = p;
            b->heap = true;
        }
        b->cap = cap;
    }
    return b->p + b->len;
}

static void
line_drop(struct line_buf *b)
{
    if (b->heap) {
        free(b->p);
    }
}

static void
line_add(struct line_buf *b, const char *s, size_t n)
{
    memcpy(line_room(b, n), s, n);
    b->len += n;
}

static bool
line_add_string(struct line_buf *b, const char *s, size_t n)
{
    size_t q = ld_json_quote(line_room(b, ld_json_quote_max(n)), s, n);
    b->len += q;
    return q > 0;
}

/* V as jansson's compact dump writes it: by hand for strings, integers
 * and the literals, through jansson for the rest. */
static bool
line_add_value(struct line_buf *b, json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return line_add_string(b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        b->len += ld_json_format_int(line_room(b, LD_JSON_INT_MAX),
                                     json_integer_value(v));
        return true;
    case JSON_TRUE:
        line_add(b, "true", 4);
        return true;
    case JSON_FALSE:
        line_add(b, "false", 5);
        return true;
    case JSON_NULL:
        line_add(b, "null", 4);
        return true;
    default: {
        char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (t == NULL) {
            return false;
        }
        line_add(b, t, strlen(t));
        free(t);
        return true;
    }
    }
}

/* The same line as dump_line of {"id":ID,"ok":true,...FIELDS}, or false
 * when a field needs jansson's own handling. */
static bool
ok_line_by_hand(struct line_buf *b, const char *id, size_t id_len,
                json_t *fields)
{
    line_add(b, "{", 1);
    if (id != NULL) {
        line_add(b, "\"id\":", 5);
        line_add(b, id, id_len);
        line_add(b, ",", 1);
    }
    line_add(b, "\"ok\":true", 9);
    if (fields != NULL) {
        const char *key;
        json_t *v;
        json_object_foreach(fields, key, v)
        {
            /* A field named like the head would replace it in place. */
            if (strcmp(key, "id") == 0 || strcmp(key, "ok") == 0) {
                return false;
            }
            line_add(b, ",", 1);
            if (!line_add_string(b, key, strlen(key))) {
                return false;
            }
            line_add(b, ":", 1);
            if (!line_add_value(b, v)) {
                return false;
            }
        }
    }
    line_add(b, "}\n", 2);
    *line_room(b, 1) = '\0'; /* as dump_line's */
    return true;
}

/* The id's JSON text back as a value, for the lines jansson writes. */
static void
set_id(json_t *obj, const char *id, size_t id_len)
{
    if (id != NULL) {
        json_t *v = json_loadb(id, id_len, JSON_DECODE_ANY | JSON_ALLOW_NUL,
                               NULL);
        json_object_set_new(obj, "id", v != NULL ? v : json_null());
    }
}

/* The ok line through jansson, for fields the hand-written line leaves. */
static char *
ok_line_jansson(const char *id, size_t id_len, json_t *fields, size_t *len)
{
    json_t *obj = json_object();
    set_id(obj, id, id_len);
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
ld_proto_ok_line(const char *id, size_t id_len, json_t *fields, size_t *len)
{
    struct line_buf b = {ld_xmalloc(256), 0, 256, true};
    if (ok_line_by_hand(&b, id, id_len, fields)) {
        json_decref(fields);
        *len = b.len;
        return b.p;
    }
    free(b.p);
    return ok_line_jansson(id, id_len, fields, len);
}

char *
ld_proto_error_line(const char *id, size_t id_len, int code, json_t *extra,
                    const char *message, size_t *len)
{
    json_t *obj = json_object();
    json_t *err = json_object();
    set_id(obj, id, id_len);
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
    if (req->cancel_fn != NULL) {
        LIST_REMOVE(req, cancel_link);
    }
    free(req->id_own);
    if (req->body != NULL) {
        json_decref(req->body);
    }
    ld_stats.requests_bytes -= (long long)req->cost_bytes;
    struct ld_session *s = req->sess;
    if (REQ_REUSE && proto_mod.n_spare < REQ_SPARE &&
        req->room <= REQ_ROOM_SPARE) {
        proto_mod.spare[proto_mod.n_spare++] = req;
    } else {
        free(req);
    }
    if (s != NULL) {
        ld_session_req_done(s);
    }
}

/* A line this long goes to the session's output as it is, not copied
 * into it (a large cache hit would otherwise be copied once more). */
#define REF_LINE_BYTES 4096

static void
free_line_cb(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    free(arg);
}

/* LINE (malloc'd) is handed over: freed once the output has sent it. */
static void
write_by_reference(struct ld_session *s, char *line, size_t len)
{
    struct evbuffer *buf = evbuffer_new();
    if (buf == NULL ||
        evbuffer_add_reference(buf, line, len, free_line_cb, line) != 0) {
        ld_session_write(s, line, len);
        free(line);
    } else {
        ld_session_write_buffer(s, buf);
    }
    if (buf != NULL) {
        evbuffer_free(buf);
    }
}

static void
send_line(struct ld_req *req, char *line, size_t len)
{
    if (line != NULL) {
        /* Also after the session ended: a half-closed client still
         * reads the answers to what it sent (see ld_session.c). */
        if (req->sess != NULL && len >= REF_LINE_BYTES) {
            write_by_reference(req->sess, line, len);
        } else {
            if (req->sess != NULL) {
                ld_session_write(req->sess, line, len);
            }
            free(line);
        }
    }
    req_free(req);
}

/* Answer REQ with the line in B: copied into the session's output when it
 * is on the caller's stack, handed over when it grew onto the heap. */
static void
send_buf(struct ld_req *req, struct line_buf *b)
{
    if (b->heap) {
        send_line(req, b->p, b->len);
        return;
    }
    if (req->sess != NULL) {
        ld_session_write(req->sess, b->p, b->len);
    }
    req_free(req);
}

char *
ld_proto_bare_error_line(int code, const char *message, size_t *len)
{
    char *line = ld_proto_error_line(NULL, 0, code, NULL, message, len);
    if (line == NULL) {
        ld_oom(0);
    }
    return line;
}

static void
reply_bare_error(struct ld_session *s, const char *id, size_t id_len, int code,
                 const char *msg)
{
    size_t len = 0;
    ld_stats_count_error(code);
    char *line = ld_proto_error_line(id, id_len, code, NULL, msg, &len);
    if (line != NULL) {
        ld_session_write(s, line, len);
        free(line);
    }
}

/* A record with room for NEED bytes after it. */
static struct ld_req *
req_new(size_t need)
{
    struct ld_req *req = NULL;
    if (proto_mod.n_spare > 0) {
        req = proto_mod.spare[--proto_mod.n_spare];
        if (req->room < need) {
            free(req);
            req = NULL;
        }
    }
    size_t room = req != NULL ? req->room
                              : (need > REQ_ROOM_MIN ? need : REQ_ROOM_MIN);
    if (req == NULL) {
        req = ld_xmalloc(sizeof(*req) + room);
    }
    memset(req, 0, sizeof(*req));
    req->room = room;
    return req;
}

/* The JSON text of member M's value (a string with its quotes). */
static const char *
member_text(const char *text, const struct ld_jmember *m, size_t *len)
{
    if (m->kind == LD_JK_STR) {
        *len = m->len + 2;
        return text + m->s - 1;
    }
    *len = m->len;
    return text + m->s;
}

/* A flat request (N members scanned from LINE): kept as the members over
 * a copy of the line, or answered bad_request (NULL). */
static struct ld_req *
flat_request(struct ld_session *s, const char *line, size_t len,
             const struct ld_jmember *m, int n)
{
    const struct ld_jmember *op = ld_json_member(line, m, n, "op", 2);
    const struct ld_jmember *id = ld_json_member(line, m, n, "id", 2);
    char msg[64];
    if (check_op(op != NULL, op != NULL && op->kind == LD_JK_STR, false, msg,
                 sizeof(msg)) != LD_OK) {
        size_t id_len = 0;
        const char *id_text = id != NULL ? member_text(line, id, &id_len)
                                         : NULL;
        reply_bare_error(s, id_text, id_len, LD_E_BAD_REQUEST, msg);
        return NULL;
    }
    size_t msize = (size_t)n * sizeof(*m);
    struct ld_req *req = req_new(msize + len + 1);
    struct ld_jmember *rm = (struct ld_jmember *)(req + 1);
    char *text = (char *)(req + 1) + msize;
    memcpy(rm, m, msize);
    memcpy(text, line, len);
    text[len] = '\0';
    /* Each name and string ends in place of its closing quote, except
     * the id's, which goes back as it came, quotes included. */
    for (int k = 0; k < n; k++) {
        text[rm[k].name + rm[k].name_len] = '\0';
        if (rm[k].kind == LD_JK_STR && &m[k] != id) {
            text[rm[k].s + rm[k].len] = '\0';
        }
    }
    if (id != NULL) {
        req->id = member_text(text, &rm[id - m], &req->id_len);
    }
    req->op = text + op->s;
    req->m = rm;
    req->nm = n;
    req->text = text;
    req->flat = true;
    return req;
}

/* Any other request, through jansson; NULL when answered bad_request. */
static struct ld_req *
tree_request(struct ld_session *s, const char *line, size_t len)
{
    json_t *body = NULL;
    json_t *id = NULL;
    char msg[256];
    /* The id is read even from a request refused here, for its answer. */
    int rc = ld_proto_parse(line, len, &body, &id, msg, sizeof(msg));
    char *id_text = NULL;
    if (id != NULL) {
        id_text = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
        json_decref(id);
        if (id_text == NULL) {
            ld_oom(0);
        }
    }
    if (rc != LD_OK) {
        reply_bare_error(s, id_text, id_text != NULL ? strlen(id_text) : 0,
                         LD_E_BAD_REQUEST, msg);
        free(id_text);
        return NULL;
    }
    struct ld_req *req = req_new(0);
    if (id_text != NULL) {
        req->id_own = id_text;
        req->id = id_text;
        req->id_len = strlen(id_text);
    }
    req->body = body;
    req->op = json_string_value(json_object_get(body, "op"));
    return req;
}

/* About what jansson holds for V, malloc's own words included: a string
 * or a number is a node of some 48 bytes beside its text, an array adds
 * a table that grows by doubling, an object a hash pair per member. A
 * request's text may cost many times its bytes so (an array of one-byte
 * strings some 90 bytes a member), which limits.max_memory_bytes must
 * see while the request waits. */
static size_t
json_cost(json_t *v)
{
    size_t n = 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *m;
        n = 128;
        json_object_foreach(v, k, m)
        {
            n += 64 + strlen(k) + json_cost(m);
        }
        return n;
    }
    case JSON_ARRAY:
        n = 64 + 16 * json_array_size(v);
        for (size_t i = 0; i < json_array_size(v); i++) {
            n += json_cost(json_array_get(v, i));
        }
        return n;
    case JSON_STRING:
        return 48 + 16 + json_string_length(v);
    case JSON_INTEGER:
    case JSON_REAL:
        return 32;
    default:
        return 0; /* true, false and null are shared */
    }
}

/* What REQ holds while it waits for its answer. */
static size_t
req_cost(struct ld_req *req)
{
    size_t n = sizeof(*req) + req->room;
    if (req->id_own != NULL) {
        n += req->id_len + 1;
    }
    return req->body != NULL ? n + json_cost(req->body) : n;
}

void
ld_proto_on_line(struct ld_session *s, const char *line, size_t len)
{
    struct ld_jmember m[REQ_MEMBERS_MAX];
    LD_ASSERT(proto_mod.route != NULL);
    int n = ld_json_flat_scan(line, len, m, REQ_MEMBERS_MAX);
    struct ld_req *req = n >= 0 ? flat_request(s, line, len, m, n)
                                : tree_request(s, line, len);
    if (req == NULL) {
        return;
    }
    req->sess = s;
    req->start_us = ld_now_us();
    req->cost_bytes = req_cost(req);
    ld_stats.requests_bytes += (long long)req->cost_bytes;
    ld_session_req_begin(s);
    proto_mod.route(req);
}

int
ld_reply_ok_hit(struct ld_req *req, const char *v, size_t len)
{
    return ld_reply_ok_hit_ex(req, v, len, NULL);
}

/* Most hit lines fit here: built on the stack, they are copied once into
 * the session's output, with no allocation of their own. */
#define HIT_STACK_LINE 2048

static int reply_hit(struct ld_req *req, const char *v, size_t len,
                     bool quoted, const char *extra);

int
ld_reply_ok_hit_ex(struct ld_req *req, const char *v, size_t len,
                   const char *extra)
{
    return reply_hit(req, v, len, false, extra);
}

int
ld_reply_ok_hit_json(struct ld_req *req, const char *json, size_t len,
                     const char *extra)
{
    return reply_hit(req, json, len, true, extra);
}

/* V is the raw value, or (QUOTED) already its JSON string literal. */
static int
reply_hit(struct ld_req *req, const char *v, size_t len, bool quoted,
          const char *extra)
{
    static const char mid[] = "\"ok\":true,\"hit\":true,\"value\":";
    /* A large value for a client that is not taking its replies (or is
     * gone) is not worth quoting: the line would be dropped. */
    if (req->sess != NULL && !ld_session_output_room(req->sess, len)) {
        req_free(req);
        return LD_OK;
    }
    size_t xlen = extra != NULL ? strlen(extra) : 0;
    size_t cap = 8 + req->id_len + sizeof(mid) +
                 (quoted ? len : ld_json_quote_max(len)) + xlen + 3;
    char stack_line[HIT_STACK_LINE];
    char *line = cap <= sizeof(stack_line) ? stack_line : malloc(cap);
    if (line == NULL) {
        return LD_ERR;
    }
    char *o = line;
    *o++ = '{';
    if (req->id != NULL) {
        memcpy(o, "\"id\":", 5);
        o += 5;
        memcpy(o, req->id, req->id_len);
        o += req->id_len;
        *o++ = ',';
    }
    memcpy(o, mid, sizeof(mid) - 1);
    o += sizeof(mid) - 1;
    size_t q = len;
    if (quoted) {
        memcpy(o, v, len);
    } else if ((q = ld_json_quote(o, v, len)) == 0) {
        if (line != stack_line) {
            free(line);
        }
        return LD_ERR;
    }
    o += q;
    if (xlen > 0) {
        memcpy(o, extra, xlen);
        o += xlen;
    }
    *o++ = '}';
    *o++ = '\n';
    struct line_buf b = {line, (size_t)(o - line), cap, line != stack_line};
    send_buf(req, &b);
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
ld_reply_ok_fd(struct ld_req *req, json_t *fields, int fd)
{
    size_t len = 0;
    char *line = ld_proto_ok_line(req->id, req->id_len, fields, &len);
    if (req->sess != NULL && line != NULL) {
        ld_session_write_fd(req->sess, line, len, fd);
    } else {
        close(fd);
    }
    free(line);
    req_free(req);
}

/* Most ok lines fit here, built without an allocation of their own. */
#define OK_STACK_LINE 512

void
ld_reply_ok(struct ld_req *req, json_t *fields)
{
    char stack_line[OK_STACK_LINE];
    struct line_buf b = {stack_line, 0, sizeof(stack_line), false};
    if (ok_line_by_hand(&b, req->id, req->id_len, fields)) {
        json_decref(fields);
        send_buf(req, &b);
        return;
    }
    line_drop(&b);
    size_t len = 0;
    char *line = ok_line_jansson(req->id, req->id_len, fields, &len);
    send_line(req, line, len);
}

/* FIELDS as a JSON object, for the line jansson writes when the fast one
 * cannot be (a string that is not valid UTF-8 gets its error there). */
static json_t *
fields_object(const struct ld_field *f, size_t n)
{
    json_t *o = json_object();
    for (size_t k = 0; k < n; k++) {
        json_t *v = f[k].type == LD_FIELD_BOOL  ? json_boolean(f[k].i)
                    : f[k].type == LD_FIELD_INT ? json_integer(f[k].i)
                                                : json_string(f[k].s);
        json_object_set_new(o, f[k].name, v != NULL ? v : json_null());
    }
    return o;
}

void
ld_reply_ok_fields(struct ld_req *req, const struct ld_field *f, size_t n)
{
    char stack_line[OK_STACK_LINE];
    struct line_buf b = {stack_line, 0, sizeof(stack_line), false};
    bool ok = ok_line_by_hand(&b, req->id, req->id_len, NULL);
    b.len -= 2; /* reopen the object: drop "}\n" */
    for (size_t k = 0; ok && k < n; k++) {
        size_t nl = strlen(f[k].name);
        char *o = line_room(&b, nl + 4);
        o[0] = ',';
        o[1] = '"';
        memcpy(o + 2, f[k].name, nl);
        o[nl + 2] = '"';
        o[nl + 3] = ':';
        b.len += nl + 4;
        switch (f[k].type) {
        case LD_FIELD_BOOL:
            line_add(&b, f[k].i ? "true" : "false", f[k].i ? 4 : 5);
            break;
        case LD_FIELD_INT:
            b.len += ld_json_format_int(line_room(&b, LD_JSON_INT_MAX),
                                        f[k].i);
            break;
        case LD_FIELD_STR:
            ok = line_add_string(&b, f[k].s, strlen(f[k].s));
            break;
        }
    }
    if (!ok) {
        line_drop(&b);
        ld_reply_ok(req, fields_object(f, n));
        return;
    }
    line_add(&b, "}\n", 2);
    *line_room(&b, 1) = '\0';
    send_buf(req, &b);
}

static void
reply_error_v(struct ld_req *req, int code, json_t *extra, const char *fmt,
              va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    ld_stats_count_error(code);
    size_t len = 0;
    char *line = ld_proto_error_line(req->id, req->id_len, code, extra, msg,
                                     &len);
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

static void
rval_of_json(json_t *v, struct ld_rval *out)
{
    memset(out, 0, sizeof(*out));
    switch (v == NULL ? JSON_NULL : json_typeof(v)) {
    case JSON_STRING:
        out->kind = LD_RV_STR;
        out->s = json_string_value(v);
        out->len = json_string_length(v);
        break;
    case JSON_INTEGER:
        out->kind = LD_RV_INT;
        out->i = json_integer_value(v);
        break;
    case JSON_TRUE:
        out->kind = LD_RV_TRUE;
        break;
    case JSON_FALSE:
        out->kind = LD_RV_FALSE;
        break;
    case JSON_NULL:
        out->kind = v == NULL ? LD_RV_ABSENT : LD_RV_NULL;
        break;
    default:
        out->kind = LD_RV_OTHER;
        out->j = v;
        break;
    }
}

void
ld_req_get(const struct ld_req *req, const char *field, struct ld_rval *v)
{
    if (!req->flat) {
        rval_of_json(json_object_get(req->body, field), v);
        return;
    }
    static const enum ld_rkind kinds[] = {
        [LD_JK_STR] = LD_RV_STR,   [LD_JK_INT] = LD_RV_INT,
        [LD_JK_TRUE] = LD_RV_TRUE, [LD_JK_FALSE] = LD_RV_FALSE,
        [LD_JK_NULL] = LD_RV_NULL,
    };
    memset(v, 0, sizeof(*v));
    const struct ld_jmember *m = ld_json_member(req->text, req->m, req->nm,
                                                field, strlen(field));
    if (m == NULL) {
        v->kind = LD_RV_ABSENT;
        return;
    }
    v->kind = kinds[m->kind];
    v->s = req->text + m->s;
    v->len = m->len;
    v->i = m->i;
}

bool
ld_req_has(const struct ld_req *req, const char *field)
{
    struct ld_rval v;
    ld_req_get(req, field, &v);
    return v.kind != LD_RV_ABSENT;
}

size_t
ld_req_nfields(const struct ld_req *req)
{
    return req->flat ? (size_t)req->nm : json_object_size(req->body);
}

json_t *
ld_req_body(struct ld_req *req)
{
    if (req->body == NULL && req->flat) {
        req->body = ld_json_flat_tree(req->text, req->m, req->nm);
    }
    return req->body;
}

/* The start of every typed read of FIELD into V: a field that is absent
 * (or null) answers REQ with an error when REQUIRED, else the caller
 * finds V not given. *PRESENT, when asked for, stays false until the
 * caller has taken the value. */
static int
req_field(struct ld_req *req, const char *field, bool required,
          struct ld_rval *v, bool *present)
{
    ld_req_get(req, field, v);
    if (present != NULL) {
        *present = false;
    }
    if (required && !ld_rval_given(v)) {
        return bad_field(req, field, "is required");
    }
    return LD_OK;
}

/* Keys, names and tokens, not values (those are read apart, with their
 * length): NUL would cut them short wherever they are used as C strings.
 * (A flat request's strings have no escapes, so no NUL.) */
static int
req_no_nul(struct ld_req *req, const char *field, const struct ld_rval *v)
{
    if (!req->flat && memchr(v->s, '\0', v->len) != NULL) {
        return bad_field(req, field, "must not contain NUL (\\u0000)");
    }
    return LD_OK;
}

int
ld_req_key(struct ld_req *req, const char *field, const char **key,
           size_t *len)
{
    struct ld_rval v;
    if (req_field(req, field, true, &v, NULL) != LD_OK) {
        return LD_ERR;
    }
    if (v.kind != LD_RV_STR) {
        return bad_field(req, field, "must be a string");
    }
    if (v.len == 0) {
        return bad_field(req, field, "must not be empty");
    }
    if ((long long)v.len > proto_mod.ctx->cfg->limits.max_key_bytes) {
        char what[96];
        snprintf(what, sizeof(what), "is longer than %lld bytes",
                 proto_mod.ctx->cfg->limits.max_key_bytes);
        return bad_field(req, field, what);
    }
    if (req_no_nul(req, field, &v) != LD_OK) {
        return LD_ERR;
    }
    *key = v.s;
    *len = v.len;
    return LD_OK;
}

int
ld_req_str(struct ld_req *req, const char *field, bool required,
           const char **s, size_t *len, bool *present)
{
    struct ld_rval v;
    if (req_field(req, field, required, &v, present) != LD_OK) {
        return LD_ERR;
    }
    if (!ld_rval_given(&v)) {
        return LD_OK;
    }
    if (v.kind != LD_RV_STR) {
        return bad_field(req, field, "must be a string");
    }
    if (req_no_nul(req, field, &v) != LD_OK) {
        return LD_ERR;
    }
    *s = v.s;
    if (len != NULL) {
        *len = v.len;
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
    struct ld_rval v;
    if (req_field(req, field, required, &v, present) != LD_OK) {
        return LD_ERR;
    }
    if (!ld_rval_given(&v)) {
        return LD_OK;
    }
    if (v.kind != LD_RV_INT) {
        return bad_field(req, field, "must be an integer");
    }
    if (v.i < min || v.i > max) {
        char what[96];
        snprintf(what, sizeof(what), "must be between %lld and %lld", min,
                 max);
        return bad_field(req, field, what);
    }
    *out = v.i;
    if (present != NULL) {
        *present = true;
    }
    return LD_OK;
}

int
ld_req_bool(struct ld_req *req, const char *field, bool *out)
{
    struct ld_rval v;
    if (req_field(req, field, false, &v, NULL) != LD_OK) {
        return LD_ERR;
    }
    if (!ld_rval_given(&v)) {
        return LD_OK;
    }
    if (v.kind != LD_RV_TRUE && v.kind != LD_RV_FALSE) {
        return bad_field(req, field, "must be true or false");
    }
    *out = v.kind == LD_RV_TRUE;
    return LD_OK;
}

int
ld_req_keys(struct ld_req *req, const char *field, size_t max, json_t **arr)
{
    struct ld_rval rv;
    if (req_field(req, field, true, &rv, NULL) != LD_OK) {
        return LD_ERR;
    }
    json_t *v = rv.j;
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
