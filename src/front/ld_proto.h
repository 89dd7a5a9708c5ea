#ifndef LD_PROTO_H
#define LD_PROTO_H

#include "ld_common.h"
#include "ld_errcode.h"

#include <jansson.h>
#include <sys/queue.h>

struct ld_ctx;
struct ld_session;
struct ld_req;

/* Where a parsed request goes (dispatch, given at init from above). */
typedef void ld_proto_route(struct ld_req *req);
int ld_proto_init(const struct ld_ctx *ctx, ld_proto_route *route);
void ld_proto_free(void);

/* One request in flight. The handler that receives it must, exactly once
 * and possibly much later, answer it with ld_reply_ok or ld_reply_error*,
 * which free it. The request keeps its session alive (not open) until
 * then; when the session has closed meanwhile the answer is dropped.
 *
 * Most requests are flat objects of plain strings and integers: those
 * are kept as the scanner's members over a copy of the line, and read
 * with the ld_req_* accessors, with no JSON tree; a tree is built only
 * when a handler asks for one (ld_req_body). The rest are parsed by
 * jansson into BODY at once. */
struct ld_jmember;
struct ld_req {
    struct ld_session *sess;
    /* The request's id as JSON text, written back as it is into the
     * answer (jansson's compact form of it); NULL when it had none. */
    const char *id;
    size_t id_len;
    char *id_own;   /* ID's storage when allocated apart */
    json_t *body;   /* the whole request object; see ld_req_body */
    const char *op; /* NUL-terminated, points into the request */
    uint64_t start_us;
    /* Set while the request waits and a cancel op may end its wait
     * (ld_cancel.h); answering the request takes it off the list. */
    bool (*cancel_fn)(void *arg);
    void *cancel_arg;
    LIST_ENTRY(ld_req) cancel_link; /* its session's cancellable list */
    /* A flat request: NM members over TEXT (the line's copy, each string
     * NUL-terminated in place), stored after the record. */
    const struct ld_jmember *m;
    const char *text;
    int nm;
    bool flat;
    size_t room; /* bytes allocated after the record */
    /* What it holds (record, text or JSON tree), in requests_bytes. */
    size_t cost_bytes;
};

/* A field of a request as read: absent, or its JSON kind and value. A
 * string's bytes are NUL-terminated (and may hold NUL, from \u0000). */
enum ld_rkind {
    LD_RV_ABSENT,
    LD_RV_NULL,
    LD_RV_STR,
    LD_RV_INT,
    LD_RV_TRUE,
    LD_RV_FALSE,
    LD_RV_OTHER /* a real, an array or an object: J */
};
struct ld_rval {
    enum ld_rkind kind;
    const char *s;
    size_t len;
    long long i;
    json_t *j; /* LD_RV_OTHER only */
};
void ld_req_get(const struct ld_req *req, const char *field,
                struct ld_rval *v);
/* Whether V carries a value: absent and JSON null both leave an optional
 * field at its default. */
static inline bool
ld_rval_given(const struct ld_rval *v)
{
    return v->kind != LD_RV_ABSENT && v->kind != LD_RV_NULL;
}
/* Is FIELD in the request (JSON null included)? */
bool ld_req_has(const struct ld_req *req, const char *field);
/* The number of distinct fields of the request. */
size_t ld_req_nfields(const struct ld_req *req);
/* The request as a JSON tree, built on first use for a flat request and
 * freed with it; NULL only without memory. */
json_t *ld_req_body(struct ld_req *req);

/* Parse one line. On success returns LD_OK and a new request object in
 * *OUT. On failure (always a bad_request) returns LD_ERR and writes a
 * message that names the field; *ID_OUT gets the id when one could be read, so the
 * error can still carry it. */
int ld_proto_parse(const char *line, size_t len, json_t **out, json_t **id_out,
                   char *msg, size_t msglen);

/* The session's line handler: parse LINE, make it a request and route
 * it; a line that is no request is answered bad_request here. */
void ld_proto_on_line(struct ld_session *s, const char *line, size_t len);
/* The session's error-line builder: the error form without an id. */
char *ld_proto_bare_error_line(int code, const char *message, size_t *len);

/* Build {"id":ID,"ok":true,...FIELDS} (FIELDS stolen, may be NULL) or the
 * error form, serialised with a trailing newline (caller frees). ID is
 * the id's JSON text (ID_LEN bytes), NULL for none. */
char *ld_proto_ok_line(const char *id, size_t id_len, json_t *fields,
                       size_t *len);
char *ld_proto_error_line(const char *id, size_t id_len, int code,
                          json_t *extra, const char *message, size_t *len);

/* Answers. FIELDS is stolen. EXTRA (stolen, may be NULL) is merged into the
 * error object, e.g. {"reason":"other"} for not_held. */
void ld_reply_ok(struct ld_req *req, json_t *fields);

/* The same for the hottest replies, whose fields are known at compile
 * time: written straight into the line, no JSON tree. NAME must need no
 * escaping (a C literal of plain ASCII). */
enum ld_field_type { LD_FIELD_BOOL, LD_FIELD_INT, LD_FIELD_STR };
struct ld_field {
    const char *name;
    enum ld_field_type type;
    long long i; /* bool or integer */
    const char *s;
};
#define LD_BOOL(n, v)                                                         \
    {                                                                         \
        (n), LD_FIELD_BOOL, (v) ? 1 : 0, NULL                                 \
    }
#define LD_INT(n, v)                                                          \
    {                                                                         \
        (n), LD_FIELD_INT, (long long)(v), NULL                               \
    }
#define LD_STR(n, v)                                                          \
    {                                                                         \
        (n), LD_FIELD_STR, 0, (v)                                             \
    }
void ld_reply_ok_fields(struct ld_req *req, const struct ld_field *f,
                        size_t n);
void ld_reply_error(struct ld_req *req, int code, const char *fmt, ...)
    LD_PRINTF(3, 4);
void ld_reply_error_extra(struct ld_req *req, int code, json_t *extra,
                          const char *fmt, ...) LD_PRINTF(4, 5);

/* {"id":..,"ok":true,"hit":true,"value":"V"}: the cache hit, built without
 * a JSON tree. Returns LD_ERR, leaving REQ unanswered, when V is not valid
 * UTF-8. */
int ld_reply_ok_hit(struct ld_req *req, const char *v, size_t len);
/* The same with EXTRA (",\"near\":true": members, each with its leading
 * comma) after the value; NULL for none. */
int ld_reply_ok_hit_ex(struct ld_req *req, const char *v, size_t len,
                       const char *extra);
/* The same with the value given as its JSON string literal JSON (LEN
 * bytes, quotes included), copied as it is; LD_ERR only without memory. */
int ld_reply_ok_hit_json(struct ld_req *req, const char *json, size_t len,
                         const char *extra);

/* Answer REQ with the line in BUF (built by the caller, trailing newline
 * included); BUF's content moves to the session without a copy. */
struct evbuffer;
void ld_reply_buffer(struct ld_req *req, struct evbuffer *buf);

/* Answer REQ with an ok line that carries the descriptor FD (handed over)
 * on its first byte: see ld_session_write_fd. */
void ld_reply_ok_fd(struct ld_req *req, json_t *fields, int fd);

/* Is the session that sent REQ still connected? */
bool ld_req_session_open(const struct ld_req *req);

/* Field access. Each returns LD_OK, or replies bad_request naming the field
 * (which consumes REQ) and returns LD_ERR: the handler must then return
 * without touching REQ. An optional field that is absent or JSON null
 * leaves the output at the caller's default and sets *PRESENT false. */
int ld_req_key(struct ld_req *req, const char *field, const char **key,
               size_t *len);
int ld_req_str(struct ld_req *req, const char *field, bool required,
               const char **s, size_t *len, bool *present);
int ld_req_int(struct ld_req *req, const char *field, bool required,
               long long min, long long max, long long *out, bool *present);
int ld_req_bool(struct ld_req *req, const char *field, bool *out);

/* The ranges of the numeric fields, one per kind of field and the same in
 * every op (leased-protocol(7) lists them). Nothing downstream may
 * overflow at the maximum: timers take microseconds in 64 bits, and a
 * number that reaches Lua is a double that Redis turns back into text
 * with 14 significant digits, so it must stay below 10^14 (2^40 is 13
 * digits, and ttl_jitter adds at most half of it). */
#define LD_TTL_MS_MAX (1LL << 40)  /* ttl_ms: lock, extend, cache.* */
#define LD_WAIT_MS_MAX (1LL << 31) /* wait_ms: lock (-1 = no limit), */
                                   /* cache.get, cache.mget */
#define LD_DELAY_MS_MAX 86400000LL /* cache.invalidate delay_ms */
/* An array of keys (each checked like ld_req_key), at most MAX entries.
 * *ARR borrows the array from the request. */
int ld_req_keys(struct ld_req *req, const char *field, size_t max,
                json_t **arr);

/* Check a key taken from an array element; same rules as ld_req_key. */
bool ld_key_valid(const char *key, size_t len);

#endif
