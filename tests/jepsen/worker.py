"""One client process of the Jepsen-style test: it talks to one leased
daemon over its Unix socket and to the resource Redis (the "database" the
locks guard) over loopback, and writes every operation it makes as one JSON
line: {"p": process, "f": op, "inv": t, "cpl": t, "type": ok|fail|info,...}
with times from CLOCK_MONOTONIC, shared by every process on the machine.
It is a separate process so that the nemesis can pause it (SIGSTOP)."""

import json
import queue
import random
import socket
import threading
import time

now = time.monotonic

# The fenced register: a read or a write carrying fence F is refused when
# a higher fence was seen (reads count: a holder that read under fence 5
# must not write after fence 6 read). Accepted writes are logged with the
# value the client read and the value found, so the checker sees lost
# updates.
FENCED = """
local f = tonumber(ARGV[1])
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if f < m then return {0, tostring(m)} end
redis.call('SET', KEYS[2], f)
local v = redis.call('GET', KEYS[1]) or '0'
if ARGV[2] == 'w' then
  redis.call('SET', KEYS[1], ARGV[4])
  redis.call('RPUSH', KEYS[3], ARGV[1]..' '..ARGV[3]..' '..v..' '..ARGV[4]..' '..ARGV[5])
end
return {1, v}
"""


class Resp:
    """A minimal RESP client for the resource Redis."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.f = self.s.makefile("rb")

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self._read()

    def _read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2].decode()
        if t == b"*":
            return [self._read() for _ in range(int(rest))]
        raise RuntimeError("bad reply %r" % line)


class Leased:
    """One session; a reader thread stamps every line as it arrives, so a
    lock_lost is timed when the kernel hands it over, not when the
    workload next looks."""

    def __init__(self, path, on_event):
        self.on_event = on_event
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.replies = queue.Queue()
        self.events = []
        self.lock = threading.Lock()
        self.next_id = 0
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        f = self.s.makefile("rb")
        for line in f:
            t = now()
            msg = json.loads(line)
            if "event" in msg:
                with self.lock:
                    self.events.append((t, msg))
                self.on_event(t, msg)
            else:
                self.replies.put(msg)
        self.replies.put(None)

    def call(self, op, timeout=10, **fields):
        self.next_id += 1
        fields.update(op=op, id=self.next_id)
        self.s.sendall(json.dumps(fields).encode() + b"\n")
        while True:
            r = self.replies.get(timeout=timeout)
            if r is None:
                raise ConnectionError("daemon closed the session")
            if r.get("id") == self.next_id:
                return r

    def lost(self, token):
        with self.lock:
            for t, e in self.events:
                if e.get("event") == "lock_lost" and e.get("token") == token:
                    return t, e
        return None


class Worker:
    def __init__(self, args):
        self.a = args
        self.p = args.id
        self.out = open(args.out, "a", buffering=1)
        self.rng = random.Random(args.seed)
        self.db = Resp(args.resource_port)
        self.sha = self.db.cmd("SCRIPT", "LOAD", FENCED)
        self.d = None
        self.n = 0

    def rec(self, f, inv, typ, **kw):
        kw.update(p=self.p, f=f, inv=inv, cpl=now(), type=typ)
        self.out.write(json.dumps(kw) + "\n")

    def event(self, t, msg):
        """Every event, as it arrives (the reader thread's; one write of
        one line, so it never interleaves with the workload's)."""
        self.out.write(json.dumps({"p": self.p, "f": msg["event"],
                                   "type": "event", "t": t,
                                   "token": msg.get("token"),
                                   "reason": msg.get("reason")}) + "\n")

    def session(self):
        if self.d is None:
            self.d = Leased(self.a.sock, self.event)
        return self.d

    def leased(self, op, **fields):
        """(reply or None, invocation time); None means unknown."""
        inv = now()
        try:
            return self.session().call(op, **fields), inv
        except (OSError, queue.Empty, ConnectionError, ValueError):
            self.d = None
            return None, inv

    def fenced(self, fence, mode, read, new, tag):
        return self.db.cmd("EVALSHA", self.sha, 3, "reg", "reg:fence",
                           "reg:log", fence, mode, read, new, tag)

    def hold(self):
        # A watchdog lease (no ttl_ms): the daemon renews it and owes
        # lock_lost when it can no longer prove it (a fixed lease just
        # runs out, without an event, as leased-protocol(7) says).
        r, inv = self.leased("lock", key="jl", wait_ms=2000,
                             owner=str(self.p))
        if r is None or not r.get("ok") or not r.get("acquired"):
            self.rec("lock", inv, "info" if r is None else "fail",
                     err=None if r is None else r.get("error"))
            time.sleep(0.05)  # backoff while the backend is away
            return
        tok, fence = r["token"], r["fence"]
        self.rec("lock", inv, "ok", token=tok, fence=fence,
                 lease=r["lease_ms"])
        self.work(tok, fence)
        r, inv = self.leased("unlock", key="jl", token=tok)
        self.rec("unlock", inv, "info" if r is None else
                 ("ok" if r.get("ok") else "fail"), token=tok)

    def lost(self, tok):
        return self.d is not None and self.d.lost(tok) is not None

    def step(self, tok, fence):
        """One read-modify-write on each resource; False when the hold is
        over (lost or fenced out)."""
        self.n += 1
        tag = "%d.%d" % (self.p, self.n)
        inv = now()
        ok, v = self.fenced(fence, "r", "", "", tag)
        self.rec("fread", inv, "ok" if ok else "fail", fence=fence,
                 value=v, token=tok)
        if not ok:
            return False
        time.sleep(self.rng.uniform(0, 0.2))  # the app's own work
        if self.lost(tok):
            return False
        inv = now()
        new = str(int(v) + 1)
        ok, _ = self.fenced(fence, "w", v, new, tag)
        self.rec("fwrite", inv, "ok" if ok else "fail", fence=fence,
                 read=v, value=new, tag=tag, token=tok)
        if not ok or self.lost(tok):
            return False
        inv = now()
        c = int(self.db.cmd("GET", "counter") or 0)
        time.sleep(self.rng.uniform(0, 0.02))
        self.db.cmd("SET", "counter", c + 1)
        self.rec("incr", inv, "ok", read=c, token=tok)
        return True

    def work(self, tok, fence):
        # One hold in five outlasts the lease several times over, so that
        # a fault in its middle has a holder that keeps writing.
        n = self.rng.randint(30, 45) if self.rng.random() < 0.2 else \
            self.rng.randint(1, 15)
        for _ in range(n):
            if not self.step(tok, fence):
                break

    def cache_write(self):
        inv = now()
        v = self.db.cmd("INCR", "db:jc")
        self.rec("db_write", inv, "ok", value=v)
        r, inv = self.leased("cache.invalidate", key="jc",
                             delay_ms=self.a.dd_ms)
        typ = "info" if r is None else ("ok" if r.get("ok") else "fail")
        self.rec("invalidate", inv, typ, version=v,
                 queued=bool(r and r.get("queued")))
        time.sleep(self.rng.uniform(0, 0.2))

    def cache_read(self):
        time.sleep(self.rng.uniform(0.005, 0.02))
        r, inv = self.leased("cache.get", key="jc", wait_ms=500)
        if r is None or not r.get("ok"):
            self.rec("cache_get", inv, "info" if r is None else "fail")
            return
        if r.get("hit"):
            self.rec("cache_get", inv, "ok", value=r.get("value"))
            return
        v = str(self.db.cmd("GET", "db:jc") or 0)
        self.rec("cache_get", inv, "ok", value=v, loaded=True)
        if r.get("lease"):
            time.sleep(self.rng.uniform(0, 0.05))  # a slow loader
            r, inv = self.leased("cache.fill", key="jc", lease=r["lease"],
                                 value=v)
            self.rec("cache_fill", inv, "info" if r is None else "ok",
                     value=v, stored=bool(r and r.get("stored")))

    def run(self):
        end = now() + self.a.seconds
        act = {"lock": self.hold, "cwrite": self.cache_write,
               "cread": self.cache_read}[self.a.role]
        while now() < end:
            try:
                act()
            except (OSError, RuntimeError) as e:
                self.rec("error", now(), "info", err=str(e))
                time.sleep(0.1)
                self.db = Resp(self.a.resource_port)


def main(args):
    Worker(args).run()
