package io.leased;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * The Java runner of the conformance suite (clients/conformance/README.md):
 *
 * <pre>
 *   java -cp leased-client.jar:conformance-classes io.leased.Conformance FILE...
 *   java -cp ... io.leased.Conformance --steps JSON      (a helper process)
 * </pre>
 *
 * Each step is carried out with the client's public API: {@code lock} with
 * {@link Leased#lock}, a background lock with {@link Leased#lockAsync} (its
 * {@code cancel} is the future's {@code cancel(true)}), {@code unlock} by
 * closing the {@link Held}, {@code wait_lost} on {@link Held#lost()}.
 */
public final class Conformance {
    static final long LOST_MS = 60000;

    /** A step that failed: the reason, for the scenario's "not ok" line. */
    static final class StepFailed extends Exception {
        private static final long serialVersionUID = 1L;

        StepFailed(String why) {
            super(why);
        }
    }

    final Map<String, Leased> clients = new LinkedHashMap<>();
    final Map<String, Held> held = new HashMap<>();
    final Map<String, Map<String, Object>> saved = new HashMap<>();
    final Map<String, Background> background = new HashMap<>();

    record Background(CompletableFuture<Held> future, long startNs) {}

    public static void main(String[] args) throws Exception {
        if (args.length == 2 && args[0].equals("--steps")) {
            Conformance c = new Conformance();
            try {
                c.steps(asList(Json.decode(args[1])));
            } catch (StepFailed e) {
                System.err.println(e.getMessage());
                System.exit(1);
            } finally {
                c.closeAll();
            }
            System.exit(0);
        }
        int passed = 0;
        int failed = 0;
        for (String file : args) {
            String name = file;
            Conformance c = new Conformance();
            try {
                Map<String, Object> sc = asMap(Json.decode(Files.readString(Path.of(file))));
                name = String.valueOf(sc.get("name"));
                Map<String, Object> begin = new LinkedHashMap<>();
                begin.put("do", "env");
                begin.put("action", "begin");
                begin.put("scenario", name);
                control(begin);
                c.steps(asList(sc.get("steps")));
                System.out.println("ok " + name);
                passed++;
            } catch (StepFailed | RuntimeException | IOException e) {
                System.out.println("not ok " + name + ": " + oneLine(e));
                if (!(e instanceof StepFailed)) {
                    e.printStackTrace(System.err);
                }
                failed++;
            } finally {
                c.closeAll();
            }
            System.out.flush();
        }
        System.out.println(passed + " passed, " + failed + " failed");
        System.out.flush();
        System.exit(failed == 0 ? 0 : 1);
    }

    static String oneLine(Exception e) {
        String m = e instanceof StepFailed ? e.getMessage() : e.toString();
        return m.replace('\n', ' ');
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> asMap(Object o) {
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    static List<Object> asList(Object o) {
        return (List<Object>) o;
    }

    void closeAll() {
        for (Background b : background.values()) {
            b.future.cancel(true);
        }
        for (Leased l : clients.values()) {
            l.close();
        }
    }

    void steps(List<Object> steps) throws StepFailed {
        for (int i = 0; i < steps.size(); i++) {
            Map<String, Object> step = asMap(steps.get(i));
            String what = "step " + (i + 1) + " (" + step.get("do") + ")";
            Map<String, Object> result;
            long t0 = System.nanoTime();
            try {
                result = step(step);
            } catch (LeasedException e) {
                result = new LinkedHashMap<>();
                result.put("error", e.code());
                result.put("message", e.getMessage());
            } catch (StepFailed e) {
                throw new StepFailed(what + ": " + e.getMessage());
            } catch (Exception e) {
                throw new StepFailed(what + ": " + e);
            }
            if (!result.containsKey("elapsed_ms")) {
                result.put("elapsed_ms", (System.nanoTime() - t0) / 1_000_000L);
            }
            try {
                expect(step, result);
            } catch (StepFailed e) {
                throw new StepFailed(what + ": " + e.getMessage());
            }
            if (step.get("as") instanceof String as && !result.containsKey("error")) {
                saved.put(as, result);
            }
        }
    }

    void expect(Map<String, Object> step, Map<String, Object> result) throws StepFailed {
        Map<String, Object> exp = step.get("expect") instanceof Map<?, ?> m ? asMap(m) : Map.of();
        if (result.containsKey("error") && !exp.containsKey("error")) {
            throw new StepFailed("error " + result.get("message"));
        }
        for (Map.Entry<String, Object> e : exp.entrySet()) {
            Object got = result.get(e.getKey());
            Object want = e.getValue();
            if (want instanceof Map<?, ?> cmp) {
                for (Map.Entry<?, ?> c : cmp.entrySet()) {
                    Object x = resolve(c.getValue());
                    if (!compare(String.valueOf(c.getKey()), got, x)) {
                        throw new StepFailed("expected " + e.getKey() + " " + c.getKey() + " "
                                + Json.encode(x) + ", got " + show(got));
                    }
                }
            } else {
                Object x = resolve(want);
                if (!same(x, got)) {
                    throw new StepFailed("expected " + e.getKey() + " " + Json.encode(x)
                            + ", got " + show(got));
                }
            }
        }
    }

    static String show(Object o) {
        try {
            return Json.encode(o);
        } catch (IllegalArgumentException e) {
            return String.valueOf(o);
        }
    }

    Object resolve(Object v) throws StepFailed {
        if (v instanceof String s && s.startsWith("$") && s.contains(".")) {
            String name = s.substring(1, s.indexOf('.'));
            Map<String, Object> r = saved.get(name);
            if (r == null) {
                throw new StepFailed("nothing saved as " + name);
            }
            return r.get(s.substring(s.indexOf('.') + 1));
        }
        return v;
    }

    static boolean same(Object a, Object b) {
        if (a instanceof Number x && b instanceof Number y) {
            return x.doubleValue() == y.doubleValue();
        }
        return a == null ? b == null : a.equals(b);
    }

    static boolean compare(String op, Object got, Object x) throws StepFailed {
        if (op.equals("ne")) {
            return !same(got, x);
        }
        if (!(got instanceof Number g) || !(x instanceof Number w)) {
            return false;
        }
        double a = g.doubleValue();
        double b = w.doubleValue();
        return switch (op) {
            case "gt" -> a > b;
            case "ge" -> a >= b;
            case "lt" -> a < b;
            case "le" -> a <= b;
            default -> throw new StepFailed("unknown matcher " + op);
        };
    }

    Map<String, Object> step(Map<String, Object> s) throws Exception {
        String does = String.valueOf(s.get("do"));
        switch (does) {
            case "open":
                return open(s);
            case "close":
                client(s).close();
                clients.remove(String.valueOf(s.get("client")));
                return new LinkedHashMap<>();
            case "lock":
                return lock(s);
            case "unlock":
                handle(s.get("held")).close();
                return new LinkedHashMap<>();
            case "sem":
                return sem(s);
            case "wait_lost":
                return waitLost(s);
            case "wait_at_risk":
                return waitRisk(s, true);
            case "wait_safe":
                return waitRisk(s, false);
            case "await":
                return await(String.valueOf(s.get("op")));
            case "cancel":
                background(String.valueOf(s.get("op"))).future.cancel(true);
                return new LinkedHashMap<>();
            case "cached":
                return cached(s);
            case "invalidate":
                client(s).invalidate(keys(s.get("keys")));
                return new LinkedHashMap<>();
            case "update":
                return update(s);
            case "rate":
                return rate(s);
            case "warm":
                return warm(s);
            case "unlock_id": {
                Map<String, Object> u = client(s).unlock(String.valueOf(s.get("key")),
                        (String) s.get("owner"), null, (String) s.get("request_id"));
                Map<String, Object> r = new LinkedHashMap<>();
                r.put("released", u.get("released"));
                r.put("count", u.getOrDefault("count", 0L));
                return r;
            }
            case "reconnect":
                // The client opens a new connection at its next call by itself.
                client(s);
                return new LinkedHashMap<>();
            case "count":
                return count(String.valueOf(s.get("file")));
            case "env":
                return env(s);
            case "pause":
                Thread.sleep(60000);
                return new LinkedHashMap<>();
            default:
                throw new StepFailed("unknown step " + does);
        }
    }

    Map<String, Object> open(Map<String, Object> s) {
        String target = s.get("target") instanceof String t ? t : "socket";
        String where = switch (target) {
            case "tcp" -> System.getenv("LEASED_TCP");
            case "dead" -> System.getenv("LEASED_DEAD_SOCKET");
            default -> System.getenv("LEASED_SOCKET");
        };
        Leased.Builder b = Leased.builder().target(where).client("conformance-java");
        if (Boolean.TRUE.equals(s.get("auth"))) {
            b.auth(System.getenv("LEASED_AUTH_TOKEN"));
        }
        clients.put(String.valueOf(s.get("as")), b.build());
        return new LinkedHashMap<>();
    }

    Leased client(Map<String, Object> s) throws StepFailed {
        Leased l = clients.get(String.valueOf(s.get("client")));
        if (l == null) {
            throw new StepFailed("no client " + s.get("client"));
        }
        return l;
    }

    Held handle(Object name) throws StepFailed {
        Held h = held.get(String.valueOf(name));
        if (h == null) {
            throw new StepFailed("no held handle " + name);
        }
        return h;
    }

    Background background(String name) throws StepFailed {
        Background b = background.get(name);
        if (b == null) {
            throw new StepFailed("no background step " + name);
        }
        return b;
    }

    static List<String> keys(Object o) {
        List<String> ks = new ArrayList<>();
        for (Object k : asList(o)) {
            ks.add(String.valueOf(k));
        }
        return ks;
    }

    static LockOptions options(Map<String, Object> s) {
        LockOptions o = new LockOptions();
        if (s.get("wait_ms") instanceof Number n) {
            o.waitMs(n.longValue());
        }
        if (s.get("ttl_ms") instanceof Number n) {
            o.ttlMs(n.longValue());
        }
        if (s.get("owner") instanceof String w) {
            o.owner(w);
        }
        if (s.get("permits") instanceof Number n) {
            o.permits(n.longValue());
        }
        return o;
    }

    CompletableFuture<Held> lockAsync(Map<String, Object> s) throws StepFailed {
        Leased l = client(s);
        LockOptions o = options(s);
        if (s.containsKey("keys")) {
            return l.lockAsync(keys(s.get("keys")), o);
        }
        String key = String.valueOf(s.get("key"));
        if ("read".equals(s.get("mode"))) {
            return l.rwlock(key).readLockAsync(o);
        }
        if ("write".equals(s.get("mode"))) {
            return l.rwlock(key).writeLockAsync(o);
        }
        return l.lockAsync(key, o);
    }

    Map<String, Object> lock(Map<String, Object> s) throws Exception {
        if (Boolean.TRUE.equals(s.get("background"))) {
            background.put(String.valueOf(s.get("as")),
                    new Background(lockAsync(s), System.nanoTime()));
            return new LinkedHashMap<>();
        }
        Leased l = client(s);
        LockOptions o = options(s);
        Held h;
        try {
            if (s.containsKey("keys")) {
                h = l.lock(keys(s.get("keys")), o);
            } else {
                String key = String.valueOf(s.get("key"));
                if ("read".equals(s.get("mode"))) {
                    h = l.rwlock(key).readLock(o);
                } else if ("write".equals(s.get("mode"))) {
                    h = l.rwlock(key).writeLock(o);
                } else {
                    h = l.lock(key, o);
                }
            }
        } catch (LockNotAcquiredException e) {
            return notAcquired();
        }
        return granted(s, h);
    }

    static Map<String, Object> notAcquired() {
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("acquired", false);
        return r;
    }

    Map<String, Object> granted(Map<String, Object> s, Held h) {
        if (s.get("as") instanceof String as) {
            held.put(as, h);
        }
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("acquired", true);
        r.put("token", h.token());
        r.put("count", h.count());
        if (h.fence() >= 0) {
            r.put("fence", h.fence());
        }
        return r;
    }

    Map<String, Object> await(String name) throws Exception {
        Background b = background(name);
        Map<String, Object> r;
        try {
            Held h = b.future.get(LOST_MS, TimeUnit.MILLISECONDS);
            r = granted(Map.of("as", name), h);
        } catch (CancellationException e) {
            r = notAcquired();
        } catch (ExecutionException e) {
            if (e.getCause() instanceof LockNotAcquiredException) {
                r = notAcquired();
            } else if (e.getCause() instanceof LeasedException le) {
                throw le;
            } else {
                throw e;
            }
        } catch (TimeoutException e) {
            throw new StepFailed("no result within " + LOST_MS + " ms");
        }
        r.put("elapsed_ms", (System.nanoTime() - b.startNs) / 1_000_000L);
        return r;
    }

    Map<String, Object> sem(Map<String, Object> s) throws StepFailed {
        Leased l = client(s);
        long limit = ((Number) s.get("limit")).longValue();
        try {
            Held h = l.semaphore(String.valueOf(s.get("key")), limit, options(s));
            if (s.get("as") instanceof String as) {
                held.put(as, h);
            }
            Map<String, Object> r = new LinkedHashMap<>();
            r.put("acquired", true);
            r.put("token", h.token());
            return r;
        } catch (NoPermitException e) {
            return notAcquired();
        }
    }

    Map<String, Object> waitLost(Map<String, Object> s) throws Exception {
        Held h = handle(s.get("held"));
        long within = s.get("within_ms") instanceof Number n ? n.longValue() : LOST_MS;
        try {
            LockLost why = h.lost().get(within, TimeUnit.MILLISECONDS);
            Map<String, Object> r = new LinkedHashMap<>();
            r.put("reason", why.reason());
            return r;
        } catch (TimeoutException e) {
            throw new StepFailed("no lost signal within " + within + " ms");
        }
    }

    /**
     * At risk through {@link Held#atRiskFuture()}; safe has no future of its
     * own, so {@link Held#atRisk()} is polled.
     */
    Map<String, Object> waitRisk(Map<String, Object> s, boolean atRisk) throws Exception {
        Held h = handle(s.get("held"));
        long within = s.get("within_ms") instanceof Number n ? n.longValue() : LOST_MS;
        long deadline = System.currentTimeMillis() + within;
        if (atRisk) {
            try {
                h.atRiskFuture().get(within, TimeUnit.MILLISECONDS);
            } catch (TimeoutException e) {
                throw new StepFailed("not at risk within " + within + " ms");
            }
        }
        while (h.atRisk() != atRisk && !h.isLost() && System.currentTimeMillis() < deadline) {
            Thread.sleep(20);
        }
        if (h.atRisk() != atRisk || h.isLost()) {
            throw new StepFailed("not " + (atRisk ? "at risk" : "safe") + " within " + within
                    + " ms" + (h.isLost() ? " (lost)" : ""));
        }
        return new LinkedHashMap<>();
    }

    Map<String, Object> cached(Map<String, Object> s) throws Exception {
        Map<String, Object> ld = asMap(s.get("loader"));
        Object v = client(s).cached(String.valueOf(s.get("key")), () -> {
            if (ld.get("count_file") instanceof String f) {
                appendLine(f);
            }
            if (ld.get("mark") instanceof String m) {
                Map<String, Object> req = new LinkedHashMap<>();
                req.put("do", "env");
                req.put("action", "mark");
                req.put("name", m);
                control(req);
            }
            if (ld.get("delay_ms") instanceof Number n) {
                Thread.sleep(n.longValue());
            }
            return ld.get("value");
        });
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("value", v);
        return r;
    }

    static long num(Object o, long dflt) {
        return o instanceof Number n ? n.longValue() : dflt;
    }

    Map<String, Object> rate(Map<String, Object> s) throws StepFailed {
        Long burst = s.get("burst") instanceof Number n ? n.longValue() : null;
        Map<String, Object> g = client(s).rateAcquire(String.valueOf(s.get("key")),
                num(s.get("rate"), 0), num(s.get("per_ms"), 0), burst, num(s.get("permits"), 1),
                num(s.get("wait_ms"), 0));
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("acquired", g.get("acquired"));
        r.put("retry_after_ms", g.get("retry_after_ms"));
        return r;
    }

    /** stored, failed (entries with their own error) and the first one's code. */
    Map<String, Object> warm(Map<String, Object> s) throws StepFailed {
        List<Leased.Entry> es = new ArrayList<>();
        for (Object o : (List<?>) s.get("entries")) {
            Map<String, Object> e = asMap(o);
            Long ttl = e.get("ttl_ms") instanceof Number n ? n.longValue() : null;
            es.add(new Leased.Entry(String.valueOf(e.get("key")), e.get("value"), ttl));
        }
        Map<String, Object> w = client(s).warm(es, null);
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("stored", w.get("stored"));
        long failed = 0;
        for (Object o : (List<?>) w.get("results")) {
            if (o instanceof Map<?, ?> m && !Boolean.TRUE.equals(m.get("ok"))) {
                if (failed++ == 0 && m.get("error") instanceof Map<?, ?> err) {
                    r.put("first_error", err.get("code"));
                }
            }
        }
        r.put("failed", failed);
        return r;
    }

    Map<String, Object> update(Map<String, Object> s) throws Exception {
        Map<String, Object> w = s.get("writer") instanceof Map<?, ?> m ? asMap(m) : Map.of();
        client(s).update(keys(s.get("keys")), () -> {
            if (w.get("count_file") instanceof String f) {
                appendLine(f);
            }
            return null;
        });
        return new LinkedHashMap<>();
    }

    static Path tmpFile(String name) {
        return Path.of(System.getenv("LEASED_CONF_TMP"), name);
    }

    static void appendLine(String name) throws IOException {
        Files.writeString(tmpFile(name), "x\n", StandardOpenOption.CREATE,
                StandardOpenOption.APPEND);
    }

    static Map<String, Object> count(String name) throws IOException {
        Path p = tmpFile(name);
        long n = Files.exists(p) ? Files.readAllLines(p).size() : 0;
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("lines", n);
        return r;
    }

    Map<String, Object> env(Map<String, Object> s) throws Exception {
        Map<String, Object> r = control(s);
        if (!Boolean.TRUE.equals(r.get("ok"))) {
            throw new StepFailed("env " + s.get("action") + ": " + r.get("error"));
        }
        r = new LinkedHashMap<>(r);
        r.remove("ok");
        return r;
    }

    /** One request on the control channel: connect, one line out, one line back. */
    static Map<String, Object> control(Map<String, Object> req) throws IOException {
        try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            c.connect(UnixDomainSocketAddress.of(System.getenv("LEASED_CONTROL")));
            byte[] line = (Json.encode(req) + "\n").getBytes(StandardCharsets.UTF_8);
            ByteBuffer b = ByteBuffer.wrap(line);
            while (b.hasRemaining()) {
                c.write(b);
            }
            var in = new java.io.BufferedReader(new java.io.InputStreamReader(
                    Channels.newInputStream(c), StandardCharsets.UTF_8));
            String reply = in.readLine();
            if (reply == null) {
                throw new IOException("the control channel closed without a reply");
            }
            return asMap(Json.decode(reply));
        }
    }
}
