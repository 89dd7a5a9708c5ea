/*
 * Answering the getters of cache.get and cache.mget: a cache.get is
 * answered as soon as its one getter settles; a cache.mget keeps each
 * distinct key's result as a serialised chunk and builds its reply once
 * the last one is in, sized first against the output limit.
 *
 * It owns the reply texts and the limits on them; it must not start a fetch
 * or send anything to Redis.
 */
#include "ld_cache_int.h"

#include "ld_cache_hot.h"
#include "ld_json.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* Result texts shorter than this are copied into the reply; longer ones
 * are added by reference, so a value named many times is never copied. */
#define REF_MIN_BYTES 512

/* ---- per-session bookkeeping ----------------------------------------- */

static struct csess *
csess_of(struct ld_session *s)
{
    if (s->cache_state == NULL) {
        struct csess *cs = ld_xcalloc(1, sizeof(*cs));
        LIST_INIT(&cs->ops);
        s->cache_state = cs;
    }
    return s->cache_state;
}

void
cache_cop_link(struct cop *op)
{
    struct csess *cs = csess_of(op->req->sess);
    LD_ASSERT(op->cs == NULL);
    op->cs = cs;
    LIST_INSERT_HEAD(&cs->ops, op, link);
}

void
cache_cop_unlink(struct cop *op)
{
    /* Both the answer and the session's close may unlink first. */
    if (op->cs == NULL) {
        return;
    }
    LIST_REMOVE(op, link);
    op->cs = NULL;
}

static void
chunk_unref(struct chunk *c)
{
    LD_ASSERT(c == NULL || c->refs > 0);
    if (c != NULL && --c->refs == 0) {
        free(c);
    }
}

static void
chunk_cleanup_cb(const void *data, size_t len, void *arg)
{
    LD_UNUSED(data);
    LD_UNUSED(len);
    chunk_unref(arg);
}

static struct chunk *
chunk_new(size_t cap)
{
    struct chunk *c = malloc(sizeof(*c) + cap);
    if (c != NULL) {
        c->refs = 1;
        c->len = 0;
    }
    return c;
}

void
cache_cop_free(struct cop *op)
{
    if (op->texts != NULL) {
        for (size_t i = 0; i < op->n; i++) {
            chunk_unref(op->texts[i]);
        }
    }
    if (op->dup_texts != NULL) {
        for (size_t i = 0; i < op->n; i++) {
            chunk_unref(op->dup_texts[i]);
        }
    }
    free(op->dup_texts);
    free(op->texts);
    free(op->leased);
    free(op->dup_of);
    if (op->g != &op->g1) {
        free(op->g);
    }
    free(op);
}

/* ---- answering getters ----------------------------------------------- */

static bool
jtrue_field(const json_t *o, const char *k)
{
    return json_is_true(json_object_get(o, k));
}

/* Every answered read counts for the hot keys (a near hit, which has no
 * ckey, is counted where it is found). */
static void
note_read(const struct getter *g, bool hit)
{
    if (ld_cache_hot_enabled() && g->ck != NULL) {
        ld_cache_hot_note(g->ck->key, g->ck->key_len, hit, ld_now_ms());
    }
}

json_t *
cache_result_error(int code, json_t *extra, const char *msg)
{
    json_t *err = json_pack("{s:s,s:s}", "code", ld_errcode_name(code),
                            "message", msg);
    if (extra != NULL) {
        json_object_update(err, extra);
        json_decref(extra);
    }
    return json_pack("{s:b,s:o}", "ok", 0, "error", err);
}

/* "," and OBJ (stolen) serialised: a slot's result text. */
struct chunk *
cache_chunk_of_json(json_t *obj)
{
    char *s = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (s == NULL) {
        return NULL;
    }
    size_t n = strlen(s);
    struct chunk *c = chunk_new(n + 1);
    if (c != NULL) {
        c->data[0] = ',';
        memcpy(c->data + 1, s, n);
        c->len = n + 1;
    }
    free(s);
    return c;
}

/* ",{"ok":true,"hit":true,"value":"V"}", escaped once whatever the number
 * of slots naming the key (or V already its JSON text: QUOTED); NULL when
 * V is not valid UTF-8 (or no memory). */
static struct chunk *
chunk_of_hit(const char *v, size_t len, bool quoted, const char *extra)
{
    static const char head[] = ",{\"ok\":true,\"hit\":true,\"value\":";
    size_t xlen = extra != NULL ? strlen(extra) : 0;
    struct chunk *c = chunk_new(
        sizeof(head) + (quoted ? len : ld_json_quote_max(len)) + xlen + 1);
    if (c == NULL) {
        return NULL;
    }
    memcpy(c->data, head, sizeof(head) - 1);
    size_t q = len;
    if (quoted) {
        memcpy(c->data + sizeof(head) - 1, v, len);
    } else if ((q = ld_json_quote(c->data + sizeof(head) - 1, v, len)) == 0) {
        free(c);
        return NULL;
    }
    c->len = sizeof(head) - 1 + q;
    if (xlen > 0) {
        memcpy(c->data + c->len, extra, xlen);
        c->len += xlen;
    }
    c->data[c->len++] = '}';
    return c;
}

static void
add_text(struct evbuffer *buf, struct chunk *c, bool first)
{
    const char *p = c->data + (first ? 1 : 0);
    size_t len = c->len - (first ? 1 : 0);
    if (len < REF_MIN_BYTES) {
        evbuffer_add(buf, p, len);
        return;
    }
    c->refs++;
    if (evbuffer_add_reference(buf, p, len, chunk_cleanup_cb, c) != 0) {
        c->refs--;
        evbuffer_add(buf, p, len);
    }
}

/* The same key again gets the same answer, but a lease belongs to one
 * caller only, and the first occurrence has it: the others get the hit
 * without it (stale, early refresh), or a miss without a lease. (A
 * duplicate is never the first element, so its text keeps its comma.) */
static const char dup_miss[] = ",{\"ok\":true,\"hit\":false,\"lease\":null}";

/* The size of OP's reply in TOTAL; false when a slot has no text (it
 * could not be built). Sized first: a reply over the output limit is
 * never built. */
static bool
mget_reply_bytes(const struct cop *op, size_t *total)
{
    *total = 32 + op->req->id_len;
    for (size_t i = 0; i < op->n; i++) {
        size_t j = op->dup_of[i] != SIZE_MAX ? op->dup_of[i] : i;
        const struct chunk *c = op->texts[j];
        if (c == NULL) {
            return false;
        }
        const struct chunk *d = op->dup_texts != NULL ? op->dup_texts[j]
                                                      : NULL;
        *total += j == i || !op->leased[j] ? c->len
                  : d != NULL              ? d->len
                                           : sizeof(dup_miss) - 1;
    }
    return true;
}

/* Whether a reply of TOTAL bytes may go out on REQ's session. When it
 * may not, REQ is answered with the error; MGET_TOO_BIG: and the session
 * is to end. */
enum mget_room { MGET_FITS, MGET_NO_ROOM, MGET_TOO_BIG };

static enum mget_room
mget_room(struct ld_req *req, size_t n, size_t total)
{
    struct ld_session *s = req->sess;
    if (s != NULL && total > ld_session_output_limit()) {
        /* This reply alone passes limits.max_output_bytes (it could be
         * 1000 times a large value): it is never built; the client is
         * told why, and the session ends as the contract says. */
        log_warn("session closed: one reply over the output limit "
                 "session=%s op=cache.mget keys=%zu reply_bytes=%zu "
                 "limit=%zu",
                 s->name, n, total, ld_session_output_limit());
        ld_reply_error(req, LD_E_BUSY,
                       "the reply would take %zu bytes, over the output "
                       "limit (limits.max_output_bytes); the session is "
                       "closed",
                       total);
        return MGET_TOO_BIG;
    }
    if (s != NULL && !ld_session_output_room(s, total)) {
        /* With what the client has not taken yet it would pass the
         * limit: the session is closing and its output is dropped. */
        ld_reply_error(req, LD_E_BUSY, "over the output limit");
        return MGET_NO_ROOM;
    }
    return MGET_FITS;
}

/* OP's reply into BUF: the texts of its slots, in the request's order. */
static void
mget_write(const struct cop *op, struct evbuffer *buf)
{
    const struct ld_req *req = op->req;
    if (req->id != NULL) {
        evbuffer_add(buf, "{\"id\":", 6);
        evbuffer_add(buf, req->id, req->id_len);
        evbuffer_add(buf, ",", 1);
    } else {
        evbuffer_add(buf, "{", 1);
    }
    static const char results[] = "\"ok\":true,\"results\":[";
    evbuffer_add(buf, results, sizeof(results) - 1);
    for (size_t i = 0; i < op->n; i++) {
        size_t j = op->dup_of[i] != SIZE_MAX ? op->dup_of[i] : i;
        struct chunk *d = op->dup_texts != NULL ? op->dup_texts[j] : NULL;
        if (j != i && op->leased[j] && d != NULL) {
            add_text(buf, d, false);
        } else if (j != i && op->leased[j]) {
            evbuffer_add(buf, dup_miss, sizeof(dup_miss) - 1);
        } else {
            add_text(buf, op->texts[j], i == 0);
        }
    }
    evbuffer_add(buf, "]}\n", 3);
}

void
cache_mget_finish(struct cop *op)
{
    cache_cop_unlink(op);
    struct ld_req *req = op->req;
    size_t total;
    if (!mget_reply_bytes(op, &total)) {
        ld_reply_error(req, LD_E_INTERNAL, "out of memory");
        cache_cop_free(op);
        return;
    }
    struct ld_session *s = req->sess;
    enum mget_room room = mget_room(req, op->n, total);
    if (room != MGET_FITS) {
        cache_cop_free(op);
        if (room == MGET_TOO_BIG) {
            ld_session_close(s, "reply over limits.max_output_bytes");
        }
        return;
    }
    struct evbuffer *buf = evbuffer_new();
    if (buf == NULL) {
        ld_oom_in("evbuffer_new");
    }
    mget_write(op, buf);
    ld_reply_buffer(req, buf);
    evbuffer_free(buf);
    cache_cop_free(op);
}

/* G is answered or gone: its place among the waiters is free. */
void
cache_getter_done(struct getter *g)
{
    LD_ASSERTF(g->on == NULL, "answered getter of slot %zu still queued",
               g->slot);
    g->state = G_DONE;
    if (g->holds_place) {
        LD_ASSERT(cache_mod.n_waiters > 0);
        g->holds_place = false;
        cache_mod.n_waiters--;
    }
}

/* Answer one getter: FIELDS (stolen) on success, else CODE and MSG. */
void
cache_getter_settle(struct getter *g, json_t *fields, int code,
                    const char *msg)
{
    struct cop *op = g->op;
    LD_ASSERT(g->state == G_IDLE);
    cache_getter_done(g);
    if (!op->mget) {
        cache_cop_unlink(op);
        if (fields != NULL) {
            ld_reply_ok(op->req, fields);
        } else {
            ld_reply_error(op->req, code, "%s", msg);
        }
        cache_cop_free(op);
        return;
    }
    if (fields != NULL) {
        /* Each result reads like a cache.get reply, "ok" first. */
        json_t *res = json_pack("{s:b}", "ok", 1);
        json_t *lease = json_object_get(fields, "lease");
        op->leased[g->slot] = (lease != NULL && json_is_string(lease)) ||
                              json_object_get(fields, "refresh") != NULL;
        json_object_update(res, fields);
        json_decref(fields);
        if (op->leased[g->slot] && jtrue_field(res, "hit")) {
            if (op->dup_texts == NULL) {
                op->dup_texts = ld_xcalloc(op->n, sizeof(*op->dup_texts));
            }
            json_t *plain = json_deep_copy(res);
            json_object_del(plain, "lease");
            json_object_del(plain, "refresh");
            op->dup_texts[g->slot] = cache_chunk_of_json(plain);
        }
        op->texts[g->slot] = cache_chunk_of_json(res);
    } else {
        op->texts[g->slot] = cache_chunk_of_json(
            cache_result_error(code, NULL, msg));
    }
    if (--op->left == 0) {
        cache_mget_finish(op);
    }
}

/* Settles G with F, the answer built for a hit on a cached value: NULL
 * when the value is not valid UTF-8, which JSON cannot carry, and then
 * the client hears that leased did not write it. */
static void
settle_value(struct getter *g, json_t *f)
{
    if (f == NULL) {
        cache_getter_settle(g, NULL, LD_E_WRONG_TYPE,
                            "the cached value is not valid UTF-8; leased "
                            "did not write it");
        return;
    }
    ld_stats.cache_hits++;
    cache_getter_settle(g, f, 0, NULL);
}

/* A near hit answers like a Redis hit, plus "near":true. */
#define NEAR_EXTRA ",\"near\":true"

/* The members a hit carries after its value: ",\"version\":N", then
 * TAIL (NULL: nothing). BUF has VERSION_EXTRA_MAX bytes. */
#define VERSION_EXTRA_MAX 64
static const char *
version_extra(char *buf, uint64_t version, const char *tail)
{
    static const char head[] = ",\"version\":";
    /* By hand, not snprintf: it is on every hit's path. */
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + version % 10);
        version /= 10;
    } while (version > 0);
    char *o = buf;
    memcpy(o, head, sizeof(head) - 1);
    o += sizeof(head) - 1;
    while (n > 0) {
        *o++ = digits[--n];
    }
    size_t tlen = tail != NULL ? strlen(tail) : 0;
    LD_ASSERT((size_t)(o - buf) + tlen < VERSION_EXTRA_MAX);
    memcpy(o, tail != NULL ? tail : "", tlen);
    o[tlen] = '\0';
    return buf;
}

void
cache_settle_hit(struct getter *g, const char *v, size_t len, uint64_t version)
{
    struct cop *op = g->op;
    char extra[VERSION_EXTRA_MAX];
    version_extra(extra, version, NULL);
    note_read(g, true);
    if (!op->mget) {
        /* The common case, built straight into the reply line: a JSON
         * tree would check and escape a large value byte by byte. */
        struct ld_req *req = op->req;
        op->req = NULL;
        if (ld_reply_ok_hit_ex(req, v, len, extra) == LD_OK) {
            ld_stats.cache_hits++;
            cache_getter_done(g);
            cache_cop_unlink(op);
            cache_cop_free(op);
            return;
        }
        op->req = req; /* not UTF-8: answered below */
    } else {
        /* Escaped once here; the reply refers to it for every slot
         * naming this key. */
        struct chunk *c = chunk_of_hit(v, len, false, extra);
        if (c != NULL) {
            ld_stats.cache_hits++;
            op->texts[g->slot] = c;
            cache_getter_done(g);
            if (--op->left == 0) {
                cache_mget_finish(op);
            }
            return;
        }
    }
    json_t *f = json_pack("{s:b,s:s%,s:I}", "hit", 1, "value", v, len,
                          "version", (json_int_t)version);
    settle_value(g, f);
}

/* Near hits come as JSON text (ld_near_get): copied, never escaped
 * again. cache.get answers them at once, without a getter; a getter's is
 * a slot of cache.mget. */
void
cache_settle_near_hit(struct getter *g, const char *json, size_t len,
                      uint64_t version)
{
    struct cop *op = g->op;
    LD_ASSERT(op->mget);
    char extra[VERSION_EXTRA_MAX];
    struct chunk *c = chunk_of_hit(json, len, true,
                                   version_extra(extra, version, NEAR_EXTRA));
    if (c == NULL) {
        cache_getter_settle(g, NULL, LD_E_INTERNAL, "out of memory");
        return;
    }
    ld_stats.cache_hits++;
    op->texts[g->slot] = c;
    cache_getter_done(g);
    if (--op->left == 0) {
        cache_mget_finish(op);
    }
}

void
cache_reply_near_hit(struct ld_req *req, const char *json, size_t len,
                     uint64_t version)
{
    char extra[VERSION_EXTRA_MAX];
    if (ld_reply_ok_hit_json(req, json, len,
                             version_extra(extra, version, NEAR_EXTRA)) !=
        LD_OK) {
        ld_reply_error(req, LD_E_INTERNAL, "out of memory");
        return;
    }
    ld_stats.cache_hits++;
}

void
cache_settle_null(struct getter *g, uint64_t version)
{
    note_read(g, true);
    ld_stats.cache_negative_hits++;
    cache_getter_settle(g,
                        json_pack("{s:b,s:n,s:I}", "hit", 1, "value",
                                  "version", (json_int_t)version),
                        0, NULL);
}

void
cache_settle_miss(struct getter *g, const char *lease)
{
    note_read(g, false);
    ld_stats.cache_misses++;
    json_t *f = lease != NULL
                    ? json_pack("{s:b,s:s}", "hit", 0, "lease", lease)
                    : json_pack("{s:b,s:n}", "hit", 0, "lease");
    cache_getter_settle(g, f, 0, NULL);
}

/* A stale value (stale-while-revalidate), with the lease to reload it
 * when LEASE is not NULL. */
void
cache_settle_stale(struct getter *g, const char *v, size_t len,
                   const char *lease, uint64_t version)
{
    note_read(g, true);
    json_t *f = json_pack("{s:b,s:s%,s:I,s:b}", "hit", 1, "value", v, len,
                          "version", (json_int_t)version, "stale", 1);
    if (f != NULL) {
        if (lease != NULL) {
            json_object_set_new(f, "lease", json_string(lease));
        }
        ld_stats.cache_stale_hits++;
    }
    settle_value(g, f);
}

/* A hit that also carries the lease to reload the value early. */
void
cache_settle_refresh(struct getter *g, const char *v, size_t len,
                     const char *lease, uint64_t version)
{
    note_read(g, true);
    json_t *f = json_pack("{s:b,s:s%,s:I,s:s}", "hit", 1, "value", v, len,
                          "version", (json_int_t)version, "refresh", lease);
    settle_value(g, f);
}
