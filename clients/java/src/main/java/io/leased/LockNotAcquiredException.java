package io.leased;

/** {@code lock()} found the lock taken for longer than its wait; code {@code not_acquired}. */
public final class LockNotAcquiredException extends LeasedException {
    private static final long serialVersionUID = 1L;
    private final long ttlMs;

    LockNotAcquiredException(String key, long ttlMs) {
        super("not_acquired", "lock '" + key + "' is held elsewhere (" + ttlMs + " ms left)");
        this.ttlMs = ttlMs;
    }

    /** The holder's remaining lease (-1 when unknown). */
    public long ttlMs() {
        return ttlMs;
    }
}
