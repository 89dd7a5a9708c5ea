/*
 * The bounds of hiredis' reader (ld_reader.h). hiredis 0.14 has no limits
 * of its own, but it builds every value through a table of functions: the
 * table here checks each value against the bounds before the default one
 * builds it, and a refusal (NULL) makes the reader fail.
 *
 * It owns the bounds only; the reader and its replies are hiredis'.
 */
#include "ld_reader.h"

#include "ld_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

/* hiredis' own functions, behind the table every reader of the daemon
 * uses. */
static struct {
    redisReplyObjectFunctions *base_fns;
} reader_mod;

/* What one value costs beyond its bytes: the reply struct and its
 * place in the parent's array. */
#define VALUE_COST (sizeof(redisReply) + sizeof(redisReply *))

/* The values themselves, built as hiredis builds them (freeReplyObject
 * frees them) but with malloc: hiredis 0.14 takes every reply struct
 * from calloc, which glibc serves without its per-thread cache, at some
 * 200 instructions a value, several values a reply. NULL when out of
 * memory, as hiredis' own. */
static redisReply *
new_value(const redisReadTask *t, int type)
{
    redisReply *r = malloc(sizeof(*r));
    if (r == NULL) {
        return NULL;
    }
    memset(r, 0, sizeof(*r));
    r->type = type;
    if (t->parent != NULL) {
        /* The parent counts the elements it has so far (see make_array):
         * hiredis builds them in order. */
        redisReply *parent = t->parent->obj;
        parent->element[t->idx] = r;
        parent->elements = (size_t)t->idx + 1;
    }
    return r;
}

static void *
make_string(const redisReadTask *t, char *s, size_t len)
{
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        return NULL;
    }
    redisReply *r = new_value(t, t->type);
    if (r == NULL) {
        free(buf);
        return NULL;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    r->str = buf;
    r->len = len;
    return r;
}

static void *
make_array(const redisReadTask *t, int n)
{
    redisReply **elements = NULL;
    if (n > 0) {
        /* Not cleared: ELEMENTS counts those built so far (new_value),
         * which is all a reply cut short has to free, and N once the
         * reply is complete. */
        elements = malloc((size_t)n * sizeof(*elements));
        if (elements == NULL) {
            return NULL;
        }
    }
    redisReply *r = new_value(t, REDIS_REPLY_ARRAY);
    if (r == NULL) {
        free(elements);
        return NULL;
    }
    r->element = elements;
    return r;
}

static void *
make_integer(const redisReadTask *t, long long v)
{
    redisReply *r = new_value(t, REDIS_REPLY_INTEGER);
    if (r != NULL) {
        r->integer = v;
    }
    return r;
}

static void *
make_nil(const redisReadTask *t)
{
    return new_value(t, REDIS_REPLY_NIL);
}

static bool
charge(const redisReadTask *t, size_t bytes)
{
    struct ld_reader_bounds *b = t->privdata;
    if (t->parent == NULL) {
        b->used = 0; /* a new reply begins */
    }
    /* BYTES is at most a bound, far from overflowing. */
    if (bytes + VALUE_COST > b->max_reply - b->used) {
        snprintf(b->why, sizeof(b->why), "reply over %zu bytes", b->max_reply);
        return false;
    }
    b->used += bytes + VALUE_COST;
    return true;
}

static void *
bounded_string(const redisReadTask *t, char *s, size_t len)
{
    struct ld_reader_bounds *b = t->privdata;
    if (len > b->max_bulk) {
        snprintf(b->why, sizeof(b->why), "string of %zu bytes, over %zu", len,
                 b->max_bulk);
        return NULL;
    }
    return charge(t, len) ? make_string(t, s, len) : NULL;
}

static void *
bounded_array(const redisReadTask *t, int n)
{
    struct ld_reader_bounds *b = t->privdata;
    if (n > b->max_elements) {
        snprintf(b->why, sizeof(b->why), "array of %d elements, over %lld", n,
                 b->max_elements);
        return NULL;
    }
    size_t bytes = n > 0 ? (size_t)n * sizeof(redisReply *) : 0;
    return charge(t, bytes) ? make_array(t, n) : NULL;
}

static void *
bounded_integer(const redisReadTask *t, long long v)
{
    return charge(t, 0) ? make_integer(t, v) : NULL;
}

static void *
bounded_nil(const redisReadTask *t)
{
    return charge(t, 0) ? make_nil(t) : NULL;
}

static void
bounded_free(void *obj)
{
    reader_mod.base_fns->freeObject(obj);
}

static redisReplyObjectFunctions bounded_fns = {
    bounded_string, bounded_array, bounded_integer, bounded_nil, bounded_free,
};

/* An array of the daemon's never holds more than this: the largest are
 * the replies of cache.mget, one element per key of a request. */
#define MAX_ELEMENTS (1LL << 20)

void
ld_reader_bounds_init(struct ld_reader_bounds *b, size_t max_value)
{
    memset(b, 0, sizeof(*b));
    b->max_bulk = max_value;
    b->max_elements = MAX_ELEMENTS;
    b->max_reply = max_value * 2 + (size_t)MAX_ELEMENTS * VALUE_COST;
}

/* The buffer a reader keeps between reads (see ld_reader_new). */
#define READER_KEEP_BYTES (256 * 1024)

redisReader *
ld_reader_new(struct ld_reader_bounds *b)
{
    redisReader *r = redisReaderCreate();
    if (r == NULL) {
        ld_oom_in("redisReaderCreate");
    }
    if (reader_mod.base_fns == NULL) {
        reader_mod.base_fns = r->fn;
    }
    r->fn = &bounded_fns;
    r->privdata = b;
    /* hiredis frees an empty buffer with more than maxbuf spare (16 KB by
     * default) and grows a new one on the next read: under large replies
     * that was an allocation, a page fault and a trim of the heap per
     * read. A connection keeps up to READER_KEEP_BYTES instead. */
    r->maxbuf = READER_KEEP_BYTES;
    b->used = 0;
    b->why[0] = '\0';
    return r;
}

bool
ld_reader_within(redisReader *r, struct ld_reader_bounds *b)
{
    /* What is buffered and not parsed belongs to one reply (the reader
     * parses everything complete first): a string of it, its header
     * included, cannot be longer than the bound. */
    size_t buffered = r->len - r->pos;
    if (buffered > b->max_bulk + 64) {
        snprintf(b->why, sizeof(b->why),
                 "%zu bytes of one reply buffered, over %zu", buffered,
                 b->max_bulk);
        return false;
    }
    return true;
}
