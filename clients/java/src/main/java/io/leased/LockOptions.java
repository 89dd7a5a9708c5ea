package io.leased;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * How to take a lock or a semaphore: {@code new LockOptions().waitMs(5000)}.
 * Absent values are the daemon's defaults (try once, a watchdog lease renewed
 * while the connection lives), except the owner: a blocking call holds under
 * the calling thread's ({@link Leased#threadOwner()}), an async call under
 * one of its own.
 */
public final class LockOptions {
    long waitMs;
    Long ttlMs;
    String owner;
    String mode;
    boolean detach;
    long permits = 1;

    /** 0: try once (the default); positive: wait up to that long; -1: wait without limit. */
    public LockOptions waitMs(long ms) {
        this.waitMs = ms;
        return this;
    }

    /** A fixed lease, not renewed. */
    public LockOptions ttlMs(long ms) {
        this.ttlMs = ms;
        return this;
    }

    /** Reentrancy is per (session, owner): name one to reenter across threads or async calls. */
    public LockOptions owner(String owner) {
        this.owner = owner;
        return this;
    }

    /** A lock that outlives the session (needs ttlMs). */
    public LockOptions detach(boolean detach) {
        this.detach = detach;
        return this;
    }

    /** Permits of a semaphore (default 1). */
    public LockOptions permits(long permits) {
        this.permits = permits;
        return this;
    }

    LockOptions copy() {
        LockOptions o = new LockOptions();
        o.waitMs = waitMs;
        o.ttlMs = ttlMs;
        o.owner = owner;
        o.mode = mode;
        o.detach = detach;
        o.permits = permits;
        return o;
    }

    LockOptions mode(String mode) {
        LockOptions o = copy();
        o.mode = mode;
        return o;
    }

    Map<String, Object> fields() {
        Map<String, Object> f = new LinkedHashMap<>();
        if (waitMs != 0) {
            f.put("wait_ms", waitMs);
        }
        if (ttlMs != null) {
            f.put("ttl_ms", ttlMs);
        }
        if (owner != null) {
            f.put("owner", owner);
        }
        if (mode != null) {
            f.put("mode", mode);
        }
        if (detach) {
            f.put("detach", true);
        }
        return f;
    }
}
