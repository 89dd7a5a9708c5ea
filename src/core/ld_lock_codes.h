#ifndef LD_LOCK_CODES_H
#define LD_LOCK_CODES_H

/* What the lock scripts (src/lua/lock_*.lua) return as the first element
 * of their reply; the header comment of each script names the ones it
 * returns. The negative codes mean the same in every script. The others
 * are read by the script that returned them, so 0 and 1 have one name
 * per meaning; the compiler sees the same numbers. */
enum ld_lock_code {
    /* A key holds another type, or a hash that is not a lock (see
     * src/lua/lib/lock_shape.lua): nothing was changed. */
    LD_LOCK_WRONG_TYPE = -1,
    LD_LOCK_ABSENT = -2, /* no lock */
    LD_LOCK_OTHER = -3,  /* held, by another holder */
    LD_LOCK_FORCED = -4, /* lock_renew: gone by lock.force_unlock */

    /* lock_acquire */
    LD_LOCK_TAKEN = 0,   /* {0, pttl}: another holder has it */
    LD_LOCK_GRANTED = 1, /* {1, count, "fence", pttl} */
    /* lock_release */
    LD_LOCK_KEPT = 0,     /* {0, count}: holds remain */
    LD_LOCK_RELEASED = 1, /* {1, 0}: deleted, and the unlock published */
    /* lock_info */
    LD_LOCK_FREE = 0, /* {0, -2, 0} */
    /* lock_info, lock_extend, lock_renew: {1, pttl, count} */
    LD_LOCK_HELD = 1
};

/* lock_acquire's (and rw_acquire's) bare answer, a free lock taken, as the
 * table it stands for: one hold with fence FENCE for LEASE_MS, the lease
 * that was sent. Returns the count of V's numbers. */
static inline int
ld_lock_bare_grant(long long fence, long long lease_ms, long long v[4])
{
    v[0] = LD_LOCK_GRANTED;
    v[1] = 1;
    v[2] = fence;
    v[3] = lease_ms;
    return 4;
}

#endif
