#ifndef LD_DICT_H
#define LD_DICT_H

#include "ld_common.h"

/* A hash table from binary-safe keys to pointers, open hashing with
 * chaining and incremental-free growth (rehash all at once on doubling;
 * tables here are small or grow rarely). The dict copies keys. */

struct ld_dict;
struct ld_dict_entry;

/* Never NULL (out of memory aborts, see ld_mem.h). */
struct ld_dict *ld_dict_new(void);
/* Frees the table and its key copies, not the values. */
void ld_dict_free(struct ld_dict *d);

void *ld_dict_get(const struct ld_dict *d, const void *key, size_t len);
/* Insert or replace; returns LD_OK. */
int ld_dict_set(struct ld_dict *d, const void *key, size_t len, void *value);
/* Remove and return the value (NULL when absent). */
void *ld_dict_del(struct ld_dict *d, const void *key, size_t len);
size_t ld_dict_size(const struct ld_dict *d);

/* Iteration that tolerates deleting the current entry. */
struct ld_dict_iter {
    const struct ld_dict *d;
    size_t bucket;
    struct ld_dict_entry *next;
};
void ld_dict_iter_init(struct ld_dict_iter *it, const struct ld_dict *d);
/* Returns false at the end. KEY/LEN may be NULL. */
bool ld_dict_iter_next(struct ld_dict_iter *it, const void **key, size_t *len,
                       void **value);

#endif
