"""A small client for leased, standard library only.

    from leased import Leased

    with Leased("/run/leased/leased.sock") as ld:
        with ld.lock("order:42", wait_ms=5000) as held:
            ...                     # held["fence"] guards writes
        user = ld.cached("user:7", lambda: db_load_user(7))
        ld.update(["user:7"], lambda: db_save_user(7, name))

The protocol is newline-delimited JSON (see leased-protocol(7)). Each
request gets an id; unsolicited events that come while waiting are kept in
.events, so a lock_lost event is never mistaken for a reply.
One Leased object is one session: its session-bound locks are released
when it is closed. It is not thread-safe; use one per thread.
"""

import contextlib
import itertools
import json
import os
import socket
import time

DEFAULT_SOCKET = "/run/leased/leased.sock"


class LeasedError(Exception):
    """An error reply ({"ok":false}); .code is the contract's code."""

    def __init__(self, code, message, reply=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.reply = reply or {}

    @property
    def reason(self):
        return self.reply.get("error", {}).get("reason")


class LockNotAcquired(Exception):
    """lock() found the lock taken for longer than wait_ms."""

    def __init__(self, key, ttl_ms):
        super().__init__("lock %r is held elsewhere (%s ms left)" % (key, ttl_ms))
        self.key = key
        self.ttl_ms = ttl_ms


class Leased:
    def __init__(self, target=None, timeout=30.0, client=None, auth=None):
        """TARGET: a Unix socket path or "host:port" ($LEASED_SOCKET, else
        the default socket, when None)."""
        target = target or os.environ.get("LEASED_SOCKET") or DEFAULT_SOCKET
        host, _, port = target.rpartition(":")
        if "/" not in target and port.isdigit() and host:
            self.sock = socket.create_connection((host.strip("[]"), int(port)),
                                                 timeout)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(target)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._buf = b""
        self.events = []
        self.session = None
        if client is not None or auth is not None:
            fields = {}
            if client is not None:
                fields["client"] = client
            if auth is not None:
                fields["auth"] = auth
            self.session = self.call("hello", **fields)["session"]

    # --- plumbing ----------------------------------------------------------

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read_line(self, deadline):
        while b"\n" not in self._buf:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError("no reply from leased in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("leased closed the connection")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def call(self, op, **fields):
        """Send one request and return its reply; raise LeasedError on
        {"ok":false}. A request that asks the daemon to wait (wait_ms) gets
        that much longer than the timeout; -1 waits without limit."""
        wait_ms = fields.get("wait_ms")
        if wait_ms is None:
            # cache.get waits cache.wait_ms (3 s by default) unless told.
            wait_ms = 3000 if op.startswith("cache.") else 0
        rid = next(self._ids)
        fields["op"] = op
        fields["id"] = rid
        self.sock.sendall(json.dumps(fields).encode() + b"\n")
        deadline = None if wait_ms < 0 else \
            time.monotonic() + self.timeout + wait_ms / 1000.0
        while True:
            msg = self._read_line(deadline)
            if "event" in msg and "id" not in msg:
                self.events.append(msg)
            elif msg.get("id", rid) == rid:
                # A reply without an id answers a line the daemon could not
                # read; with one request at a time that is ours. Other ids
                # are late replies to requests that timed out.
                reply = msg
                break
        if not reply.get("ok"):
            err = reply.get("error", {})
            raise LeasedError(err.get("code"), err.get("message"), reply)
        return reply

    # --- locks ---------------------------------------------------------------

    def try_lock(self, key, wait_ms=0, ttl_ms=None, owner=None):
        """The lock reply: {"acquired":true,"token":..,"fence":..} or
        {"acquired":false,"ttl_ms":..}."""
        fields = {"key": key}
        if wait_ms:
            fields["wait_ms"] = wait_ms
        if ttl_ms:
            fields["ttl_ms"] = ttl_ms
        if owner is not None:
            fields["owner"] = owner
        return self.call("lock", **fields)

    def unlock(self, key, owner=None, token=None):
        fields = {"key": key}
        if owner is not None:
            fields["owner"] = owner
        if token is not None:
            fields["token"] = token
        return self.call("unlock", **fields)

    @contextlib.contextmanager
    def lock(self, key, wait_ms=0, ttl_ms=None, owner=None):
        """Hold KEY for the with-block (renewed by the daemon while this
        session lives, unless ttl_ms is given). Raises LockNotAcquired."""
        held = self.try_lock(key, wait_ms=wait_ms, ttl_ms=ttl_ms, owner=owner)
        if not held["acquired"]:
            raise LockNotAcquired(key, held.get("ttl_ms"))
        try:
            yield held
        finally:
            self.unlock(key, owner=owner)

    # --- cache-aside ---------------------------------------------------------

    def cached(self, key, loader, ttl_ms=None):
        """The read path: the cached value, or LOADER() loaded once
        cluster-wide and filled. A loader returning None caches "not
        found". A loader that raises gives its fill lease back."""
        got = self.call("cache.get", key=key)
        if got["hit"]:
            return got["value"]
        lease = got.get("lease")
        try:
            value = loader()
        except BaseException:
            if lease:
                self.call("cache.release", key=key, lease=lease)
            raise
        if lease:
            fields = {"key": key, "lease": lease, "value": value}
            if ttl_ms:
                fields["ttl_ms"] = ttl_ms
            self.call("cache.fill", **fields)
        return value

    def invalidate(self, keys, delay_ms=None):
        """Delete KEYS now and once more after delay_ms (the daemon's
        default double delete when None)."""
        fields = {"keys": list(keys)}
        if delay_ms is not None:
            fields["delay_ms"] = delay_ms
        return self.call("cache.invalidate", **fields)

    def update(self, keys, writer):
        """The write path: WRITER() commits to the database first, then
        the cached copies are invalidated. Returns WRITER's result."""
        result = writer()
        self.invalidate(keys)
        return result
