#ifndef LD_BLOOM_H
#define LD_BLOOM_H

#include "ld_common.h"

#include <stdint.h>

struct ld_ctx;

/* Bloom filters in Redis: registers bloom.create, bloom.add and
 * bloom.check. */
int ld_bloom_init(const struct ld_ctx *ctx);
void ld_bloom_free(void);

/* The bounds of a filter (leased-protocol(7) BLOOM FILTERS). */
#define LD_BLOOM_CAPACITY_MAX 1000000000LL
#define LD_BLOOM_ERROR_MIN 1e-9
#define LD_BLOOM_ERROR_MAX 0.5 /* excluded */
#define LD_BLOOM_BITS_MAX (1ULL << 32)
#define LD_BLOOM_HASHES_MAX 32
#define LD_BLOOM_MAX_KEYS 1000

/* The size of a filter for CAPACITY keys at ERROR_RATE, both in bounds:
 * M bits and K hashes. LD_ERR when M would pass LD_BLOOM_BITS_MAX (*M is
 * then what it would need). */
int ld_bloom_size(long long capacity, double error_rate, uint64_t *m,
                  unsigned *k);

/* The K bit positions of KEY in a filter of M bits, into OUT. */
void ld_bloom_positions(const char *key, size_t len, uint64_t m, unsigned k,
                        uint64_t *out);

/* What a filter says of one key, for cache.get's "bloom": NO (it was
 * never added), MAYBE, or ERROR with CODE (LD_E_*) and MSG. */
enum ld_bloom_says { LD_BLOOM_NO, LD_BLOOM_MAYBE, LD_BLOOM_ERROR };
typedef void ld_bloom_cb(enum ld_bloom_says says, int code, const char *msg,
                         void *arg);
/* Ask FILTER about KEY; CB runs once, never before this returns. */
void ld_bloom_check_key(const char *filter, size_t flen, const char *key,
                        size_t klen, ld_bloom_cb *cb, void *arg);

#endif
