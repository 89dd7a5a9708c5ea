package io.leased;

/** The read (shared) and write (exclusive) sides of one read-write lock. */
public final class RWLock {
    private final Leased ld;
    private final String key;

    RWLock(Leased ld, String key) {
        this.ld = ld;
        this.key = key;
    }

    public Held readLock(LockOptions o) {
        return ld.lock(key, o.mode("read"));
    }

    public Held writeLock(LockOptions o) {
        return ld.lock(key, o.mode("write"));
    }

    /** The read side without blocking; see {@link Leased#lockAsync(String, LockOptions)}. */
    public java.util.concurrent.CompletableFuture<Held> readLockAsync(LockOptions o) {
        return ld.lockAsync(key, o.mode("read"));
    }

    public java.util.concurrent.CompletableFuture<Held> writeLockAsync(LockOptions o) {
        return ld.lockAsync(key, o.mode("write"));
    }

    public Held readLock() {
        return readLock(new LockOptions());
    }

    public Held writeLock() {
        return writeLock(new LockOptions());
    }
}
