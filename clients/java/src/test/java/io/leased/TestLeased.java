package io.leased;

import java.io.BufferedReader;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The Java client against a real leased at $LEASED_SOCKET (the restart tests
 * also start one of their own: $LEASED_BIN on $LEASED_TEST_REDIS). Prints TAP
 * and "N passed, M failed"; exits 1 when anything failed.
 */
public final class TestLeased {
    static final String SOCK = System.getenv().getOrDefault("LEASED_SOCKET",
            Leased.DEFAULT_SOCKET);
    static final String P = "java:" + ProcessHandle.current().pid() + ":";
    static final long WAIT_MS = 10000;

    interface Case {
        void run() throws Exception;
    }

    static final List<String> names = new ArrayList<>();
    static final List<Case> cases = new ArrayList<>();

    static void test(String name, Case c) {
        names.add(name);
        cases.add(c);
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    static void eq(Object want, Object got, String what) {
        if (want == null ? got != null : !want.equals(got)) {
            throw new AssertionError(what + ": want " + want + ", got " + got);
        }
    }

    static LeasedException fails(String code, Case c) throws Exception {
        try {
            c.run();
        } catch (LeasedException e) {
            eq(code, e.code(), "error code (" + e.getMessage() + ")");
            return e;
        }
        throw new AssertionError("no error; wanted " + code);
    }

    static boolean free(Leased other, String key) {
        Map<String, Object> r = other.tryLock(key, new LockOptions());
        if (Boolean.TRUE.equals(r.get("acquired"))) {
            other.call("unlock", Map.of("key", key, "token", r.get("token")));
            return true;
        }
        return false;
    }

    /* KEY becomes free for OTHER within WAIT_MS: a hold released by the
     * daemon on its own (a session that ended) is freed when the daemon
     * has read the end, which may come after this process saw it. */
    static boolean freeSoon(Leased other, String key) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
        while (!free(other, key)) {
            if (System.nanoTime() > end) {
                return false;
            }
            Thread.sleep(10);
        }
        return true;
    }

    static long waiters(Leased ld) {
        Object stats = ld.call("stats", Map.of()).get("stats");
        Object w = ((Map<?, ?>) stats).get("lock_waiters");
        return w instanceof Number n ? n.longValue() : -1;
    }

    static final Pattern ID = Pattern.compile("\"id\":(\\d+)");
    static final Pattern OP = Pattern.compile("\"op\":\"([a-z_.]+)\"");

    static String riskEvent(String name, String key) {
        return "{\"event\":\"" + name + "\",\"key\":\"" + key
                + "\",\"token\":\"t1\",\"lease_left_ms\":1850}\n";
    }

    /**
     * Answers one connection as the daemon would: the lock of a group is
     * granted; before the first ping's reply both keys go at risk and a is
     * safe again, before the second's b is.
     */
    static void standInDaemon(ServerSocketChannel srv) {
        try (SocketChannel c = srv.accept();
                BufferedReader in = new BufferedReader(
                        Channels.newReader(c, StandardCharsets.UTF_8))) {
            int pings = 0;
            for (String line; (line = in.readLine()) != null;) {
                Matcher id = ID.matcher(line);
                Matcher op = OP.matcher(line);
                String name = op.find() ? op.group(1) : "";
                StringBuilder out = new StringBuilder();
                if (name.equals("ping") && ++pings == 1) {
                    out.append(riskEvent("lock_at_risk", "a"))
                            .append(riskEvent("lock_at_risk", "b"))
                            .append(riskEvent("lock_safe", "a"));
                } else if (name.equals("ping")) {
                    out.append(riskEvent("lock_safe", "b"));
                }
                String rid = id.find() ? id.group(1) : "null";
                if (name.equals("rate.acquire")) {
                    // A decision that left for Redis and got no answer.
                    out.append("{\"id\":").append(rid).append(",\"ok\":false,\"error\":"
                            + "{\"code\":\"redis_unavailable\",\"message\":\"no answer\","
                            + "\"outcome\":\"unknown\"}}\n");
                    c.write(ByteBuffer.wrap(out.toString().getBytes(StandardCharsets.UTF_8)));
                    continue;
                }
                out.append("{\"id\":").append(rid)
                        .append(",\"ok\":true,\"protocol\":1,\"features\":[],\"acquired\":true,"
                                + "\"token\":\"t1\",\"count\":1,\"released\":true}\n");
                c.write(ByteBuffer.wrap(out.toString().getBytes(StandardCharsets.UTF_8)));
            }
        } catch (IOException e) {
            // the client closed
        }
    }

    public static void main(String[] args) throws Exception {
        define();
        int passed = 0;
        int failed = 0;
        System.out.println("1.." + cases.size());
        for (int i = 0; i < cases.size(); i++) {
            try {
                cases.get(i).run();
                System.out.println("ok " + (i + 1) + " - " + names.get(i));
                passed++;
            } catch (Throwable t) {
                System.out.println("not ok " + (i + 1) + " - " + names.get(i) + ": " + t);
                t.printStackTrace(System.err);
                failed++;
            }
        }
        System.out.println("# " + passed + " passed, " + failed + " failed");
        System.out.flush();
        System.exit(failed == 0 ? 0 : 1);
    }

    static void define() {
        test("json round trip and refusals", () -> {
            Object v = Json.decode(" {\"a\":[1,2.5,\"x\\n\\u00e9\",true,null],\"b\":{}} ");
            eq("{\"a\":[1,2.5,\"x\\né\",true,null],\"b\":{}}", Json.encode(v), "re-encoded");
            for (String bad : new String[] {"", "{", "[1,]", "{\"a\" 1}", "tru", "1 2"}) {
                try {
                    Json.decode(bad);
                    throw new AssertionError("accepted " + bad);
                } catch (IllegalArgumentException expected) {
                    // refused, as it should be
                }
            }
        });

        test("hello on connect: session, features, protocol", () -> {
            try (Leased ld = new Leased(SOCK)) {
                check(ld.session() != null && !ld.session().equals("null"), "a session id");
                check(ld.hasFeature("cancel"), "cancel offered: " + ld.features());
                eq(Boolean.TRUE, ld.ping().get("ok"), "ping");
                eq(1, Leased.PROTOCOL, "protocol version");
            }
        });

        test("lock, fence that grows, released at the end of the block", () -> {
            String k = P + "lock";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK)) {
                long f1;
                try (Held held = ld.lock(k, new LockOptions().waitMs(1000))) {
                    f1 = held.fence();
                    check(f1 > 0, "a fence");
                    eq(1L, held.count(), "count");
                    check(held.token() != null && held.leaseMs() > 0, "token and lease");
                    check(!free(other, k), "held against another session");
                }
                check(free(other, k), "free after close");
                try (Held held = ld.lock(k)) {
                    check(held.fence() > f1, "fence grows: " + held.fence() + " > " + f1);
                }
            }
        });

        test("taken elsewhere: LockNotAcquiredException with the holder's ttl", () -> {
            String k = P + "taken";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK);
                    Held held = ld.lock(k, new LockOptions().ttlMs(20000))) {
                LeasedException e = fails("not_acquired", () -> other.lock(k));
                check(e instanceof LockNotAcquiredException l && l.ttlMs() > 0, "ttl " + e);
                long t0 = System.nanoTime();
                fails("not_acquired", () -> other.lock(k, new LockOptions().waitMs(300)));
                check(System.nanoTime() - t0 >= 250_000_000L, "waited");
                eq(Boolean.FALSE, other.tryLock(k, new LockOptions()).get("acquired"), "try");
            }
        });

        test("reentry by owner: count 2, free after two closes", () -> {
            String k = P + "reentry";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK)) {
                LockOptions o = new LockOptions().owner("w");
                Held outer = ld.lock(k, o);
                try (Held inner = ld.lock(k, o)) {
                    eq(2L, inner.count(), "count");
                    eq(outer.token(), inner.token(), "same token");
                    eq(outer.fence(), inner.fence(), "same fence");
                }
                check(!free(other, k), "still held after the inner close");
                outer.close();
                outer.close(); // a second close does nothing
                check(free(other, k), "free after the outer close");
            }
        });

        test("a hold belongs to its handle: closed from another thread", () -> {
            String k = P + "handle";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK)) {
                Held held = ld.lock(k);
                Thread t = new Thread(held::close);
                t.start();
                t.join();
                check(free(other, k), "released by the other thread");
            }
        });

        test("a waiter is granted when the holder lets go", () -> {
            String k = P + "wait";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK)) {
                Held held = ld.lock(k);
                CompletableFuture<Held> w = other.lockAsync(k, new LockOptions().waitMs(WAIT_MS));
                check(!w.isDone(), "waits");
                // The wait must not hold up other calls on the same connection.
                eq(Boolean.TRUE, other.ping().get("ok"), "ping while waiting");
                held.close();
                try (Held got = w.get(WAIT_MS, TimeUnit.MILLISECONDS)) {
                    check(got.fence() > held.fence(), "new fence");
                }
            }
        });

        test("a callback on lockAsync's future may call the daemon", () -> {
            String k = P + "async:callback";
            try (Leased ld = Leased.builder().target(SOCK)
                    .timeout(java.time.Duration.ofSeconds(3)).build()) {
                CompletableFuture<Object> pinged = ld.lockAsync(k, new LockOptions())
                        .thenApply(h -> {
                            Object ok = ld.ping().get("ok");
                            h.close();
                            return ok;
                        });
                eq(Boolean.TRUE, pinged.get(WAIT_MS, TimeUnit.MILLISECONDS), "ping from the callback");
                check(free(ld, k), "closed from the callback");
            }
        });

        test("cancel of a wait: nothing acquired", () -> {
            String k = P + "cancel";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK)) {
                Held held = ld.lock(k);
                CompletableFuture<Held> w = other.lockAsync(k, new LockOptions().waitMs(-1));
                check(w.cancel(true), "cancelled");
                eq(Boolean.TRUE, other.ping().get("ok"), "ping");
                held.close();
                try (Leased third = new Leased(SOCK)) {
                    check(free(third, k), "the cancelled waiter took nothing");
                }
            }
        });

        test("an interrupted blocking lock cancels its wait", () -> {
            String k = P + "interrupt";
            try (Leased ld = new Leased(SOCK); Leased other = new Leased(SOCK)) {
                Held held = ld.lock(k);
                CompletableFuture<String> code = new CompletableFuture<>();
                Thread t = new Thread(() -> {
                    try {
                        other.lock(k, new LockOptions().waitMs(-1)).close();
                        code.complete("acquired");
                    } catch (LeasedException e) {
                        code.complete(e.code());
                    }
                });
                t.start();
                // Interrupt once the wait is under way at the daemon.
                long deadline = System.currentTimeMillis() + WAIT_MS;
                while (waiters(ld) < 1 && System.currentTimeMillis() < deadline) {
                    Thread.sleep(10);
                }
                t.interrupt();
                eq("timeout", code.get(WAIT_MS, TimeUnit.MILLISECONDS), "the waiter's error");
                long left = System.currentTimeMillis() + WAIT_MS;
                while (waiters(ld) > 0 && System.currentTimeMillis() < left) {
                    Thread.sleep(10);
                }
                eq(0L, waiters(ld), "the wait was cancelled at the daemon");
                held.close();
                try (Leased third = new Leased(SOCK)) {
                    check(free(third, k), "the interrupted waiter took nothing");
                }
            }
        });

        test("lock_lost completes held.lost() while the holder is idle", () -> {
            String k = P + "lost";
            try (Leased ld = new Leased(SOCK); Leased op = new Leased(SOCK)) {
                try (Held held = ld.lock(k)) {
                    op.call("lock.force_unlock", Map.of("key", k));
                    LockLost why = held.lost().get(WAIT_MS, TimeUnit.MILLISECONDS);
                    eq("taken", why.reason(), "reason");
                    eq(held.token(), why.token(), "token");
                    check(held.isLost(), "isLost");
                } // closing a lost hold is no error
                eq(Boolean.TRUE, ld.ping().get("ok"), "connection still usable");
            }
        });

        test("held.atRisk() follows lock_at_risk and lock_safe of each key", () -> {
            Path dir = Files.createTempDirectory("leased-java-risk");
            Path sock = dir.resolve("s.sock");
            try (ServerSocketChannel srv = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
                srv.bind(UnixDomainSocketAddress.of(sock));
                Thread peer = new Thread(() -> standInDaemon(srv));
                peer.setDaemon(true);
                peer.start();
                try (Leased ld = new Leased(sock.toString());
                        Held held = ld.lock(List.of("a", "b"), new LockOptions())) {
                    CompletableFuture<Map<String, Object>> first = held.atRiskFuture();
                    check(!held.atRisk() && !first.isDone(), "at risk before any event");
                    // Lines are read in order: the ping's reply comes after
                    // lock_at_risk of a and b and lock_safe of a.
                    ld.ping();
                    Map<String, Object> ev = first.get(WAIT_MS, TimeUnit.MILLISECONDS);
                    eq("lock_at_risk", ev.get("event"), "event");
                    check(held.atRisk(), "safe while b is at risk");
                    ld.ping(); // after lock_safe of b
                    check(!held.atRisk(), "at risk after lock_safe of every key");
                    check(!held.atRiskFuture().isDone(), "the next episode's future is done");
                    check(!held.isLost(), "lost");
                }
            } finally {
                Files.deleteIfExists(sock);
                Files.deleteIfExists(dir);
            }
        });

        test("held.lost() when the session ends with the connection", () -> {
            String k = P + "session";
            Leased ld = new Leased(SOCK);
            Held held = ld.lock(k);
            Held other = null;
            try (Leased l2 = new Leased(SOCK)) {
                other = l2.lock(P + "session:other");
                ld.close();
                eq("connection_closed",
                        held.lost().get(WAIT_MS, TimeUnit.MILLISECONDS).reason(), "reason");
                check(!other.isLost(), "another connection's hold is untouched");
                held.close();
                check(freeSoon(l2, k), "released with the session");
                other.close();
            }
        });

        test("read-write lock: readers share, a writer waits", () -> {
            String k = P + "rw";
            try (Leased a = new Leased(SOCK); Leased b = new Leased(SOCK)) {
                check(a.hasFeature("rwlock"), "rwlock offered");
                try (Held r1 = a.rwlock(k).readLock(); Held r2 = b.rwlock(k).readLock()) {
                    check(r1.token() != null && r2.token() != null, "two readers");
                    fails("not_acquired", () -> b.rwlock(k).writeLock(new LockOptions().owner("x")));
                }
                try (Held w = b.rwlock(k).writeLock(new LockOptions().waitMs(1000))) {
                    check(w.fence() > 0, "writer fence");
                    fails("not_acquired", () -> a.rwlock(k).readLock());
                }
            }
        });

        test("several keys: all or none, a fence per key", () -> {
            String k1 = P + "multi:a";
            String k2 = P + "multi:b";
            try (Leased a = new Leased(SOCK); Leased b = new Leased(SOCK)) {
                try (Held g = a.lock(List.of(k1, k2), new LockOptions())) {
                    eq(2, g.fences().size(), "fences " + g.fences());
                    check(!free(b, k1) && !free(b, k2), "both held");
                }
                try (Held one = b.lock(k2)) {
                    fails("not_acquired", () -> a.lock(List.of(k1, k2), new LockOptions()));
                    check(free(b, k1), "none taken when one is held");
                }
                fails("invalid", () -> a.lock(List.of(), new LockOptions()));
            }
        });

        test("semaphore: permits up to the limit, back on close", () -> {
            String k = P + "sem";
            try (Leased a = new Leased(SOCK); Leased b = new Leased(SOCK)) {
                Held s1 = a.semaphore(k, 2);
                Held s2 = b.semaphore(k, 2);
                LeasedException e = fails("no_permit", () -> b.semaphore(k, 2));
                check(e instanceof NoPermitException, "NoPermitException");
                s1.close();
                try (Held s3 = b.semaphore(k, 2, new LockOptions().waitMs(1000))) {
                    check(s3.token() != null, "a permit after a release");
                }
                s2.close();
            }
        });

        test("unlock repeated with one request_id releases one hold of two", () -> {
            String k = P + "rid";
            try (Leased a = new Leased(SOCK); Leased b = new Leased(SOCK)) {
                LockOptions o = new LockOptions().owner("rid");
                Held h1 = a.lock(k, o);
                a.lock(k, o);
                for (int i = 0; i < 2; i++) {
                    Map<String, Object> u = a.unlock(k, "rid", null, "java-1");
                    eq(false, u.get("released"), "released, unlock " + (i + 1));
                    eq(1L, u.get("count"), "count, unlock " + (i + 1));
                }
                eq(1L, b.call("lock.info", Map.of("key", k, "token", h1.token())).get("count"),
                        "lock.info count");
                check(!free(b, k), "still held once");
                fails("bad_request", () -> a.unlock(k, "rid", null, "r".repeat(65)));
                fails("invalid", () -> a.unlock(k, null, null, "java-x"));
                eq(true, b.unlock(k, null, h1.token(), "java-2").get("released"),
                        "released with a new id");
                check(free(b, k), "free");
                fails("not_held", () -> a.unlock(k, "rid", null, "java-3"));
            }
        });

        test("rateAcquire: a burst, a refusal with retry_after_ms, a wait that gets it", () -> {
            String k = P + "rate";
            try (Leased ld = new Leased(SOCK)) {
                for (int i = 0; i < 2; i++) {
                    eq(true, ld.rateAcquire(k, 1, 60000, 2L, 1, 0).get("acquired"),
                            "grant " + (i + 1));
                }
                Map<String, Object> r = ld.rateAcquire(k, 1, 60000, 2L, 1, 0);
                eq(false, r.get("acquired"), "past the burst");
                check(Leased.num(r.get("retry_after_ms")) > 0, "retry_after_ms " + r);
                fails("bad_request", () -> ld.rateAcquire(k, 1, 60000, 2L, 3, 0));
                // 20 a second, one at a time: the second waits about 50 ms.
                String f = P + "rate:fast";
                eq(true, ld.rateAcquire(f, 20, 1000, 1L, 1, 0).get("acquired"), "first");
                eq(true, ld.rateAcquire(f, 20, 1000, 1L, 1, 10000).get("acquired"),
                        "after a wait");
            }
            try (LeasedPool pool = new LeasedPool(SOCK, 2)) {
                eq(true, pool.rateAcquire(P + "rate:pool", 5, 1000).get("acquired"), "pool");
            }
        });

        test("rateAcquire: redis_unavailable with outcome unknown says so", () -> {
            Path dir = Files.createTempDirectory("leased-java-rate");
            Path sock = dir.resolve("s.sock");
            try (ServerSocketChannel srv = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
                srv.bind(UnixDomainSocketAddress.of(sock));
                Thread peer = new Thread(() -> standInDaemon(srv));
                peer.setDaemon(true);
                peer.start();
                try (Leased ld = new Leased(sock.toString())) {
                    LeasedException e = fails("redis_unavailable",
                            () -> ld.rateAcquire("r", 1, 1000));
                    check(e.outcomeUnknown(), "outcomeUnknown");
                    check(!new LeasedException("io", "x").outcomeUnknown(), "io is known");
                }
            } finally {
                Files.deleteIfExists(sock);
                Files.deleteIfExists(dir);
            }
        });

        test("warm: entries read by cached as hits, per-entry errors", () -> {
            String k = P + "warm:";
            try (Leased ld = new Leased(SOCK)) {
                Map<String, Object> r = ld.warm(List.of(
                        new Leased.Entry(k + "a", Map.of("name", "Ada")),
                        new Leased.Entry(k + "none", null, 30000L),
                        new Leased.Entry("", "empty key"),
                        new Leased.Entry(k + "t", "v", 0L)), 60000L);
                eq(2L, r.get("stored"), "stored " + r);
                List<?> res = (List<?>) r.get("results");
                eq(4, res.size(), "results");
                eq(true, ((Map<?, ?>) res.get(0)).get("ok"), "entry 1");
                eq(false, ((Map<?, ?>) res.get(2)).get("ok"), "entry 3");
                eq("bad_request", ((Map<?, ?>) ((Map<?, ?>) res.get(2)).get("error")).get("code"),
                        "entry 3's code");
                eq(false, ((Map<?, ?>) res.get(3)).get("ok"), "entry 4 (ttl 0)");
                Leased.Task<Object, RuntimeException> fail = () -> {
                    throw new AssertionError("loaded a warmed key");
                };
                eq("Ada", ((Map<?, ?>) ld.cached(k + "a", fail)).get("name"), "hit");
                eq(null, ld.cached(k + "none", fail), "not found");
                Map<String, Object> one = new java.util.LinkedHashMap<>();
                one.put(k + "b", 1);
                eq(1L, ld.warm(one, null).get("stored"), "a map");
                eq(1L, ld.cached(k + "b", fail), "hit b");
                fails("invalid", () -> ld.warm(List.<Leased.Entry>of(), null));
                List<Leased.Entry> many = new ArrayList<>();
                for (int i = 0; i < 1001; i++) {
                    many.add(new Leased.Entry(k + "m" + i, i));
                }
                fails("bad_request", () -> ld.warm(many, null));
            }
        });

        test("bloom: create, add, check, and cached() asking the filter first", () -> {
            String f = P + "bloom";
            String in = P + "bloom:in";
            String out = P + "bloom:out";
            try (Leased ld = new Leased(SOCK)) {
                Map<String, Object> c = ld.bloomCreate(f, 1000, 0.01);
                eq(true, c.get("created"), "created");
                check(Leased.num(c.get("bits")) > 0 && Leased.num(c.get("hashes")) > 0,
                        "sized: " + c);
                eq(false, ld.bloomCreate(f, 1000, 0.01).get("created"), "created again alike");
                fails("bad_request", () -> ld.bloomCreate(f, 2000, 0.01));
                eq(List.of(true), ld.bloomAdd(f, List.of(in)), "added");
                eq(List.of(false), ld.bloomAdd(f, List.of(in)), "added again");
                eq(List.of(true, false), ld.bloomCheck(f, List.of(in, out)), "maybe");
                fails("bad_request", () -> ld.bloomCheck(P + "bloom:none", List.of(in)));
                fails("invalid", () -> ld.bloomAdd(f, List.of()));
                AtomicInteger loads = new AtomicInteger();
                eq(null, ld.cached(out, () -> {
                    loads.incrementAndGet();
                    return "v";
                }, null, null, f), "ruled out: not found");
                eq("v", ld.cached(in, () -> {
                    loads.incrementAndGet();
                    return "v";
                }, null, null, f), "maybe: loaded");
                eq(1, loads.get(), "one load, for the key that may exist");
            }
        });

        test("versioned: a compare-and-set that wins, one that loses, a fill over 0", () -> {
            String a = P + "ver:a";
            String f = P + "ver:f";
            try (Leased ld = new Leased(SOCK)) {
                Leased.Versioned miss = ld.read(a);
                check(!miss.hit() && miss.value() == null && miss.version() == 0, "miss " + miss);
                Leased.Written w1 = ld.write(a, Map.of("n", 1), null, 0L);
                check(w1.stored() && w1.version() > 0, "written over none " + w1);
                Leased.Versioned got = ld.read(a);
                check(got.hit() && got.version() == w1.version(), "read " + got);
                eq(1L, ((Map<?, ?>) got.value()).get("n"), "value");
                Leased.Written w2 = ld.write(a, Map.of("n", 2), null, got.version());
                check(w2.stored() && w2.version() > w1.version(), "compare-and-set " + w2);
                eq(new Leased.Written(false, w2.version()), ld.write(a, "late", null, got.version()),
                        "a write over a version that moved on");
                eq(2L, ((Map<?, ?>) ld.read(a).value()).get("n"), "the losing write not stored");
                String lease = ld.read(f, true, null).lease();
                check(lease != null, "a lease on a miss");
                eq(new Leased.Written(false, 0), ld.fill(f, lease, "x", null, 7L), "fill over 7");
                Leased.Written fw = ld.fill(f, lease, null, null, 0L);
                check(fw.stored(), "fill over none");
                Leased.Versioned nf = ld.read(f);
                check(nf.hit() && nf.value() == null && nf.version() == fw.version(), "nf " + nf);
                fails("bad_request", () -> ld.write(a, "x", null, -1L));
            }
            try (LeasedPool pool = new LeasedPool(SOCK, 2)) {
                long v = pool.read(a).version();
                Leased.Written p = pool.write(a, "pool", null, v);
                check(p.stored() && pool.read(a).version() == p.version(), "pool " + p);
            }
        });

        test("cached: loads once, JSON values, null cached as not found", () -> {
            String k = P + "cache";
            AtomicInteger loads = new AtomicInteger();
            try (Leased ld = new Leased(SOCK)) {
                Object v = ld.cached(k, () -> {
                    loads.incrementAndGet();
                    return Map.of("name", "Ada", "n", 7);
                });
                eq("Ada", ((Map<?, ?>) v).get("name"), "value");
                eq(7L, ((Map<?, ?>) v).get("n"), "a number comes back as read back");
                Object again = ld.cached(k, () -> {
                    loads.incrementAndGet();
                    return "other";
                });
                eq(v, again, "hit");
                eq(1, loads.get(), "one load");
                String n = P + "cache:none";
                eq(null, ld.cached(n, () -> null), "not found");
                eq(null, ld.cached(n, () -> "loaded"), "not found is cached");
                fails("invalid", () -> ld.cached(P + "cache:bytes", () -> new byte[] {1}));
            }
        });

        test("cached: a loader that throws gives the lease back", () -> {
            String k = P + "cache:throws";
            try (Leased ld = new Leased(SOCK)) {
                try {
                    ld.cached(k, () -> {
                        throw new IOException("database down");
                    });
                    throw new AssertionError("no error");
                } catch (IOException expected) {
                    eq("database down", expected.getMessage(), "the loader's error");
                }
                long t0 = System.nanoTime();
                // The next reader gets a lease at once, not after the fill lease ran out.
                eq("ok", ld.cached(k, () -> "ok", null, 2000L), "loaded");
                check(System.nanoTime() - t0 < 1_500_000_000L, "without waiting the lease out");
            }
        });

        test("cached: single flight across threads of a pool", () -> {
            String k = P + "cache:flight";
            AtomicInteger loads = new AtomicInteger();
            ExecutorService ex = Executors.newFixedThreadPool(8);
            try (LeasedPool pool = Leased.builder().target(SOCK).size(4).buildPool()) {
                List<Future<Object>> fs = new ArrayList<>();
                for (int i = 0; i < 8; i++) {
                    fs.add(ex.submit(() -> pool.cached(k, () -> {
                        loads.incrementAndGet();
                        Thread.sleep(300);
                        return "v";
                    })));
                }
                for (Future<Object> f : fs) {
                    eq("v", f.get(WAIT_MS, TimeUnit.MILLISECONDS), "value");
                }
                eq(1, loads.get(), "one load");
            } finally {
                ex.shutdownNow();
            }
        });

        test("cached: a waiter past wait_ms times out and does not load", () -> {
            String k = P + "cache:slow";
            AtomicInteger loads = new AtomicInteger();
            CountDownLatch loading = new CountDownLatch(1);
            try (Leased a = new Leased(SOCK); Leased b = new Leased(SOCK)) {
                CompletableFuture<Object> first = CompletableFuture.supplyAsync(() ->
                        a.cached(k, () -> {
                            loads.incrementAndGet();
                            loading.countDown();
                            try {
                                Thread.sleep(1000);
                            } catch (InterruptedException e) {
                                throw new IllegalStateException(e);
                            }
                            return "slow";
                        }));
                check(loading.await(WAIT_MS, TimeUnit.MILLISECONDS), "loading");
                fails("timeout", () -> b.cached(k, () -> {
                    loads.incrementAndGet();
                    return "again";
                }, null, 100L));
                eq("slow", first.get(WAIT_MS, TimeUnit.MILLISECONDS), "first");
                eq(1, loads.get(), "one load");
            }
        });

        test("update and invalidate: a string is one key, a list several", () -> {
            String k1 = P + "inv:a";
            String k2 = P + "inv:b";
            try (Leased ld = new Leased(SOCK)) {
                ld.cached(k1, () -> "1");
                ld.cached(k2, () -> "1");
                eq(1L, ld.invalidate(k1).get("deleted"), "one key deleted");
                eq("2", ld.cached(k1, () -> "2"), "reloaded");
                String r = ld.update(List.of(k1, k2), () -> "written");
                eq("written", r, "the writer's result");
                eq("3", ld.cached(k1, () -> "3"), "k1 reloaded");
                eq("3", ld.cached(k2, () -> "3"), "k2 reloaded");
                ld.update(k1, () -> null);
                eq("4", ld.cached(k1, () -> "4"), "k1 reloaded after update(String)");
                fails("invalid", () -> ld.invalidate(List.of()));
            }
        });

        test("a null key, in any call, is code invalid", () -> {
            try (Leased ld = new Leased(SOCK)) {
                fails("invalid", () -> ld.lock((String) null));
                fails("invalid", () -> ld.invalidate((String) null));
                fails("invalid", () -> ld.invalidate(java.util.Arrays.asList("a", null)));
                fails("invalid", () -> ld.cached(null, () -> "v"));
                AtomicInteger writes = new AtomicInteger();
                fails("invalid", () -> ld.update((String) null, writes::incrementAndGet));
                eq(0, writes.get(), "refused before the write runs");
                eq(Boolean.TRUE, ld.ping().get("ok"), "still usable");
            }
        });

        test("raw serializer stores strings as they are; bad_value for foreign text", () -> {
            String k = P + "raw";
            try (Leased raw = Leased.builder().target(SOCK).serializer(Serializer.RAW).build();
                    Leased json = new Leased(SOCK)) {
                eq("plain text", raw.cached(k, () -> "plain text"), "raw value");
                fails("bad_value", () -> json.cached(k, () -> "x"));
                fails("invalid", () -> raw.cached(P + "raw:map", () -> Map.of()));
            }
        });

        test("error replies carry the protocol's code", () -> {
            try (Leased ld = new Leased(SOCK)) {
                fails("bad_request", () -> ld.lock(""));
                LeasedException e = fails("not_held", () -> ld.call("unlock",
                        Map.of("key", P + "never")));
                eq("absent", e.reason(), "reason");
                fails("unknown_op", () -> ld.call("no.such.op", Map.of()));
                eq(Boolean.TRUE, ld.ping().get("ok"), "still usable");
            }
        });

        test("connect errors name the socket and what to check", () -> {
            String path = "/nonexistent/leased.sock";
            LeasedException e = fails("connect", () -> new Leased(path));
            check(e.getMessage().contains(path), "names the path: " + e.getMessage());
            check(e.getMessage().contains("LEASED_SOCKET"), "says what to check");
            check(e.getCause() instanceof IOException, "the cause");
        });

        test("threads sharing a connection exclude each other; a thread reenters its own", () -> {
            String k = P + "threads";
            ExecutorService other = Executors.newSingleThreadExecutor();
            try (Leased ld = new Leased(SOCK)) {
                Held h1 = ld.lock(k);
                Held h2 = ld.lock(k);
                eq(2L, h2.count(), "the same thread reenters");
                eq(h1.token(), h2.token(), "one token");
                other.submit(() -> {
                    eq(Boolean.FALSE, ld.tryLock(k, new LockOptions()).get("acquired"),
                            "another thread's tryLock");
                    fails("not_acquired", () -> ld.lock(k));
                    return null;
                }).get(WAIT_MS, TimeUnit.MILLISECONDS);
                CompletableFuture<Held> async = ld.lockAsync(k, new LockOptions());
                fails("not_acquired", () -> {
                    try {
                        async.get(WAIT_MS, TimeUnit.MILLISECONDS).close();
                    } catch (java.util.concurrent.ExecutionException e) {
                        throw (Exception) e.getCause();
                    }
                });
                RWLock rw = ld.rwlock(k + ":rw");
                try (Held w1 = rw.writeLock(); Held w2 = rw.writeLock()) {
                    eq(2L, w2.count(), "the same thread reenters the write side");
                    other.submit(() -> fails("not_acquired", rw::writeLock))
                            .get(WAIT_MS, TimeUnit.MILLISECONDS);
                }
                h2.close();
                h1.close();
                other.submit(() -> {
                    try (Held h = ld.lock(k)) {
                        eq(1L, h.count(), "another thread's lock once it is free");
                    }
                    return null;
                }).get(WAIT_MS, TimeUnit.MILLISECONDS);
                eq(Boolean.TRUE, ld.tryLock(k, new LockOptions()).get("acquired"), "tryLock");
                eq(true, ld.unlock(k, Leased.threadOwner(), null, null).get("released"),
                        "unlocked by the thread's owner");
            } finally {
                other.shutdownNow();
            }
        });

        test("a pool: a thread reenters a lock it holds; a group meets its own session", () -> {
            try (LeasedPool pool = Leased.builder().target(SOCK).size(3).buildPool()) {
                for (int i = 0; i < 6; i++) {
                    String k = P + "pool-re:" + i;
                    try (Held h1 = pool.lock(k); Held h2 = pool.lock(k)) {
                        eq(2L, h2.count(), "count of " + k);
                        eq(h1.token(), h2.token(), "token of " + k);
                    }
                    // A group is not reentrant: the second lock meets the
                    // first's session and owner, which refuses it at once.
                    List<String> group = List.of(k + ":b", k + ":a");
                    try (Held g = pool.lock(group, new LockOptions())) {
                        fails("bad_request", () -> pool.lock(group, new LockOptions()));
                    }
                }
            }
        });

        test("a pool shared by threads: locks exclude each other", () -> {
            String k = P + "pool";
            AtomicInteger inside = new AtomicInteger();
            AtomicInteger overlaps = new AtomicInteger();
            ExecutorService ex = Executors.newFixedThreadPool(8);
            try (LeasedPool pool = Leased.builder().target(SOCK).size(3).buildPool()) {
                List<Future<?>> fs = new ArrayList<>();
                for (int t = 0; t < 8; t++) {
                    fs.add(ex.submit(() -> {
                        for (int i = 0; i < 25; i++) {
                            try (Held h = pool.lock(k, new LockOptions().waitMs(WAIT_MS))) {
                                if (inside.incrementAndGet() != 1) {
                                    overlaps.incrementAndGet();
                                }
                                inside.decrementAndGet();
                            }
                        }
                        return null;
                    }));
                }
                for (Future<?> f : fs) {
                    f.get(60, TimeUnit.SECONDS);
                }
                eq(0, overlaps.get(), "overlaps");
            } finally {
                ex.shutdownNow();
            }
        });

        restartTests();
    }

    /** A leased of the test's own, for the tests that restart it. */
    static final class OwnDaemon implements AutoCloseable {
        final Path dir;
        final String sock;
        final String tcp;
        final Path conf;
        Process proc;

        OwnDaemon() throws Exception {
            dir = Files.createTempDirectory("leased-java");
            sock = dir.resolve("own.sock").toString();
            try (ServerSocket s = new ServerSocket(0)) {
                tcp = "127.0.0.1:" + s.getLocalPort();
            }
            conf = dir.resolve("own.yml");
            Files.writeString(conf, "listen:\n  unix: \"" + sock + "\"\n  tcp: \"" + tcp
                    + "\"\nmetrics:\n  listen: \"\"\nredis:\n  address: \""
                    + System.getenv("LEASED_TEST_REDIS") + "\"\njournal:\n  path: \""
                    + dir.resolve("journal") + "\"\nlog:\n  level: info\n");
            start();
        }

        void start() throws Exception {
            proc = new ProcessBuilder(System.getenv("LEASED_BIN"), "-f", "-c", conf.toString())
                    .redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("own.log")
                            .toFile()))
                    .start();
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (!answers()) {
                if (!proc.isAlive() || System.currentTimeMillis() > deadline) {
                    throw new AssertionError("leased did not start: "
                            + Files.readString(dir.resolve("own.log")));
                }
                Thread.sleep(20);
            }
        }

        boolean answers() {
            try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
                c.connect(UnixDomainSocketAddress.of(sock));
                c.write(ByteBuffer.wrap("{\"op\":\"ping\",\"id\":1}\n"
                        .getBytes(StandardCharsets.UTF_8)));
                ByteBuffer b = ByteBuffer.allocate(256);
                return c.read(b) > 0;
            } catch (IOException e) {
                return false;
            }
        }

        void stop() {
            if (proc != null) {
                proc.destroy();
                try {
                    if (!proc.waitFor(WAIT_MS, TimeUnit.MILLISECONDS)) {
                        proc.destroyForcibly().waitFor();
                    }
                } catch (InterruptedException e) {
                    proc.destroyForcibly();
                    Thread.currentThread().interrupt();
                }
                proc = null;
            }
        }

        void restart() throws Exception {
            stop();
            start();
        }

        @Override
        public void close() {
            stop();
        }
    }

    static void restartTests() {
        if (System.getenv("LEASED_BIN") == null || System.getenv("LEASED_TEST_REDIS") == null) {
            test("restart tests need LEASED_BIN and LEASED_TEST_REDIS", () -> {
                throw new AssertionError("LEASED_BIN or LEASED_TEST_REDIS not set");
            });
            return;
        }
        test("a lock block across a daemon restart ends without error", () -> {
            try (OwnDaemon own = new OwnDaemon(); Leased ld = new Leased(own.sock)) {
                String s1 = ld.session();
                try (Held held = ld.lock(P + "restart:block")) {
                    own.restart();
                    eq("connection_closed",
                            held.lost().get(WAIT_MS, TimeUnit.MILLISECONDS).reason(), "reason");
                }
                eq(Boolean.TRUE, ld.ping().get("ok"), "the next call opens a new session");
                check(!s1.equals(ld.session()), "a new session");
            }
        });

        test("Leased and a pool carry on after a restart (Unix socket and TCP)", () -> {
            try (OwnDaemon own = new OwnDaemon()) {
                for (String target : new String[] {own.sock, own.tcp}) {
                    try (Leased ld = new Leased(target);
                            LeasedPool pool = Leased.builder().target(target).size(2)
                                    .buildPool()) {
                        own.restart();
                        eq(Boolean.TRUE, ld.ping().get("ok"), "ping after restart");
                        for (int i = 0; i < 4; i++) {
                            try (Held h = pool.lock(P + "restart:pool:" + i)) {
                                check(h.fence() > 0, "pool lock after restart");
                            }
                        }
                    }
                }
            }
        });

        test("a stopped daemon is a connect error", () -> {
            OwnDaemon own = new OwnDaemon();
            own.stop();
            LeasedException e = fails("connect", () -> new Leased(own.sock));
            check(e.getMessage().contains(own.sock), "names the socket");
        });
    }
}
