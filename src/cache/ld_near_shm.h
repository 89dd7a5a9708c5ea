#ifndef LD_NEAR_SHM_H
#define LD_NEAR_SHM_H

/* The writer of one shared near cache segment (lib/leased/near_layout.h):
 * a sealed memfd of a fixed size that this daemon alone maps writable,
 * and hands out read-only (ld_near_shm_ro_fd). Pure memory work: no loop,
 * no Redis, no configuration; ld_near.c decides what goes in and when. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ld_near_shm;

/* A new segment of BYTES (rounded down to whole pages; at least 64 KiB)
 * named NAME (for /proc/PID/fd), readers told STALE_NS. NULL with errno
 * set when the memfd, its seals or its mapping fail. */
struct ld_near_shm *ld_near_shm_create(const char *name, uint64_t bytes,
                                       uint64_t stale_ns);
/* Marks it closed for readers, unmaps it and closes the memfd (readers
 * that mapped it keep a mapping that says closed). */
void ld_near_shm_destroy(struct ld_near_shm *s);

/* A new read-only descriptor of the segment (O_RDONLY|O_CLOEXEC), for
 * SCM_RIGHTS; the caller closes it. -1 with errno on failure. */
int ld_near_shm_ro_fd(const struct ld_near_shm *s);

/* KEY's value is V until DEADLINE_NS (CLOCK_MONOTONIC), with VERSION (0:
 * none); V NULL (VLEN 0) is a cached null (LEASED_NEAR_NULL), V non-NULL
 * with VLEN 0 an empty value. Replaces what was there. A value that cannot fit (over a quarter
 * of the ring) is not stored and KEY is deleted instead; returns whether
 * it was stored. Older records are taken out to make room. */
bool ld_near_shm_put(struct ld_near_shm *s, const char *key, size_t klen,
                     const char *v, size_t vlen, uint64_t deadline_ns,
                     uint64_t version);
/* KEY is gone; readers that look after this returns do not find it. */
void ld_near_shm_del(struct ld_near_shm *s, const char *key, size_t klen);
/* Everything is gone, and the epoch moves. */
void ld_near_shm_flush(struct ld_near_shm *s);
/* The daemon is alive at NOW_NS (CLOCK_MONOTONIC). */
void ld_near_shm_beat(struct ld_near_shm *s, uint64_t now_ns);

struct ld_near_shm_usage {
    uint64_t bytes;      /* the segment's size */
    uint64_t used_bytes; /* ring bytes held by live records */
    uint64_t entries;
};
void ld_near_shm_usage(const struct ld_near_shm *s,
                       struct ld_near_shm_usage *out);

#endif
