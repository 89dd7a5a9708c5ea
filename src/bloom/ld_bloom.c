/*
 * Bloom filters against cache penetration: bloom.create, bloom.add,
 * bloom.check, and the check cache.get makes with "bloom".
 *
 * Redis layout. A filter F is two keys in one hash slot:
 *   <cache.prefix>{F}:bloom     the bitmap, a string of m bits, made by
 *                               the first bloom.add (Redis grows it)
 *   <cache.prefix>{F}:bloom:p   its parameters, a hash: m, k, capacity,
 *                               error_rate and scheme ("1", the recipe
 *                               of the positions below)
 * Neither expires.
 *
 * The daemon computes each key's k bit positions (ld_bloom_positions)
 * and sends them with the m and k it assumes to one script
 * (src/lua/bloom_bits.lua), which sets or reads them only when the
 * filter still has that m and k: a filter deleted and made again with
 * other parameters is answered with those, and the daemon computes the
 * positions again and retries once. The parameters of the filters it has
 * seen are kept here, so one round trip is the usual cost; the first use
 * of a filter costs two.
 */
#include "ld_bloom.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_dispatch.h"
#include "ld_features.h"
#include "ld_lease.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_redis.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Filters whose parameters are kept; past it the list starts again (a
 * forgotten filter costs one more round trip, never a wrong answer). */
#define KNOWN_MAX 4096

/* What a filter's parameters are believed to be. */
struct known {
    uint64_t m;
    unsigned k;
};

enum bop_kind { BOP_ADD, BOP_CHECK, BOP_KEY };

/* One bloom.add or bloom.check, or the check of one key for cache.get. */
struct bop {
    enum bop_kind kind;
    struct ld_req *req; /* BOP_ADD, BOP_CHECK */
    ld_bloom_cb *cb;    /* BOP_KEY */
    void *cb_arg;
    char *names; /* the bitmap's and the parameters' names */
    const char *bits_name, *params_name;
    size_t bits_len, params_len;
    char *filter; /* a copy, NUL-terminated */
    size_t filter_len;
    size_t n;          /* keys */
    const char **keys; /* borrowed from the request, or KEY1 */
    size_t *key_lens;
    const char *key1; /* BOP_KEY's key: a copy */
    uint64_t m;       /* as sent; 0: not known yet */
    unsigned k;
    int mismatches_left; /* answers of other parameters it may still take */
};

static struct {
    const struct ld_ctx *ctx;
    struct ld_dict *known; /* filter name -> struct known */
} bloom_mod;

/* ---------------------------------------------------------- positions */

/* The recipe (scheme "1", leased-protocol(7) BLOOM FILTERS): h is the
 * 64-bit FNV-1a of the key's bytes passed through MurmurHash3's 64-bit
 * finaliser (FNV-1a alone mixes its last bytes into the low bits only);
 * h1 its low 32 bits, h2 its high 32 bits; position i, for i from 0 to
 * k - 1, is (h1 + i * h2) mod m (Kirsch and Mitzenmacher's double
 * hashing). ld_hash_mixed's fixed recipe, not ld_hash's nor the
 * dictionaries' seeded one: the bits in Redis outlive any daemon. */
static uint64_t
key_hash(const char *key, size_t len)
{
    return ld_hash_mixed(LD_FNV_BASIS, key, len);
}

void
ld_bloom_positions(const char *key, size_t len, uint64_t m, unsigned k,
                   uint64_t *out)
{
    uint64_t h = key_hash(key, len);
    uint64_t h1 = h & 0xffffffffull;
    uint64_t h2 = h >> 32;
    /* h1 + i * h2 < 2^32 + 32 * 2^32: no overflow. */
    for (unsigned i = 0; i < k; i++) {
        out[i] = (h1 + (uint64_t)i * h2) % m;
    }
}

int
ld_bloom_size(long long capacity, double error_rate, uint64_t *m, unsigned *k)
{
    double n = (double)capacity;
    double bits = ceil(-n * log(error_rate) / (M_LN2 * M_LN2));
    if (bits > (double)LD_BLOOM_BITS_MAX) {
        *m = bits > 1e19 ? UINT64_MAX : (uint64_t)bits;
        *k = 0;
        return LD_ERR;
    }
    *m = bits < 8 ? 8 : (uint64_t)bits;
    double hashes = round((double)*m / n * M_LN2);
    *k = hashes < 1                     ? 1
         : hashes > LD_BLOOM_HASHES_MAX ? LD_BLOOM_HASHES_MAX
                                        : (unsigned)hashes;
    return LD_OK;
}

/* ------------------------------------------------------ known filters */

static void
known_forget(const char *filter, size_t len)
{
    free(ld_dict_del(bloom_mod.known, filter, len));
}

static void
known_clear(void)
{
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, bloom_mod.known);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        free(v);
    }
    ld_dict_free(bloom_mod.known);
    bloom_mod.known = ld_dict_new();
}

static void
known_set(const char *filter, size_t len, uint64_t m, unsigned k)
{
    struct known *kn = ld_dict_get(bloom_mod.known, filter, len);
    if (kn == NULL) {
        if (ld_dict_size(bloom_mod.known) >= KNOWN_MAX) {
            known_clear();
        }
        kn = ld_xmalloc(sizeof(*kn));
        ld_dict_set(bloom_mod.known, filter, len, kn);
    }
    kn->m = m;
    kn->k = k;
}

/* ---------------------------------------------------------- requests */

/* The two Redis names of FILTER into OP. */
static void
bop_names(struct bop *op, const char *filter, size_t flen)
{
    static const char *const sufs[] = {":p"};
    const char *names[2];
    size_t lens[2];
    op->names = ld_lease_names(bloom_mod.ctx->cfg->cache.prefix, filter, flen,
                               ":bloom", sufs, 1, names, lens);
    op->bits_name = names[0];
    op->bits_len = lens[0];
    op->params_name = names[1];
    op->params_len = lens[1];
    op->filter = ld_xmalloc(flen + 1);
    memcpy(op->filter, filter, flen);
    op->filter[flen] = '\0';
    op->filter_len = flen;
}

static struct bop *
bop_new(enum bop_kind kind, const char *filter, size_t flen, size_t n)
{
    struct bop *op = ld_xcalloc(1, sizeof(*op));
    op->kind = kind;
    op->n = n;
    op->keys = ld_xcalloc(n, sizeof(*op->keys));
    op->key_lens = ld_xcalloc(n, sizeof(*op->key_lens));
    bop_names(op, filter, flen);
    struct known *kn = ld_dict_get(bloom_mod.known, filter, flen);
    if (kn != NULL) {
        op->m = kn->m;
        op->k = kn->k;
    }
    /* Not known: the first answer tells the parameters, and one more
     * may still say they changed. */
    op->mismatches_left = kn != NULL ? 1 : 2;
    return op;
}

static void
bop_free(struct bop *op)
{
    free(op->names);
    free(op->filter);
    free(op->keys);
    free(op->key_lens);
    free((char *)op->key1);
    free(op);
}

static void bits_cb(redisReply *r, void *arg);

/* The script with the positions of every key for the M and K assumed;
 * none while they are not known (the script answers them). */
static void
bop_send(struct bop *op)
{
    size_t npos = op->m == 0 ? 0 : op->n * op->k;
    size_t argc = 5 + npos;
    const char **argv = ld_xmalloc(argc * sizeof(*argv));
    size_t *lens = ld_xmalloc(argc * sizeof(*lens));
    char *text = ld_xmalloc(npos * LD_LL_STR_MAX + 2 * LD_LL_STR_MAX);
    uint64_t pos[LD_BLOOM_HASHES_MAX];
    char *t = text;

    argv[0] = op->bits_name;
    lens[0] = op->bits_len;
    argv[1] = op->params_name;
    lens[1] = op->params_len;
    argv[2] = op->kind == BOP_ADD ? "set" : "get";
    lens[2] = 3;
    argv[3] = t;
    lens[3] = ld_ll_to_str(t, (long long)op->m);
    t += lens[3] + 1;
    argv[4] = t;
    lens[4] = ld_ll_to_str(t, (long long)op->k);
    t += lens[4] + 1;
    size_t a = 5;
    for (size_t i = 0; npos > 0 && i < op->n; i++) {
        ld_bloom_positions(op->keys[i], op->key_lens[i], op->m, op->k, pos);
        for (unsigned j = 0; j < op->k; j++) {
            argv[a] = t;
            lens[a] = ld_ll_to_str(t, (long long)pos[j]);
            t += lens[a] + 1;
            a++;
        }
    }
    LD_ASSERT(a == argc);
    /* The arguments after the script's two key names. */
    ld_redis_script(LD_SCRIPT_bloom_bits, op->bits_name, op->bits_len, 2,
                    (int)argc, argv, lens, bits_cb, op);
    free(argv);
    free(lens);
    free(text);
}

/* OP failed with CODE and MSG: its request, or its caller, is told. */
static void
bop_fail(struct bop *op, int code, const char *msg)
{
    if (op->kind == BOP_KEY) {
        op->cb(LD_BLOOM_ERROR, code, msg, op->cb_arg);
    } else {
        ld_reply_error(op->req, code, "%s", msg);
    }
    bop_free(op);
}

/* Redis did not answer, or answered an error. Only a bloom.add that may
 * have run leaves its outcome unknown; a check changes nothing. */
static void
bop_redis_failed(struct bop *op, const redisReply *r)
{
    if (op->kind == BOP_ADD) {
        ld_lease_reply_failure(op->req, r, "bloom.add");
        bop_free(op);
        return;
    }
    char msg[256];
    int code = LD_E_REDIS_UNAVAILABLE;
    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        code = ld_reply_is_unavailable(r) ? LD_E_REDIS_UNAVAILABLE
                                          : LD_E_INTERNAL;
        snprintf(msg, sizeof(msg), "bloom.check: %s", r->str);
    } else if (r != NULL) {
        code = LD_E_INTERNAL;
        snprintf(msg, sizeof(msg), "bloom.check: unexpected reply");
    } else {
        snprintf(msg, sizeof(msg), "redis unavailable: %s",
                 ld_redis_failure_reason());
    }
    bop_fail(op, code, msg);
}

static void
bop_answer(struct bop *op, const long long *v)
{
    if (op->kind == BOP_KEY) {
        bool maybe = v[0] != 0;
        if (!maybe) {
            ld_stats.bloom_ruled_out++;
        }
        ld_stats.bloom_checked++;
        op->cb(maybe ? LD_BLOOM_MAYBE : LD_BLOOM_NO, 0, NULL, op->cb_arg);
        bop_free(op);
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < op->n; i++) {
        json_array_append_new(arr, json_boolean(v[i] != 0));
        if (op->kind == BOP_CHECK && v[i] == 0) {
            ld_stats.bloom_ruled_out++;
        }
    }
    if (op->kind == BOP_ADD) {
        ld_stats.bloom_added += (long long)op->n;
    } else {
        ld_stats.bloom_checked += (long long)op->n;
    }
    ld_reply_ok(op->req,
                json_pack("{s:o}", op->kind == BOP_ADD ? "added" : "maybe",
                          arr));
    bop_free(op);
}

static void
bits_cb(redisReply *r, void *arg)
{
    struct bop *op = arg;
    char msg[256];
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        bop_redis_failed(op, r);
        return;
    }
    long long *v = ld_xmalloc((r->elements + 1) * sizeof(*v));
    int got = ld_lease_reply_ints(r, v, (int)r->elements);
    long long rc = got >= 1 ? v[0] : 0;
    if (rc == 1 && op->m != 0 && (size_t)got == op->n + 1) {
        bop_answer(op, v + 1);
    } else if (rc == -1) {
        snprintf(msg, sizeof(msg),
                 "the Redis keys of filter '%.*s' hold data leased did "
                 "not write; nothing was changed",
                 (int)(op->filter_len > 60 ? 60 : op->filter_len), op->filter);
        known_forget(op->filter, op->filter_len);
        bop_fail(op, LD_E_WRONG_TYPE, msg);
    } else if (rc == -2) {
        snprintf(msg, sizeof(msg),
                 "filter '%.*s' does not exist: bloom.create it first",
                 (int)(op->filter_len > 60 ? 60 : op->filter_len), op->filter);
        known_forget(op->filter, op->filter_len);
        bop_fail(op, LD_E_BAD_REQUEST, msg);
    } else if (rc == -3 && got == 3 && v[1] > 0 &&
               (uint64_t)v[1] <= LD_BLOOM_BITS_MAX && v[2] > 0 &&
               v[2] <= LD_BLOOM_HASHES_MAX && op->mismatches_left > 0) {
        /* Made again with other parameters (or not known yet): the
         * positions are computed again for them. */
        op->mismatches_left--;
        op->m = (uint64_t)v[1];
        op->k = (unsigned)v[2];
        known_set(op->filter, op->filter_len, op->m, op->k);
        bop_send(op);
    } else if (rc == -3) {
        known_forget(op->filter, op->filter_len);
        snprintf(msg, sizeof(msg),
                 "the parameters of filter '%.*s' changed while it was "
                 "read, or are out of bounds; nothing was changed",
                 (int)(op->filter_len > 60 ? 60 : op->filter_len), op->filter);
        bop_fail(op, LD_E_INTERNAL, msg);
    } else {
        bop_redis_failed(op, r);
    }
    free(v);
}

void
ld_bloom_check_key(const char *filter, size_t flen, const char *key,
                   size_t klen, ld_bloom_cb *cb, void *arg)
{
    struct bop *op = bop_new(BOP_KEY, filter, flen, 1);
    op->cb = cb;
    op->cb_arg = arg;
    char *copy = ld_xmalloc(klen + 1);
    memcpy(copy, key, klen);
    copy[klen] = '\0';
    op->key1 = copy;
    op->keys[0] = copy;
    op->key_lens[0] = klen;
    bop_send(op);
}

/* bloom.add and bloom.check: the filter and its keys. */
static void
op_bits(struct ld_req *req, enum bop_kind kind)
{
    const char *filter;
    size_t flen;
    json_t *keys;
    if (ld_req_key(req, "filter", &filter, &flen) != LD_OK ||
        ld_req_keys(req, "keys", LD_BLOOM_MAX_KEYS, &keys) != LD_OK) {
        return;
    }
    size_t n = json_array_size(keys);
    struct bop *op = bop_new(kind, filter, flen, n);
    op->req = req;
    /* The request, and KEYS with it, lives until it is answered. */
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, i);
        op->keys[i] = json_string_value(k);
        op->key_lens[i] = json_string_length(k);
    }
    bop_send(op);
}

static void
op_add(struct ld_req *req)
{
    op_bits(req, BOP_ADD);
}

static void
op_check(struct ld_req *req)
{
    op_bits(req, BOP_CHECK);
}

/* ------------------------------------------------------------ create */

/* One bloom.create on its way. */
struct create_op {
    struct ld_req *req;
    char *names;
    char *filter;
    size_t filter_len;
    char rate[32];
    uint64_t m;
    unsigned k;
};

static void
create_reply(struct create_op *c, bool created)
{
    known_set(c->filter, c->filter_len, c->m, c->k);
    ld_reply_ok(c->req,
                json_pack("{s:b,s:I,s:I,s:I}", "created", created, "bits",
                          (json_int_t)c->m, "hashes", (json_int_t)c->k,
                          "bytes", (json_int_t)((c->m + 7) / 8)));
}

static void
create_cb(redisReply *r, void *arg)
{
    struct create_op *c = arg;
    const char *f = c->filter;
    int fl = (int)(c->filter_len > 60 ? 60 : c->filter_len);
    long long rc = -99;
    size_t n = 0;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
        r->element[0]->type == REDIS_REPLY_INTEGER) {
        rc = r->element[0]->integer;
        n = r->elements;
    }
    if (rc == 1 || (rc == 0 && n == 1)) {
        create_reply(c, rc == 1);
    } else if (rc == 2 && n == 5) {
        const char *p[4];
        for (int i = 0; i < 4; i++) {
            const redisReply *e = r->element[i + 1];
            p[i] = e->type == REDIS_REPLY_STRING ? e->str : "?";
        }
        ld_reply_error(c->req, LD_E_BAD_REQUEST,
                       "filter '%.*s' exists with capacity %s and "
                       "error_rate %s (%s bits, %s hashes): create it under "
                       "another name, or delete it first",
                       fl, f, p[0], p[1], p[2], p[3]);
    } else if (rc == -1) {
        ld_reply_error(c->req, LD_E_WRONG_TYPE,
                       "the Redis keys of filter '%.*s' hold data leased "
                       "did not write; nothing was changed",
                       fl, f);
    } else {
        ld_lease_reply_failure(c->req, r, "bloom.create");
    }
    free(c->names);
    free(c->filter);
    free(c);
}

/* A real in [MIN, MAX) from FIELD; false once REQ is answered. */
static bool
req_rate(struct ld_req *req, const char *field, double *out)
{
    struct ld_rval v;
    ld_req_get(req, field, &v);
    if (v.kind == LD_RV_INT) {
        *out = (double)v.i;
    } else if (v.kind == LD_RV_OTHER && json_is_real(v.j)) {
        *out = json_real_value(v.j);
    } else {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field '%s' is required and must be a number", field);
        return false;
    }
    if (!(*out >= LD_BLOOM_ERROR_MIN && *out < LD_BLOOM_ERROR_MAX)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field '%s' must be at least %g and below %g", field,
                       LD_BLOOM_ERROR_MIN, LD_BLOOM_ERROR_MAX);
        return false;
    }
    return true;
}

static void
op_create(struct ld_req *req)
{
    const char *filter;
    size_t flen;
    long long capacity;
    double rate;
    uint64_t m;
    unsigned k;
    if (ld_req_key(req, "filter", &filter, &flen) != LD_OK ||
        ld_req_int(req, "capacity", true, 1, LD_BLOOM_CAPACITY_MAX, &capacity,
                   NULL) != LD_OK ||
        !req_rate(req, "error_rate", &rate)) {
        return;
    }
    if (ld_bloom_size(capacity, rate, &m, &k) != LD_OK) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "capacity %lld at error_rate %g needs %.0f bits, "
                       "over the limit of 2^32 bits (512 MiB)",
                       capacity, rate, (double)m);
        return;
    }
    struct create_op *c = ld_xcalloc(1, sizeof(*c));
    c->req = req;
    c->m = m;
    c->k = k;
    /* Printed so that the same number always reads back the same: the
     * idempotence check compares these strings. */
    snprintf(c->rate, sizeof(c->rate), "%.17g", rate);
    c->filter = ld_xmalloc(flen + 1);
    memcpy(c->filter, filter, flen);
    c->filter[flen] = '\0';
    c->filter_len = flen;
    static const char *const sufs[] = {":p"};
    const char *names[2];
    size_t nlens[2];
    c->names = ld_lease_names(bloom_mod.ctx->cfg->cache.prefix, filter, flen,
                              ":bloom", sufs, 1, names, nlens);
    char cap[LD_LL_STR_MAX], ms[LD_LL_STR_MAX], ks[LD_LL_STR_MAX];
    size_t caplen = ld_ll_to_str(cap, capacity);
    size_t mlen = ld_ll_to_str(ms, (long long)m);
    size_t klen = ld_ll_to_str(ks, (long long)k);
    const char *argv[] = {names[0], names[1], cap, c->rate, ms, ks};
    size_t lens[] = {nlens[0], nlens[1], caplen, strlen(c->rate), mlen, klen};
    ld_redis_script(LD_SCRIPT_bloom_create, names[0], nlens[0], 2, 6, argv,
                    lens, create_cb, c);
}

/* -------------------------------------------------------------- module */

int
ld_bloom_init(const struct ld_ctx *ctx)
{
    bloom_mod.ctx = ctx;
    bloom_mod.known = ld_dict_new();
    static const struct ld_op bloom_ops[] = {
        {"bloom.create", op_create, LD_OP_ADDS_WORK},
        {"bloom.add", op_add, LD_OP_ADDS_WORK},
        {"bloom.check", op_check, LD_OP_ADDS_WORK},
    };
    if (ld_dispatch_register_ops(bloom_ops, LD_ARRAY_LEN(bloom_ops)) !=
        LD_OK) {
        return LD_ERR;
    }
    ld_features_add("bloom");
    return LD_OK;
}

/* After ld_redis_free: the replies it ran for requests in flight have
 * answered them, and may have used the filter list. */
void
ld_bloom_free(void)
{
    if (bloom_mod.ctx == NULL) {
        return;
    }
    known_clear();
    ld_dict_free(bloom_mod.known);
    bloom_mod.known = NULL;
    bloom_mod.ctx = NULL;
}
