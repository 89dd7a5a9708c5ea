#!/usr/bin/env python3
"""Partitions and pauses judged by a history checker (make jepsen).

The topology: one network namespace holds the backend, and each leased
daemon runs in a namespace of its own, joined to the backend by a veth
pair. Two backends (--backend):
* sentinel (the default): a Redis master, a replica and three Sentinels,
  all on the service address 10.231.0.1;
* cluster: a Redis Cluster of three masters and three replicas on
  10.232.0.1, ports 7001-7006, with a cluster-node-timeout of 2 s so that
  the cluster itself promotes a replica when its master dies or stops.
  The lock key's slot and the cache key's slot are given to one master
  (7001), so the faults aimed at "the master" hit both workloads.
Each run's namespaces and links are named after the backend and the pid,
and the two backends use different subnets, so runs side by side (of one
backend or both) do not collide. The clients run in the root namespace:
they reach their daemon over its Unix socket and the resource they guard
(the "database", a separate Redis on loopback) directly, so a partition
cuts a daemon from its locks but not its clients from the resource, as in
production.

The oneway nemesis puts daemon 1's path to Redis through the fault proxy:
under Sentinel that daemon runs in the backend's namespace and talks to
the master through one proxy; on a cluster it stays in its own namespace,
where the service address is local and one proxy per node forwards over
its link, since the daemon connects to whatever nodes the cluster names.

This is a Python driver rather than C on the integration harness: most of
it is running `ip`, starting and signalling processes and JSON lines, and
the clients must be processes of their own to be paused; the fault proxy
is reused through tests/jepsen/fpctl.

Usage: jepsen.py run [--backend sentinel|cluster] [--seconds N]
                    [--nemesis a,b] [--results FILE]
       (as root; JEPSEN_SECONDS, LEASED_BIN, REDIS_SERVER, FPCTL_BIN)
--results replaces the backend's section of FILE (between its marker
lines), or appends one when FILE has none.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402
import worker  # noqa: E402

NEMESES = ["none", "partition", "oneway", "pause-daemon", "pause-client",
           "pause-redis", "data-loss", "failover"]
LEASE_MS = 1500
DD_MS = 300
DAEMONS = 2
ALL = list(range(1, DAEMONS + 1))


def sh(*args, check=True):
    return subprocess.run(args, check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True).stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Topology:
    """Everything one nemesis run starts; stop() undoes all of it by pid
    and by name, and is safe to call twice and after a partial start.
    The backend's own part is in a subclass."""

    TAG = "lj"  # namespace and link names: TAG + pid + ...
    NET = 231  # the backend's subnets: 10.NET.0.1 and 10.NET.i.0/24
    SVC = "10.231.0.1"  # the backend's service address

    def __init__(self, a, nemesis):
        self.a = a
        self.nemesis = nemesis
        self.tag = self.TAG + "%d" % os.getpid()
        self.rns = self.tag + "r"
        self.dns = [self.tag + "d%d" % i for i in range(1, DAEMONS + 1)]
        self.dir = tempfile.mkdtemp(prefix="jepsen-")
        self.procs = {}  # name -> Popen
        self.fp = None

    # -- namespaces ----------------------------------------------------
    def veth(self, i):
        return self.tag + "a%d" % i, self.tag + "b%d" % i

    def net_up(self):
        sh("ip", "netns", "add", self.rns)
        sh("ip", "-n", self.rns, "link", "set", "lo", "up")
        sh("ip", "-n", self.rns, "addr", "add", self.SVC + "/32", "dev",
           "lo")
        for i, ns in enumerate(self.dns, 1):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            r, d = self.veth(i)
            sh("ip", "link", "add", r, "netns", self.rns, "type", "veth",
               "peer", "name", d, "netns", ns)
            sh("ip", "-n", self.rns, "addr", "add",
               "10.%d.%d.1/24" % (self.NET, i), "dev", r)
            sh("ip", "-n", ns, "addr", "add", "10.%d.%d.2/24" % (self.NET, i),
               "dev", d)
            self.link(i, True)

    def link(self, i, up):
        r, d = self.veth(i)
        state = "up" if up else "down"
        sh("ip", "-n", self.rns, "link", "set", r, state)
        sh("ip", "-n", self.dns[i - 1], "link", "set", d, state)
        if up:
            sh("ip", "-n", self.dns[i - 1], "route", "replace",
               self.SVC + "/32", "via", "10.%d.%d.1" % (self.NET, i))

    def net_down(self):
        for ns in [self.rns] + self.dns:
            sh("ip", "netns", "del", ns, check=False)

    # -- processes -----------------------------------------------------
    def spawn(self, name, argv, ns=None, **kw):
        if ns:
            argv = ["ip", "netns", "exec", ns] + argv
        # Appended: a server restarted by the nemesis keeps its earlier
        # lives' log.
        log = open(os.path.join(self.dir, name + ".log"), "a")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log,
                                            **kw)
        return self.procs[name]

    def redis(self, port, replicaof=None, extra=()):
        # Without persistence Redis still writes the RDB a replica
        # receives in a full sync to its dbfilename, and loads that file
        # when it starts: one file per server, removed before each start,
        # or a restart "without data" comes back with an old snapshot (of
        # itself or, in one shared dump.rdb, of another server).
        rdb = "dump-%d.rdb" % port
        try:
            os.unlink(os.path.join(self.dir, rdb))
        except FileNotFoundError:
            pass
        argv = [self.a.redis, "--port", str(port), "--bind", "0.0.0.0",
                "--save", "", "--appendonly", "no", "--protected-mode", "no",
                "--replica-announce-ip", self.SVC, "--dir", self.dir,
                "--dbfilename", rdb]
        argv += list(extra)
        if self.a.min_replicas > 0:
            # The setting leased-protocol(7) GUARANTEES asks for under
            # Sentinel: a master whose replica is gone or still syncing
            # refuses writes instead of acknowledging what a failover to
            # that replica would lose.
            # No diskless sync delay: a replica that must resync (after
            # each data loss or failover) is back in sync at once, not
            # after 5 s of refused writes.
            argv += ["--min-replicas-to-write", str(self.a.min_replicas),
                     "--min-replicas-max-lag", "1",
                     "--repl-diskless-sync-delay", "0"]
        if replicaof:
            argv += ["--replicaof", self.SVC, str(replicaof)]
        self.spawn("redis%d" % port, argv, self.rns)
        self.wait_redis(port)

    def ask(self, port, *cmd):
        return sh("ip", "netns", "exec", self.rns, "redis-cli", "-h",
                  self.SVC, "-p", str(port), *cmd, check=False).strip()

    def wait_redis(self, port):
        until(lambda: self.ask(port, "PING") == "PONG", 10, "redis up")

    def daemon(self, i):
        ns, redis = self.daemon_backend(i)
        conf = os.path.join(self.dir, "leased%d.yml" % i)
        with open(conf, "w") as f:
            f.write("listen:\n  unix: %s\n  tcp: \"\"\n"
                    "redis:\n  %s\n  timeout_ms: 300\n"
                    "lock:\n  watchdog_ms: %d\n"
                    "cache:\n  double_delete_ms: %d\n"
                    "journal:\n  path: %s\n"
                    "metrics:\n  listen: \"\"\n"
                    "log:\n  level: info\n"
                    % (self.sock(i), redis, LEASE_MS, DD_MS,
                       os.path.join(self.dir, "journal%d" % i)))
        self.spawn("leased%d" % i, [self.a.leased, "-f", "-c", conf], ns)
        until(lambda: os.path.exists(self.sock(i)), 10, "leased up")

    def sock(self, i):
        return os.path.join(self.dir, "leased%d.sock" % i)

    def fp_mode(self, mode):
        self.fp.stdin.write(mode + "\n")
        self.fp.stdin.flush()

    def start(self):
        self.net_up()
        self.backend_up()
        if self.nemesis == "oneway":
            self.proxy()
        for i in range(1, DAEMONS + 1):
            self.daemon(i)
        self.rport = free_port()
        self.spawn("resource", [self.a.redis, "--port", str(self.rport),
                                "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"])
        until(lambda: port_open(self.rport), 10, "resource redis up")

    def workers(self, seconds):
        self.hist = os.path.join(self.dir, "history.jsonl")
        roles = []
        for i in range(1, DAEMONS + 1):
            roles += [(i, "lock"), (i, "lock"), (i, "cread"), (i, "cwrite")]
        self.clients = []
        for n, (i, role) in enumerate(roles):
            argv = [sys.executable, os.path.abspath(__file__), "worker",
                    "--sock", self.sock(i), "--role", role, "--id", str(n),
                    "--out", self.hist, "--resource-port", str(self.rport),
                    "--seconds", str(seconds), "--seed", str(n),
                    "--lease-ms", str(LEASE_MS), "--dd-ms", str(DD_MS)]
            self.clients.append(self.spawn("client%d" % n, argv))

    def stop(self):
        for name, p in self.procs.items():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = {}
        self.net_down()

    def cleanup_dir(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelTopology(Topology):
    """A Redis master and its replica, watched by three Sentinels."""

    def backend_up(self):
        self.redis(6379)
        self.redis(6380, replicaof=6379)
        self.sentinels()

    def sentinels(self):
        for k in range(3):
            port = 26379 + k
            conf = os.path.join(self.dir, "sentinel%d.conf" % k)
            with open(conf, "w") as f:
                f.write("port %d\nbind 0.0.0.0\nprotected-mode no\n"
                        "sentinel announce-ip %s\n"
                        "sentinel monitor mymaster %s 6379 2\n"
                        "sentinel down-after-milliseconds mymaster 3000\n"
                        "sentinel failover-timeout mymaster 6000\n"
                        % (port, self.SVC, self.SVC))
            self.spawn("sentinel%d" % k, [self.a.redis, conf, "--sentinel"],
                       self.rns)
        # Only a failover needs the Sentinels to know the replica and each
        # other (about 10 s); the others start once the master is known.
        want = "slaves=1,sentinels=3" if self.nemesis == "failover" \
            else "status=ok"
        until(lambda: all(want in self.ask(26379 + k, "INFO", "sentinel")
                          for k in range(3)), 30, "Sentinels ready")

    def current_master(self):
        out = self.ask(26379, "SENTINEL", "get-master-addr-by-name",
                       "mymaster").split()
        return int(out[1]) if len(out) == 2 else 6379

    def daemon_backend(self, i):
        """The namespace daemon I runs in and its redis: section."""
        if self.nemesis == "oneway" and i == 1:
            # The proxy listens on the backend's loopback: this daemon
            # runs in the backend namespace, its Redis path through it.
            return self.rns, ("mode: standalone\n  address: "
                              "\"127.0.0.1:%d\"" % self.fp_port)
        return self.dns[i - 1], (
            "mode: sentinel\n  addresses: [%s]\n  master_name: mymaster"
            % ", ".join("\"%s:%d\"" % (self.SVC, 26379 + k)
                        for k in range(3)))

    def proxy(self):
        self.fp = subprocess.Popen(
            ["ip", "netns", "exec", self.rns, self.a.fpctl, "6379"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs["fpctl"] = self.fp
        self.fp_port = int(self.fp.stdout.readline())

    def restart_master(self, wipe, note):
        m = self.current_master()
        other = 6380 if m == 6379 else 6379
        # The fault starts at the kill, not before the question above: on
        # a loaded host redis-cli took up to 174 ms, and the daemons
        # confirmed leases meanwhile.
        note("start", daemons=ALL)
        self.procs["redis%d" % m].kill()
        self.procs["redis%d" % m].wait()
        if wipe:
            # Data loss: the same master back at once, empty (no
            # persistence), before the Sentinels would fail over.
            self.redis(m)
            return
        until(lambda: self.current_master() == other, 30, "failover")
        # The fault ends with the promotion: from then on the daemons can
        # confirm leases again. The old master returns as a replica.
        note("end")
        self.redis(m, replicaof=other)


def keyslot(key):
    """Redis Cluster's hash slot of KEY (CRC16/XMODEM mod 16384; the key
    has no hash tag of its own)."""
    crc = 0
    for byte in key.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xffff
    return crc % 16384


# The daemons name a lock's keys and a cache entry "<prefix>{KEY}": the
# slots the workload's lock ("jl", worker.py) and cache entry ("jc") live in.
LOCK_SLOT = keyslot("jl")
CACHE_SLOT = keyslot("jc")


class ClusterTopology(Topology):
    """A Redis Cluster: three masters, each with one replica, all on the
    service address, ports 7001-7006 (their cluster bus 10000 higher)."""

    TAG = "lc"
    NET = 232
    SVC = "10.232.0.1"
    MASTERS = [7001, 7002, 7003]
    REPLICAS = [7004, 7005, 7006]
    NODE_TIMEOUT_MS = 2000

    def node(self, port):
        # The same nodes.conf across a restart: a node killed and started
        # again keeps its id and its slots (or its master), and without
        # persistence comes back empty.
        self.redis(port, extra=[
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes-%d.conf" % port,
            "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS),
            "--cluster-announce-ip", self.SVC])

    def slot_ranges(self):
        """Three even ranges, but the cache key's slot goes to the master
        of the lock key's, so a fault of that one master hits both."""
        even = [(0, 5460), (5461, 10922), (10923, 16383)]
        out = [[r] for r in even]
        own = [k for k, (lo, hi) in enumerate(even) if lo <= LOCK_SLOT <= hi]
        has = [k for k, (lo, hi) in enumerate(even) if lo <= CACHE_SLOT <= hi]
        if own != has:
            lo, hi = even[has[0]]
            out[has[0]] = [r for r in ((lo, CACHE_SLOT - 1),
                                       (CACHE_SLOT + 1, hi)) if r[0] <= r[1]]
            out[own[0]].append((CACHE_SLOT, CACHE_SLOT))
        return out

    def nodes(self, port):
        """CLUSTER NODES as node PORT sees it: {port: (id, flags, master
        id, [slot ranges])}."""
        out = {}
        for line in self.ask(port, "CLUSTER", "NODES").splitlines():
            f = line.split()
            if len(f) < 8 or "@" not in f[1]:
                continue
            p = int(f[1].split("@")[0].rsplit(":", 1)[1] or 0)
            ranges = []
            for r in f[8:]:
                if r.startswith("["):
                    continue  # a slot being migrated or imported
                lo, _, hi = r.partition("-")
                ranges.append((int(lo), int(hi or lo)))
            out[p] = (f[0], f[2].split(","), f[3], ranges)
        return out

    def owner(self, port, slot):
        """The port of the master of SLOT as node PORT sees it, or None.
        A master flagged as failing still owns its slots until a replica
        is promoted: the failover nemesis waits for that promotion, and
        must not take the failing flag for it (restarting the old master
        empty before then, it would hand the cluster an empty master that
        its replica then syncs from)."""
        for p, (_, flags, _, ranges) in self.nodes(port).items():
            if "master" in flags and \
                    any(lo <= slot <= hi for lo, hi in ranges):
                return p
        return None

    def cluster_ok(self):
        want = self.MASTERS[0]
        for p in self.MASTERS + self.REPLICAS:
            info = self.ask(p, "CLUSTER", "INFO")
            if "cluster_state:ok" not in info or \
                    "cluster_slots_ok:16384" not in info or \
                    self.owner(p, LOCK_SLOT) != want:
                return False
        return all("master_link_status:up" in
                   self.ask(r, "INFO", "replication") for r in self.REPLICAS)

    def backend_up(self):
        ports = self.MASTERS + self.REPLICAS
        for p in ports:
            self.node(p)
        ids = {p: self.ask(p, "CLUSTER", "MYID") for p in ports}
        for k, p in enumerate(ports, 1):
            # Distinct config epochs from the start, as redis-cli --cluster
            # create gives them, rather than left to collision handling.
            self.ask(p, "CLUSTER", "SET-CONFIG-EPOCH", str(k))
        for p in ports[1:]:
            self.ask(ports[0], "CLUSTER", "MEET", self.SVC, str(p))
        for m, ranges in zip(self.MASTERS, self.slot_ranges()):
            args = [str(x) for r in ranges for x in r]
            self.ask(m, "CLUSTER", "ADDSLOTSRANGE", *args)

        def met():
            for p in ports:
                seen = self.nodes(p)
                if len(seen) != len(ports) or any(
                        "handshake" in v[1] or "noaddr" in v[1]
                        for v in seen.values()):
                    return False
            return True

        until(met, 30, "cluster nodes to meet")
        for r, m in zip(self.REPLICAS, self.MASTERS):
            # A replica must have heard of its master by id first; met()
            # waited for that.
            until(lambda: self.ask(r, "CLUSTER", "REPLICATE", ids[m]) == "OK",
                  10, "CLUSTER REPLICATE")
        until(self.cluster_ok, 60, "cluster_state:ok")

    def current_master(self):
        """The master of the lock key's slot, as the first master that
        is never a target (7002, else 7003) sees it."""
        found = []

        def ask():
            for p in self.MASTERS[1:]:
                m = self.owner(p, LOCK_SLOT)
                if m is not None:
                    found.append(m)
                    return True
            return False

        until(ask, 10, "the lock slot's master")
        return found[0]

    def daemon_backend(self, i):
        return self.dns[i - 1], (
            "mode: cluster\n  addresses: [%s]"
            % ", ".join("\"%s:%d\"" % (self.SVC, p) for p in self.MASTERS))

    def proxy(self):
        """Daemon 1 reaches every node through the fault proxy: in its
        namespace the service address is local, and a proxy on each
        node's port there forwards over the link to the node (the
        cluster bus and the other daemon do not pass through it)."""
        ns = self.dns[0]
        sh("ip", "-n", ns, "addr", "add", self.SVC + "/32", "dev", "lo")
        ports = [str(p) for p in self.MASTERS + self.REPLICAS]
        self.fp = subprocess.Popen(
            ["ip", "netns", "exec", ns, self.a.fpctl, "-a", self.SVC,
             "10.%d.1.1" % self.NET] + ports,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs["fpctl"] = self.fp
        for _ in ports:
            if not self.fp.stdout.readline():
                raise RuntimeError("fpctl did not start")

    def restart_master(self, wipe, note):
        m = self.current_master()
        note("start", daemons=ALL)  # at the kill, as above
        self.procs["redis%d" % m].kill()
        self.procs["redis%d" % m].wait()
        if wipe:
            # Data loss: the same node back at once with its slots, empty
            # (no persistence), long before the cluster would fail over;
            # its replica then resyncs from it, empty too.
            self.node(m)
            return
        until(lambda: self.current_master() != m, 30, "failover")
        # The fault ends with the promotion; the old master returns as a
        # replica of its successor, and the next failover waits until it
        # is in sync (a replica that never synced is not eligible under
        # the default cluster-replica-validity-factor).
        note("end")
        self.node(m)
        until(lambda: "master_link_status:up" in
              self.ask(m, "INFO", "replication"), 30, "replica in sync")


TOPOLOGIES = {"sentinel": SentinelTopology, "cluster": ClusterTopology}


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def until(cond, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise RuntimeError("timed out waiting for " + what)


def stopped(pid, seconds=1.0):
    """True once /proc says PID is stopped (state T), within SECONDS."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with open("/proc/%d/stat" % pid) as f:
                # The state follows the command name, which is in parens.
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return True
        except OSError:
            return False
        time.sleep(0.01)
    return False


class Nemesis:
    """Faults in cycles of a few seconds; each start and end is written
    into the history, so the checker knows when a client was paused."""

    def __init__(self, c, kind, hist, rng):
        self.c, self.kind, self.rng = c, kind, rng
        self.out = open(hist, "a", buffering=1)
        self.lock = threading.Lock()

    def note(self, what, **kw):
        rec = dict(p="nemesis", f=what, t=time.monotonic(), type="nemesis",
                   kind=self.kind)
        rec.update(kw)
        with self.lock:
            self.out.write(json.dumps(rec) + "\n")

    def run(self, seconds):
        end = time.monotonic() + seconds
        watch = threading.Thread(target=self.watch_master, args=(end,),
                                 daemon=True)
        watch.start()
        while time.monotonic() < end - 4:
            time.sleep(self.rng.uniform(1.5, 3))
            if self.kind != "none":
                self.fault(self.rng.uniform(2, 4))
        watch.join()

    def watch_master(self, end):
        """Note each promotion the Sentinels (or the cluster) make,
        whatever the fault: a pause of the master past
        down-after-milliseconds (cluster-node-timeout) is a failover too,
        and writes the old master had not replicated are lost."""
        seen = self.c.current_master()
        while time.monotonic() < end:
            time.sleep(0.1)
            m = self.c.current_master()
            if m != seen:
                self.note("promoted", master=m, was=seen)
                seen = m

    def fault(self, length):
        c, k = self.c, self.kind
        if k == "partition":
            i = self.rng.randint(1, DAEMONS)
            self.note("start", link=i, daemons=[i])
            c.link(i, False)
            time.sleep(length)
            c.link(i, True)
        elif k == "oneway":
            mode = self.rng.choice(["drop_up", "drop_down", "stall"])
            self.note("start", mode=mode, daemons=[1])
            c.fp_mode(mode)
            time.sleep(length)
            c.fp_mode("pass")
        elif k in ("pause-daemon", "pause-client", "pause-redis"):
            self.pause(k, length)
            return
        elif k == "data-loss":
            self.restart_master(wipe=True)
        elif k == "failover":
            self.restart_master(wipe=False)
            return
        self.note("end")

    def pause(self, k, length):
        c = self.c
        hit = ALL
        if k == "pause-daemon":
            hit = [self.rng.randint(1, DAEMONS)]
            name = "leased%d" % hit[0]
        elif k == "pause-redis":
            name = "redis%d" % c.current_master()
        else:
            hit = []
            # Mostly lock holders: a stopped holder is what (b) is about.
            locks = [n for n in range(len(c.clients)) if n % 4 < 2]
            n = self.rng.choice(locks) if self.rng.random() < 0.75 else \
                self.rng.randrange(len(c.clients))
            name = "client%d" % n
        p = c.procs[name]
        # ip netns exec execs the program: the pid is the program's.
        t = time.monotonic()
        p.send_signal(signal.SIGSTOP)
        if stopped(p.pid):
            self.note("start", target=name, pid=p.pid, daemons=hit, t=t)
        else:
            # Not seen stopped: the fault cut nobody, and the checker must
            # not judge lock_lost against it.
            self.note("start", target=None, pid=p.pid, daemons=[], t=t,
                      missed=name)
        time.sleep(length)
        p.send_signal(signal.SIGCONT)
        self.note("end", target=name, pid=p.pid)

    def restart_master(self, wipe):
        self.c.restart_master(wipe, self.note)


def run_one(a, kind, seconds):
    c = TOPOLOGIES[a.backend](a, kind)
    rng = random.Random(a.seed)
    try:
        c.start()
        c.workers(seconds)
        nem = Nemesis(c, kind, c.hist, rng)
        nem.run(seconds)
        for w in c.clients:
            w.wait(timeout=seconds + 60)
        hist = checker.load(c.hist)
        for i in ALL:
            log = os.path.join(c.dir, "leased%d.log" % i)
            hist += checker.daemon_log(log, i)
            if a.keep:
                shutil.copy(log, "leased%d-%s.log" % (i, kind))
        db = worker.Resp(c.rport)
        final = {"log": db.cmd("LRANGE", "reg:log", 0, -1),
                 "reg": db.cmd("GET", "reg"),
                 "counter": db.cmd("GET", "counter")}
        res = checker.check(hist, final, DD_MS,
                            daemon_of=lambda p: p // 4 + 1)
        res["nemesis"] = kind
        res["seconds"] = seconds
        if a.keep:
            shutil.copy(c.hist, "history-%s.jsonl" % kind
                        if a.backend == "sentinel"
                        else "history-%s-%s.jsonl" % (a.backend, kind))
        return res
    finally:
        c.stop()
        if not a.keep_dir:
            c.cleanup_dir()


TITLES = {"sentinel": "Redis with a replica and Sentinels "
                      "(--backend sentinel)",
          "cluster": "Redis Cluster (--backend cluster)"}


def write_results(path, backend, table):
    """Put TABLE (checker.table's page) into PATH as the backend's
    section: between its two marker lines if PATH has them, else at the
    end, so that the runs of the two backends and the text around them
    stay side by side in one file."""
    begin = "<!-- make jepsen --backend %s: begin -->" % backend
    end = "<!-- make jepsen --backend %s: end -->" % backend
    body = table.split("\n", 1)[1] if table.startswith("# ") else table
    body = "\n".join("#" + x if x.startswith("## ") else x
                     for x in body.split("\n"))
    section = "%s\n## %s\n%s%s" % (begin, TITLES[backend], body, end)
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = "# make jepsen: results\n"
    i, j = old.find(begin), old.find(end)
    if 0 <= i < j:
        new = old[:i] + section + old[j + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    with open(path + ".tmp", "w") as f:
        f.write(new)
    os.replace(path + ".tmp", path)


def cmd_run(a):
    if os.geteuid() != 0:
        print("jepsen: needs root (ip netns); skipped")
        return 77
    kinds = a.nemesis.split(",") if a.nemesis else NEMESES
    results = []

    def on_signal(sig, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    for kind in kinds:
        print("jepsen: %s %s for %ds" % (a.backend, kind, a.seconds),
              flush=True)
        r = run_one(a, kind, a.seconds)
        print(checker.summary(r), flush=True)
        results.append(r)
    if a.results:
        write_results(a.results, a.backend, checker.table(results, a.label))
    bad = [r for r in results if r["anomalies"]]
    for r in bad:
        print(checker.excerpt(r))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seconds", type=int,
                   default=int(os.environ.get("JEPSEN_SECONDS", "180")))
    r.add_argument("--nemesis", default="")
    r.add_argument("--backend", choices=sorted(TOPOLOGIES),
                   default="sentinel")
    r.add_argument("--results", default="")
    r.add_argument("--label", default="")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--keep", action="store_true")
    r.add_argument("--keep-dir", action="store_true")
    r.add_argument("--min-replicas", type=int, default=1,
                   help="Redis min-replicas-to-write (0: off)")
    r.add_argument("--leased", default=os.environ.get("LEASED_BIN",
                                                      "src/leased"))
    r.add_argument("--redis", default=os.environ.get("REDIS_SERVER",
                                                     "redis-server"))
    r.add_argument("--fpctl", default=os.environ.get("FPCTL_BIN",
                                                     "tests/jepsen/fpctl"))
    w = sub.add_parser("worker")
    for opt in ("--sock", "--role", "--out"):
        w.add_argument(opt, required=True)
    for opt in ("--id", "--resource-port", "--seconds", "--seed",
                "--lease-ms", "--dd-ms"):
        w.add_argument(opt, type=int, required=True)
    a = ap.parse_args()
    if a.cmd == "worker":
        return worker.main(a)
    a.leased = os.path.abspath(a.leased)
    a.fpctl = os.path.abspath(a.fpctl)
    return cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
