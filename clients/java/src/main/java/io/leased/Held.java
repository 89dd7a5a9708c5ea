package io.leased;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A held lock, side of a read-write lock, group of keys or semaphore grant.
 * It belongs to this handle, not to the thread that took it: any thread may
 * {@link #close()} it (by its token), once. {@link #lost()} completes when the
 * daemon reports the hold lost or its session ends with the connection;
 * stop writing under it then.
 */
public final class Held implements AutoCloseable {
    private final Leased ld;
    final Leased.Conn conn;
    private final List<String> keys;
    private final boolean group;
    private final Map<String, Object> reply;
    private final String mode;
    private final boolean sem;
    private final CompletableFuture<LockLost> lost = new CompletableFuture<>();
    private final AtomicBoolean closed = new AtomicBoolean();
    private volatile boolean gone;
    // Keys at risk (lock_at_risk until lock_safe), and the future of the
    // episode under way or to come; both under this.
    private final java.util.Set<String> risky = new java.util.HashSet<>();
    private CompletableFuture<Map<String, Object>> risk = new CompletableFuture<>();

    Held(Leased ld, Leased.Conn conn, List<String> keys, boolean group, Map<String, Object> reply,
            String mode, boolean sem) {
        this.ld = ld;
        this.conn = conn;
        this.keys = List.copyOf(keys);
        this.group = group;
        this.reply = reply;
        this.mode = mode;
        this.sem = sem;
    }

    /** The key (the first key of a group). */
    public String key() {
        return keys.get(0);
    }

    /** Every key of the hold: one, or the group's. */
    public List<String> keys() {
        return keys;
    }

    public String token() {
        return (String) reply.get("token");
    }

    /** The fencing token of a one-key lock (-1 for a group or a semaphore). */
    public long fence() {
        return reply.get("fence") instanceof Number n ? n.longValue() : -1;
    }

    /** A group's fence per key; empty for one key. */
    @SuppressWarnings("unchecked")
    public Map<String, Long> fences() {
        Object f = reply.get("fences");
        return f instanceof Map<?, ?> ? (Map<String, Long>) f : Map.of();
    }

    /** The hold count after this acquisition (2 on the first reentry). */
    public long count() {
        return reply.get("count") instanceof Number n ? n.longValue() : 0;
    }

    /** How long the hold is guaranteed from its grant without renewal. */
    public long leaseMs() {
        return reply.get("lease_ms") instanceof Number n ? n.longValue() : -1;
    }

    /** The grant as the daemon sent it. */
    public Map<String, Object> reply() {
        return reply;
    }

    /** Completes (with the reason) when the hold is lost; never completes for a clean close. */
    public CompletableFuture<LockLost> lost() {
        return lost;
    }

    /** Whether the hold has been reported lost. */
    public boolean isLost() {
        return gone;
    }

    /**
     * Whether the hold is at risk: from {@code lock_at_risk} ({@code
     * sem_at_risk}) until {@code lock_safe} ({@code sem_safe}) a renewal failed
     * or is late and the lease may end, so finish or pause the writes. For a
     * group, while any of its keys is at risk.
     */
    public synchronized boolean atRisk() {
        return !risky.isEmpty();
    }

    /**
     * Completes with the {@code lock_at_risk} event when the hold is put at
     * risk: already done while it is, else at the next episode. After {@code
     * lock_safe} a new future stands for the next one.
     */
    public synchronized CompletableFuture<Map<String, Object>> atRiskFuture() {
        return risk;
    }

    void risk(String key, boolean atRisk, Map<String, Object> event) {
        CompletableFuture<Map<String, Object>> started = null;
        synchronized (this) {
            boolean was = !risky.isEmpty();
            if (atRisk) {
                risky.add(key);
            } else {
                risky.remove(key);
            }
            if (!was && atRisk) {
                started = risk;
            } else if (was && risky.isEmpty()) {
                risk = new CompletableFuture<>();
            }
        }
        if (started != null) {
            // Off the reader thread, as for lost().
            CompletableFuture<Map<String, Object>> f = started;
            CompletableFuture.runAsync(() -> f.complete(event));
        }
    }

    boolean group() {
        return group;
    }

    boolean matches(String key, String token) {
        return keys.contains(key) && token != null && token.equals(token());
    }

    void lose(String key, String token, String reason, Map<String, Object> event) {
        if (gone) {
            return;
        }
        gone = true;
        LockLost why = new LockLost(key, token, reason, event);
        // Completed off the connection's reader thread, so that a callback
        // that calls the daemon does not wait for a reply only that thread
        // would read.
        CompletableFuture.runAsync(() -> lost.complete(why));
    }

    /** Set the remaining lease to TTL_MS (not for semaphores). */
    public Map<String, Object> extend(long ttlMs) {
        Map<String, Object> f = keyFields();
        f.put("ttl_ms", ttlMs);
        return ld.callOn(conn, "extend", f, 0, null);
    }

    java.util.LinkedHashMap<String, Object> keyFields() {
        java.util.LinkedHashMap<String, Object> f = new java.util.LinkedHashMap<>();
        if (group) {
            f.put("keys", keys);
        } else {
            f.put("key", keys.get(0));
        }
        f.put("token", token());
        if (mode != null) {
            f.put("mode", mode);
        }
        return f;
    }

    /**
     * Give the hold back (one level of a reentrant hold). A hold already lost
     * ends without an error (it was told through {@link #lost()}); so does one
     * whose connection failed, which took its session's locks along.
     */
    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        try {
            if (conn.isDead()) {
                lose(key(), token(), "connection_closed", null);
                return;
            }
            ld.callOn(conn, sem ? "sem.release" : "unlock", sem ? semFields() : keyFields(), 0, null);
        } catch (LeasedException e) {
            if (e.code().equals("io")) {
                lose(key(), token(), "connection_closed", null);
            } else if (!e.code().equals("not_held") || !(sem || gone)) {
                throw e;
            }
        } finally {
            conn.removeHold(this);
        }
    }

    private Map<String, Object> semFields() {
        java.util.LinkedHashMap<String, Object> f = new java.util.LinkedHashMap<>();
        f.put("key", keys.get(0));
        f.put("token", token());
        return f;
    }

    @Override
    public String toString() {
        return "Held[" + (group ? keys : key()) + ", fence " + fence() + "]";
    }
}
