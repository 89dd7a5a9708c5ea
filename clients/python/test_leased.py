"""Proof from Python: cache-aside over sqlite3 and locks, through leased.

    python3 test_leased.py SOCKET

Needs a running leased (and its Redis) on SOCKET; `make check` starts
both (tests/integration/check_clients.c). The tests that force a
lock_lost delete the lock's key in Redis directly: they need
LEASED_TEST_REDIS=host:port and a short lock.watchdog_ms in the daemon
(check_clients sets both), else they are skipped.
"""

import asyncio
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from leased import _decode as leased_decode  # noqa: E402
from leased import _connect_error as leased_connect_error  # noqa: E402
from leased import _Anon as LeasedAnon  # noqa: E402
from leased import (AsyncLeased, Leased, LeasedError,  # noqa: E402
                    LeasedTypeError, LockNotAcquired, NoPermit, Pool,
                    RWLock)

SOCKET = os.environ.get("LEASED_SOCKET", "")
REDIS = os.environ.get("LEASED_TEST_REDIS", "")
PREFIX = "py-%d-" % os.getpid()
# Generous: the daemon may run under valgrind on a loaded machine.
WAIT_S = 30


def redis_del(key):
    """DEL the Redis key of lock KEY (lock.prefix "leased:lock:" and the
    hash tag around the key), as another party or an operator would."""
    host, _, port = REDIS.rpartition(":")
    name = ("leased:lock:{%s}" % key).encode()
    cmd = b"*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n" % (len(name), name)
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(cmd)
        reply = s.recv(100)
    if not reply.startswith(b":1"):
        raise AssertionError("DEL %r answered %r" % (name, reply))


def redis_cmd(*args):
    """One Redis command from the test; its raw reply."""
    host, _, port = REDIS.rpartition(":")
    cmd = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode()
        cmd += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(cmd)
        return s.recv(100)


def needs_redis(test):
    return unittest.skipUnless(REDIS, "LEASED_TEST_REDIS not set")(test)


class Users:
    """A sqlite3 table standing in for the application's database; counts
    the loads so the tests can see when the cache spared one."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        self.db.execute("INSERT INTO users VALUES (7, 'Ada')")
        self.db.commit()
        self.loads = 0

    def load(self, uid):
        self.loads += 1
        row = self.db.execute("SELECT name FROM users WHERE id = ?",
                              (uid,)).fetchone()
        return row[0] if row else None

    def rename(self, uid, name):
        self.db.execute("UPDATE users SET name = ? WHERE id = ?", (name, uid))
        self.db.commit()


class CacheAside(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.users = Users(os.path.join(self.dir.name, "app.db"))
        self.ld = Leased(SOCKET, timeout=10, client="test_leased.py")

    def tearDown(self):
        self.ld.close()
        self.users.db.close()
        self.dir.cleanup()

    def test_read_update_read(self):
        key = PREFIX + "user:7"
        load = lambda: self.users.load(7)  # noqa: E731

        self.assertEqual(self.ld.cached(key, load), "Ada")
        self.assertEqual(self.ld.cached(key, load), "Ada")
        self.assertEqual(self.users.loads, 1, "the second read hit the db")

        # Write path: the database first, then the cache.
        self.ld.update([key], lambda: self.users.rename(7, "Grace"))
        self.assertEqual(self.ld.cached(key, load), "Grace")
        self.assertEqual(self.users.loads, 2)
        self.assertEqual(self.ld.cached(key, load), "Grace")
        self.assertEqual(self.users.loads, 2)

    def test_not_found_is_cached(self):
        key = PREFIX + "user:404"
        load = lambda: self.users.load(404)  # noqa: E731

        self.assertIsNone(self.ld.cached(key, load))
        self.assertIsNone(self.ld.cached(key, load))
        self.assertEqual(self.users.loads, 1, "a cached null was not served")

    def test_failed_loader_gives_the_lease_back(self):
        key = PREFIX + "flaky"

        def broken():
            raise RuntimeError("database down")

        with self.assertRaises(RuntimeError):
            self.ld.cached(key, broken)
        # The lease was released, so the next reader loads at once rather
        # than waiting for the fill lease to run out.
        start = time.monotonic()
        self.assertEqual(self.ld.cached(key, lambda: "fine"), "fine")
        self.assertLess(time.monotonic() - start, 2.0)
        self.assertEqual(self.ld.cached(key, lambda: "loaded again"), "fine")

    def test_warm_is_read_by_cached(self):
        k = PREFIX + "warm:"
        got = self.ld.warm([(k + "a", {"name": "Ada"}),
                            (k + "none", None, 30000),
                            ("", "empty key"),
                            (k + "t", "v", 0)], ttl_ms=60000)
        self.assertEqual(got["stored"], 2, got)
        self.assertEqual([r["ok"] for r in got["results"]],
                         [True, True, False, False])
        self.assertEqual(got["results"][2]["error"]["code"], "bad_request")
        fail = lambda: self.fail("loaded")  # noqa: E731
        self.assertEqual(self.ld.cached(k + "a", fail), {"name": "Ada"})
        self.assertIsNone(self.ld.cached(k + "none", fail))
        self.assertEqual(self.ld.warm({k + "b": 1})["stored"], 1)
        self.assertEqual(self.ld.cached(k + "b", fail), 1)
        for bad in ([], [("k",)], [(7, "v")], ["k"]):
            with self.assertRaises(LeasedTypeError):
                self.ld.warm(bad)

    def test_warm_async_and_pool(self):
        k = PREFIX + "warm2:"

        async def main():
            a = await AsyncLeased.connect(SOCKET, timeout=10)
            try:
                return await a.warm({k + "x": "y"})
            finally:
                await a.close()

        self.assertEqual(asyncio.run(main())["stored"], 1)
        with Pool(SOCKET, size=2) as pool:
            self.assertEqual(pool.warm([(k + "p", "q")])["stored"], 1)
            self.assertEqual(pool.cached(k + "p", lambda: "loaded"), "q")
        self.assertEqual(self.ld.cached(k + "x", lambda: "loaded"), "y")

    def test_versioned_writes(self):
        k = PREFIX + "ver:"
        miss = self.ld.read(k + "a")
        self.assertEqual((miss.hit, miss.value, miss.version), (False, None, 0))
        w1 = self.ld.write(k + "a", {"n": 1}, if_version=0)
        self.assertTrue(w1.stored)
        self.assertGreater(w1.version, 0)
        got = self.ld.read(k + "a")
        self.assertEqual((got.hit, got.value, got.version),
                         (True, {"n": 1}, w1.version))
        # A compare-and-set loop: the loser reads again and retries.
        w2 = self.ld.write(k + "a", {"n": 2}, if_version=got.version)
        self.assertTrue(w2.stored)
        self.assertGreater(w2.version, w1.version)
        late = self.ld.write(k + "a", {"n": 99}, if_version=got.version)
        self.assertEqual(late, (False, w2.version))
        self.assertEqual(self.ld.read(k + "a").value, {"n": 2})
        # A fill under the lease of a miss, over version 0.
        lease = self.ld.read(k + "f", lease=True).lease
        self.assertIsNotNone(lease)
        self.assertEqual(self.ld.fill(k + "f", lease, "x", if_version=7),
                         (False, 0))
        f = self.ld.fill(k + "f", lease, None, if_version=0)
        self.assertTrue(f.stored)
        got = self.ld.read(k + "f")
        self.assertEqual((got.hit, got.value, got.version),
                         (True, None, f.version))
        with self.assertRaises(LeasedError) as e:
            self.ld.write(k + "a", "x", if_version=-1)
        self.assertEqual(e.exception.code, "bad_request")

        async def main():
            a = await AsyncLeased.connect(SOCKET, timeout=10)
            try:
                cur = await a.read(k + "a")
                w = await a.write(k + "a", "async", if_version=cur.version)
                return cur, w, await a.read(k + "a")
            finally:
                await a.close()

        cur, w, after = asyncio.run(main())
        self.assertEqual(cur.version, w2.version)
        self.assertTrue(w.stored)
        self.assertEqual((after.value, after.version), ("async", w.version))
        with Pool(SOCKET, size=2) as pool:
            p = pool.write(k + "a", "pool", if_version=w.version)
            self.assertTrue(p.stored)
            self.assertEqual(pool.read(k + "a").version, p.version)

    def test_a_string_is_one_key(self):
        key = PREFIX + "user:7"
        pool = Pool(SOCKET, size=2, timeout=10)
        self.addCleanup(pool.close)

        async def on_async(keys):
            ald = await AsyncLeased.connect(SOCKET, timeout=10)
            try:
                await ald.invalidate(keys)
                return await ald.update(keys, lambda: "written")
            finally:
                await ald.close()

        invalidations = [
            self.ld.invalidate, lambda k: self.ld.update(k, lambda: None),
            pool.invalidate, lambda k: pool.update(k, lambda: None),
            lambda k: asyncio.run(on_async(k))]
        for n, invalidate in enumerate(invalidations):
            self.assertEqual(self.ld.cached(key, lambda: "old %d" % n),
                             "old %d" % n)
            invalidate(key)
            self.assertEqual(self.ld.cached(key, lambda: "new %d" % n),
                             "new %d" % n, "invalidation %d missed" % n)
            self.ld.invalidate(key)

    def test_keys_of_other_types_are_refused(self):
        written = []
        for bad in (7, b"user:7", ["user:7", 8], {"user:7"}, None):
            for call in (self.ld.invalidate,
                         lambda k: self.ld.update(k, written.append)):
                with self.assertRaises(TypeError) as cm:
                    call(bad)
                self.assertIsInstance(cm.exception, LeasedError)
                self.assertEqual(cm.exception.code, "invalid")
                self.assertIn("str", str(cm.exception))
        self.assertEqual(written, [], "update wrote before it refused")
        for call in (lambda: self.ld.cached(7, lambda: "x"),
                     lambda: self.ld.try_lock(b"k"),
                     lambda: self.ld.unlock(["a", 1]),
                     lambda: self.ld.try_semaphore(None, 2),
                     lambda: self.ld.sem_release(7, "t"),
                     lambda: self.ld.sem_info(("a",), 2)):
            with self.assertRaises(TypeError):
                call()
        self.assertTrue(self.ld.call("ping")["ok"])

    def test_records_are_cached_as_json(self):
        key = PREFIX + "user:rec"
        user = {"id": 7, "name": "Ada", "tags": ["a", "b"], "score": 1.5}
        self.assertEqual(self.ld.cached(key, lambda: dict(user)), user)
        with Leased(SOCKET, timeout=10) as other:
            self.assertEqual(other.cached(key, self.fail), user)
        self.assertEqual(json.loads(self.ld.call("cache.get",
                                                 key=key)["value"]), user)
        # What the loader's caller gets is what a hit gives: read back.
        key = PREFIX + "user:tuple"
        self.assertEqual(self.ld.cached(key, lambda: (1, 2)), [1, 2])
        self.assertEqual(self.ld.cached(key, self.fail), [1, 2])
        for n, value in enumerate((0, [], "", False)):
            self.assertEqual(self.ld.cached(key + str(n), lambda: value),
                             value)

    def test_raw_strings_without_a_serializer(self):
        key = PREFIX + "user:raw"
        with Leased(SOCKET, timeout=10, serializer=None) as raw:
            self.assertEqual(raw.cached(key, lambda: "Ada"), "Ada")
            self.assertEqual(raw.call("cache.get", key=key)["value"], "Ada")
            # Not JSON: the default serializer says so rather than guess.
            with self.assertRaises(LeasedError) as cm:
                self.ld.cached(key, self.fail)
            self.assertEqual(cm.exception.code, "bad_value")
            with self.assertRaises(TypeError):
                raw.cached(key + ":dict", lambda: {"a": 1})

    def assert_lease_free(self, key):
        """The next reader of KEY gets a lease at once, though it would
        wait 2.5 s for one still held."""
        start = time.monotonic()
        got = self.ld.call("cache.get", key=key, wait_ms=2500)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertIsNotNone(got.get("lease"))
        self.ld.call("cache.release", key=key, lease=got["lease"])

    def test_a_value_that_cannot_be_filled_gives_the_lease_back(self):
        key = PREFIX + "user:bytes"
        with self.assertRaises(TypeError) as cm:
            self.ld.cached(key, lambda: b"\x00raw")
        self.assertIn("bytes", str(cm.exception))
        self.assert_lease_free(key)

        async def main():
            ld = await AsyncLeased.connect(SOCKET, timeout=10,
                                           serializer=None)
            try:
                await ld.cached(key, lambda: {"not": "a str"})
            finally:
                await ld.close()

        with self.assertRaises(TypeError):
            asyncio.run(main())
        self.assert_lease_free(key)
        with self.assertRaises(RuntimeError):
            self.ld.cached(key, self.broken_loader)
        self.assert_lease_free(key)

    @staticmethod
    def broken_loader():
        raise RuntimeError("database down")

    def test_waiters_past_wait_ms_raise_and_do_not_load(self):
        # A loader slower than wait_ms: the waiters give up with a
        # timeout after wait_ms, without loading; the key is loaded once.
        key = PREFIX + "user:slow"
        loads, outcomes = [], []
        loading = threading.Event()

        def slow():
            loads.append(1)
            loading.set()
            time.sleep(2.5)
            return "v"

        def wait(pool):
            start = time.monotonic()
            try:
                outcomes.append(pool.cached(key, slow, wait_ms=300))
            except LeasedError as e:
                outcomes.append((e.code, isinstance(e, TimeoutError),
                                 time.monotonic() - start))

        with Pool(SOCKET, size=8, timeout=10) as pool:
            holder = threading.Thread(target=lambda: outcomes.append(
                pool.cached(key, slow, wait_ms=300)))
            holder.start()
            self.assertTrue(loading.wait(WAIT_S))
            waiters = [threading.Thread(target=wait, args=(pool,))
                       for _ in range(5)]
            for t in waiters:
                t.start()
            for t in waiters + [holder]:
                t.join(WAIT_S)
            self.assertEqual(len(loads), 1)
            self.assertEqual(outcomes.count("v"), 1, outcomes)
            timeouts = [o for o in outcomes if o != "v"]
            self.assertEqual(len(timeouts), 5, outcomes)
            for code, is_timeout, elapsed in timeouts:
                self.assertEqual((code, is_timeout), ("timeout", True))
                self.assertGreaterEqual(elapsed, 0.25)
                self.assertLess(elapsed, 2.0, "waited for the fill")
            self.assertEqual(pool.cached(key, slow, wait_ms=300), "v")
            self.assertEqual(len(loads), 1)

    def test_error_codes(self):
        with self.assertRaises(LeasedError) as cm:
            self.ld.call("cache.get", key="")
        self.assertEqual(cm.exception.code, "bad_request")
        with self.assertRaises(LeasedError) as cm:
            self.ld.call("no.such.op")
        self.assertEqual(cm.exception.code, "unknown_op")
        with self.assertRaises(LeasedError) as cm:
            self.ld.unlock(PREFIX + "never-locked")
        self.assertEqual(cm.exception.code, "not_held")
        self.assertEqual(self.ld.call("ping")["ok"], True)


class Locks(unittest.TestCase):
    def test_exclusion_between_sessions(self):
        key = PREFIX + "lock:basic"
        with Leased(SOCKET, timeout=10) as a, Leased(SOCKET, timeout=10) as b:
            with a.lock(key) as held:
                self.assertTrue(held["token"])
                self.assertGreater(held["fence"], 0)
                self.assertFalse(b.try_lock(key)["acquired"])
                with self.assertRaises(LockNotAcquired):
                    with b.lock(key):
                        self.fail("b entered a lock that a holds")
            with b.lock(key) as held2:
                self.assertGreater(held2["fence"], held["fence"])

    def test_unlock_request_id_repeated_releases_one_hold(self):
        key = PREFIX + "lock:rid"
        with Leased(SOCKET, timeout=10) as a, Leased(SOCKET, timeout=10) as b:
            r = a.try_lock(key, ttl_ms=60000, detach=True)
            tok = r["token"]
            a.try_lock(key, token=tok)
            first = a.unlock(key, token=tok, request_id="py-1")
            self.assertEqual((first["released"], first["count"]), (False, 1))
            again = b.unlock(key, token=tok, request_id="py-1")
            self.assertEqual((again["released"], again["count"]), (False, 1))
            self.assertEqual(b.call("lock.info", key=key, token=tok)["count"],
                             1)
            with self.assertRaises(LeasedError) as cm:
                b.unlock(key, token=tok, request_id="")
            self.assertEqual(cm.exception.code, "bad_request")
            self.assertTrue(b.unlock(key, token=tok,
                                     request_id="py-2")["released"])

        async def main():
            ld = await AsyncLeased.connect(SOCKET)
            try:
                r = await ld.try_lock(key + ":aio", ttl_ms=60000, owner="w")
                await ld.try_lock(key + ":aio", ttl_ms=60000, owner="w")
                for _ in range(2):
                    u = await ld.unlock(key + ":aio", owner="w",
                                        request_id="aio-1")
                    self.assertEqual((u["released"], u["count"]), (False, 1))
                u = await ld.unlock(key + ":aio", token=r["token"],
                                    request_id="aio-2")
                self.assertTrue(u["released"])
            finally:
                await ld.close()
        asyncio.run(main())

    def test_a_late_grant_is_given_back(self):
        key = PREFIX + "lock:late"
        with Leased(SOCKET, timeout=10) as a, Leased(SOCKET, timeout=10) as b, \
                Leased(SOCKET, timeout=10) as c:
            a.try_lock(key)
            # b gives up on the reply long before the daemon's wait ends
            # (its deadline is timeout + wait_ms: 0.3 s here).
            b.timeout = -9.7
            with self.assertRaises(TimeoutError):
                b.try_lock(key, wait_ms=10000)
            b.timeout = 10
            a.unlock(key)
            # The daemon now grants b's wait; b reads that late reply
            # with its next call and unlocks, so c gets the lock although
            # b's session lives on.
            deadline = time.monotonic() + WAIT_S
            got = {"acquired": False}
            while not got["acquired"] and time.monotonic() < deadline:
                b.call("ping")
                got = c.try_lock(key, wait_ms=500)
            self.assertTrue(got["acquired"], got)

    def test_threads_do_not_overlap(self):
        key = PREFIX + "lock:counter"
        rounds, workers = 15, 4
        state = {"count": 0, "inside": 0, "overlap": False}
        errors = []

        def work():
            try:
                with Leased(SOCKET, timeout=10) as ld:
                    for _ in range(rounds):
                        with ld.lock(key, wait_ms=10000):
                            state["inside"] += 1
                            if state["inside"] != 1:
                                state["overlap"] = True
                            count = state["count"]
                            time.sleep(0.002)
                            state["count"] = count + 1
                            state["inside"] -= 1
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertFalse(state["overlap"])
        self.assertEqual(state["count"], rounds * workers)


    def test_threads_sharing_one_leased_exclude_each_other(self):
        key = PREFIX + "lock:shared-leased"
        results = {}

        def other_thread(step):
            def run():
                try:
                    results[step] = step_of[step]()
                except Exception as e:  # noqa: BLE001 - checked below
                    results[step] = e
            t = threading.Thread(target=run)
            t.start()
            t.join(30)
            return results[step]

        with Leased(SOCKET, timeout=10) as ld:
            def locked_elsewhere():
                with ld.lock(key):
                    return "entered"

            def lock_once_free():
                with ld.lock(key) as held:
                    return held["count"]
            step_of = {"try": lambda: ld.try_lock(key)["acquired"],
                       "block": locked_elsewhere, "free": lock_once_free}
            with ld.lock(key):
                with ld.lock(key) as again:
                    self.assertEqual(again["count"], 2, "the thread reenters")
                self.assertFalse(other_thread("try"))
                self.assertIsInstance(other_thread("block"), LockNotAcquired)
            self.assertEqual(other_thread("free"), 1)
            # The first thread keeps the session's owner "": by hand.
            self.assertTrue(ld.try_lock(key)["acquired"])
            self.assertTrue(ld.call("unlock", key=key)["released"])

    @needs_redis
    def test_anonymous_holds_forgotten_and_bounded(self):
        key = PREFIX + "share:forget"
        with Pool(SOCKET, size=2, timeout=10) as pool:
            r = pool.try_lock(key)
            self.assertEqual(len(pool._anon), 1)
            pool.unlock(key, token=r["token"])
            self.assertEqual(len(pool._anon), 0, "unlocked by its token")

        async def main():
            ld = await AsyncLeased.connect(SOCKET)
            try:
                self.assertTrue((await ld.try_lock(key))["acquired"])
                self.assertEqual(len(ld._anon), 1)
                redis_del(key)
                deadline = time.monotonic() + WAIT_S
                while len(ld._anon) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self.assertEqual(len(ld._anon), 0, "lost")
            finally:
                await ld.close()
        asyncio.run(asyncio.wait_for(main(), 90))
        # Locks left to expire: the oldest are forgotten past the bound.
        anon = LeasedAnon()
        for i in range(2 * anon.MAX):
            anon.keep("k%d" % i, {}, {"acquired": True, "token": "t%d" % i})
        self.assertEqual(len(anon), anon.MAX)
        self.assertIsNone(anon.token("k0", None, None, {}, False))
        self.assertEqual(anon.token("k%d" % (2 * anon.MAX - 1), None, None,
                                    {}, False), "t%d" % (2 * anon.MAX - 1))

    def _shared_session_checks(self, name, try_lock, unlock, extend,
                               other):
        """What a client whose callers share sessions owes them (a Pool's
        threads, an AsyncLeased's tasks): locks without an owner exclude
        each other, and unlock/extend by key find the caller's hold."""
        key = PREFIX + "share:" + name
        both = try_lock(key, both=True)
        self.assertEqual(sorted(r["acquired"] for r in both), [False, True],
                         name)
        held = [r for r in both if r["acquired"]][0]
        self.assertFalse(try_lock(key)["acquired"],
                         name + ": no reentry without an owner")
        self.assertGreater(extend(key, 60000)["lease_ms"], 30000, name)
        info = other.call("lock.info", key=key, token=held["token"])
        self.assertGreater(info["ttl_ms"], 30000, name)
        self.assertTrue(unlock(key)["released"], name)
        with self.assertRaises(LeasedError) as cm:
            unlock(key)
        self.assertEqual(cm.exception.code, "not_held", name)
        reads = try_lock(key, both=True, mode="read")
        self.assertTrue(all(r["acquired"] for r in reads), name)
        unlock(key, mode="read")
        self.assertFalse(other.try_lock(key, mode="write")["acquired"], name)
        unlock(key, mode="read")
        w = other.try_lock(key, mode="write")
        self.assertTrue(w["acquired"], name + ": both reads given back")
        other.unlock(key, token=w["token"], mode="write")
        group = [key + ":g2", key + ":g1"]
        both = try_lock(group, both=True)
        self.assertEqual(sorted(r["acquired"] for r in both), [False, True],
                         name + ": a group")
        self.assertTrue(unlock(list(reversed(group)))["released"],
                        name + ": the group by key")
        g = other.try_lock(group)
        self.assertTrue(g["acquired"], name + ": the group given back")
        other.unlock(group, token=g["token"])
        try_lock(key, owner="w")
        self.assertEqual(try_lock(key, owner="w")["count"], 2, name)

    def test_pool_threads_exclude_each_other_unlock_by_key(self):
        with Pool(SOCKET, size=2, timeout=10) as pool, \
                Leased(SOCKET, timeout=10) as other:
            def try_lock(key, both=False, **kw):
                if not both:
                    return pool.try_lock(key, **kw)
                out = [pool.try_lock(key, **kw)]
                t = threading.Thread(
                    target=lambda: out.append(pool.try_lock(key, **kw)))
                t.start()
                t.join(30)
                return out
            self._shared_session_checks("pool", try_lock, pool.unlock,
                                        pool.extend, other)
            # Inside a lock() block the connection is the thread's alone:
            # a try_lock there reenters, as on a Leased.
            key = PREFIX + "share:pool:block"
            with pool.lock(key):
                self.assertEqual(pool.try_lock(key)["count"], 2)
                self.assertEqual(pool.unlock(key)["count"], 1)

    def test_async_tasks_exclude_each_other_unlock_by_key(self):
        async def main():
            ld = await AsyncLeased.connect(SOCKET)
            loop = asyncio.get_running_loop()
            try:
                with Leased(SOCKET, timeout=10) as other:
                    def run(coro):
                        return asyncio.run_coroutine_threadsafe(
                            coro, loop).result(30)

                    def try_lock(key, both=False, **kw):
                        if not both:
                            return run(ld.try_lock(key, **kw))

                        async def two():
                            return await asyncio.gather(
                                ld.try_lock(key, **kw),
                                ld.try_lock(key, **kw))
                        return list(run(two()))
                    await loop.run_in_executor(
                        None, self._shared_session_checks, "aio", try_lock,
                        lambda key, **kw: run(ld.unlock(key, **kw)),
                        lambda key, ms: run(ld.extend(key, ms)), other)
            finally:
                await ld.close()
        asyncio.run(asyncio.wait_for(main(), 90))


class Lines(unittest.TestCase):
    def test_keys_that_need_escaping_take_the_short_path_intact(self):
        with Leased(SOCKET, timeout=10) as a, Leased(SOCKET, timeout=10) as b:
            for k in ('q"uote', "back\\slash", "new\nline", "tab\t",
                      "\u00e9\u20ac\U0001f600", "\x01"):
                key = PREFIX + "esc:" + k
                self.assertTrue(a.try_lock(key)["acquired"], key)
                self.assertTrue(b.call("lock.info", key=key)["locked"], key)
                self.assertFalse(b.try_lock(key)["acquired"], key)
                self.assertTrue(a.unlock(key)["released"], key)
                # By token: the other short unlock.
                held = a.try_lock(key)
                with self.assertRaises(LeasedError) as cm:
                    b.unlock(key, token="0" * 32)
                self.assertEqual(cm.exception.code, "not_held")
                self.assertTrue(a.unlock(key, token=held["token"])["released"])

    def test_replies_split_across_reads_and_many_per_read(self):
        with Leased(SOCKET, timeout=10) as ld:
            big = "\u00e9\u20ac\U0001f600x" * 40000
            key = PREFIX + "lines:big"
            self.assertEqual(ld.cached(key, lambda: big), big)
            self.assertEqual(json.loads(ld.call("cache.get",
                                                key=key)["value"]), big)
            # Several replies in one chunk, one cut in the middle.
            ld._fill(b'{"id":1,"ok":true}\n{"id":2,')
            ld._fill(b'"ok":true}\n \n')
            self.assertEqual(len(ld._lines), 3)
            self.assertEqual(leased_decode(ld._lines[1]), {"id": 2,
                                                           "ok": True})
            ld._lines.clear()

    def test_decode_takes_spaces_and_refuses_junk(self):
        self.assertEqual(leased_decode(b' {"a": [1, 2]} '), {"a": [1, 2]})
        self.assertEqual(leased_decode(b'{"a":"\\u00e9"}'), {"a": "\u00e9"})
        for bad in (b'{"a":1} x', b"{", b"nope", b'{"a":1}\nx'):
            with self.assertRaises(ValueError):
                leased_decode(bad)
        # A whole line with its newline, as one recv or readline() gives.
        self.assertEqual(leased_decode(b'{"a":1}\n'), {"a": 1})


def rwlock_daemon(test):
    with Leased(SOCKET, timeout=10, client="test_leased.py") as ld:
        if "rwlock" not in ld.features:
            test.skipTest('this leased does not announce "rwlock" in hello')


class RWLocks(unittest.TestCase):
    def setUp(self):
        rwlock_daemon(self)

    def test_readers_share_and_a_writer_waits_for_them(self):
        key = PREFIX + "rw:basic"
        with Leased(SOCKET, timeout=10) as a, Leased(SOCKET, timeout=10) as b, \
                Leased(SOCKET, timeout=10) as c:
            rw = a.rwlock(key)
            self.assertIsInstance(rw, RWLock)
            with rw.read_lock() as ra, \
                    b.rwlock(key).read_lock(wait_ms=1000) as rb:
                self.assertIsInstance(ra.lost, threading.Event)
                self.assertFalse(ra.lost.is_set() or rb.lost.is_set())
                with self.assertRaises(LockNotAcquired):
                    with c.rwlock(key).write_lock(wait_ms=0):
                        self.fail("a writer entered a read-held lock")
                r = c.try_lock(key, mode="write")
                self.assertFalse(r["acquired"])
            # Both read holds were unlocked with their mode.
            with c.rwlock(key).write_lock(wait_ms=5000) as w:
                self.assertGreater(w.fence, 0)
                self.assertFalse(a.try_lock(key, mode="read")["acquired"])
                x = c.extend(key, 60000, token=w.token, mode="write")
                self.assertEqual(x["lease_ms"], 60000)
            with a.rwlock(key).read_lock():
                pass

    def test_pool_readers_in_threads(self):
        key = PREFIX + "rw:pool"
        inside = {"n": 0, "max": 0}
        mu = threading.Lock()
        both = threading.Barrier(2, timeout=WAIT_S)
        errors = []
        with Pool(SOCKET, size=2, timeout=10) as pool:
            def reader():
                try:
                    with pool.rwlock(key).read_lock(wait_ms=5000):
                        with mu:
                            inside["n"] += 1
                            inside["max"] = max(inside["max"], inside["n"])
                        both.wait()
                        with mu:
                            inside["n"] -= 1
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            ts = [threading.Thread(target=reader) for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(WAIT_S)
            self.assertEqual(errors, [])
            self.assertEqual(inside["max"], 2)
            with pool.rwlock(key).write_lock(wait_ms=5000) as w:
                self.assertGreater(w.fence, 0)

    def test_asyncio_readers_share_writer_refused(self):
        async def main():
            a = await AsyncLeased.connect(SOCKET)
            b = await AsyncLeased.connect(SOCKET)
            try:
                key = PREFIX + "rw:aio"
                async with a.rwlock(key).read_lock() as ra, \
                        b.rwlock(key).read_lock(wait_ms=1000) as rb:
                    self.assertIsInstance(ra.lost, asyncio.Event)
                    self.assertFalse(rb.lost.is_set())
                    with self.assertRaises(LockNotAcquired):
                        async with b.rwlock(key).write_lock(wait_ms=0):
                            self.fail("a writer entered a read-held lock")
                async with b.rwlock(key).write_lock(wait_ms=5000) as w:
                    self.assertGreater(w.fence, 0)
                    r = await a.try_lock(key, mode="read")
                    self.assertFalse(r["acquired"])
            finally:
                await a.close()
                await b.close()

        asyncio.run(asyncio.wait_for(main(), 90))


class Timeouts(unittest.TestCase):
    def test_a_silent_peer_times_out(self):
        # The timeout is the socket's SO_RCVTIMEO: a call to a peer that
        # never answers must still end at the timeout.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "mute.sock")
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(path)
            srv.listen(1)
            try:
                with Leased(path, timeout=0.5) as ld:
                    start = time.monotonic()
                    with self.assertRaises(TimeoutError):
                        ld.call("ping")
                    self.assertLess(time.monotonic() - start, 10)
                    self.assertGreaterEqual(time.monotonic() - start, 0.45)
            finally:
                srv.close()

    def test_events_before_the_reply_in_chunks_of_their_own(self):
        # Each event and the reply come in a read of their own (the path
        # that decodes a whole-line chunk without splitting it).
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chatty.sock")
            t = chatty_server(path, 3, 0.05)
            with Leased(path, timeout=5) as ld:
                self.assertTrue(ld.call("ping")["pong"])
                self.assertEqual([e["event"] for e in ld.events],
                                 ["lock_lost"] * 3)
            t.join(WAIT_S)

    def test_events_that_keep_coming_do_not_stretch_the_timeout(self):
        # Every read brings an event well within SO_RCVTIMEO; the call
        # must still end once its own timeout has passed.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chatty.sock")
            t = chatty_server(path, 0, None)
            with Leased(path, timeout=0.5) as ld:
                start = time.monotonic()
                with self.assertRaises(TimeoutError):
                    ld.call("ping")
                took = time.monotonic() - start
                self.assertGreaterEqual(took, 0.45)
                self.assertLess(took, 5)
                self.assertGreater(len(ld.events), 2)
            t.join(WAIT_S)


def fake_server(path, answer):
    """A Unix socket peer at PATH that accepts one connection, reads its
    first request line and hands the connection and the request to
    ANSWER, in a thread (returned)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            buf = b""
            while b"\n" not in buf:
                buf += conn.recv(4096)
            answer(conn, json.loads(buf.split(b"\n")[0]))
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def chatty_server(path, events, reply_after):
    """A Unix socket peer that answers the first request after sending
    EVENTS event lines, one write each REPLY_AFTER seconds apart (its
    reply then in a write of its own), or never when REPLY_AFTER is
    None: then it sends an event every 0.1 s for 8 s."""

    def answer(conn, req):
        ev = b'{"event":"lock_lost","key":"k","token":"x"}\n'
        try:
            if reply_after is None:
                for _ in range(80):
                    conn.sendall(ev)
                    time.sleep(0.1)
            else:
                for _ in range(events):
                    conn.sendall(ev)
                    time.sleep(reply_after)
                conn.sendall(b'{"id":%d,"ok":true,"pong":true}\n'
                             % req["id"])
            conn.recv(1)
        except OSError:
            pass

    return fake_server(path, answer)


def one_shot_server(path, reply):
    """A Unix socket peer that answers one request with REPLY (its id
    filled in), then closes the connection, as a stopping daemon would."""

    def answer(conn, req):
        conn.sendall(json.dumps(dict(reply, id=req["id"])).encode() + b"\n")
        time.sleep(0.2)

    return fake_server(path, answer)


GRANT = {"ok": True, "acquired": True, "token": "t1", "count": 1,
         "fence": 1, "lease_ms": 30000}


class LockLost(unittest.TestCase):
    def test_held_lost_when_the_session_ends(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "s.sock")
            t = one_shot_server(path, GRANT)
            with Leased(path, timeout=10) as ld:
                # The lock went with the session: the block ends without
                # an error (leased-protocol(7), CLIENTS), told through
                # held.lost.
                with ld.lock("k") as held:
                    self.assertTrue(held.lost.wait(WAIT_S))
                    self.assertEqual(held.lost_event["reason"],
                                     "connection_closed")
            t.join(WAIT_S)

    def test_async_held_lost_when_the_session_ends(self):
        async def main():
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "s.sock")
                srv_done = asyncio.Event()

                async def serve(r, w):
                    w.write(b'{"id":1,"ok":true,"session":"s"}\n')
                    await r.readline()
                    req = json.loads(await r.readline())
                    w.write(json.dumps(dict(GRANT, id=req["id"])).encode()
                            + b"\n")
                    await w.drain()
                    w.close()
                    srv_done.set()

                srv = await asyncio.start_unix_server(serve, path)
                ld = await AsyncLeased.connect(path)
                try:
                    held = await ld.lock("k")
                    await asyncio.wait_for(held.lost.wait(), WAIT_S)
                    self.assertEqual(held.lost_event["reason"],
                                     "connection_closed")
                finally:
                    await ld.close()
                    srv.close()
        asyncio.run(asyncio.wait_for(main(), 90))

    @needs_redis
    def test_held_lost_while_idle_in_block(self):
        key = PREFIX + "lost:idle"
        with Leased(SOCKET, timeout=10) as ld:
            with ld.lock(key) as held:
                self.assertFalse(held.lost.is_set())
                redis_del(key)
                # The block makes no call: only the connection's watcher
                # reads the socket, and it must deliver the event.
                self.assertTrue(held.lost.wait(WAIT_S),
                                "held.lost not set after the key vanished")
                self.assertEqual(held.lost_event["token"], held.token)
                self.assertIn(held.lost_event["reason"],
                              ("taken", "expired"))
            # The with-block ended without raising not_held.
            self.assertEqual(ld.call("ping")["ok"], True)

    @needs_redis
    def test_other_locks_are_not_marked_lost(self):
        k1, k2 = PREFIX + "lost:one", PREFIX + "lost:two"
        with Leased(SOCKET, timeout=10) as ld:
            with ld.lock(k1) as h1, ld.lock(k2) as h2:
                redis_del(k1)
                self.assertTrue(h1.lost.wait(WAIT_S))
                self.assertFalse(h2.lost.is_set())
                self.assertTrue(ld.call("lock.info", key=k2)["mine"])


class Groups(unittest.TestCase):
    """Several keys at once: a list of keys instead of one key."""

    def test_group_all_or_none_and_lost_key(self):
        k1, k2 = PREFIX + "grp:1", PREFIX + "grp:2"
        with Leased(SOCKET, timeout=10) as a, Leased(SOCKET, timeout=10) as b:
            with b.lock(k2):
                self.assertFalse(a.try_lock([k1, k2])["acquired"])
                self.assertFalse(a.call("lock.info", key=k1)["locked"])
            with a.lock([k1, k2]) as held:
                self.assertEqual(set(held.fences), {k1, k2})
                self.assertFalse(b.try_lock(k1)["acquired"])
                self.assertEqual(
                    a.extend([k1, k2], 60000, token=held.token)["lease_ms"],
                    60000)
                if REDIS:
                    redis_del(k1)
                    self.assertTrue(held.lost.wait(WAIT_S))
                    self.assertEqual(held.lost_event["key"], k1)
                    self.assertTrue(a.call("lock.info", key=k2)["mine"])
            # The block's unlock freed the rest.
            self.assertTrue(b.try_lock([k1, k2])["acquired"])
            self.assertTrue(b.unlock([k1, k2])["released"])

    def test_async_group(self):
        async def main():
            ld = await AsyncLeased.connect(SOCKET)
            try:
                keys = [PREFIX + "agrp:1", PREFIX + "agrp:2"]
                async with ld.lock(keys, owner="t") as held:
                    self.assertEqual(len(held.fences), 2)
                    r = await ld.try_lock(keys[1])
                    self.assertFalse(r["acquired"])
                info = await ld.call("lock.info", key=keys[0])
                self.assertFalse(info["locked"])
            finally:
                await ld.close()
        asyncio.run(asyncio.wait_for(main(), 90))


class Pools(unittest.TestCase):
    def test_threads_share_a_pool(self):
        key = PREFIX + "pool:counter"
        rounds, workers = 10, 6
        state = {"count": 0, "inside": 0, "overlap": False}
        errors = []
        fences = []
        with Pool(SOCKET, size=3, timeout=10) as pool:
            def work():
                try:
                    for _ in range(rounds):
                        with pool.lock(key, wait_ms=20000) as held:
                            state["inside"] += 1
                            if state["inside"] != 1:
                                state["overlap"] = True
                            fences.append(held.fence)
                            # A nested call in the block uses the block's
                            # connection: the pool has fewer connections
                            # than threads, and this must not deadlock.
                            info = pool.call("lock.info", key=key)
                            self.assertTrue(info["mine"])
                            count = state["count"]
                            time.sleep(0.001)
                            state["count"] = count + 1
                            state["inside"] -= 1
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=work) for _ in range(workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertLessEqual(pool._made, 3)
        self.assertEqual(errors, [])
        self.assertFalse(state["overlap"])
        self.assertEqual(state["count"], rounds * workers)
        self.assertEqual(fences, sorted(fences), "fences out of order")

    def test_more_threads_than_connections_and_a_close_that_wakes(self):
        errors = []
        done = []
        with Pool(SOCKET, size=2, timeout=10) as pool:
            def work(w):
                try:
                    key = PREFIX + "pool:many:%d" % w
                    for _ in range(30):
                        r = pool.try_lock(key)
                        self.assertTrue(r["acquired"])
                        # By token: the connection went back to the pool.
                        u = pool.unlock(key, token=r["token"])
                        self.assertTrue(u["released"])
                    done.append(w)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(w,))
                       for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertEqual(errors, [])
            self.assertEqual(len(done), 8)
            self.assertLessEqual(pool._made, 2)
            # A thread waiting for a connection is woken by close().
            c1, c2 = pool._checkout(), pool._checkout()
            waited = []

            def waiter():
                t0 = time.monotonic()
                try:
                    pool.call("ping")
                except (ConnectionError, TimeoutError) as e:
                    waited.append((type(e), time.monotonic() - t0))

            t = threading.Thread(target=waiter)
            t.start()
            deadline = time.monotonic() + WAIT_S
            while pool._waiting == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(pool._waiting, 1)
            pool.close()
            t.join(20)
            self.assertEqual(len(waited), 1, waited)
            self.assertTrue(issubclass(waited[0][0], ConnectionError))
            self.assertLess(waited[0][1], 5)
            c1.close()
            c2.close()

    def test_pool_cached_and_reentry(self):
        key = PREFIX + "pool:cached"
        loads = []
        with Pool(SOCKET, size=2, timeout=10) as pool:
            for _ in range(3):
                self.assertEqual(
                    pool.cached(key, lambda: loads.append(1) or "v"), "v")
            self.assertEqual(len(loads), 1)
            lk = PREFIX + "pool:reenter"
            with pool.lock(lk) as outer:
                with pool.lock(lk) as inner:
                    self.assertEqual(inner["count"], 2)
                    self.assertEqual(inner.token, outer.token)

    def test_pool_cached_keeps_single_flight(self):
        # More threads than connections, all reading one key while a slow
        # loader runs: one load, whatever the pool's size.
        for size in (8, 2):
            key = PREFIX + "pool:flight:%d" % size
            loads = []
            barrier = threading.Barrier(20)
            got, errors = [], []

            def loader():
                loads.append(1)
                time.sleep(0.5)
                return "v"

            def read(pool):
                try:
                    barrier.wait(WAIT_S)
                    got.append(pool.cached(key, loader))
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            with Pool(SOCKET, size=size, timeout=WAIT_S) as pool:
                threads = [threading.Thread(target=read, args=(pool,))
                           for _ in range(20)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
            self.assertEqual(errors, [])
            self.assertEqual(got, ["v"] * 20)
            self.assertEqual(len(loads), 1, "pool of %d: %d loads"
                             % (size, len(loads)))


class Async(unittest.TestCase):
    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, 90))

    def test_timeout_and_a_late_grant_given_back(self):
        async def main():
            key = PREFIX + "aio:late"
            a = await AsyncLeased.connect(SOCKET, timeout=10)
            b = await AsyncLeased.connect(SOCKET, timeout=10)
            c = await AsyncLeased.connect(SOCKET, timeout=10)
            try:
                self.assertTrue((await a.try_lock(key))["acquired"])
                # b gives up long before the daemon's wait would end.
                b.timeout = -9.7
                t0 = time.monotonic()
                with self.assertRaises(TimeoutError):
                    await b.try_lock(key, wait_ms=10000)
                self.assertLess(time.monotonic() - t0, 5)
                b.timeout = 10
                await a.unlock(key)
                # Cancelled, or granted late and unlocked at once: either
                # way c gets the lock although b's session lives on.
                got = await c.try_lock(key, wait_ms=WAIT_S * 1000)
                self.assertTrue(got["acquired"], got)
            finally:
                for ld in (a, b, c):
                    await ld.close()

        self.run_async(main())

    def test_cached_by_many_tasks_loads_once(self):
        key = PREFIX + "async:flight"
        loads = []

        async def loader():
            loads.append(1)
            await asyncio.sleep(0.5)
            return "v"

        async def main():
            ld = await AsyncLeased.connect(SOCKET, timeout=10)
            try:
                return await asyncio.gather(
                    *(ld.cached(key, loader) for _ in range(20)))
            finally:
                await ld.close()

        self.assertEqual(self.run_async(main()), ["v"] * 20)
        self.assertEqual(len(loads), 1)

    def test_requests_of_one_iteration_go_out_in_one_write(self):
        async def main():
            ld = await AsyncLeased.connect(SOCKET, timeout=10)
            try:
                writes = []
                real = ld._writer.write
                ld._writer.write = lambda data: (writes.append(data),
                                                 real(data))
                keys = [PREFIX + "aio:tick:%d" % i for i in range(20)]
                got = await asyncio.gather(*[ld.try_lock(k) for k in keys])
                self.assertTrue(all(r["acquired"] for r in got))
                self.assertEqual(len(writes), 1)
                self.assertEqual(writes[0].count(b"\n"), 20)
                # Keys that need escaping take the short path intact.
                for k in ('q"uote', "new\nline", "\u00e9\U0001f600"):
                    r = await ld.try_lock(PREFIX + k)
                    self.assertTrue(r["acquired"])
                    info = await ld.call("lock.info", key=PREFIX + k)
                    self.assertTrue(info["locked"])
                    self.assertTrue((await ld.unlock(PREFIX + k))["released"])
                    r = await ld.try_lock(PREFIX + k)
                    u = await ld.unlock(PREFIX + k, token=r["token"])
                    self.assertTrue(u["released"])
            finally:
                await ld.close()

        self.run_async(main())

    def test_lock_cache_and_errors(self):
        async def main():
            ld = await AsyncLeased.connect(SOCKET, client="test_leased.py")
            try:
                key = PREFIX + "aio:lock"
                async with ld.lock(key, wait_ms=1000) as held:
                    self.assertGreater(held.fence, 0)
                    self.assertFalse(held.lost.is_set())
                    other = await AsyncLeased.connect(SOCKET)
                    try:
                        r = await other.try_lock(key)
                        self.assertFalse(r["acquired"])
                        with self.assertRaises(LockNotAcquired):
                            async with other.lock(key):
                                self.fail("entered a held lock")
                    finally:
                        await other.close()
                info = await ld.call("lock.info", key=key)
                self.assertFalse(info["locked"])
                # Pipelined: many requests in flight on one connection.
                replies = await asyncio.gather(
                    *[ld.call("ping") for _ in range(50)])
                self.assertTrue(all(r["ok"] for r in replies))
                loads = []

                async def load():
                    loads.append(1)
                    await asyncio.sleep(0.05)
                    return "value"

                ck = PREFIX + "aio:cached"
                vals = await asyncio.gather(
                    *[ld.cached(ck, load) for _ in range(5)])
                self.assertEqual(vals, ["value"] * 5)
                self.assertEqual(len(loads), 1)
                with self.assertRaises(LeasedError) as cm:
                    await ld.call("no.such.op")
                self.assertEqual(cm.exception.code, "unknown_op")
            finally:
                await ld.close()
        self.run_async(main())

    def test_tasks_on_one_connection_exclude_each_other(self):
        async def main():
            ld = await AsyncLeased.connect(SOCKET)
            key = PREFIX + "aio:tasks"
            state = {"inside": 0, "max": 0, "count": 0}

            async def task():
                for _ in range(5):
                    async with ld.lock(key, wait_ms=20000):
                        state["inside"] += 1
                        state["max"] = max(state["max"], state["inside"])
                        await asyncio.sleep(0.002)
                        state["count"] += 1
                        state["inside"] -= 1
            try:
                await asyncio.gather(*[task() for _ in range(4)])
            finally:
                await ld.close()
            self.assertEqual(state["max"], 1)
            self.assertEqual(state["count"], 20)
        self.run_async(main())

    def test_cancel_is_sent_when_the_daemon_offers_it(self):
        async def main():
            seen = []
            got_cancel = asyncio.Event()

            async def serve(r, w):
                # A daemon that offers cancel: the lock waits until it is
                # cancelled, then answers as if wait_ms had run out.
                hello = json.loads(await r.readline())
                w.write(json.dumps({"id": hello["id"], "ok": True,
                                    "session": "s",
                                    "features": ["cancel"]}).encode()
                        + b"\n")
                lock = json.loads(await r.readline())
                cancel = json.loads(await r.readline())
                seen.extend([lock, cancel])
                w.write(json.dumps({"id": lock["id"], "ok": True,
                                    "acquired": False,
                                    "ttl_ms": -1}).encode() + b"\n")
                w.write(json.dumps({"id": cancel["id"], "ok": True,
                                    "cancelled": True}).encode() + b"\n")
                await w.drain()
                got_cancel.set()
                await r.read()
                w.close()

            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "s.sock")
                srv = await asyncio.start_unix_server(serve, path)
                ld = await AsyncLeased.connect(path)
                try:
                    self.assertIn("cancel", ld.features)
                    task = asyncio.ensure_future(ld.lock("k", wait_ms=-1))
                    while not ld._pending:
                        await asyncio.sleep(0.01)
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    await asyncio.wait_for(got_cancel.wait(), WAIT_S)
                    lock, cancel = seen
                    self.assertEqual(lock["op"], "lock")
                    self.assertEqual(cancel["op"], "cancel")
                    self.assertEqual(cancel["target"], lock["id"])
                    # Both replies were taken (no unlock was needed).
                    deadline = time.monotonic() + WAIT_S
                    while ld._pending and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    self.assertEqual(ld._pending, {})
                finally:
                    await ld.close()
                    srv.close()
        self.run_async(main())

    @needs_redis
    def test_held_lost_is_an_asyncio_event(self):
        async def main():
            ld = await AsyncLeased.connect(SOCKET)
            try:
                key = PREFIX + "aio:lost"
                async with ld.lock(key) as held:
                    redis_del(key)
                    await asyncio.wait_for(held.lost.wait(), WAIT_S)
                    self.assertEqual(held.lost_event["token"], held.token)
            finally:
                await ld.close()
        self.run_async(main())

    def test_cancelled_wait_never_leaks_the_lock(self):
        async def main():
            key = PREFIX + "aio:cancel"
            a = await AsyncLeased.connect(SOCKET)
            b = await AsyncLeased.connect(SOCKET)
            c = await AsyncLeased.connect(SOCKET)
            try:
                held = await a.lock(key)
                waiter = asyncio.ensure_future(b.lock(key, wait_ms=-1))
                # Let b's request reach the daemon and wait there.
                deadline = time.monotonic() + WAIT_S
                while not b._pending and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)
                waiter.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await waiter
                # a releases; without the cancel feature the daemon still
                # grants the lock to b's abandoned wait, and b must give it
                # back at once, so c gets it although b stays connected.
                await a.unlock(key, owner=held.owner)
                r = await c.try_lock(key, wait_ms=WAIT_S * 1000)
                self.assertTrue(r["acquired"], r)
                await c.unlock(key)
            finally:
                for x in (a, b, c):
                    await x.close()
        self.run_async(main())

    def test_cancelled_cached_gives_the_lease_back(self):
        async def main():
            key = PREFIX + "aio:cancel-cached"
            a = await AsyncLeased.connect(SOCKET)
            b = await AsyncLeased.connect(SOCKET)
            try:
                first = await a.call("cache.get", key=key)
                self.assertTrue(first["lease"])
                # b waits for a's fill; cancel it, then a gives up its
                # lease: the daemon hands the next lease to b's abandoned
                # wait, and b must release it so c loads at once.
                waiter = asyncio.ensure_future(
                    b.cached(key, lambda: "never", ttl_ms=None))
                await asyncio.sleep(0.3)
                waiter.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await waiter
                await a.call("cache.release", key=key, lease=first["lease"])
                start = time.monotonic()
                c = await AsyncLeased.connect(SOCKET)
                try:
                    got = await c.call("cache.get", key=key, wait_ms=10000)
                    self.assertFalse(got["hit"])
                    self.assertTrue(got["lease"], got)
                finally:
                    await c.close()
                # Well under fill_lease_ms (5 s) plus the wait.
                self.assertLess(time.monotonic() - start, 4.5)
            finally:
                await a.close()
                await b.close()
        self.run_async(main())


class Semaphores(unittest.TestCase):
    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, WAIT_S * 2))

    def test_semaphore_block_holds_a_permit(self):
        key = PREFIX + "sem"
        with Leased(SOCKET) as a, Leased(SOCKET) as b:
            with a.semaphore(key, 2) as g1:
                self.assertTrue(g1["token"])
                self.assertEqual(g1["available"], 1)
                with b.semaphore(key, 2, wait_ms=100):
                    self.assertEqual(a.sem_info(key, 2)["held"], 2)
                    with self.assertRaises(NoPermit) as cm:
                        with b.semaphore(key, 2, wait_ms=50):
                            pass
                    self.assertEqual(cm.exception.available, 0)
                self.assertEqual(a.sem_info(key, 2)["held"], 1)
            info = b.sem_info(key, 2)
            self.assertEqual((info["available"], info["held"]), (2, 0))
            with self.assertRaises(LeasedError) as cm:
                a.try_semaphore(key, 2, permits=3)
            self.assertEqual(cm.exception.code, "bad_request")

    @needs_redis
    def test_held_lost_when_the_grant_is_gone(self):
        key = PREFIX + "sem-lost"
        with Leased(SOCKET) as ld:
            with ld.semaphore(key, 1) as held:
                redis_cmd("DEL", "leased:lock:{%s}:sem" % key,
                          "leased:lock:{%s}:sem:permits" % key)
                # Idle in the block: the watcher reads the event.
                self.assertTrue(held.lost.wait(WAIT_S))
                self.assertEqual(held.lost_event["event"], "sem_lost")
                self.assertEqual(held.lost_event["token"], held.token)

    @needs_redis
    def test_blocking_call_that_times_out_sends_cancel(self):
        key = PREFIX + "sem-timeout"
        with Leased(SOCKET, client="t") as a, \
                Leased(SOCKET, timeout=0.3, client="t") as b:
            self.assertIn("cancel", b.features)
            before = a.call("stats")["stats"]["cancelled"]
            # Redis holds the daemon's attempt back (below its
            # redis.timeout_ms): b's call times out first.
            self.assertEqual(redis_cmd("CLIENT", "PAUSE", "800", "WRITE"),
                             b"+OK\r\n")
            with self.assertRaises(TimeoutError):
                b.try_semaphore(key, 1, wait_ms=100)
            self.assertEqual(a.call("stats")["stats"]["cancelled"],
                             before + 1)
            # The grant Redis makes once the pause ends goes back.
            deadline = time.monotonic() + WAIT_S
            while a.sem_info(key, 1)["held"] != 0:
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.05)
            b.call("ping")
            with a.semaphore(key, 1):
                pass

    def test_cancelled_or_timed_out_wait_takes_no_permit(self):
        async def main():
            key = PREFIX + "aio:sem"
            a = await AsyncLeased.connect(SOCKET)
            b = await AsyncLeased.connect(SOCKET)
            try:
                self.assertIn("semaphore", b.features)
                grant = await a.semaphore(key, 1)
                # A task cancelled while it waits.
                waiter = asyncio.ensure_future(b.semaphore(key, 1,
                                                           wait_ms=-1))
                deadline = time.monotonic() + WAIT_S
                while not b._pending and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                waiter.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await waiter
                # A wait that asyncio.wait_for gives up on.
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(b.semaphore(key, 1, wait_ms=-1),
                                           0.3)
                stats = (await a.call("stats"))["stats"]
                self.assertGreaterEqual(stats["cancelled"], 2, stats)
                self.assertEqual(stats["lock_waiters"], 0, stats)
                # Released now: neither cancelled wait takes the permit.
                await a.sem_release(key, grant["token"])
                info = await a.sem_info(key, 1)
                self.assertEqual(info["held"], 0, info)
                async with a.semaphore(key, 1) as g:
                    self.assertTrue(g["acquired"])
            finally:
                await a.close()
                await b.close()
        self.run_async(main())


class RateLimiter(unittest.TestCase):
    def test_rate_acquire(self):
        key = PREFIX + "rate"
        with Leased(SOCKET) as ld:
            r = ld.rate_acquire(key, 2, 60000, burst=2)
            self.assertEqual((r["acquired"], r["retry_after_ms"]), (True, 0))
            r = ld.rate_acquire(key, 2, 60000, burst=2)
            self.assertTrue(r["acquired"])
            r = ld.rate_acquire(key, 2, 60000, burst=2)
            self.assertFalse(r["acquired"])
            self.assertTrue(0 < r["retry_after_ms"] <= 30000)
            with self.assertRaises(LeasedError) as cm:
                ld.rate_acquire(key, 2, 60000, burst=2, permits=3)
            self.assertEqual(cm.exception.code, "bad_request")
        with Pool(SOCKET, size=1) as pool:
            r = pool.rate_acquire(key, 2, 60000, burst=2)
            self.assertFalse(r["acquired"])

    def test_rate_acquire_waits(self):
        key = PREFIX + "rate-wait"

        async def main():
            a = await AsyncLeased.connect(SOCKET)
            try:
                r = await a.rate_acquire(key, 1, 300, burst=1)
                self.assertTrue(r["acquired"])
                r = await a.rate_acquire(key, 1, 300, burst=1,
                                         wait_ms=WAIT_S * 1000)
                self.assertTrue(r["acquired"])
            finally:
                await a.close()
        asyncio.run(asyncio.wait_for(main(), WAIT_S * 2))


class BloomFilter(unittest.TestCase):
    def test_bloom_ops_and_cached(self):
        f = PREFIX + "bloom"
        k1, k2, k3 = PREFIX + "b1", PREFIX + "b2", PREFIX + "b3"
        with Leased(SOCKET) as ld:
            r = ld.bloom_create(f, 100, 0.01)
            self.assertEqual((r["created"], r["hashes"]), (True, 7))
            self.assertFalse(ld.bloom_create(f, 100, 0.01)["created"])
            with self.assertRaises(LeasedError) as cm:
                ld.bloom_create(f, 200, 0.01)
            self.assertEqual(cm.exception.code, "bad_request")
            self.assertEqual(ld.bloom_add(f, [k1, k2]), [True, True])
            self.assertEqual(ld.bloom_add(f, k1), [False])
            self.assertEqual(ld.bloom_check(f, (k1, k2, k3)),
                             [True, True, False])
            calls = []

            def loader():
                calls.append(1)
                return {"n": 1}
            # Ruled out: "not found" at once, the loader not called.
            self.assertIsNone(ld.cached(k3, loader, bloom=f))
            self.assertEqual(calls, [])
            # Maybe: loaded and filled as usual.
            self.assertEqual(ld.cached(k1, loader, bloom=f), {"n": 1})
            self.assertEqual(calls, [1])
            with self.assertRaises(LeasedError) as cm:
                ld.bloom_check(PREFIX + "no-such-filter", k1)
            self.assertEqual(cm.exception.code, "bad_request")
        with Pool(SOCKET, size=1) as pool:
            self.assertEqual(pool.bloom_check(f, [k2, k3]), [True, False])
            self.assertIsNone(pool.cached(k3, loader, bloom=f))

        async def main():
            a = await AsyncLeased.connect(SOCKET)
            try:
                self.assertEqual(await a.bloom_add(f, k3), [True])
                self.assertEqual(await a.bloom_check(f, [k3]), [True])
                r = await a.bloom_create(f, 100, 0.01)
                self.assertFalse(r["created"])
                self.assertIsNone(
                    await a.cached(PREFIX + "b4", loader, bloom=f))
            finally:
                await a.close()
        asyncio.run(asyncio.wait_for(main(), WAIT_S))
        self.assertEqual(calls, [1])


LEASED_BIN = os.environ.get("LEASED_BIN", "")


class OwnDaemon:
    """A leased of the test's own ($LEASED_BIN, on LEASED_TEST_REDIS) in
    DIR, for the tests that stop and restart it."""

    def __init__(self, tmp, redis=None, extra=""):
        self.sock = os.path.join(tmp, "own.sock")
        self.conf = os.path.join(tmp, "own.yml")
        self.log = os.path.join(tmp, "own.log")
        self.proc = None
        # One port for every start, so that clients find it again.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.tcp = "127.0.0.1:%d" % s.getsockname()[1]
        with open(self.conf, "w") as f:
            f.write('listen:\n  unix: "%s"\n  tcp: "%s"\n'
                    'metrics:\n  listen: ""\nredis:\n  address: "%s"\n'
                    'journal:\n  path: "%s"\nlog:\n  level: info\n%s'
                    % (self.sock, self.tcp, redis or REDIS,
                       os.path.join(tmp, "journal"), extra))

    def start(self):
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([LEASED_BIN, "-f", "-c", self.conf],
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + WAIT_S
        while True:
            if self._stats() is not None:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log) as log:
                    raise AssertionError("leased did not start: "
                                         + log.read())
            time.sleep(0.02)

    def _stats(self):
        """stats, once the daemon answers on its socket; else None."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(self.sock)
                s.sendall(b'{"op":"stats","id":1}\n')
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        return None
                    buf += chunk
        except OSError:
            return None
        return json.loads(buf)["stats"]

    def stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self):
        self.stop()
        self.start()


def own_daemon(test):
    return unittest.skipUnless(REDIS and LEASED_BIN,
                               "LEASED_TEST_REDIS or LEASED_BIN not set")(test)


@own_daemon
class Restart(unittest.TestCase):
    """The daemon restarts under a client: the client carries on with a
    new session; what the old session held is lost, not an error."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.own = OwnDaemon(self.dir.name)
        self.own.start()

    def tearDown(self):
        self.own.stop()
        self.dir.cleanup()

    def test_lock_block_across_a_restart_ends_without_error(self):
        key = PREFIX + "restart:block"
        with Leased(self.own.sock, timeout=10) as ld:
            with ld.lock(key) as held:
                self.own.restart()
                self.assertTrue(held.lost.wait(WAIT_S))
                self.assertEqual(held.lost_event["reason"],
                                 "connection_closed")
            # The next call opens a new session.
            self.assertEqual(ld.call("ping")["ok"], True)

    def test_single_leased_reconnects_on_the_next_call(self):
        for target in (self.own.sock, self.own.tcp):
            with Leased(target, timeout=10, client="restart") as ld:
                first = ld.session
                self.own.restart()
                try:
                    ld.call("ping")
                except LeasedError as e:
                    # Over TCP the request may have gone out before the
                    # reset came back: that call fails, as a LeasedError
                    # with the socket error as its cause.
                    self.assertEqual(target, self.own.tcp)
                    self.assertEqual(e.code, "io")
                    self.assertIsInstance(e, ConnectionError)
                self.assertTrue(ld.call("ping")["ok"])
                self.assertIsNotNone(ld.session)
                self.assertNotEqual(ld.session, first)

    def test_pool_checks_its_idle_connections(self):
        # Over TCP, where a write to a closed peer succeeds and only the
        # read fails: the pool must notice the close before it uses an
        # idle connection.
        with Pool(self.own.tcp, size=4, timeout=10) as pool:
            conns = [pool._checkout() for _ in range(4)]
            for c in conns:
                c.call("ping")
                pool._checkin(c, False)
            self.own.restart()
            for _ in range(8):
                self.assertTrue(pool.call("ping")["ok"])
            with pool.lock(PREFIX + "restart:pool") as held:
                self.own.restart()
                self.assertTrue(held.lost.wait(WAIT_S))
            self.assertLessEqual(pool._made, 4)

    def test_async_lock_block_across_a_restart_and_a_new_session(self):
        key = PREFIX + "restart:async"

        async def main():
            ld = await AsyncLeased.connect(self.own.sock, timeout=10)
            try:
                first = ld.session
                async with ld.lock(key) as held:
                    self.own.restart()
                    await asyncio.wait_for(held.lost.wait(), WAIT_S)
                # The next call opens a new connection and session.
                self.assertTrue((await ld.call("ping"))["ok"])
                self.assertNotEqual(ld.session, first)
                async with ld.lock(key, wait_ms=5000) as held:
                    self.assertFalse(held.lost.is_set())
            finally:
                await ld.close()
            with self.assertRaises(LeasedError):
                await ld.call("ping")

        asyncio.run(asyncio.wait_for(main(), 60))

    def test_a_stopped_daemon_is_a_connection_error(self):
        with Leased(self.own.sock, timeout=10) as ld:
            self.own.stop()
            with self.assertRaises(LeasedError) as cm:
                ld.call("ping")
            self.assertIsInstance(cm.exception, ConnectionError)
            self.assertEqual(cm.exception.code, "connect")
            self.assertIn(self.own.sock, str(cm.exception))
            self.assertIsInstance(cm.exception.__cause__, OSError)


class StallProxy:
    """A TCP proxy to LEASED_TEST_REDIS whose replies can be held back
    (stall) and let go again, in order: a Redis that stops answering."""

    def __init__(self):
        self.flowing = threading.Event()
        self.flowing.set()
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.address = "127.0.0.1:%d" % self.srv.getsockname()[1]
        self.socks = [self.srv]
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self, on):
        if on:
            self.flowing.clear()
        else:
            self.flowing.set()

    def close(self):
        self.flowing.set()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self):
        host, _, port = REDIS.rpartition(":")
        while True:
            try:
                down, _ = self.srv.accept()
                up = socket.create_connection((host, int(port)), 10)
            except OSError:
                return
            self.socks += [down, up]
            for a, b, held in ((down, up, False), (up, down, True)):
                threading.Thread(target=self._pump, args=(a, b, held),
                                 daemon=True).start()

    def _pump(self, src, dst, held):
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    return
                if held:
                    self.flowing.wait()
                dst.sendall(data)
            except OSError:
                return


def wait_for(cond, timeout):
    """Whether COND() became true within TIMEOUT seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@own_daemon
class AtRisk(unittest.TestCase):
    """Redis stops answering while a lock or grant is held: held.at_risk
    is set before held.lost, and cleared when Redis answers in time."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.proxy = StallProxy()
        # The command timeout is longer than the stall: the renewal is
        # late, not failed.
        self.own = OwnDaemon(self.dir.name, self.proxy.address,
                             "lock:\n  watchdog_ms: 3000\n")
        with open(self.own.conf) as f:
            conf = f.read()
        with open(self.own.conf, "w") as f:
            f.write(conf.replace('redis:\n', 'redis:\n  timeout_ms: 60000\n'
                                 '  connections: 1\n'))
        self.own.start()

    def tearDown(self):
        self.own.stop()
        self.proxy.close()
        self.dir.cleanup()

    def stall_until_at_risk(self, held):
        self.proxy.stall(True)
        self.assertTrue(held.at_risk.wait(WAIT_S), "held.at_risk not set")
        self.assertFalse(held.lost.is_set())

    def test_lock_at_risk_then_safe(self):
        with Leased(self.own.sock, timeout=10) as ld:
            with ld.lock(PREFIX + "risk") as held:
                self.assertFalse(held.at_risk.is_set())
                self.stall_until_at_risk(held)
                self.proxy.stall(False)
                self.assertTrue(wait_for(lambda: not held.at_risk.is_set(),
                                         WAIT_S), "held.at_risk not cleared")
                self.assertFalse(held.lost.is_set())
                self.assertTrue(ld.call("lock.info", key=held.key)["mine"])

    def test_sem_at_risk_then_lost(self):
        with Leased(self.own.sock, timeout=10) as ld:
            with ld.semaphore(PREFIX + "risk", 1) as held:
                self.stall_until_at_risk(held)
                self.assertTrue(held.lost.wait(WAIT_S))
                self.assertEqual(held.lost_event["event"], "sem_lost")
                self.proxy.stall(False)

    def test_async_at_risk_is_an_asyncio_event(self):
        async def main():
            ld = await AsyncLeased.connect(self.own.sock, timeout=10)
            try:
                async with ld.lock(PREFIX + "risk:async") as held:
                    self.assertIsInstance(held.at_risk, asyncio.Event)
                    self.proxy.stall(True)
                    await asyncio.wait_for(held.at_risk.wait(), WAIT_S)
                    self.assertFalse(held.lost.is_set())
                    self.proxy.stall(False)
                    deadline = time.monotonic() + WAIT_S
                    while held.at_risk.is_set():
                        self.assertLess(time.monotonic(), deadline,
                                        "held.at_risk not cleared")
                        await asyncio.sleep(0.01)
                    self.assertFalse(held.lost.is_set())
            finally:
                await ld.close()

        asyncio.run(asyncio.wait_for(main(), 60))


class Errors(unittest.TestCase):
    def test_connect_errors_name_the_socket_and_what_to_check(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "none.sock")
            with self.assertRaises(LeasedError) as cm:
                Leased(path, timeout=5)
            e = cm.exception
            self.assertEqual(e.code, "connect")
            self.assertIsInstance(e, ConnectionError)
            self.assertIsInstance(e.__cause__, FileNotFoundError)
            self.assertIn(path, str(e))
            self.assertIn("is leased running", str(e))
            self.assertIn("LEASED_SOCKET", str(e))

            async def aconnect():
                await AsyncLeased.connect(path, timeout=5)

            with self.assertRaises(LeasedError) as cm:
                asyncio.run(aconnect())
            self.assertIn(path, str(cm.exception))
        e = leased_connect_error("/run/leased/leased.sock",
                                 PermissionError(13, "Permission denied"))
        self.assertIn("/run/leased/leased.sock", str(e))
        self.assertIn("group", str(e))
        e = leased_connect_error("127.0.0.1:1", ConnectionRefusedError(
            111, "Connection refused"))
        self.assertIn("127.0.0.1:1", str(e))
        self.assertIn("listening", str(e))

    def test_client_errors_are_leased_errors(self):
        self.assertTrue(issubclass(LockNotAcquired, LeasedError))
        self.assertTrue(issubclass(NoPermit, LeasedError))
        self.assertEqual(LockNotAcquired("k", 5).code, "not_acquired")
        self.assertEqual(NoPermit("k", 0).code, "no_permit")


class Package(unittest.TestCase):
    def test_pip_install_offline_into_a_venv(self):
        try:
            import ensurepip  # noqa: F401 - Debian splits it off
            import venv  # noqa: F401
        except ImportError:
            self.skipTest("python3-venv is not installed")
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
            env["PIP_NO_CACHE_DIR"] = "1"
            vdir = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", vdir], check=True,
                           env=env, timeout=300)
            py = os.path.join(vdir, "bin", "python")
            # A copy: the source tree may be read-only (distcheck).
            src = os.path.join(tmp, "src")
            shutil.copytree(HERE, src)
            # --no-index: nothing may come from a package index; build
            # isolation stays on, as for a user's plain pip install.
            r = subprocess.run([py, "-m", "pip", "install", "--no-index",
                                src], env=env, timeout=300,
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run(
                [py, "-c", "import leased, sys; "
                 "l = leased.Leased(sys.argv[1]); "
                 "print(leased.__file__, l.call('ping')['ok'])", SOCKET],
                cwd=tmp, env=env, timeout=60, capture_output=True,
                text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("site-packages", r.stdout)
            self.assertTrue(r.stdout.strip().endswith("True"), r.stdout)

    def test_sdist_and_wheel_contents(self):
        import tarfile
        import zipfile
        sys.path.insert(0, HERE)
        import leased_build
        with tempfile.TemporaryDirectory() as tmp:
            whl = leased_build.build_wheel(tmp)
            with zipfile.ZipFile(os.path.join(tmp, whl)) as z:
                names = z.namelist()
                record = z.read("leased-0.1.0.dist-info/RECORD").decode()
            self.assertIn("leased.py", names)
            self.assertIn("leased.py,sha256=", record)
            sd = leased_build.build_sdist(tmp)
            with tarfile.open(os.path.join(tmp, sd)) as t:
                names = t.getnames()
            self.assertIn("leased-0.1.0/pyproject.toml", names)
            self.assertIn("leased-0.1.0/leased_build.py", names)
            self.assertIn("leased-0.1.0/PKG-INFO", names)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        SOCKET = sys.argv.pop(1)
    if not SOCKET:
        sys.exit("usage: test_leased.py SOCKET")
    unittest.main(verbosity=2)
