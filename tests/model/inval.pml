/*
 * P5: an acknowledged cache.invalidate's second delete happens, across a
 * daemon crash (src/cache/ld_cache_inval.c, src/cache/ld_journal.c). One key, one
 * invalidation with a delay; see tests/model/README.
 *
 * The journal is a file: what ld_journal_add wrote is there after the
 * process dies (write(2) is done before the deletes start). A machine
 * crash is not modelled: it keeps only what was fsynced (journal.fsync).
 */

#ifndef N_CRASH
#define N_CRASH 2
#endif
#ifndef N_FAIL
#define N_FAIL 2 /* deletes Redis does not take (del_failed, then a retry) */
#endif

bool up = true;
/* The journal: live records of the first delete and of the second
 * (ADD_AFTER the first). */
bool j1, j2;
/* The daemon's memory: the two struct del. */
bool m1, m1_run; /* the first delete, sent and not answered */
bool m2;
bool m2_after;   /* the second waits for the first (d->after) */
bool m2_due;     /* its delay has passed since the first was done */
bool inv_pending; /* the request waits for its first delete */
bool requested, acked;
/* Ghosts. */
bool first_done; /* Redis ran a first delete */
bool second_done;
byte n_crash, n_fail;

/* cache_op_invalidate: both deletes journaled, then the first runs. */
inline cache_op_invalidate()
{
    j1 = true;
#ifndef NO_JOURNAL_SECOND
    j2 = true;
#endif
    m1 = true; m2 = true; m2_after = true;
    inv_pending = true
}

/* inv_first_result and inv_reply: the answer, whatever the first delete
 * did (deleted, or queued for retries). */
inline inv_reply()
{
    if
    :: inv_pending -> inv_pending = false; acked = true
    :: else
    fi
}

/* del_cb for the first delete: the second's delay starts now. */
inline del_cb_first()
{
    m1_run = false;
    inv_reply();
    if
    :: m2 && m2_after -> m2_after = false; m2_due = false
    :: else
    fi;
    j1 = false; /* ld_journal_done */
    m1 = false
}

/* Replay at start: cache_replay_one for each live record, in id order. */
inline cache_replay()
{
    if
    :: j1 -> m1 = true
    :: else
    fi;
    if
    :: j2 -> m2 = true;
        /* Waits for the first when it is still owed, else its delay
         * counts from this start. */
        m2_after = j1; m2_due = false
    :: else
    fi
}

active proctype world()
{
    do
    :: atomic {
        up && !requested -> requested = true; cache_op_invalidate()
    }
    /* del_run of the first delete: Redis takes it, or not (del_failed). */
    :: atomic {
        up && m1 && !m1_run ->
        if
        :: m1_run = true; first_done = true
        :: n_fail < N_FAIL -> n_fail++; inv_reply() /* queued */
        fi
    }
    :: atomic { up && m1_run -> del_cb_first() }
    /* The second's timer: its delay passes. */
    :: atomic { up && m2 && !m2_after && !m2_due -> m2_due = true }
    /* del_run of the second delete. */
    :: atomic {
        up && m2 && m2_due ->
        if
        :: assert(first_done); second_done = true; j2 = false; m2 = false
        :: n_fail < N_FAIL -> n_fail++
        fi
    }
    :: atomic {
        up && n_crash < N_CRASH -> n_crash++; up = false;
        m1 = false; m1_run = false; m2 = false; m2_after = false;
        m2_due = false;
        inv_pending = false /* the client sees its connection close */
    }
    :: atomic { !up -> up = true; cache_replay() }
    :: atomic { up && requested && !m1 && !m2 -> break }
    od;
    /* P5: an acknowledged invalidation's second delete happened. */
    assert(!acked || second_done)
}
