package io.leased;

import java.util.Map;

/**
 * Every error the client throws. {@link #code()} is the protocol's code for
 * an error reply ({@code not_held}, {@code busy}, ...; the reply is
 * {@link #reply()}) or the client's own: {@code connect} (the daemon could
 * not be reached; the message names the socket and what to check),
 * {@code io} (the connection failed: its session and the session's locks
 * are gone), {@code timeout}, {@code invalid} (a bad argument),
 * {@code bad_value} (a cached value the serializer cannot read),
 * {@code not_acquired} and {@code no_permit}. An I/O error behind one is
 * its cause.
 */
public class LeasedException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final String code;
    private final transient Map<String, Object> reply;

    public LeasedException(String code, String message) {
        this(code, message, null, null);
    }

    public LeasedException(String code, String message, Map<String, Object> reply,
            Throwable cause) {
        super(code + ": " + message, cause);
        this.code = code;
        this.reply = reply == null ? Map.of() : reply;
    }

    /** The error reply of the daemon as an exception. */
    static LeasedException of(Map<String, Object> reply) {
        Object e = reply.get("error");
        String code = "internal";
        String message = "error reply without an error object";
        if (e instanceof Map<?, ?> m) {
            code = String.valueOf(m.get("code"));
            message = String.valueOf(m.get("message"));
        }
        return new LeasedException(code, message, reply, null);
    }

    /** The protocol's error code, or the client's own (see the class). */
    public String code() {
        return code;
    }

    /** The error reply as the daemon sent it (empty for the client's own errors). */
    public Map<String, Object> reply() {
        return reply;
    }

    /** The error object's {@code reason} ({@code absent}, {@code other} for not_held), or null. */
    public String reason() {
        if (reply.get("error") instanceof Map<?, ?> m && m.get("reason") instanceof String r) {
            return r;
        }
        return null;
    }

    /**
     * True when the request left for Redis and no answer came
     * ({@code redis_unavailable} with {@code "outcome":"unknown"}): it may
     * have taken effect. An unlock with a request id is then safe to repeat.
     */
    public boolean outcomeUnknown() {
        return reply.get("error") instanceof Map<?, ?> m && "unknown".equals(m.get("outcome"));
    }
}
