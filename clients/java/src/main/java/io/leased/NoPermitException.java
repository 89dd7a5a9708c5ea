package io.leased;

/** {@code semaphore()} got no permit within its wait; code {@code no_permit}. */
public final class NoPermitException extends LeasedException {
    private static final long serialVersionUID = 1L;
    private final long available;

    NoPermitException(String key, long available) {
        super("no_permit", "semaphore '" + key + "': no permit (" + available + " available)");
        this.available = available;
    }

    public long available() {
        return available;
    }
}
