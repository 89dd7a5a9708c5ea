/*
 * The bounds of hiredis' reader (ld_reader.h). hiredis 0.14 has no limits
 * of its own, but it builds every value through a table of functions: the
 * table here checks each value against the bounds before the default one
 * builds it, and a refusal (NULL) makes the reader fail.
 */
#include "ld_reader.h"

#include "ld_mem.h"

#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

/* hiredis' own functions, behind the table every reader of the daemon
 * uses. */
static redisReplyObjectFunctions *base_fns;

/* What one value costs beyond its bytes: the reply struct and its
 * place in the parent's array. */
#define VALUE_COST (sizeof(redisReply) + sizeof(redisReply *))

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
    return charge(t, len) ? base_fns->createString(t, s, len) : NULL;
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
    return charge(t, bytes) ? base_fns->createArray(t, n) : NULL;
}

static void *
bounded_integer(const redisReadTask *t, long long v)
{
    return charge(t, 0) ? base_fns->createInteger(t, v) : NULL;
}

static void *
bounded_nil(const redisReadTask *t)
{
    return charge(t, 0) ? base_fns->createNil(t) : NULL;
}

static void
bounded_free(void *obj)
{
    base_fns->freeObject(obj);
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

redisReader *
ld_reader_new(struct ld_reader_bounds *b)
{
    redisReader *r = redisReaderCreate();
    if (r == NULL) {
        ld_oom(0);
    }
    if (base_fns == NULL) {
        base_fns = r->fn;
    }
    r->fn = &bounded_fns;
    r->privdata = b;
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
