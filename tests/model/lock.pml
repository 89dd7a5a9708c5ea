/*
 * A model of what leased does for one lock key, checked by spin.
 * See tests/model/README for the properties, the switches and how to run
 * it. Every transition is an inline named after the C function or Lua
 * script that implements it; a reader can hold the two side by side.
 *
 * Actors: NS client sessions (2 or 3) on ND = 2 daemons (session 0 and,
 * with NS 3, session 1 on daemon 0; the last session on daemon 1), a
 * Redis master with one replica, and a fenced resource. Time is counted
 * in ticks: a watchdog lease is WD ticks, the watchdog may renew at any
 * moment (a superset of the pass every third of the lease), and the
 * daemon stops vouching for a lease MARGIN ticks before it ends.
 *
 * Time may pass (tick) only when no running daemon has a timer due, and
 * a running client acts on lock_lost (or its connection closing) as it
 * arrives: that is what "the daemon and the client are not paused" means.
 * A pause (of a daemon or a client) lifts both.
 */

#ifndef NS
#define NS 2
#endif
#define MAXS 3 /* array size: sessions NS..MAXS-1 never open */
#define ND 2
#define WD 3     /* lock.watchdog_ms, in ticks */
#define FIXED 2  /* ttl_ms of a fixed lease */
#define EXT 4    /* ttl_ms of extend */
#define MARGIN 1 /* lost_margin_ms(): 2 ms + 1% of the watchdog lease */
#ifndef MAXT
#define MAXT 7 /* the last tick explored */
#endif
#ifndef MAXG
#define MAXG 4 /* new acquisitions explored */
#endif
#define MAXC 2 /* holds of one token explored (reentries) */
/* How often each fault may strike in one run. */
#ifndef N_LOSS
#define N_LOSS 1
#endif
#ifndef N_FAILOVER
#define N_FAILOVER 1
#endif
#ifndef N_CRASH
#define N_CRASH 1
#endif
#ifndef N_PAUSE
#define N_PAUSE 1
#endif
#ifndef N_CLOSE
#define N_CLOSE 1
#endif

/* A session, a daemon: one nondeterministic step (select() would take
 * several). */
#define PICK_S(v) if :: v = 0 :: v = 1 :: NS > 2 -> v = 2 fi
#define PICK_D(v) if :: v = 0 :: v = 1 fi

/* The session's daemon. */
#define DMN(s) ((s) == NS - 1 -> 1 : 0)

/* Codes of the Lua scripts (src/core/ld_lock_codes.h). */
#define GRANTED 1
#define TAKEN 4  /* 0 in Redis */
#define ABSENT 2 /* -2 in Redis */
#define OTHER 3  /* -3 in Redis */
#define FAILED 5 /* the daemon's: no usable answer */

/* ---- Redis: the master, its replica ---------------------------------- */
/* The lock hash (one holder: its token, hold count, expiry tick) and the
 * fence counter. 0 is "no key". */
byte m_tok, m_cnt, m_exp, m_fence;
byte r_tok, r_cnt, r_exp, r_fence;

/* ---- daemons ---------------------------------------------------------- */
bool d_up[ND];
bool d_paused[ND];
byte d_floor[ND]; /* lk_fmemo: highest fence handed out here (forgotten on restart) */
byte d_ntok[ND];  /* used by REUSE_TOKEN only */

/* ---- per session: the daemon's record (lk_rec) ----------------------- */
bool s_open[MAXS];
bool s_held[MAXS]; /* rec->count > 0 */
byte s_cnt[MAXS];
byte s_tok[MAXS];
byte s_fence[MAXS];
bool s_wd[MAXS];   /* rec->watchdog */
byte s_lend[MAXS]; /* rec->lease_end_ms */
bool s_wait[MAXS]; /* a request waits in the queue (ld_lockwait) */
bool s_wwd[MAXS];  /* ... and asks for a watchdog lease */

/* ---- per session: the client ----------------------------------------- */
bool c_hold[MAXS];   /* believes it holds the lock */
byte c_fence[MAXS];
bool c_ev[MAXS];     /* lock_lost sent (or connection closed), not yet read */
bool c_paused[MAXS];
bool c_wd[MAXS];     /* its hold is a watchdog lease ... */
byte c_lend[MAXS];   /* ... or a fixed one, ending here (lease_ms) */

/* ---- the fenced resource --------------------------------------------- */
byte res_max; /* highest fence accepted */

/* ---- ghosts and budgets ---------------------------------------------- */
byte now;
byte n_grant; /* new acquisitions so far (at most MAXG) */
byte p2_max[ND]; /* highest fence daemon d handed out since it started */
bool lossy;      /* Redis lost data or failed over */
bool paused;     /* a daemon or a client was paused */
byte n_loss, n_failover, n_crash, n_pause, n_close;

/* Seeded NO_FLOOR: no floor at all, neither in the script nor held
 * against the fence by the daemon. */
#ifdef NO_FLOOR
#define FLOOR_CHECKED false
#else
#define FLOOR_CHECKED true
#endif

/* The scripts' results. */
byte rc, rcnt, rfence;

/* P4 is a promise only without data loss, failover or pauses: the known
 * limit of any lease. LIMITS drops that exemption, so that spin shows how
 * it breaks (make model-limits). */
#ifdef LIMITS
#define P4_EXEMPT false
#else
#define P4_EXEMPT (lossy || paused)
#endif

#ifdef LATE_LOST
#define CAP_AT(s) (s_lend[s])
#else
#define CAP_AT(s) (s_lend[s] - MARGIN)
#endif

/* A running daemon's timer is due: cap_on_timer must run first. */
#define DUE(s) (s_open[s] && s_held[s] && s_wd[s] && !d_paused[DMN(s)] && \
                now >= CAP_AT(s))
/* A running client reads its events before time goes on. */
#define UNREAD(s) (c_ev[s] && !c_paused[s])
#define URGENT(s) (DUE(s) || UNREAD(s))

/* ---- Redis ------------------------------------------------------------ */

/* PEXPIRE's end: the key is gone once its lease has run out. */
inline redis_expire()
{
    if
    :: m_tok != 0 && now >= m_exp -> m_tok = 0; m_cnt = 0; m_exp = 0
    :: else
    fi
}

/* src/lua/lock_acquire.lua: tk holder, lease (0 keeps it), reenter only,
 * floor (ARGV[4]). */
inline lock_acquire(tk, lease, reenter, floor)
{
    redis_expire();
    if
    :: m_tok != 0 && m_tok == tk ->
        m_cnt++;
        if
        :: lease > 0 -> m_exp = now + lease
        :: else
        fi;
        rc = GRANTED; rcnt = m_cnt; rfence = m_fence
    :: else ->
        if
        :: reenter && m_tok == 0 -> rc = ABSENT
        :: reenter && m_tok != 0 -> rc = OTHER
        :: !reenter && m_tok != 0 -> rc = TAKEN
        :: !reenter && m_tok == 0 ->
#ifndef NO_FLOOR
            if
            :: floor != 0 && m_fence < floor -> m_fence = floor
            :: else
            fi;
#endif
            m_fence++; n_grant++;
            m_tok = tk; m_cnt = 1; m_exp = now + lease;
            rc = GRANTED; rcnt = 1; rfence = m_fence
        fi
    fi
}

/* src/lua/lock_refence.lua: for a fresh grant whose fence came back at or
 * below the daemon's floor, raise the counter past the floor and take the
 * next fence (the lock is held by then). */
inline lock_refence(floor)
{
#ifndef NO_REFENCE_RAISE
    if
    :: m_fence < floor -> m_fence = floor
    :: else
    fi;
#endif
    m_fence++;
    rfence = m_fence
}

/* src/lua/lock_release.lua: one hold, or all of them (all). */
inline lock_release(tk, all)
{
    redis_expire();
    if
    :: m_tok == 0 -> rc = ABSENT
    :: m_tok != 0 && m_tok != tk -> rc = OTHER
    :: m_tok == tk && !all && m_cnt > 1 -> m_cnt--; rc = TAKEN /* KEPT */
    :: m_tok == tk && (all || m_cnt == 1) ->
        m_tok = 0; m_cnt = 0; m_exp = 0; rc = GRANTED /* RELEASED, published */
    fi
}

/* src/lua/lock_renew.lua with "never shorten" (the watchdog) or a check
 * only (lease 0); rfence carries the lease left. */
inline lock_renew(tk, lease)
{
    redis_expire();
    if
    :: m_tok == 0 -> rc = ABSENT
    :: m_tok != 0 && m_tok != tk -> rc = OTHER
    :: m_tok == tk ->
        if
        :: lease > 0 && m_exp < now + lease -> m_exp = now + lease
        :: else
        fi;
        rc = GRANTED; rfence = m_exp - now
    fi
}

/* src/lua/lock_extend.lua: sets the lease, shorter or longer. */
inline lock_extend(tk, lease)
{
    redis_expire();
    if
    :: m_tok == 0 -> rc = ABSENT
    :: m_tok != 0 && m_tok != tk -> rc = OTHER
    :: m_tok == tk -> m_exp = now + lease; rc = GRANTED
    fi
}

/* ---- the daemon ------------------------------------------------------- */

/* lk_rec_set_count(rec, 0): the record no longer holds. */
inline rec_forget(s)
{
    s_held[s] = false; s_cnt[s] = 0; s_tok[s] = 0; s_fence[s] = 0;
    s_wd[s] = false; s_lend[s] = 0
}

/* The client no longer holds. */
inline client_drop(s)
{
    c_hold[s] = false; c_fence[s] = 0; c_wd[s] = false; c_lend[s] = 0
}

/* A client stops using a fixed lease by itself, a margin before it ends:
 * no event comes for it. */
inline client_clock(s)
{
    if
    :: c_hold[s] && !c_wd[s] && now + MARGIN >= c_lend[s] -> client_drop(s)
    :: else
    fi
}

/* lk_rec_lost: tell the session, forget the hold; release also deletes it
 * in Redis, when Redis can be reached. */
inline lk_rec_lost(s, release)
{
    printf("s%d lk_rec_lost: lock_lost sent\n", s);
    client_event(s);
    if
    :: release -> lock_release(s_tok[s], true)
    :: release -> skip /* Redis unreachable */
    :: else
    fi;
    rec_forget(s)
}

/* lk_rec_retoken: a new acquisition gets a token never handed out. */
inline lk_rec_retoken(s)
{
#ifdef REUSE_TOKEN
    /* Seeded: a token made from a counter of the daemon's own. */
    d_ntok[DMN(s)]++;
    s_tok[s] = d_ntok[DMN(s)]
#else
    /* 128 random bits never repeat; the model reuses a token only once
     * nothing refers to it any more (Redis, a record), which nobody can
     * tell apart from a new one. */
    s_tok[s] = 1;
    do
    :: s_tok[s] == m_tok || s_tok[s] == r_tok || (s != 0 && s_tok[s] == s_tok[0]) ||
       (s != 1 && s_tok[s] == s_tok[1]) || (s != 2 && s_tok[s] == s_tok[2]) ->
        s_tok[s]++
    :: else -> break
    od
#endif
}

/* lock_lost (or the connection closing) reaches the client: a running
 * client stops using the lock as it arrives, a paused one reads it once
 * it runs again. */
inline client_event(s)
{
    if
    :: c_hold[s] && !c_paused[s] -> printf("s%d stops\n", s); client_drop(s)
    :: c_hold[s] && c_paused[s] -> c_ev[s] = true
    :: else
    fi
}

/* The client reads what came before the answer: lock_lost first. */
inline client_read(s)
{
    if
    :: c_ev[s] -> printf("s%d reads lock_lost\n", s);
        c_ev[s] = false; client_drop(s)
    :: else
    fi
}

/* acq_granted: a grant of rcnt holds with fence rfence. */
inline acq_granted(s, wd, lease)
{
    if
    :: !s_held[s] ->
        /* P2: the fences one daemon hands out strictly increase. */
        assert(rfence > p2_max[DMN(s)]);
        p2_max[DMN(s)] = rfence;
        if
        :: rfence > d_floor[DMN(s)] -> d_floor[DMN(s)] = rfence
        :: else
        fi;
        s_fence[s] = rfence;
        s_wd[s] = wd
    :: else -> s_wd[s] = s_wd[s] || wd
    fi;
    s_held[s] = true; s_cnt[s] = rcnt;
    s_lend[s] = m_exp; /* sent + PTTL */
    client_read(s);
    printf("s%d acq_granted token=%d count=%d fence=%d lease_end=%d\n", s,
           s_tok[s], s_cnt[s], s_fence[s], s_lend[s]);
    if
    :: !c_hold[s] ->
        /* P4: without data loss, failover or pauses, no two sessions
         * hold the key at once. */
        assert(P4_EXEMPT ||
               ((s == 0 || !c_hold[0]) && (s == 1 || !c_hold[1]) &&
                (s == 2 || !c_hold[2])));
        skip
    :: else
    fi;
    c_hold[s] = true; c_fence[s] = s_fence[s]; c_wd[s] = s_wd[s];
    c_lend[s] = s_lend[s]
}

/* acq_send and acq_on_reply: a lock request (lk_op_lock), first or
 * queued (acq_try). A reentry that finds its hold gone tells the session
 * (lk_rec_lost) and becomes a new acquisition under a new token. */
inline acq_send(s, wd, wait)
{
    lease = (wd -> WD : FIXED);
    if
    :: s_held[s] ->
        lock_acquire(s_tok[s], lease, true, d_floor[DMN(s)]);
        if
        :: rc == ABSENT || rc == OTHER ->
            lk_rec_lost(s, false);
            if
            :: rc == OTHER -> rc = TAKEN
            :: else
            fi
        :: else
        fi
    :: else
    fi;
    if
    :: !s_held[s] && rc != TAKEN && d_floor[DMN(s)] == 0 ->
        lk_rec_retoken(s);
        lock_acquire(s_tok[s], lease, false, 0)
    :: !s_held[s] && rc != TAKEN && d_floor[DMN(s)] > 0 ->
        /* The floor left out: the daemon holds the fence against it
         * (acq_refence), and raises the counter itself when it went back;
         * should that fail, the hold is given back (acq_refence_failed). */
        lk_rec_retoken(s);
        lock_acquire(s_tok[s], lease, false, 0);
        if
        :: rc == GRANTED && rcnt == 1 && rfence <= d_floor[DMN(s)] &&
           FLOOR_CHECKED ->
            if
            :: true -> lock_refence(d_floor[DMN(s)])
            :: true -> lock_release(s_tok[s], false); rc = FAILED
            :: true -> rc = FAILED /* the give-back lost too: the lease ends */
            fi
        :: else
        fi
    :: else
    fi;
    if
    :: rc == GRANTED -> s_wait[s] = false; s_wwd[s] = false; acq_granted(s, wd, lease)
    :: rc == TAKEN && wait -> s_wait[s] = true; s_wwd[s] = wd
    :: rc == TAKEN && !wait -> s_wait[s] = false; s_wwd[s] = false; client_read(s)
    :: rc == FAILED -> s_wait[s] = false; s_wwd[s] = false; client_read(s)
    fi
}

/* on_session_close: waiters leave, session-bound holds are released. */
inline on_session_close(s)
{
    s_wait[s] = false; s_wwd[s] = false;
    if
    :: s_held[s] -> lock_release(s_tok[s], true)
    :: s_held[s] -> skip /* Redis unreachable: the lease runs out */
    :: else
    fi;
    rec_forget(s);
    s_open[s] = false;
    client_drop(s); c_ev[s] = false
}

/* A daemon crash: its sessions end without a release; each client sees
 * its connection close (an event it must read before going on). */
inline daemon_crash(d)
{
    d_up[d] = false; d_paused[d] = false;
    d_floor[d] = 0; p2_max[d] = 0; d_ntok[d] = 0;
    for (i : 0 .. NS - 1) {
        if
        :: DMN(i) == d && s_open[i] ->
            s_open[i] = false; rec_forget(i);
            s_wait[i] = false; s_wwd[i] = false;
            client_event(i)
        :: else
        fi
    }
    i = 0
}

/* renew_send and renew_on_reply: the watchdog pass renews a watchdog
 * lease (or, for a fixed lease, only checks it). */
inline renew_on_reply(s)
{
    if
    :: s_wd[s] -> lock_renew(s_tok[s], WD)
    :: else -> lock_renew(s_tok[s], 0)
    fi;
    if
    :: rc == GRANTED -> s_lend[s] = now + rfence
    :: rc != GRANTED && (s_wd[s] || now < s_lend[s]) ->
#ifdef SILENT_LOSS
        /* Seeded: the hold is forgotten without lock_lost. */
        rec_forget(s)
#else
        lk_rec_lost(s, false)
#endif
    :: else -> rec_forget(s) /* a fixed lease ran out: no event */
    fi
}

/* extend_on_reply: the lease is what extend set. */
inline extend_on_reply(s)
{
    lock_extend(s_tok[s], EXT);
    if
    :: rc == GRANTED -> s_lend[s] = now + EXT; c_lend[s] = now + EXT
    :: else /* not_held; the next renewal finds out */
    fi
}

/* unlock_on_reply: one hold released; the last frees the key. */
inline unlock_on_reply(s)
{
    lock_release(s_tok[s], false);
    if
    :: rc == GRANTED || rc == ABSENT || rc == OTHER ->
        rec_forget(s);
        client_read(s); client_drop(s)
    :: else -> s_cnt[s]--
    fi
}

/* The client writes under its lock to the fenced resource, which accepts
 * a fence at least the highest it has seen. */
inline resource_write(s)
{
    if
    :: c_fence[s] >= res_max ->
        /* P1: never a write below one accepted. */
        assert(c_fence[s] >= res_max);
        res_max = c_fence[s]
    :: else /* refused */
    fi
}

/* Time goes on: P3 first. Every client that believes it holds, is not
 * paused and has no lock_lost to read, holds by its daemon's record; a
 * watchdog hold of a running daemon never outlives the lease it confirmed
 * less the margin; a client stops a fixed lease itself. */
inline tick()
{
    for (i : 0 .. NS - 1) {
        if
        :: c_hold[i] && !c_ev[i] && !c_paused[i] ->
            /* (After a failover the check of a fixed lease adopts the
             * new master's lease, which may end before the one the
             * client was told, and that end goes unreported.) */
            assert(s_held[i] || (n_failover > 0 && !c_wd[i]));
            assert(!s_wd[i] || d_paused[DMN(i)] || now + 1 <= s_lend[i] - MARGIN);
            /* Without data loss or failover the daemon's idea of the
             * lease is never longer than Redis' own. */
            assert(lossy || paused || m_tok != s_tok[i] || s_lend[i] <= m_exp);
        :: else
        fi
    }
    now++;
    printf("tick %d\n", now);
    for (i : 0 .. NS - 1) {
        if
        :: !c_paused[i] -> client_clock(i)
        :: else
        fi
    }
    i = 0
}

proctype world()
{
    byte i, s, lease;
    bool wd, wait;
    for (i : 0 .. ND - 1) {
        d_up[i] = true
    }
    for (i : 0 .. NS - 1) {
        s_open[i] = true
    }
    i = 0;
end:
    do
    /* ---- a client's requests (lk_op_lock, op_unlock, op_extend) ---- */
    :: atomic {
        PICK_S(s);
        if
        :: s_open[s] && !c_paused[s] && !s_wait[s] && !d_paused[DMN(s)] &&
           n_grant < MAXG && s_cnt[s] < MAXC ->
            if
            :: wd = true
            :: wd = false
            fi;
            if
            :: wait = true
            :: wait = false
            fi;
            printf("s%d lk_op_lock watchdog=%d wait=%d\n", s, wd, wait);
            acq_send(s, wd, wait)
        :: else
        fi;
        s = 0; wd = false; wait = false; lease = 0; rc = 0; rcnt = 0;
        rfence = 0
    }
    :: atomic {
        PICK_S(s);
        if
        :: s_open[s] && !c_paused[s] && c_hold[s] && !d_paused[DMN(s)] ->
            printf("s%d op_unlock\n", s);
            unlock_on_reply(s)
        :: else
        fi;
        s = 0; rc = 0
    }
    :: atomic {
        PICK_S(s);
        if
        :: s_open[s] && !c_paused[s] && c_hold[s] && s_held[s] &&
           !d_paused[DMN(s)] ->
            printf("s%d op_extend\n", s);
            extend_on_reply(s)
        :: else
        fi;
        s = 0; rc = 0
    }
    /* A waiting request tries again (woken by an unlock or the holder's
     * lease end: q_head_try) or runs out of wait_ms (acq_expire). */
    :: atomic {
        PICK_S(s);
        if
        :: s_wait[s] && !d_paused[DMN(s)] && n_grant < MAXG ->
            printf("s%d q_head_try\n", s);
            acq_send(s, s_wwd[s], true)
        :: s_wait[s] && !d_paused[DMN(s)] ->
            printf("s%d acq_expire\n", s);
            s_wait[s] = false; s_wwd[s] = false
        :: else
        fi;
        s = 0; lease = 0; rc = 0; rcnt = 0; rfence = 0
    }
    :: atomic {
        PICK_S(s);
        if
        :: c_hold[s] -> printf("s%d resource_write fence=%d\n", s, c_fence[s]);
            resource_write(s)
        :: else
        fi;
        s = 0
    }
    :: atomic {
        PICK_S(s);
        if
        :: s_open[s] && !c_paused[s] && !d_paused[DMN(s)] &&
           n_close < N_CLOSE ->
            n_close++;
            printf("s%d on_session_close\n", s);
            on_session_close(s)
        :: !s_open[s] && d_up[DMN(s)] && !c_paused[s] && !c_ev[s] ->
            printf("s%d new session\n", s);
            s_open[s] = true; client_drop(s) /* a new session */
        :: else
        fi;
        s = 0; rc = 0
    }
    /* ---- the daemon: the watchdog pass, its timer ---- */
    :: atomic {
        PICK_S(s);
        if
        :: s_open[s] && s_held[s] && !d_paused[DMN(s)] ->
            printf("s%d renew_on_reply\n", s);
            renew_on_reply(s)
        :: else
        fi;
        s = 0; rc = 0; rfence = 0
    }
    :: atomic {
        PICK_S(s);
        if
        :: DUE(s) -> printf("s%d cap_on_timer\n", s);
            lk_rec_lost(s, true)
        :: else
        fi;
        s = 0; rc = 0
    }
    /* ---- faults ---- */
    :: atomic {
        n_crash < N_CRASH -> n_crash++;
        PICK_D(s);
        printf("d%d crash\n", s);
        daemon_crash(s);
        s = 0
    }
    :: atomic {
        PICK_D(s);
        if
        :: !d_up[s] -> printf("d%d restart\n", s); d_up[s] = true
        :: else
        fi;
        s = 0
    }
    :: atomic {
        n_pause < N_PAUSE -> n_pause++; paused = true;
        PICK_D(s);
        if
        :: d_up[s] -> printf("d%d paused\n", s); d_paused[s] = true
        :: else
        fi;
        s = 0
    }
    :: atomic {
        n_pause < N_PAUSE -> n_pause++; paused = true;
        PICK_S(s);
        printf("s%d client paused\n", s);
        c_paused[s] = true;
        s = 0
    }
    :: atomic {
        PICK_D(s);
        if
        :: d_paused[s] -> printf("d%d resumed\n", s)
        :: else
        fi;
        d_paused[s] = false;
        s = 0
    }
    :: atomic {
        PICK_S(s);
        if
        :: c_paused[s] -> printf("s%d client resumed\n", s)
        :: else
        fi;
        c_paused[s] = false;
        client_read(s);
        client_clock(s);
        s = 0
    }
    /* Replication: the replica catches up with the master. */
    :: atomic {
        n_failover < N_FAILOVER &&
        (r_tok != m_tok || r_cnt != m_cnt || r_exp != m_exp || r_fence != m_fence) ->
        printf("replicate\n");
        r_tok = m_tok; r_cnt = m_cnt; r_exp = m_exp; r_fence = m_fence
    }
    /* FLUSHALL (the replica follows), or a restart without persistence
     * (the replica resyncs from the empty master). */
    :: atomic {
        n_loss < N_LOSS -> n_loss++; lossy = true;
        printf("redis data loss\n");
        m_tok = 0; m_cnt = 0; m_exp = 0; m_fence = 0
    }
    /* Failover: the replica becomes the master; what it had not received
     * is gone. */
    :: atomic {
        n_failover < N_FAILOVER -> n_failover++; lossy = true;
        printf("failover\n");
        m_tok = r_tok; m_cnt = r_cnt; m_exp = r_exp; m_fence = r_fence
    }
    :: atomic {
        now < MAXT && !URGENT(0) && !URGENT(1) && !URGENT(2) -> tick()
    }
    od
}

init
{
    run world()
}
