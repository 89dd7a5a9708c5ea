/* A chained hash table with power-of-two bucket counts.
 *
 * Keys often come from clients (lock and cache keys), so the bucket index
 * must not be something a client can aim at: the hash is seeded once per
 * process and passed through a finalizer. Plain FNV-1a alone would be a
 * poor choice here, because its low bits depend only on the low bits of
 * each input byte, and the low bits pick the bucket.
 *
 * It owns the buckets and its copies of the keys; the values are the
 * caller's, never freed here. */
#include "ld_dict.h"

#include "ld_mem.h"
#include "ld_util.h"

#include <stdlib.h>
#include <string.h>

#define DICT_MIN_BUCKETS 8

struct ld_dict_entry {
    struct ld_dict_entry *next;
    uint64_t hash;
    void *value;
    size_t len;
    unsigned char key[]; /* the dict's own copy, LEN bytes */
};

struct ld_dict {
    struct ld_dict_entry **buckets;
    size_t mask; /* bucket count - 1 */
    size_t size;
};

static struct {
    uint64_t seed;
    bool seeded;
} dict_mod;

static uint64_t
dict_hash(const void *key, size_t len)
{
    if (!dict_mod.seeded) {
        if (ld_random_bytes(&dict_mod.seed, sizeof(dict_mod.seed)) != LD_OK) {
            dict_mod.seed = ld_now_us();
        }
        dict_mod.seeded = true;
    }
    return ld_hash_mixed(LD_FNV_BASIS ^ dict_mod.seed, key, len);
}

struct ld_dict *
ld_dict_new(void)
{
    struct ld_dict *d = ld_xcalloc(1, sizeof(*d));
    d->buckets = ld_xcalloc(DICT_MIN_BUCKETS, sizeof(*d->buckets));
    d->mask = DICT_MIN_BUCKETS - 1;
    return d;
}

void
ld_dict_free(struct ld_dict *d)
{
    if (d == NULL) {
        return;
    }
    for (size_t i = 0; i <= d->mask; i++) {
        struct ld_dict_entry *e = d->buckets[i];
        while (e != NULL) {
            struct ld_dict_entry *next = e->next;
            free(e);
            e = next;
        }
    }
    free(d->buckets);
    free(d);
}

static struct ld_dict_entry **
find_slot(const struct ld_dict *d, uint64_t h, const void *key, size_t len)
{
    struct ld_dict_entry **pp = &d->buckets[h & d->mask];
    for (; *pp != NULL; pp = &(*pp)->next) {
        struct ld_dict_entry *e = *pp;
        if (e->hash == h && e->len == len &&
            (len == 0 || memcmp(e->key, key, len) == 0)) {
            return pp;
        }
    }
    return pp;
}

void *
ld_dict_get(const struct ld_dict *d, const void *key, size_t len)
{
    struct ld_dict_entry *e = *find_slot(d, dict_hash(key, len), key, len);
    return e != NULL ? e->value : NULL;
}

/* Doubling rehashes everything at once. The tables in the daemon are either
 * small or grow once to their working size, so the occasional pause is
 * cheaper than the bookkeeping of incremental rehashing. */
static void
grow(struct ld_dict *d)
{
    size_t nbuckets = (d->mask + 1) * 2;
    struct ld_dict_entry **nb = ld_xcalloc(nbuckets, sizeof(*nb));
    for (size_t i = 0; i <= d->mask; i++) {
        struct ld_dict_entry *e = d->buckets[i];
        while (e != NULL) {
            struct ld_dict_entry *next = e->next;
            size_t b = e->hash & (nbuckets - 1);
            e->next = nb[b];
            nb[b] = e;
            e = next;
        }
    }
    free(d->buckets);
    d->buckets = nb;
    d->mask = nbuckets - 1;
}

int
ld_dict_set(struct ld_dict *d, const void *key, size_t len, void *value)
{
    uint64_t h = dict_hash(key, len);
    struct ld_dict_entry **pp = find_slot(d, h, key, len);
    if (*pp != NULL) {
        (*pp)->value = value;
        return LD_OK;
    }
    struct ld_dict_entry *e = ld_xmalloc(sizeof(*e) + len);
    e->next = NULL;
    e->hash = h;
    e->value = value;
    e->len = len;
    if (len > 0) {
        memcpy(e->key, key, len);
    }
    *pp = e; /* the end of its chain */
    d->size++;
    if (d->size > d->mask + 1) {
        grow(d);
    }
    return LD_OK;
}

void *
ld_dict_del(struct ld_dict *d, const void *key, size_t len)
{
    struct ld_dict_entry **pp = find_slot(d, dict_hash(key, len), key, len);
    struct ld_dict_entry *e = *pp;
    if (e == NULL) {
        return NULL;
    }
    *pp = e->next;
    void *value = e->value;
    free(e);
    d->size--;
    return value;
}

size_t
ld_dict_size(const struct ld_dict *d)
{
    return d->size;
}

void
ld_dict_iter_init(struct ld_dict_iter *it, const struct ld_dict *d)
{
    it->d = d;
    it->bucket = 0;
    it->next = NULL;
}

/* The iterator holds the entry it will return next, never the one it
 * returned last: deleting the current entry frees memory the iterator no
 * longer points to. Deleting other entries or inserting (which may grow
 * the table) during iteration is not supported. */
bool
ld_dict_iter_next(struct ld_dict_iter *it, const void **key, size_t *len,
                  void **value)
{
    while (it->next == NULL) {
        if (it->bucket > it->d->mask) {
            return false;
        }
        it->next = it->d->buckets[it->bucket++];
    }
    struct ld_dict_entry *e = it->next;
    it->next = e->next;
    if (key != NULL) {
        *key = e->key;
    }
    if (len != NULL) {
        *len = e->len;
    }
    if (value != NULL) {
        *value = e->value;
    }
    return true;
}
