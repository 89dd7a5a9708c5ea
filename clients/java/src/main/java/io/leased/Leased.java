package io.leased;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.StandardProtocolFamily;
import java.net.StandardSocketOptions;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;

/**
 * One connection to leased: one session. Thread-safe: calls from many
 * threads share the connection, each matched to its reply by id (a lock that
 * waits does not hold up the others), and a reader thread takes events
 * ({@code lock_lost}) as they come, also while the application makes no
 * call. When the connection fails (the daemon restarted, say), its session's
 * holds are lost and the next call opens a new connection (a new session).
 *
 * <pre>{@code
 * try (var ld = new Leased()) {                 // $LEASED_SOCKET
 *     try (var held = ld.lock("order:42", new LockOptions().waitMs(5000))) {
 *         ship(42, held.fence());
 *     }
 * }
 * }</pre>
 */
public final class Leased implements AutoCloseable {
    /** Where the daemon listens when neither a target nor LEASED_SOCKET is given. */
    public static final String DEFAULT_SOCKET = "/run/leased/leased.sock";
    /** The version of the daemon's protocol this client speaks. */
    public static final int PROTOCOL = 1;

    final String target;
    final long timeoutMs;
    final String client;
    final String auth;
    final Serializer serializer;
    final Consumer<Map<String, Object>> onEvent;
    private final AtomicLong ids = new AtomicLong();
    private final AtomicLong owners = new AtomicLong();
    private final Object opening = new Object();
    private volatile Conn conn;
    private volatile boolean closed;

    /** A connection to $LEASED_SOCKET (else {@link #DEFAULT_SOCKET}). */
    public Leased() {
        this(builder());
    }

    /** A connection to TARGET: a Unix socket path, or "host:port". */
    public Leased(String target) {
        this(builder().target(target));
    }

    Leased(Builder b) {
        this.target = b.target != null ? b.target : defaultTarget();
        this.timeoutMs = b.timeout.toMillis();
        this.client = b.client;
        this.auth = b.auth;
        this.serializer = b.serializer;
        this.onEvent = b.onEvent;
        conn();
    }

    public static Builder builder() {
        return new Builder();
    }

    static String defaultTarget() {
        String s = System.getenv("LEASED_SOCKET");
        return s != null && !s.isEmpty() ? s : DEFAULT_SOCKET;
    }

    /** Options of a connection (and of a {@link LeasedPool}). */
    public static final class Builder {
        String target;
        Duration timeout = Duration.ofSeconds(30);
        String client = "java";
        String auth;
        Serializer serializer = Serializer.JSON;
        Consumer<Map<String, Object>> onEvent;
        int size = 8;

        public Builder target(String target) {
            this.target = target;
            return this;
        }

        /** How long to wait for a reply, on top of a request's own wait_ms. */
        public Builder timeout(Duration timeout) {
            this.timeout = timeout;
            return this;
        }

        /** The name given in hello. */
        public Builder client(String client) {
            this.client = client;
            return this;
        }

        /** The secret of hello, for a listener that requires auth. */
        public Builder auth(String auth) {
            this.auth = auth;
            return this;
        }

        public Builder serializer(Serializer serializer) {
            this.serializer = serializer;
            return this;
        }

        /** Called with every event, on the connection's reader thread: it must not wait for replies. */
        public Builder onEvent(Consumer<Map<String, Object>> onEvent) {
            this.onEvent = onEvent;
            return this;
        }

        /** Connections of a pool. */
        public Builder size(int size) {
            this.size = size;
            return this;
        }

        public Leased build() {
            return new Leased(this);
        }

        public LeasedPool buildPool() {
            return new LeasedPool(this);
        }
    }

    // --- the connection -----------------------------------------------------

    /** The open connection; a new one (a new session) when the last one failed. */
    Conn conn() {
        Conn c = conn;
        if (c != null && !c.isDead()) {
            return c;
        }
        synchronized (opening) {
            if (closed) {
                throw new LeasedException("io", "the connection to leased at " + target
                        + " was closed");
            }
            c = conn;
            if (c == null || c.isDead()) {
                c = new Conn(this);
                conn = c;
                c.hello();
            }
            return c;
        }
    }

    /** The session id the daemon gave the current connection. */
    public String session() {
        return conn().session;
    }

    /** The optional parts the daemon offers (hello's features). */
    public List<String> features() {
        return conn().features;
    }

    /** Whether the daemon offers FEATURE (check before relying on it). */
    public boolean hasFeature(String feature) {
        return features().contains(feature);
    }

    @Override
    public void close() {
        synchronized (opening) {
            closed = true;
        }
        Conn c = conn;
        if (c != null) {
            c.kill(null);
        }
    }

    /**
     * Send one request and return its reply; an error reply is a
     * {@link LeasedException}. A request with wait_ms gets that much longer
     * than the timeout (-1: no limit).
     */
    public Map<String, Object> call(String op, Map<String, Object> fields) {
        long wait = fields.get("wait_ms") instanceof Number n ? n.longValue()
                : op.startsWith("cache.") ? 3000 : 0;
        return callOn(null, op, new LinkedHashMap<>(fields), wait, null);
    }

    public Map<String, Object> ping() {
        return call("ping", Map.of());
    }

    /** The reply of OP on C (the current connection when null), or the error it carries. */
    Map<String, Object> callOn(Conn c, String op, Map<String, Object> fields, long waitMs,
            Consumer<Map<String, Object>> onLate) {
        return await(send(c, op, fields), waitMs, onLate);
    }

    /** A request sent; its reply completes {@code reply}. */
    record Sent(Conn conn, long id, CompletableFuture<Map<String, Object>> reply) {}

    Sent send(Conn c, String op, Map<String, Object> fields) {
        boolean pinned = c != null;
        Conn on = pinned ? c : conn();
        try {
            return on.send(op, fields);
        } catch (WriteFailed e) {
            if (pinned) {
                throw e.error;
            }
            // The daemon closed the connection while it was idle (a restart,
            // say): no session read the request, so it goes out on a new
            // connection instead of failing.
            return conn().send(op, fields);
        }
    }

    Map<String, Object> await(Sent s, long waitMs, Consumer<Map<String, Object>> onLate) {
        Map<String, Object> reply;
        try {
            reply = waitMs < 0 ? s.reply.get()
                    : s.reply.get(timeoutMs + waitMs, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            s.conn.abandon(s.id, onLate);
            throw new LeasedException("timeout", "no reply from leased at " + target
                    + " in time", null, e);
        } catch (InterruptedException e) {
            s.conn.abandon(s.id, onLate);
            Thread.currentThread().interrupt();
            throw new LeasedException("timeout", "interrupted while waiting for leased at "
                    + target, null, e);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof LeasedException le) {
                throw le;
            }
            throw new LeasedException("io", String.valueOf(e.getCause()), null, e.getCause());
        }
        if (!Boolean.TRUE.equals(reply.get("ok"))) {
            throw LeasedException.of(reply);
        }
        return reply;
    }

    static final class WriteFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final transient LeasedException error;

        WriteFailed(LeasedException error) {
            super(error);
            this.error = error;
        }
    }

    static LeasedException connectError(String target, IOException e) {
        String what = e.getMessage() != null ? e.getMessage() : e.getClass().getSimpleName();
        String hint;
        if (what.contains("Permission denied") || e instanceof java.nio.file.AccessDeniedException) {
            hint = "is this user in the socket's group (listen.unix_group in leased.yml)?";
        } else if (tcpAddress(target) != null) {
            hint = "is leased running and listening there?";
        } else {
            hint = "is leased running, and is $LEASED_SOCKET (or the path given) its"
                    + " listen.unix socket?";
        }
        return new LeasedException("connect", "cannot connect to leased at " + target + ": "
                + what + "; " + hint, null, e);
    }

    static InetSocketAddress tcpAddress(String target) {
        int colon = target.lastIndexOf(':');
        if (target.contains("/") || colon <= 0 || colon == target.length() - 1) {
            return null;
        }
        String port = target.substring(colon + 1);
        if (!port.chars().allMatch(Character::isDigit)) {
            return null;
        }
        String host = target.substring(0, colon).replace("[", "").replace("]", "");
        return new InetSocketAddress(host, Integer.parseInt(port));
    }

    /** One connection: its socket, its requests in flight, its holds and its reader. */
    static final class Conn {
        final Leased ld;
        final SocketChannel ch;
        final ConcurrentHashMap<Long, CompletableFuture<Map<String, Object>>> pending =
                new ConcurrentHashMap<>();
        final ConcurrentHashMap<Long, Consumer<Map<String, Object>>> late =
                new ConcurrentHashMap<>();
        final ConcurrentHashMap<String, CopyOnWriteArrayList<Held>> holds =
                new ConcurrentHashMap<>();
        // lock_lost events for a token whose hold was not registered yet: its
        // grant and the event can be read before the caller registers it.
        final ConcurrentHashMap<String, Map<String, Object>> early = new ConcurrentHashMap<>();
        // A SocketChannel is interruptible: a write by a thread that is
        // interrupted meanwhile (a caller giving up a blocking lock) would
        // close it, and with it the session and its locks. Writes therefore
        // go out on a thread of the connection's own.
        final ExecutorService writer = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "leased-writer");
            t.setDaemon(true);
            return t;
        });
        volatile boolean dead;
        volatile String session;
        volatile List<String> features = List.of();

        Conn(Leased ld) {
            this.ld = ld;
            SocketChannel c = null;
            try {
                InetSocketAddress tcp = tcpAddress(ld.target);
                SocketAddress addr = tcp != null ? tcp : UnixDomainSocketAddress.of(ld.target);
                if (tcp != null) {
                    // Whichever family the host resolves to, within the timeout.
                    c = SocketChannel.open();
                    c.setOption(StandardSocketOptions.TCP_NODELAY, true);
                    c.socket().connect(addr, (int) Math.min(ld.timeoutMs, Integer.MAX_VALUE));
                } else {
                    c = SocketChannel.open(StandardProtocolFamily.UNIX);
                    c.connect(addr);
                }
            } catch (IOException | RuntimeException e) {
                closeQuietly(c);
                IOException io = e instanceof IOException i ? i : new IOException(e.getMessage(), e);
                throw connectError(ld.target, io);
            }
            this.ch = c;
            Thread t = new Thread(this::read, "leased-reader");
            t.setDaemon(true);
            t.start();
        }

        static void closeQuietly(SocketChannel c) {
            if (c != null) {
                try {
                    c.close();
                } catch (IOException ignored) {
                    // closing: nothing left to do with it
                }
            }
        }

        @SuppressWarnings("unchecked")
        void hello() {
            Map<String, Object> f = new LinkedHashMap<>();
            if (ld.client != null) {
                f.put("client", ld.client);
            }
            if (ld.auth != null) {
                f.put("auth", ld.auth);
            }
            Map<String, Object> r;
            try {
                r = ld.callOn(this, "hello", f, 0, null);
            } catch (LeasedException e) {
                kill(null);
                throw e;
            }
            session = String.valueOf(r.get("session"));
            if (r.get("features") instanceof List<?> l) {
                features = List.copyOf((List<String>) l);
            }
        }

        boolean isDead() {
            return dead;
        }

        Sent send(String op, Map<String, Object> fields) {
            long id = ld.ids.incrementAndGet();
            Map<String, Object> req = new LinkedHashMap<>();
            req.put("op", op);
            req.put("id", id);
            req.putAll(fields);
            byte[] line = (Json.encode(req) + "\n").getBytes(StandardCharsets.UTF_8);
            CompletableFuture<Map<String, Object>> f = new CompletableFuture<>();
            pending.put(id, f);
            if (dead) {
                pending.remove(id);
                throw new WriteFailed(gone());
            }
            try {
                write(line);
            } catch (IOException e) {
                pending.remove(id);
                LeasedException err = new LeasedException("io", "the connection to leased at "
                        + ld.target + " failed: " + e.getMessage()
                        + "; its session and the session's locks are gone", null, e);
                kill(err);
                throw new WriteFailed(err);
            }
            return new Sent(this, id, f);
        }

        void write(byte[] line) throws IOException {
            Future<?> done;
            try {
                done = writer.submit(() -> {
                    ByteBuffer b = ByteBuffer.wrap(line);
                    while (b.hasRemaining()) {
                        ch.write(b);
                    }
                    return null;
                });
            } catch (java.util.concurrent.RejectedExecutionException e) {
                throw new IOException("the connection is closed", e);
            }
            boolean interrupted = false;
            try {
                while (true) {
                    try {
                        done.get();
                        return;
                    } catch (InterruptedException e) {
                        interrupted = true; // the write is quick: finish it
                    } catch (ExecutionException e) {
                        if (e.getCause() instanceof IOException io) {
                            throw io;
                        }
                        throw new IOException(String.valueOf(e.getCause()), e.getCause());
                    }
                }
            } finally {
                if (interrupted) {
                    Thread.currentThread().interrupt();
                }
            }
        }

        /** Send a request whose reply nobody waits for (a cleanup). */
        void post(String op, Map<String, Object> fields) {
            try {
                send(op, fields).reply.whenComplete((r, e) -> { });
            } catch (RuntimeException ignored) {
                // the connection is gone, and what the cleanup was for with it
            }
        }

        /**
         * The caller of ID stopped waiting: its reply, when it comes, goes to
         * ON_LATE (a late grant is given back), and its wait is cancelled.
         */
        void abandon(long id, Consumer<Map<String, Object>> onLate) {
            CompletableFuture<Map<String, Object>> f = pending.remove(id);
            if (f == null) {
                return;
            }
            if (f.isDone() || !f.complete(null)) {
                Map<String, Object> r = f.getNow(null);
                if (r != null && onLate != null) {
                    onLate.accept(r);
                }
                return;
            }
            if (onLate != null) {
                late.put(id, onLate);
            }
            if (features.contains("cancel")) {
                post("cancel", Map.of("target", id));
            }
        }

        LeasedException gone() {
            return new LeasedException("io", "leased at " + ld.target + " closed the connection;"
                    + " its session and the session's locks are gone");
        }

        private void read() {
            ByteBuffer buf = ByteBuffer.allocate(65536);
            java.io.ByteArrayOutputStream line = new java.io.ByteArrayOutputStream();
            LeasedException why = null;
            try {
                while (true) {
                    buf.clear();
                    int n = ch.read(buf);
                    if (n < 0) {
                        break;
                    }
                    byte[] a = buf.array();
                    int start = 0;
                    for (int i = 0; i < n; i++) {
                        if (a[i] == '\n') {
                            line.write(a, start, i - start);
                            take(line.toString(StandardCharsets.UTF_8));
                            line.reset();
                            start = i + 1;
                        }
                    }
                    line.write(a, start, n - start);
                }
            } catch (IOException e) {
                if (!dead) {
                    why = new LeasedException("io", "the connection to leased at " + ld.target
                            + " failed: " + e.getMessage()
                            + "; its session and the session's locks are gone", null, e);
                }
            }
            kill(why);
        }

        @SuppressWarnings("unchecked")
        private void take(String text) {
            if (text.isBlank()) {
                return;
            }
            Map<String, Object> msg;
            try {
                msg = (Map<String, Object>) Json.decode(text);
            } catch (RuntimeException e) {
                return;
            }
            Object id = msg.get("id");
            if (id == null && msg.containsKey("event")) {
                event(msg);
                return;
            }
            if (id instanceof Long l) {
                CompletableFuture<Map<String, Object>> f = pending.remove(l);
                if (f != null) {
                    f.complete(msg);
                    return;
                }
                Consumer<Map<String, Object>> after = late.remove(l);
                if (after != null) {
                    after.accept(msg);
                }
                return;
            }
            // A reply without an id answers a line the daemon could not read:
            // with one request in flight, that one.
            if (id == null && pending.size() == 1) {
                for (Long k : pending.keySet()) {
                    CompletableFuture<Map<String, Object>> f = pending.remove(k);
                    if (f != null) {
                        f.complete(msg);
                    }
                }
            }
        }

        /** The events that put a key of a hold at risk (true) or take it out. */
        private static final Map<Object, Boolean> RISK = Map.of("lock_at_risk", true,
                "sem_at_risk", true, "lock_safe", false, "sem_safe", false);

        private void event(Map<String, Object> msg) {
            Object ev = msg.get("event");
            if ("lock_lost".equals(ev) || "sem_lost".equals(ev)) {
                String key = String.valueOf(msg.get("key"));
                String token = String.valueOf(msg.get("token"));
                String reason = String.valueOf(msg.get("reason"));
                List<Held> hs = holds.get(token);
                boolean told = false;
                if (hs != null) {
                    for (Held h : hs) {
                        if (h.matches(key, token)) {
                            h.lose(key, token, reason, msg);
                            told = true;
                        }
                    }
                }
                if (!told) {
                    if (early.size() > 1024) {
                        early.clear();
                    }
                    early.put(key + "\0" + token, msg);
                }
            } else if (RISK.containsKey(ev)) {
                String key = String.valueOf(msg.get("key"));
                String token = String.valueOf(msg.get("token"));
                for (Held h : holds.getOrDefault(token, new CopyOnWriteArrayList<>())) {
                    if (h.matches(key, token)) {
                        h.risk(key, RISK.get(ev), msg);
                    }
                }
            }
            if (ld.onEvent != null) {
                try {
                    ld.onEvent.accept(msg);
                } catch (RuntimeException ignored) {
                    // a listener's failure is its own
                }
            }
        }

        void addHold(Held h) {
            holds.computeIfAbsent(h.token(), k -> new CopyOnWriteArrayList<>()).add(h);
            for (String k : h.keys()) {
                Map<String, Object> ev = early.remove(k + "\0" + h.token());
                if (ev != null) {
                    h.lose(k, h.token(), String.valueOf(ev.get("reason")), ev);
                }
            }
            if (dead) {
                h.lose(h.key(), h.token(), "connection_closed", null);
            }
        }

        void removeHold(Held h) {
            holds.computeIfPresent(h.token(), (k, l) -> {
                l.remove(h);
                return l.isEmpty() ? null : l;
            });
        }

        /** The connection ended: requests in flight fail, holds are lost. */
        void kill(LeasedException why) {
            synchronized (this) {
                if (dead) {
                    return;
                }
                dead = true;
            }
            closeQuietly(ch);
            writer.shutdown();
            LeasedException err = why != null ? why : gone();
            for (Long k : new ArrayList<>(pending.keySet())) {
                CompletableFuture<Map<String, Object>> f = pending.remove(k);
                if (f != null) {
                    f.completeExceptionally(err);
                }
            }
            late.clear();
            for (List<Held> hs : holds.values()) {
                for (Held h : hs) {
                    h.lose(h.key(), h.token(), "connection_closed", null);
                }
            }
        }
    }

    // --- locks --------------------------------------------------------------

    static List<String> keyList(Collection<String> keys) {
        if (keys == null || keys.isEmpty()) {
            throw new LeasedException("invalid", "a group of keys needs at least one key");
        }
        for (Object k : keys) {
            if (!(k instanceof String)) {
                throw new LeasedException("invalid", "a key is a String, not " + Json.typeName(k));
            }
        }
        return List.copyOf(keys);
    }

    static String oneKey(String key) {
        if (key == null) {
            throw new LeasedException("invalid", "a key is a String, not null");
        }
        return key;
    }

    static Map<String, Object> lockFields(List<String> keys, boolean group, LockOptions o) {
        Map<String, Object> f = new LinkedHashMap<>();
        if (group) {
            f.put("keys", keys);
        } else {
            f.put("key", keys.get(0));
        }
        f.putAll(o.fields());
        return f;
    }

    /** A late grant (the call had timed out or was cancelled) is given back. */
    static Consumer<Map<String, Object>> lateUnlock(Conn c, Map<String, Object> f) {
        return r -> {
            if (Boolean.TRUE.equals(r.get("acquired"))) {
                Map<String, Object> u = new LinkedHashMap<>();
                if (f.containsKey("keys")) {
                    u.put("keys", f.get("keys"));
                } else {
                    u.put("key", f.get("key"));
                }
                u.put("token", r.get("token"));
                if (f.containsKey("mode")) {
                    u.put("mode", f.get("mode"));
                }
                c.post("unlock", u);
            }
        };
    }

    /**
     * The owner a blocking lock call without one holds under: the calling
     * thread's, so a thread that locks a key it holds reenters (as with
     * Redisson's RLock and ReentrantLock) and threads sharing the connection
     * exclude each other. For an unlock by owner of such a hold.
     */
    public static String threadOwner() {
        return "java-thread-" + Thread.currentThread().getId();
    }

    /**
     * O with an owner: its own, else the thread's (BLOCKING) or one of this
     * call's own, since async callers on one thread (an event loop) are
     * separate tasks that must not reenter each other's holds.
     */
    LockOptions owned(LockOptions o, boolean blocking) {
        if (o.owner != null) {
            return o;
        }
        return o.copy().owner(blocking ? threadOwner() : "java-call-" + owners.incrementAndGet());
    }

    /**
     * The lock reply ({@code acquired} true with token and fence, or false
     * with ttl_ms). Without an owner it holds under {@link #threadOwner()}.
     */
    public Map<String, Object> tryLock(String key, LockOptions o) {
        Map<String, Object> f = lockFields(List.of(oneKey(key)), false, owned(o, true));
        Sent s = send(null, "lock", f);
        return await(s, o.waitMs, lateUnlock(s.conn, f));
    }

    public Held lock(String key) {
        return lock(key, new LockOptions());
    }

    /**
     * Hold KEY until the handle is closed: {@code try (var held = ld.lock(k, opts))}.
     * Throws {@link LockNotAcquiredException} when it is held elsewhere past the wait.
     * Without an owner it holds under {@link #threadOwner()}: the same thread
     * locking KEY again reenters, another thread waits.
     */
    public Held lock(String key, LockOptions o) {
        return await(lockAsync(List.of(oneKey(key)), false, o, false), o);
    }

    /** Hold every key of KEYS, or none (one token, a fence per key). */
    public Held lock(Collection<String> keys, LockOptions o) {
        return await(lockAsync(keyList(keys), true, o, false), o);
    }

    /**
     * Start taking KEY and return at once. Cancelling the future
     * ({@code cancel(true)}) ends the wait at the daemon (op {@code cancel});
     * a grant that won the race is given back. Without an owner each call
     * holds under one of its own: two calls exclude each other, whatever
     * thread makes them.
     */
    public CompletableFuture<Held> lockAsync(String key, LockOptions o) {
        return lockAsync(List.of(oneKey(key)), false, o, true);
    }

    /** {@link #lockAsync(String, LockOptions)} for a group of keys. */
    public CompletableFuture<Held> lockAsync(Collection<String> keys, LockOptions o) {
        return lockAsync(keyList(keys), true, o, true);
    }

    CompletableFuture<Held> lockAsync(List<String> keys, boolean group, LockOptions o,
            boolean async) {
        Map<String, Object> f = lockFields(keys, group, owned(o, !async));
        Sent s = send(null, "lock", f);
        return hold(s, keys, group, o.mode, false, lateUnlock(s.conn, f), async);
    }

    /**
     * The Held of the grant S brings. With ASYNC (a future handed to the
     * application) it is completed off the reader thread, so that a callback
     * on it may call the daemon; a blocking lock() waits for it directly.
     */
    CompletableFuture<Held> hold(Sent s, List<String> keys, boolean group, String mode,
            boolean sem, Consumer<Map<String, Object>> giveBack, boolean async) {
        CompletableFuture<Held> out = new CompletableFuture<>();
        java.util.function.BiConsumer<Map<String, Object>, Throwable> done = (r, e) -> {
            if (e != null) {
                out.completeExceptionally(e);
                return;
            }
            if (r == null) {
                return; // abandoned: the late handler has it
            }
            if (!Boolean.TRUE.equals(r.get("ok"))) {
                out.completeExceptionally(LeasedException.of(r));
            } else if (!Boolean.TRUE.equals(r.get("acquired"))) {
                out.completeExceptionally(sem
                        ? new NoPermitException(keys.get(0), num(r.get("available")))
                        : new LockNotAcquiredException(group ? keys.toString() : keys.get(0),
                                num(r.get("ttl_ms"))));
            } else {
                Held h = new Held(this, s.conn, keys, group, r, mode, sem);
                s.conn.addHold(h);
                if (!out.complete(h)) {
                    // Cancelled meanwhile: given back without waiting, as
                    // this may be the reader thread.
                    s.conn.removeHold(h);
                    giveBack.accept(r);
                }
            }
        };
        if (async) {
            s.reply.whenCompleteAsync(done);
        } else {
            s.reply.whenComplete(done);
        }
        out.whenComplete((h, e) -> {
            if (e instanceof CancellationException) {
                s.conn.abandon(s.id, giveBack);
            }
        });
        return out;
    }

    static long num(Object o) {
        return o instanceof Number n ? n.longValue() : -1;
    }

    Held await(CompletableFuture<Held> f, LockOptions o) {
        try {
            return o.waitMs < 0 ? f.get() : f.get(timeoutMs + o.waitMs, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            if (!f.cancel(true) && f.isDone() && !f.isCompletedExceptionally()) {
                return f.join(); // granted just as the time ran out
            }
            throw new LeasedException("timeout", "no reply from leased at " + target + " in time",
                    null, e);
        } catch (InterruptedException e) {
            if (!f.cancel(true) && f.isDone() && !f.isCompletedExceptionally()) {
                // Granted before the interrupt was seen: the caller holds it.
                Thread.currentThread().interrupt();
                return f.join();
            }
            Thread.currentThread().interrupt();
            throw new LeasedException("timeout", "interrupted while waiting for leased at "
                    + target, null, e);
        } catch (ExecutionException e) {
            if (e.getCause() instanceof LeasedException le) {
                throw le;
            }
            throw new LeasedException("io", String.valueOf(e.getCause()), null, e.getCause());
        }
    }

    /**
     * Release one hold of KEY named by OWNER (on this connection's session)
     * or TOKEN (any session; a detached lock), outside of a {@link Held}: for
     * a lock of another process, or an unlock that must be safe to repeat.
     * REQUEST_ID (1 to 64 printable ASCII characters, unique among the
     * unlocks of one hold; null for none): sent again with the same token or
     * owner and id after a lost answer (code {@code io} or {@code timeout},
     * or {@link LeasedException#outcomeUnknown()}), it gets the first answer
     * and releases no second hold. Returns the reply: {@code released}, and
     * the {@code count} of holds left.
     */
    public Map<String, Object> unlock(String key, String owner, String token, String requestId) {
        return unlock(key, owner, token, requestId, null);
    }

    /** {@link #unlock(String, String, String, String)} of a side ("read"/"write") of a read-write lock. */
    public Map<String, Object> unlock(String key, String owner, String token, String requestId,
            String mode) {
        if (owner == null && token == null) {
            throw new LeasedException("invalid", "unlock needs an owner or a token");
        }
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("key", oneKey(key));
        if (owner != null) {
            f.put("owner", owner);
        }
        if (token != null) {
            f.put("token", token);
        }
        if (mode != null) {
            f.put("mode", mode);
        }
        if (requestId != null) {
            f.put("request_id", requestId);
        }
        return callOn(null, "unlock", f, 0, null);
    }

    /** {@link #rateAcquire(String, long, long, Long, long, long)} of one permit, deciding once. */
    public Map<String, Object> rateAcquire(String key, long rate, long perMs) {
        return rateAcquire(key, rate, perMs, null, 1, 0);
    }

    /**
     * Take PERMITS from the rate limiter KEY, which allows RATE permits every
     * PER_MS milliseconds with at most BURST at once (null: the daemon's
     * default, the rate); GCRA decided on Redis time, exact across daemons.
     * WAIT_MS 0 decides once; more lets the daemon try again when the permits
     * will be free, up to that long. Returns the reply: {@code acquired}, and
     * {@code retry_after_ms} (refused: until the permits could be granted;
     * granted: until one more could be). A refusal is no exception; a
     * {@code redis_unavailable} whose {@link LeasedException#outcomeUnknown()}
     * may have granted.
     */
    public Map<String, Object> rateAcquire(String key, long rate, long perMs, Long burst,
            long permits, long waitMs) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("key", oneKey(key));
        f.put("rate", rate);
        f.put("per_ms", perMs);
        if (burst != null) {
            f.put("burst", burst);
        }
        if (permits != 1) {
            f.put("permits", permits);
        }
        if (waitMs != 0) {
            f.put("wait_ms", waitMs);
        }
        return call("rate.acquire", f);
    }

    /** The two sides of the read-write lock KEY (when features has "rwlock"). */
    public RWLock rwlock(String key) {
        return new RWLock(this, oneKey(key));
    }

    /**
     * Hold PERMITS (o.permits, default 1) of the LIMIT permits of KEY until the
     * handle is closed. Throws {@link NoPermitException} past the wait.
     */
    public Held semaphore(String key, long limit, LockOptions o) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("key", oneKey(key));
        f.put("limit", limit);
        if (o.permits != 1) {
            f.put("permits", o.permits);
        }
        Map<String, Object> rest = o.fields();
        rest.remove("owner");
        rest.remove("mode");
        f.putAll(rest);
        Sent s = send(null, "sem.acquire", f);
        Consumer<Map<String, Object>> giveBack = r -> {
            if (Boolean.TRUE.equals(r.get("acquired"))) {
                s.conn.post("sem.release", Map.of("key", key, "token", r.get("token")));
            }
        };
        return await(hold(s, List.of(key), false, null, true, giveBack, false), o);
    }

    public Held semaphore(String key, long limit) {
        return semaphore(key, limit, new LockOptions());
    }

    // --- cache-aside --------------------------------------------------------

    /** A loader or a writer: what {@link #cached} and {@link #update} run. */
    @FunctionalInterface
    public interface Task<T, E extends Exception> {
        T run() throws E;
    }

    public <E extends Exception> Object cached(String key, Task<?, E> loader) throws E {
        return cached(key, loader, null, null);
    }

    /**
     * The read path: the cached value of KEY, or LOADER's, loaded once
     * cluster-wide and filled (with TTL_MS, the daemon's default when null).
     * Other readers wait up to WAIT_MS (the daemon's cache.wait_ms when null)
     * for a load that runs elsewhere; past it they throw code {@code timeout}
     * rather than load. Values go through the serializer (JSON by default):
     * what comes back is the loader's value read back, as every reader that
     * hits gets it. A loader's null is cached as "not found". A loader that
     * throws, or a value that cannot be filled, gives the fill lease back.
     */
    public <E extends Exception> Object cached(String key, Task<?, E> loader, Long ttlMs,
            Long waitMs) throws E {
        return cached(key, loader, ttlMs, waitMs, null);
    }

    /**
     * {@link #cached(String, Task, Long, Long)} that asks the Bloom filter
     * BLOOM first (hello's feature "bloom"; null: none): a key it rules out
     * is "not found" (null) at once, LOADER not called.
     */
    public <E extends Exception> Object cached(String key, Task<?, E> loader, Long ttlMs,
            Long waitMs, String bloom) throws E {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("key", oneKey(key));
        if (waitMs != null) {
            f.put("wait_ms", waitMs);
        }
        if (bloom != null) {
            f.put("bloom", bloom);
        }
        Sent s = send(null, "cache.get", f);
        Conn c = s.conn;
        Map<String, Object> got = await(s, waitMs != null ? waitMs : 3000, r -> {
            if (r.get("lease") instanceof String lease) {
                c.post("cache.release", Map.of("key", key, "lease", lease));
            }
        });
        if (Boolean.TRUE.equals(got.get("hit"))) {
            return valueOf(key, (String) got.get("value"));
        }
        if (!(got.get("lease") instanceof String lease)) {
            throw new LeasedException("timeout", "'" + key + "' is still being loaded elsewhere"
                    + " after " + (waitMs == null ? "the daemon's cache.wait_ms" : "wait_ms="
                    + waitMs + " ms"));
        }
        String text = fill(c, key, lease, loader, ttlMs);
        return valueOf(key, text);
    }

    private <E extends Exception> String fill(Conn c, String key, String lease, Task<?, E> loader,
            Long ttlMs) throws E {
        boolean filled = false;
        try {
            String text = textOf(key, loader.run());
            Map<String, Object> f = new LinkedHashMap<>();
            f.put("key", key);
            f.put("lease", lease);
            f.put("value", text);
            if (ttlMs != null) {
                f.put("ttl_ms", ttlMs);
            }
            callOn(c, "cache.fill", f, 0, null);
            filled = true;
            return text;
        } finally {
            if (!filled) {
                try {
                    callOn(c, "cache.release", Map.of("key", key, "lease", lease), 0, null);
                } catch (LeasedException ignored) {
                    // the lease runs out by itself; the first error is the one to see
                }
            }
        }
    }

    private String textOf(String key, Object value) {
        if (value == null) {
            return null;
        }
        try {
            return serializer.dumps(value);
        } catch (IllegalArgumentException e) {
            throw new LeasedException("invalid", "the value loaded for '" + key
                    + "' cannot be cached: " + e.getMessage(), null, e);
        }
    }

    private Object valueOf(String key, String text) {
        if (text == null) {
            return null;
        }
        try {
            return serializer.loads(text);
        } catch (RuntimeException e) {
            throw new LeasedException("bad_value", "the cached value of '" + key
                    + "' cannot be read by the serializer: " + e.getMessage(), null, e);
        }
    }

    /** One entry of {@link #warm(Collection, Long)}: TTL_MS null takes warm's. */
    public record Entry(String key, Object value, Long ttlMs) {
        public Entry(String key, Object value) {
            this(key, value, null);
        }
    }

    /** {@link #warm(Collection, Long)} of KEY to VALUE pairs, each with TTL_MS. */
    public Map<String, Object> warm(Map<String, ?> entries, Long ttlMs) {
        List<Entry> list = new ArrayList<>();
        entries.forEach((k, v) -> list.add(new Entry(k, v)));
        return warm(list, ttlMs);
    }

    /**
     * Bulk warm-up (cache.mset; hello's feature "mset"): store ENTRIES (at
     * most 1000) in one request as {@link #cached} would have filled them,
     * values through the serializer (null: "not found"), each with its own
     * TTL or TTL_MS (null: the daemon's cache.ttl_ms). Returns the reply:
     * {@code stored} counts what was stored, {@code results} has one result
     * per entry in order, {@code {"ok":false,"error":{...}}} for an entry that
     * failed alone. A request refused as a whole throws.
     */
    public Map<String, Object> warm(Collection<Entry> entries, Long ttlMs) {
        List<Object> out = new ArrayList<>();
        for (Entry e : entries) {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("key", oneKey(e.key()));
            m.put("value", textOf(e.key(), e.value()));
            Long ttl = e.ttlMs() != null ? e.ttlMs() : ttlMs;
            if (ttl != null) {
                m.put("ttl_ms", ttl);
            }
            out.add(m);
        }
        if (out.isEmpty()) {
            throw new LeasedException("invalid", "nothing to warm");
        }
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("entries", out);
        return callOn(null, "cache.mset", f, 0, null);
    }

    /**
     * bloom.create (hello's feature "bloom"): the filter FILTER for CAPACITY
     * keys at ERROR_RATE false positives. Returns the reply ({@code created}
     * false when it existed alike; {@code bits}, {@code hashes},
     * {@code bytes}); other parameters than the filter has are a
     * {@code bad_request}.
     */
    public Map<String, Object> bloomCreate(String filter, long capacity, double errorRate) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("filter", oneKey(filter));
        f.put("capacity", capacity);
        f.put("error_rate", errorRate);
        return callOn(null, "bloom.create", f, 0, null);
    }

    /** Add KEYS (1 to 1000) to FILTER: true where the key was certainly not in it. */
    public List<Boolean> bloomAdd(String filter, Collection<String> keys) {
        return bloomKeys("bloom.add", "added", filter, keys);
    }

    /** Ask FILTER about KEYS: false where the key was certainly never added. */
    public List<Boolean> bloomCheck(String filter, Collection<String> keys) {
        return bloomKeys("bloom.check", "maybe", filter, keys);
    }

    private List<Boolean> bloomKeys(String op, String field, String filter,
            Collection<String> keys) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("filter", oneKey(filter));
        f.put("keys", keyList(keys));
        List<Boolean> out = new ArrayList<>();
        if (callOn(null, op, f, 0, null).get(field) instanceof List<?> l) {
            for (Object o : l) {
                out.add(Boolean.TRUE.equals(o));
            }
        }
        return out;
    }

    /**
     * What {@link #read} found (hello's feature "versioned"): HIT, the VALUE
     * through the serializer (null for a miss or a cached "not found"), its
     * VERSION (0 on a miss) and, on a miss read with a lease, the fill LEASE.
     */
    public record Versioned(boolean hit, Object value, long version, String lease) {}

    /**
     * What {@link #write} and {@link #fill(String, String, Object, Long, Long)}
     * did: STORED, and the VERSION the value got, or, when it was not stored,
     * the entry's current version (0: none), to read again and retry.
     */
    public record Written(boolean stored, long version) {}

    /** {@link #read(String, boolean, Long)} without a lease. */
    public Versioned read(String key) {
        return read(key, false, null);
    }

    /**
     * A cache.get that returns the value with its version, for a later
     * {@link #write} or {@code fill} with ifVersion (a compare-and-set).
     * LEASE true asks for the fill lease on a miss (and may wait up to WAIT_MS,
     * as {@link #cached} does).
     */
    public Versioned read(String key, boolean lease, Long waitMs) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("key", oneKey(key));
        if (!lease) {
            f.put("lease", false);
        }
        if (waitMs != null) {
            f.put("wait_ms", waitMs);
        }
        Map<String, Object> got = callOn(null, "cache.get", f,
                lease ? (waitMs != null ? waitMs : 3000) : 0, null);
        if (Boolean.TRUE.equals(got.get("hit"))) {
            return new Versioned(true, valueOf(key, (String) got.get("value")),
                    num(got.get("version")), null);
        }
        return new Versioned(false, null, 0, got.get("lease") instanceof String l ? l : null);
    }

    /**
     * cache.set of VALUE (through the serializer; null: "not found"), with
     * TTL_MS (null: the daemon's default). IF_VERSION (null: none) stores
     * only when the entry's version is that one (0: only when there is none).
     */
    public Written write(String key, Object value, Long ttlMs, Long ifVersion) {
        return written(callOn(null, "cache.set", writeFields(key, null, value, ttlMs, ifVersion),
                0, null));
    }

    /** cache.fill under LEASE (from {@code read(key, true, ...)}), IF_VERSION as for write. */
    public Written fill(String key, String lease, Object value, Long ttlMs, Long ifVersion) {
        if (lease == null) {
            throw new LeasedException("invalid", "a fill needs the lease of a miss");
        }
        return written(callOn(null, "cache.fill", writeFields(key, lease, value, ttlMs, ifVersion),
                0, null));
    }

    private Map<String, Object> writeFields(String key, String lease, Object value, Long ttlMs,
            Long ifVersion) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("key", oneKey(key));
        if (lease != null) {
            f.put("lease", lease);
        }
        f.put("value", textOf(key, value));
        if (ttlMs != null) {
            f.put("ttl_ms", ttlMs);
        }
        if (ifVersion != null) {
            f.put("if_version", ifVersion);
        }
        return f;
    }

    private static Written written(Map<String, Object> r) {
        long v = r.get("version") instanceof Number n ? n.longValue() : 0;
        return new Written(Boolean.TRUE.equals(r.get("stored")), v);
    }

    /** Delete KEYS now and once more after the daemon's double-delete delay. */
    public Map<String, Object> invalidate(String... keys) {
        // Arrays.asList, not List.of: a null key is the caller's "invalid",
        // not a NullPointerException.
        return invalidate(java.util.Arrays.asList(keys), null);
    }

    public Map<String, Object> invalidate(Collection<String> keys) {
        return invalidate(keys, null);
    }

    /** DELAY_MS: when the second delete runs (0: a single delete; null: the daemon's default). */
    public Map<String, Object> invalidate(Collection<String> keys, Long delayMs) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("keys", keyList(keys));
        if (delayMs != null) {
            f.put("delay_ms", delayMs);
        }
        return callOn(null, "cache.invalidate", f, 0, null);
    }

    /** The write path: WRITER commits to the database, then KEY is invalidated. */
    public <T, E extends Exception> T update(String key, Task<T, E> writer) throws E {
        return update(List.of(oneKey(key)), writer);
    }

    public <T, E extends Exception> T update(Collection<String> keys, Task<T, E> writer) throws E {
        List<String> ks = keyList(keys);
        T result = writer.run();
        invalidate(ks, null);
        return result;
    }
}
