"""Proof from Python: cache-aside over sqlite3 and locks, through leased.

    python3 test_leased.py SOCKET

Needs a running leased (and its Redis) on SOCKET; `make check` starts
both (tests/integration/check_clients.c).
"""

import os
import sqlite3
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from leased import Leased, LeasedError, LockNotAcquired  # noqa: E402

SOCKET = os.environ.get("LEASED_SOCKET", "")
PREFIX = "py-%d-" % os.getpid()


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


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        SOCKET = sys.argv.pop(1)
    if not SOCKET:
        sys.exit("usage: test_leased.py SOCKET")
    unittest.main(verbosity=2)
