/*
 * Hot keys: space-saving top-K over a sliding window (see ld_cache_hot.h).
 *
 * Slots are ranked by `count` (the period's reads plus the error a slot
 * inherited from the key it replaced, as space-saving has it). Equal
 * counts share a bucket; buckets form a list in ascending count, so the
 * minimum is the head and an increment moves a slot to the next bucket or
 * a fresh one right after its own: O(1) per read (the "stream summary").
 * Buckets come from a pool of K (there are never more distinct counts
 * than slots). Keys are found through an open-addressing table of indexes
 * with room for twice K.
 *
 * Bookkeeping only: no I/O, no Redis, no knowledge of the ops that feed it.
 */
#include "ld_cache_hot.h"

#include "ld_assert.h"
#include "ld_mem.h"
#include "ld_util.h"

#include <stdlib.h>
#include <string.h>

#define NONE (-1)

struct hslot {
    char *key;
    size_t len, cap;
    uint64_t hash;
    uint64_t count;         /* ranking: reads this period + inherited error */
    uint64_t cur, cur_hits; /* this period */
    uint64_t prev, prev_hits; /* the period before */
    int bucket;
    int prev_in_b, next_in_b;
    bool used;
};

struct hbucket {
    uint64_t count;
    int first; /* slot */
    int prev, next;
};

static struct {
    size_t k;
    struct hslot *slots;
    struct hbucket *buckets;
    int free_bucket; /* pool, linked by next */
    int head;        /* bucket with the lowest count */
    int *tab;        /* slot index or NONE */
    size_t tab_mask;
    int *free_slots; /* unused slot indexes, a stack */
    size_t n_free;
    int *order;    /* scratch for sorting, K entries */
    double *score; /* scratch: weighted reads per slot */
    uint64_t period_start_ms;
    bool have_prev; /* a whole period lies behind period_start_ms */
    bool started;
    uint64_t seed;
} hot_mod;

bool
ld_cache_hot_enabled(void)
{
    return hot_mod.k > 0;
}

void
ld_cache_hot_free(void)
{
    for (size_t i = 0; i < hot_mod.k; i++) {
        free(hot_mod.slots[i].key);
    }
    free(hot_mod.slots);
    free(hot_mod.buckets);
    free(hot_mod.tab);
    free(hot_mod.order);
    free(hot_mod.score);
    free(hot_mod.free_slots);
    memset(&hot_mod, 0, sizeof(hot_mod));
}

static void
reset_buckets(void)
{
    for (size_t i = 0; i < hot_mod.k; i++) {
        hot_mod.buckets[i].next = i + 1 < hot_mod.k ? (int)i + 1 : NONE;
    }
    hot_mod.free_bucket = 0;
    hot_mod.head = NONE;
}

void
ld_cache_hot_init(size_t k)
{
    ld_cache_hot_free();
    if (k == 0) {
        return;
    }
    hot_mod.k = k;
    hot_mod.slots = ld_xcalloc(k, sizeof(*hot_mod.slots));
    hot_mod.buckets = ld_xcalloc(k, sizeof(*hot_mod.buckets));
    size_t t = 4;
    while (t < 2 * k) {
        t *= 2;
    }
    hot_mod.tab = ld_xmalloc(t * sizeof(*hot_mod.tab));
    hot_mod.tab_mask = t - 1;
    for (size_t i = 0; i < t; i++) {
        hot_mod.tab[i] = NONE;
    }
    hot_mod.order = ld_xmalloc(k * sizeof(*hot_mod.order));
    hot_mod.free_slots = ld_xmalloc(k * sizeof(*hot_mod.free_slots));
    for (size_t i = 0; i < k; i++) {
        hot_mod.free_slots[i] = (int)(k - 1 - i);
    }
    hot_mod.n_free = k;
    hot_mod.score = ld_xmalloc(k * sizeof(*hot_mod.score));
    /* Keys come from clients: a secret seed keeps them from choosing
     * collisions. */
    if (ld_random_bytes(&hot_mod.seed, sizeof(hot_mod.seed)) != LD_OK) {
        hot_mod.seed = (uint64_t)(ld_random_unit() * (double)UINT64_MAX);
    }
    reset_buckets();
}

static uint64_t
key_hash(const char *key, size_t len)
{
    return ld_hash(key, len) ^ hot_mod.seed;
}

/* ---- the index ------------------------------------------------------- */

static int
tab_find(const char *key, size_t len, uint64_t h)
{
    for (size_t p = h & hot_mod.tab_mask;; p = (p + 1) & hot_mod.tab_mask) {
        int i = hot_mod.tab[p];
        if (i == NONE) {
            return NONE;
        }
        const struct hslot *s = &hot_mod.slots[i];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            return i;
        }
    }
}

static void
tab_insert(int i)
{
    size_t p = hot_mod.slots[i].hash & hot_mod.tab_mask;
    while (hot_mod.tab[p] != NONE) {
        p = (p + 1) & hot_mod.tab_mask;
    }
    hot_mod.tab[p] = i;
}

/* Linear probing without tombstones: the entries after the hole that
 * would no longer be found move back into it. */
static void
tab_remove(int i)
{
    size_t p = hot_mod.slots[i].hash & hot_mod.tab_mask;
    while (hot_mod.tab[p] != i) {
        p = (p + 1) & hot_mod.tab_mask;
    }
    size_t hole = p;
    for (size_t q = (p + 1) & hot_mod.tab_mask; hot_mod.tab[q] != NONE;
         q = (q + 1) & hot_mod.tab_mask) {
        size_t home = hot_mod.slots[hot_mod.tab[q]].hash & hot_mod.tab_mask;
        /* Does q's home lie cyclically in (hole, q]? Then it stays. */
        bool stays = hole <= q ? (home > hole && home <= q)
                               : (home > hole || home <= q);
        if (!stays) {
            hot_mod.tab[hole] = hot_mod.tab[q];
            hole = q;
        }
    }
    hot_mod.tab[hole] = NONE;
}

/* ---- buckets --------------------------------------------------------- */

static int
bucket_new(uint64_t count, int after)
{
    int b = hot_mod.free_bucket;
    /* At most one bucket per used slot, and the pool has K. */
    hot_mod.free_bucket = hot_mod.buckets[b].next;
    struct hbucket *nb = &hot_mod.buckets[b];
    nb->count = count;
    nb->first = NONE;
    nb->prev = after;
    nb->next = after == NONE ? hot_mod.head : hot_mod.buckets[after].next;
    if (nb->next != NONE) {
        hot_mod.buckets[nb->next].prev = b;
    }
    if (after == NONE) {
        hot_mod.head = b;
    } else {
        hot_mod.buckets[after].next = b;
    }
    return b;
}

static void
bucket_drop(int b)
{
    struct hbucket *ob = &hot_mod.buckets[b];
    if (ob->prev != NONE) {
        hot_mod.buckets[ob->prev].next = ob->next;
    } else {
        hot_mod.head = ob->next;
    }
    if (ob->next != NONE) {
        hot_mod.buckets[ob->next].prev = ob->prev;
    }
    ob->next = hot_mod.free_bucket;
    hot_mod.free_bucket = b;
}

static void
slot_link(int i, int b)
{
    struct hslot *s = &hot_mod.slots[i];
    s->bucket = b;
    s->prev_in_b = NONE;
    s->next_in_b = hot_mod.buckets[b].first;
    if (s->next_in_b != NONE) {
        hot_mod.slots[s->next_in_b].prev_in_b = i;
    }
    hot_mod.buckets[b].first = i;
}

/* Take slot I out of its bucket (which may be left empty). */
static void
slot_unlink(int i)
{
    struct hslot *s = &hot_mod.slots[i];
    if (s->prev_in_b != NONE) {
        hot_mod.slots[s->prev_in_b].next_in_b = s->next_in_b;
    } else {
        hot_mod.buckets[s->bucket].first = s->next_in_b;
    }
    if (s->next_in_b != NONE) {
        hot_mod.slots[s->next_in_b].prev_in_b = s->prev_in_b;
    }
}

/* Slot I's count goes up by one. */
static void
slot_bump(int i)
{
    struct hslot *s = &hot_mod.slots[i];
    int b = s->bucket;
    uint64_t c = ++s->count;
    int next = hot_mod.buckets[b].next;
    slot_unlink(i);
    if (next != NONE && hot_mod.buckets[next].count == c) {
        slot_link(i, next);
    } else if (hot_mod.buckets[b].first == NONE) {
        /* Alone in its bucket: the bucket moves up with it, and stays
         * below the next one. */
        hot_mod.buckets[b].count = c;
        slot_link(i, b);
        return;
    } else {
        slot_link(i, bucket_new(c, b));
    }
    if (hot_mod.buckets[b].first == NONE) {
        bucket_drop(b);
    }
}

/* ---- the window ------------------------------------------------------ */

static int
by_count(const void *a, const void *b)
{
    uint64_t ca = hot_mod.slots[*(const int *)a].count;
    uint64_t cb = hot_mod.slots[*(const int *)b].count;
    return ca < cb ? -1 : ca > cb;
}

/* A period ended (or several did): the one just ended becomes "prev",
 * the ranking restarts from it, and slots with nothing left are free. */
static void
roll(uint64_t now_ms)
{
    uint64_t periods = (now_ms - hot_mod.period_start_ms) / LD_HOT_WINDOW_MS;
    hot_mod.period_start_ms += periods * LD_HOT_WINDOW_MS;
    hot_mod.have_prev = true;
    for (size_t t = 0; t <= hot_mod.tab_mask; t++) {
        hot_mod.tab[t] = NONE;
    }
    reset_buckets();
    size_t n = 0;
    for (size_t i = 0; i < hot_mod.k; i++) {
        struct hslot *s = &hot_mod.slots[i];
        if (!s->used) {
            continue;
        }
        s->prev = periods == 1 ? s->cur : 0;
        s->prev_hits = periods == 1 ? s->cur_hits : 0;
        s->cur = s->cur_hits = 0;
        s->count = s->prev;
        if (s->count == 0) {
            s->used = false;
            hot_mod.free_slots[hot_mod.n_free++] = (int)i;
            continue;
        }
        hot_mod.order[n++] = (int)i;
    }
    LD_ASSERT(hot_mod.n_free + n == hot_mod.k);
    qsort(hot_mod.order, n, sizeof(*hot_mod.order), by_count);
    int last = NONE;
    for (size_t j = 0; j < n; j++) {
        int i = hot_mod.order[j];
        tab_insert(i);
        if (last == NONE ||
            hot_mod.buckets[last].count != hot_mod.slots[i].count) {
            last = bucket_new(hot_mod.slots[i].count, last);
        }
        slot_link(i, last);
    }
}

static void
advance(uint64_t now_ms)
{
    if (!hot_mod.started) {
        hot_mod.started = true;
        hot_mod.period_start_ms = now_ms;
        return;
    }
    if (now_ms >= hot_mod.period_start_ms + LD_HOT_WINDOW_MS) {
        roll(now_ms);
    }
}

/* ---- reads and queries ----------------------------------------------- */

void
ld_cache_hot_note(const char *key, size_t len, bool hit, uint64_t now_ms)
{
    if (hot_mod.k == 0) {
        return;
    }
    advance(now_ms);
    uint64_t h = key_hash(key, len);
    int i = tab_find(key, len, h);
    if (i == NONE) {
        struct hslot *s;
        if (hot_mod.n_free > 0) {
            i = hot_mod.free_slots[--hot_mod.n_free];
            s = &hot_mod.slots[i];
            s->count = 0;
            int b = hot_mod.head != NONE &&
                            hot_mod.buckets[hot_mod.head].count == 0
                        ? hot_mod.head
                        : bucket_new(0, NONE);
            slot_link(i, b);
        } else {
            /* Space-saving: the key replaces the least counted one and
             * inherits its count as its possible error. */
            i = hot_mod.buckets[hot_mod.head].first;
            s = &hot_mod.slots[i];
            tab_remove(i);
        }
        if (len > s->cap) {
            s->key = ld_xrealloc(s->key, len > 0 ? len : 1);
            s->cap = len;
        }
        memcpy(s->key, key, len);
        s->len = len;
        s->hash = h;
        s->cur = s->cur_hits = s->prev = s->prev_hits = 0;
        s->used = true;
        tab_insert(i);
    }
    struct hslot *s = &hot_mod.slots[i];
    s->cur++;
    if (hit) {
        s->cur_hits++;
    }
    slot_bump(i);
}

static int
by_score_desc(const void *a, const void *b)
{
    double sa = hot_mod.score[*(const int *)a];
    double sb = hot_mod.score[*(const int *)b];
    return sa > sb ? -1 : sa < sb;
}

size_t
ld_cache_hot_top(struct ld_hot_key *out, size_t max, uint64_t now_ms)
{
    if (hot_mod.k == 0 || !hot_mod.started) {
        return 0;
    }
    advance(now_ms);
    uint64_t into = now_ms - hot_mod.period_start_ms;
    double left = hot_mod.have_prev ? 1.0 - (double)into / LD_HOT_WINDOW_MS
                                    : 0.0;
    /* The span the weighted counts cover; at least a second, so that the
     * first reads after a start do not read as a huge rate. */
    double span_s = ((double)into + left * LD_HOT_WINDOW_MS) / 1000.0;
    if (span_s < 1.0) {
        span_s = 1.0;
    }
    size_t n = 0;
    for (size_t i = 0; i < hot_mod.k; i++) {
        const struct hslot *s = &hot_mod.slots[i];
        if (!s->used) {
            continue;
        }
        hot_mod.score[i] = (double)s->cur + left * (double)s->prev;
        if (hot_mod.score[i] > 0) {
            hot_mod.order[n++] = (int)i;
        }
    }
    qsort(hot_mod.order, n, sizeof(*hot_mod.order), by_score_desc);
    if (n > max) {
        n = max;
    }
    for (size_t j = 0; j < n; j++) {
        int i = hot_mod.order[j];
        const struct hslot *s = &hot_mod.slots[i];
        double hits = (double)s->cur_hits + left * (double)s->prev_hits;
        out[j].key = s->key;
        out[j].len = s->len;
        out[j].reads = (uint64_t)(hot_mod.score[i] + 0.5);
        out[j].reads_per_s = hot_mod.score[i] / span_s;
        out[j].hit_ratio = hot_mod.score[i] > 0 ? hits / hot_mod.score[i]
                                                : 0.0;
    }
    return n;
}
