package io.leased;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Several connections shared by threads: each call goes to the next one
 * (every connection is thread-safe, so none is checked out), except a lock,
 * which goes to its key's connection, so a thread reenters a lock it holds
 * as on one connection. A hold stays on the connection that took it, and
 * {@code cached()} fills on the connection that got the lease. A connection
 * whose daemon went away opens a new one at its next call, so a daemon
 * restart costs the pool's callers no errors (only the holds of the old
 * sessions, which are reported lost).
 */
public final class LeasedPool implements AutoCloseable {
    private final List<Leased> conns = new ArrayList<>();
    private final AtomicInteger next = new AtomicInteger();

    /** A pool of 8 connections to $LEASED_SOCKET. */
    public LeasedPool() {
        this(Leased.builder());
    }

    public LeasedPool(String target, int size) {
        this(Leased.builder().target(target).size(size));
    }

    LeasedPool(Leased.Builder b) {
        if (b.size < 1) {
            throw new LeasedException("invalid", "a pool needs at least one connection");
        }
        try {
            for (int i = 0; i < b.size; i++) {
                conns.add(new Leased(b));
            }
        } catch (LeasedException e) {
            close();
            throw e;
        }
    }

    /** One of the pool's connections (for several calls on one session). */
    public Leased connection() {
        return conns.get(Math.floorMod(next.getAndIncrement(), conns.size()));
    }

    /**
     * The connection KEY's locks go to, so that a thread's second lock of
     * a key meets the session of its first and reenters; a group goes by
     * its smallest key. A key the call refuses (null) goes anywhere.
     */
    Leased connectionFor(Collection<String> keys) {
        String k = null;
        for (Object o : keys == null ? List.of() : keys) {
            if (!(o instanceof String s)) {
                return connection();
            }
            k = k == null || s.compareTo(k) < 0 ? s : k;
        }
        return k == null ? connection() : conns.get(Math.floorMod(k.hashCode(), conns.size()));
    }

    Leased connectionFor(String key) {
        return key == null ? connection() : connectionFor(List.of(key));
    }

    @Override
    public void close() {
        for (Leased l : conns) {
            l.close();
        }
    }

    public Map<String, Object> call(String op, Map<String, Object> fields) {
        return connection().call(op, fields);
    }

    public Map<String, Object> tryLock(String key, LockOptions o) {
        return connectionFor(key).tryLock(key, o);
    }

    public Held lock(String key) {
        return connectionFor(key).lock(key);
    }

    public Held lock(String key, LockOptions o) {
        return connectionFor(key).lock(key, o);
    }

    public Held lock(Collection<String> keys, LockOptions o) {
        return connectionFor(keys).lock(keys, o);
    }

    public RWLock rwlock(String key) {
        return connectionFor(key).rwlock(key);
    }

    public Held semaphore(String key, long limit, LockOptions o) {
        return connection().semaphore(key, limit, o);
    }

    public <E extends Exception> Object cached(String key, Leased.Task<?, E> loader) throws E {
        return connection().cached(key, loader);
    }

    public <E extends Exception> Object cached(String key, Leased.Task<?, E> loader, Long ttlMs,
            Long waitMs) throws E {
        return connection().cached(key, loader, ttlMs, waitMs);
    }

    public Map<String, Object> invalidate(String... keys) {
        return connection().invalidate(keys);
    }

    public Map<String, Object> invalidate(Collection<String> keys) {
        return connection().invalidate(keys);
    }

    public <T, E extends Exception> T update(String key, Leased.Task<T, E> writer) throws E {
        return connection().update(key, writer);
    }

    public <T, E extends Exception> T update(Collection<String> keys, Leased.Task<T, E> writer)
            throws E {
        return connection().update(keys, writer);
    }

    /** By token (a pool's connections are different sessions: an owner names one). */
    public Map<String, Object> unlock(String key, String token, String requestId) {
        return connection().unlock(key, null, token, requestId);
    }

    public Map<String, Object> rateAcquire(String key, long rate, long perMs) {
        return connection().rateAcquire(key, rate, perMs);
    }

    public Map<String, Object> rateAcquire(String key, long rate, long perMs, Long burst,
            long permits, long waitMs) {
        return connection().rateAcquire(key, rate, perMs, burst, permits, waitMs);
    }

    public Map<String, Object> warm(Map<String, ?> entries, Long ttlMs) {
        return connection().warm(entries, ttlMs);
    }

    public Map<String, Object> warm(Collection<Leased.Entry> entries, Long ttlMs) {
        return connection().warm(entries, ttlMs);
    }

    public <E extends Exception> Object cached(String key, Leased.Task<?, E> loader, Long ttlMs,
            Long waitMs, String bloom) throws E {
        return connection().cached(key, loader, ttlMs, waitMs, bloom);
    }

    public Map<String, Object> bloomCreate(String filter, long capacity, double errorRate) {
        return connection().bloomCreate(filter, capacity, errorRate);
    }

    public List<Boolean> bloomAdd(String filter, Collection<String> keys) {
        return connection().bloomAdd(filter, keys);
    }

    public List<Boolean> bloomCheck(String filter, Collection<String> keys) {
        return connection().bloomCheck(filter, keys);
    }

    public Leased.Versioned read(String key) {
        return connection().read(key);
    }

    public Leased.Versioned read(String key, boolean lease, Long waitMs) {
        return connection().read(key, lease, waitMs);
    }

    public Leased.Written write(String key, Object value, Long ttlMs, Long ifVersion) {
        return connection().write(key, value, ttlMs, ifVersion);
    }

    public Leased.Written fill(String key, String lease, Object value, Long ttlMs,
            Long ifVersion) {
        return connection().fill(key, lease, value, ttlMs, ifVersion);
    }
}
