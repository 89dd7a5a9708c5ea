// The Java client's own CPU per uncontended lock+unlock pair (see
// clientcpu.js): WORKERS threads, each on its own key, do PAIRS pairs in
// all; the process's CPU time (all its threads: the JIT and the GC too)
// over them divided by PAIRS. One JSON line on stdout. Run in the JDK's
// source-file mode against the built client:
//
//     java -cp leased-client.jar ClientCpu.java --sock=PATH
//         [--workers=50] [--pairs=50000] [--pool=N] [--label=TEXT]
//
// Without --pool each thread has its own Leased (as the Python rows); with
// --pool=N the threads share one LeasedPool of N connections.

import io.leased.Leased;
import io.leased.LeasedPool;
import io.leased.LockOptions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

public class ClientCpu {
    static long cpuNs() {
        return ProcessHandle.current().info().totalCpuDuration().orElse(Duration.ZERO).toNanos();
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opt = new HashMap<>();
        for (String a : args) {
            int eq = a.indexOf('=');
            if (!a.startsWith("--") || eq < 0) {
                throw new IllegalArgumentException("bad argument " + a);
            }
            opt.put(a.substring(2, eq), a.substring(eq + 1));
        }
        int workers = Integer.parseInt(opt.getOrDefault("workers", "50"));
        int pairs = Integer.parseInt(opt.getOrDefault("pairs", "50000"));
        // The JIT compiles the hot path during the warm-up, not the measure.
        int warm = Math.min(pairs, Integer.parseInt(opt.getOrDefault("warm", "20000")));
        String sock = opt.get("sock");
        LockOptions once = new LockOptions();
        List<AutoCloseable> closers = new ArrayList<>();
        Function<Integer, Leased> conn;
        if (opt.containsKey("pool")) {
            LeasedPool pool = new LeasedPool(sock, Integer.parseInt(opt.get("pool")));
            closers.add(pool);
            conn = w -> pool.connection();
        } else {
            List<Leased> own = new ArrayList<>();
            for (int w = 0; w < workers; w++) {
                Leased l = new Leased(sock);
                own.add(l);
                closers.add(l);
            }
            conn = own::get;
        }
        run(conn, workers, warm, once, "warm");
        long c0 = cpuNs();
        long t0 = System.nanoTime();
        run(conn, workers, pairs, once, "m");
        long t1 = System.nanoTime();
        long c1 = cpuNs();
        for (AutoCloseable c : closers) {
            c.close();
        }
        String conns = opt.containsKey("pool") ? "\"pool " + opt.get("pool") + "\""
                : String.valueOf(workers);
        System.out.printf("{\"lang\":\"java\",\"label\":\"%s\",\"workers\":%d,\"pairs\":%d,"
                + "\"conns\":%s,\"cpu_us_per_pair\":%.3f,\"pairs_per_s\":%.1f}%n",
                opt.getOrDefault("label", "leased"), workers, pairs, conns,
                (c1 - c0) / 1e3 / pairs, pairs / ((t1 - t0) / 1e9));
    }

    static void run(Function<Integer, Leased> conn, int workers, int n, LockOptions once,
            String tag) throws Exception {
        List<Thread> ts = new ArrayList<>();
        List<Throwable> errors = java.util.Collections.synchronizedList(new ArrayList<>());
        for (int w = 0; w < workers; w++) {
            int share = n / workers + (w < n % workers ? 1 : 0);
            String key = "clientcpu:java:" + tag + ":" + ProcessHandle.current().pid() + ":" + w;
            Leased c = conn.apply(w);
            Thread t = new Thread(() -> {
                try {
                    for (int i = 0; i < share; i++) {
                        // A lock that stayed held would be taken again reentrantly.
                        c.lock(key, once).close();
                    }
                } catch (Throwable e) {
                    errors.add(e);
                }
            });
            ts.add(t);
            t.start();
        }
        for (Thread t : ts) {
            t.join();
        }
        if (!errors.isEmpty()) {
            throw new RuntimeException(errors.get(0));
        }
    }
}
