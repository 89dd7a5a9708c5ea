"""A client for leased, standard library only, in one module.

    from leased import Leased

    with Leased("/run/leased/leased.sock") as ld:
        with ld.lock("order:42", wait_ms=5000) as held:
            ...                     # held.fence guards writes
            if held.lost.is_set():  # lock_lost: stop writing under it
                ...
        with ld.semaphore("pool:db", limit=4):
            ...                     # one of at most 4 holders
        with ld.rwlock("doc:7").read_lock(wait_ms=1000):
            ...                     # readers share, writers exclude
        user = ld.cached("user:7", lambda: db_load_user(7))  # JSON
        ld.update("user:7", lambda: db_save_user(7, name))

Install it with `pip install ./clients/python`, or copy this file into the
application: it is the whole client.

The protocol is newline-delimited JSON (see leased-protocol(7)). Each
request gets an id; unsolicited events that come while waiting are kept in
.events, so a lock_lost event is never mistaken for a reply.

Leased is one connection, so one session: its session-bound locks are
released when it is closed. When the connection fails (the daemon
restarted, say), they are lost (held.lost is set) and the next call opens
a new connection, a new session. It is one thread's; share a Pool between
threads instead (threads that share one anyway exclude each other: see
Leased._owner). AsyncLeased is the asyncio client.

Events and idle holders: a lock_lost event is read by whoever reads the
socket. While a with-block of lock() is open, a watcher thread of the
connection also reads the socket whenever no call is in progress, so an
event that arrives while the application is busy elsewhere inside the
block still sets held.lost at once. Calls and the watcher never read at
the same time (one lock guards the socket), so replies are always read by
the call that waits for them. The watcher starts with the first lock()
block and ends with the connection.
"""

import array
import asyncio
import collections
import contextlib
import functools
import itertools
import json
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
import zlib

__all__ = ["Leased", "Pool", "AsyncLeased", "Held", "RWLock", "LeasedError",
           "LeasedConnectionError", "LeasedTimeout", "LeasedTypeError",
           "LockNotAcquired", "NoPermit", "Versioned", "Written",
           "DEFAULT_SOCKET"]
__version__ = "0.1.0"

DEFAULT_SOCKET = "/run/leased/leased.sock"

# One encoder without the default ", " separators: smaller lines, and it
# skips building an encoder per call the way json.dumps does.
_encode = json.JSONEncoder(separators=(",", ":")).encode
# A key as a JSON string (quoted, escaped, ASCII): the hot requests are
# written from a template around it instead of encoding a dict.
_quote = json.encoder.encode_basestring_ascii
# A cached value as JSON text: non-ASCII as it is, since the request that
# carries the text escapes it once more.
_encode_text = json.JSONEncoder(separators=(",", ":"),
                                ensure_ascii=False).encode
_scan = json.JSONDecoder().scan_once


def _decode(line):
    """One reply line (bytes) as an object. The daemon writes compact
    lines, so the C scanner reads them directly, without json.loads'
    encoding detection and whitespace matching; anything else (spaces
    around, a bad line) goes through json.loads for its answer. The
    line may end in its newline (as readline() and a whole-line chunk
    give it)."""
    s = line.decode()
    try:
        obj, end = _scan(s, 0)
    except StopIteration:
        return json.loads(s)
    n = len(s) - end
    if n == 0 or n == 1 and s[end] == "\n":
        return obj
    return json.loads(s)


class LeasedError(Exception):
    """Every error the client raises. .code is the contract's code for an
    error reply ({"ok":false}, .reply), or the client's own: "connect"
    (the daemon could not be reached), "io" (the connection failed: its
    session, and the session's locks, are gone), "timeout" (no answer in
    time), "invalid" (a bad argument), "bad_value" (a cached value the
    serializer cannot read), "not_acquired", "no_permit". An OSError
    behind it is its __cause__."""

    def __init__(self, code, message, reply=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.reply = reply or {}

    @property
    def reason(self):
        return self.reply.get("error", {}).get("reason")


class LeasedConnectionError(LeasedError, ConnectionError):
    """"connect" or "io": also a ConnectionError."""


class LeasedTimeout(LeasedError, TimeoutError):
    """"timeout": also a TimeoutError."""


class LeasedTypeError(LeasedError, TypeError):
    """"invalid": an argument of the wrong type; also a TypeError."""

    def __init__(self, message):
        super().__init__("invalid", message)


class LockNotAcquired(LeasedError):
    """lock() found the lock taken for longer than wait_ms."""

    def __init__(self, key, ttl_ms):
        super().__init__("not_acquired", "lock %r is held elsewhere "
                         "(%s ms left)" % (key, ttl_ms))
        self.key = key
        self.ttl_ms = ttl_ms


class NoPermit(LeasedError):
    """semaphore() got no permit within wait_ms."""

    def __init__(self, key, available):
        super().__init__("no_permit", "semaphore %r: no permit (%s "
                         "available)" % (key, available))
        self.key = key
        self.available = available


def _connect_error(target, err):
    """The error of a connection to TARGET that failed with ERR, naming
    the socket and what to check."""
    if isinstance(err, PermissionError):
        hint = ("is this user in the socket's group (listen.unix_group in "
                "leased.yml)?")
    elif _split_target(target):
        hint = "is leased running and listening there?"
    else:
        hint = ("is leased running, and is $LEASED_SOCKET (or the path "
                "given) its listen.unix socket?")
    what = err.strerror or str(err) or type(err).__name__
    return LeasedConnectionError(
        "connect", "cannot connect to leased at %s: %s; %s"
        % (target, what, hint))


def _one_key(key):
    """KEY, when it is one key (a str); else a LeasedTypeError."""
    if not isinstance(key, str):
        raise LeasedTypeError("a key is a str, not %s" % type(key).__name__)
    return key


def _keys(keys):
    """KEYS as a list of keys: a str is one key (not its characters), a
    list or tuple of str several; anything else is a LeasedTypeError."""
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, (list, tuple)) and \
            all(isinstance(k, str) for k in keys):
        return list(keys)
    raise LeasedTypeError("keys are a str (one key) or a list or tuple of "
                          "str, not %s" % _type_name(keys))


def _type_name(keys):
    if isinstance(keys, (list, tuple)):
        bad = next(k for k in keys if not isinstance(k, str))
        return "a %s holding a %s" % (type(keys).__name__,
                                      type(bad).__name__)
    return type(keys).__name__


def _invalidate_fields(keys, delay_ms):
    fields = {"keys": _keys(keys)}
    if delay_ms is not None:
        fields["delay_ms"] = delay_ms
    return fields


def _sem_fields(key, limit, permits, wait_ms, ttl_ms, extra):
    fields = {"key": _one_key(key), "limit": limit}
    if permits != 1:
        fields["permits"] = permits
    if wait_ms:
        fields["wait_ms"] = wait_ms
    if ttl_ms is not None:
        fields["ttl_ms"] = ttl_ms
    fields.update(extra)
    return fields


def _rate_fields(key, rate, per_ms, burst, permits, wait_ms, extra):
    fields = {"key": _one_key(key), "rate": rate, "per_ms": per_ms}
    if burst is not None:
        fields["burst"] = burst
    if permits != 1:
        fields["permits"] = permits
    if wait_ms:
        fields["wait_ms"] = wait_ms
    fields.update(extra)
    return fields


class Held(dict):
    """A held lock: the lock reply (held["fence"] as before) with .key,
    .token, .fence, and .lost, an Event (threading.Event, or asyncio.Event
    for AsyncLeased) set when the daemon reports the lock lost; .lost_event
    is that lock_lost event. When the connection ends, its session's
    locks are gone: .lost is set too, with reason "connection_closed".
    .at_risk, an Event of the same kind, is set while a renewal has failed
    or is late (lock_at_risk, sem_at_risk: finish or pause the writes) and
    cleared when a later one confirms the lease (lock_safe, sem_safe); for
    a group, while any of its keys is at risk."""

    def __init__(self, reply, key, owner, lost):
        dict.__init__(self, reply)
        self.key = _norm_key(key)
        self.owner = owner
        self.lost = lost
        self.lost_event = None
        self.at_risk = type(lost)()
        self._risky = set()
        self._conn = None

    def _risk(self, event):
        """A lock_at_risk or lock_safe (sem_ alike) event for this hold."""
        if event.get("event").endswith("_at_risk"):
            self._risky.add(event.get("key"))
            self.at_risk.set()
        else:
            self._risky.discard(event.get("key"))
            if not self._risky:
                self.at_risk.clear()

    @property
    def token(self):
        return self.get("token")

    @property
    def fence(self):
        return self.get("fence")

    @property
    def fences(self):
        """A group's fence per key ({key: fence}); None for one key."""
        return self.get("fences")


_RISK_EVENTS = ("lock_at_risk", "lock_safe", "sem_at_risk", "sem_safe")


def _norm_key(key):
    """A group of keys (a list or tuple) as a tuple; one key as it is."""
    return tuple(key) if isinstance(key, (list, tuple)) else key


class _Anon:
    """The anonymous holds of a client whose callers share sessions
    (AsyncLeased's tasks, a Pool's threads): try_lock calls that named
    neither an owner nor a token. One session's holds of a key under one
    owner are reentrant, so two callers locking as the session's owner ""
    would both hold the key: each such call gets an owner of its own, and
    its token is kept for an unlock or extend that names neither (the
    latest anonymous hold of the key and mode). A token unlocked by itself
    or reported lost is forgotten; at most MAX are kept, the oldest
    forgotten first (a lock left to expire), and one forgotten so is
    unlocked by token only.

    A slot is the key itself (a plain lock), else (sorted keys of a group,
    mode); it holds the token of its hold, or a list of them for the read
    side, which holds share."""

    MAX = 10000
    _owners = itertools.count(1)

    def __init__(self):
        self._by_slot = {}
        self._by_token = {}     # insertion-ordered: the oldest first
        self._mu = threading.Lock()

    def __len__(self):
        return len(self._by_token)

    @staticmethod
    def wanted(owner, extra):
        return owner is None and extra.get("token") is None

    def owner(self):
        # Unique in the process, so in any session its callers share.
        return "anon-%d" % next(self._owners)

    @staticmethod
    def _slot(key, extra):
        mode = extra.get("mode") if extra else None
        if mode is None and isinstance(key, str):
            return key
        return (tuple(sorted(key)) if isinstance(key, (list, tuple))
                else key, mode)

    def keep(self, key, extra, reply):
        """An exclusive grant ends every earlier anonymous hold of its key
        here (lost or expired: no two holders); read holds share it."""
        if not reply.get("acquired"):
            return
        slot = self._slot(key, extra)
        token = reply["token"]
        with self._mu:
            old = self._by_slot.get(slot)
            if extra and extra.get("mode") == "read":
                if old is None:
                    self._by_slot[slot] = [token]
                else:
                    old.append(token)
            else:
                if old is not None:
                    self._by_token.pop(old, None)
                self._by_slot[slot] = token
            self._by_token[token] = slot
            if len(self._by_token) > self.MAX:
                self._forget(next(iter(self._by_token)))

    def forget(self, token):
        """TOKEN was reported lost."""
        if self._by_token:
            with self._mu:
                self._forget(token)

    def _forget(self, token):
        slot = self._by_token.pop(token, None)
        if slot is None:
            return
        held = self._by_slot[slot]
        if held.__class__ is list:
            held.remove(token)
            if held:
                return
        del self._by_slot[slot]

    def token(self, key, owner, token, extra, take):
        """TOKEN, or the latest anonymous hold's when neither it nor
        OWNER is given (TAKE: for the unlock, which forgets it, as it
        forgets TOKEN)."""
        if not self._by_token:
            return token
        with self._mu:
            if owner is not None or token is not None:
                if take and token.__class__ is str:
                    self._forget(token)
                return token
            held = self._by_slot.get(self._slot(key, extra))
            if held is None:
                return None
            token = held[-1] if held.__class__ is list else held
            if take:
                self._forget(token)
            return token


def _key_fields(key):
    """{"keys": [...]} for a group of keys, else {"key": KEY}."""
    if isinstance(key, str):
        return {"key": key}
    return {"keys": _keys(key)}


def _hold_keys(held):
    """The (key, token) pairs a lock_lost event of HELD names."""
    keys = held.key if isinstance(held.key, tuple) else (held.key,)
    return [(k, held.token) for k in keys]


def _timeval(seconds):
    if seconds is None or seconds <= 0:
        return struct.pack("ll", 0, 0)      # no limit
    usec = int(seconds * 1e6)
    return struct.pack("ll", usec // 1000000, max(usec % 1000000, 1))


def _target(target):
    return target or os.environ.get("LEASED_SOCKET") or DEFAULT_SOCKET


def _split_target(target):
    """(host, port) for "host:port", else None (a Unix socket path)."""
    host, _, port = target.rpartition(":")
    if "/" not in target and port.isdigit() and host:
        return host.strip("[]"), int(port)
    return None


def _raise_for(reply):
    err = reply.get("error", {})
    raise LeasedError(err.get("code"), err.get("message"), reply)


def _lock_fields(key, wait_ms, ttl_ms, owner, extra):
    fields = _key_fields(key)
    if wait_ms:
        fields["wait_ms"] = wait_ms
    if ttl_ms:
        fields["ttl_ms"] = ttl_ms
    if owner is not None:
        fields["owner"] = owner
    fields.update(extra)
    return fields


class _Holds:
    """Held locks by (key, token), for routing lock_lost events. Shared
    by the connections of a Pool; the lock is held by the caller of add,
    remove and lost (the watcher thread and the calling thread both)."""

    def __init__(self):
        self._by = {}
        self._mu = threading.Lock()
        self.anon = None    # a Pool's _Anon, told of lost locks

    def add(self, held):
        with self._mu:
            for k in _hold_keys(held):
                self._by.setdefault(k, []).append(held)

    def remove(self, held):
        with self._mu:
            for k in _hold_keys(held):
                lst = self._by.get(k)
                if lst and held in lst:
                    lst.remove(held)
                    if not lst:
                        del self._by[k]

    def gone(self, conn):
        """CONN's session ended: its session-bound locks went with it."""
        with self._mu:
            lst = {id(h): h for hs in self._by.values() for h in hs
               if h._conn is conn}.values()
        for held in lst:
            _lose(held)

    def lost(self, event):
        if self.anon is not None and event.get("event") == "lock_lost":
            self.anon.forget(event.get("token"))
        for held in self._of(event):
            held.lost_event = event
            held.lost.set()

    def risk(self, event):
        for held in self._of(event):
            held._risk(event)

    def _of(self, event):
        with self._mu:
            return list(self._by.get((event.get("key"), event.get("token")),
                                     ()))


def _lose(held):
    """HELD went with its session (the connection ended)."""
    if not held.lost.is_set():
        held.lost_event = {"event": "lock_lost", "key": held.key,
                           "token": held.token,
                           "reason": "connection_closed"}
        held.lost.set()


def _end_hold(held, release, any_not_held=False):
    """Give the hold of a block back with RELEASE() at its end. A hold
    lost meanwhile ends without an error (leased-protocol(7), CLIENTS):
    the block was told through held.lost. A connection that fails at the
    release took its session's holds with it: HELD is lost then too. With
    ANY_NOT_HELD, not_held is no error even when held.lost was not set
    (a semaphore's lease that ran out)."""
    try:
        release()
    except LeasedConnectionError:
        _lose(held)
    except LeasedError as e:
        if e.code != "not_held" or not (any_not_held or held.lost.is_set()):
            raise


class JSONSerializer:
    """The default serializer of cached values: JSON text, so a loader
    may return a dict, a list, a number or a str, and cached() gives back
    what JSON gives back (a tuple comes back as a list). bytes are refused
    rather than guessed at: JSON has no bytes, and a str read back would
    not be what the loader returned; decode them, or pass a serializer
    that takes bytes."""

    def dumps(self, value):
        if isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError("bytes are not JSON: decode them, or pass a "
                            "serializer that takes bytes")
        return _encode_text(value)

    def loads(self, text):
        # The C scanner alone when the text is one JSON value and nothing
        # else (what the daemon hands back): a tenth of json.loads' cost,
        # which a hit from the shared near cache would otherwise be made
        # of. Anything else goes through json.loads for its answer.
        try:
            obj, end = _scan(text, 0)
        except StopIteration:
            return json.loads(text)
        if end == len(text):
            return obj
        return json.loads(text)


class _Raw:
    """serializer=None: values are str, stored and read back as they are
    (what leasectl get/set and other clients that store plain strings
    see)."""

    def dumps(self, value):
        if not isinstance(value, str):
            raise TypeError("serializer=None caches str only, not %s"
                            % type(value).__name__)
        return value

    def loads(self, text):
        return text


def _serializer(serializer):
    return _Raw() if serializer is None else serializer


def _value_text(serializer, key, value):
    """The text cache.fill stores for VALUE (None, "not found", as it
    is); a value the serializer refuses is a LeasedTypeError."""
    if value is None:
        return None
    try:
        text = serializer.dumps(value)
    except (TypeError, ValueError) as e:
        raise LeasedTypeError("the value loaded for %r cannot be cached: %s"
                              % (key, e)) from e
    if not isinstance(text, str):
        raise LeasedTypeError("the serializer gave %s for %r, not a str"
                              % (type(text).__name__, key))
    return text


def _value_of(serializer, key, text):
    """The value of the cached TEXT; a "bad_value" LeasedError when the
    serializer cannot read it (say, a plain string another client stored
    while this one reads JSON)."""
    if text is None:
        return None
    try:
        return serializer.loads(text)
    except Exception as e:  # noqa: BLE001 - any serializer's refusal
        raise LeasedError("bad_value", "the cached value of %r cannot be "
                          "read by the serializer: %s" % (key, e)) from e


def _fill_fields(key, lease, text, ttl_ms):
    fields = {"key": key, "lease": lease, "value": text}
    if ttl_ms:
        fields["ttl_ms"] = ttl_ms
    return fields


class Versioned(collections.namedtuple("Versioned",
                                        "hit value version lease")):
    """What read() found: HIT, the VALUE (through the serializer; None for
    a miss or a cached "not found"), its VERSION (hello's feature
    "versioned"; 0 on a miss) and, on a miss read with lease=True, the
    fill LEASE (None otherwise)."""


class Written(collections.namedtuple("Written", "stored version")):
    """What write() and fill() did: STORED, and the VERSION the value got,
    or, when it was not stored, the entry's current version (0: none)."""


def _versioned(serializer, key, got):
    if got["hit"]:
        return Versioned(True, _value_of(serializer, key, got["value"]),
                         got.get("version", 0), None)
    return Versioned(False, None, 0, got.get("lease"))


def _read_fields(key, lease, wait_ms):
    fields = _get_fields(key, wait_ms)
    if not lease:
        fields["lease"] = False
    return fields


def _write_fields(serializer, key, value, ttl_ms, if_version, lease=None):
    key = _one_key(key)
    fields = {"key": key, "value": _value_text(serializer, key, value)}
    if lease is not None:
        fields["lease"] = lease
    if ttl_ms:
        fields["ttl_ms"] = ttl_ms
    if if_version is not None:
        fields["if_version"] = if_version
    return fields


def _written(reply):
    return Written(bool(reply.get("stored")), reply.get("version", 0))


def _warm_fields(serializer, entries, ttl_ms):
    """cache.mset's fields for ENTRIES: a dict {key: value}, or an iterable
    of (key, value) or (key, value, ttl_ms); values go through SERIALIZER
    as cached() stores them (None: "not found")."""
    if isinstance(entries, dict):
        entries = entries.items()
    out = []
    for e in entries:
        if not isinstance(e, (tuple, list)) or len(e) not in (2, 3):
            raise LeasedTypeError("an entry to warm is (key, value) or "
                                  "(key, value, ttl_ms), not %r" % (e,))
        key = _one_key(e[0])
        entry = {"key": key, "value": _value_text(serializer, key, e[1])}
        ttl = e[2] if len(e) == 3 else ttl_ms
        if ttl is not None:
            entry["ttl_ms"] = ttl
        out.append(entry)
    if not out:
        raise LeasedTypeError("nothing to warm")
    return {"entries": out}


def _get_fields(key, wait_ms, bloom=None):
    fields = {"key": _one_key(key)}
    if wait_ms is not None:
        fields["wait_ms"] = wait_ms
    if bloom is not None:
        fields["bloom"] = bloom
    return fields


def _bloom_create_fields(filter, capacity, error_rate, extra):
    fields = {"filter": _one_key(filter), "capacity": capacity,
              "error_rate": float(error_rate)}
    fields.update(extra)
    return fields


def _bloom_keys_fields(filter, keys, extra):
    fields = {"filter": _one_key(filter), "keys": _keys(keys)}
    fields.update(extra)
    return fields


def _lease_of(got, key, wait_ms):
    """The fill lease of the miss GOT; a "timeout" LeasedTimeout when
    there is none: the key was still being loaded elsewhere when wait_ms
    ran out. Loading it here too, and again in every other waiter, is
    the stampede cached() is there to stop."""
    lease = got.get("lease")
    if lease is None:
        raise LeasedTimeout("timeout", "%r is still being loaded elsewhere "
                            "after %s" % (key, "the daemon's cache.wait_ms"
                                          if wait_ms is None else
                                          "wait_ms=%s ms" % wait_ms))
    return lease


def _load_through(call, serializer, got, key, loader, ttl_ms, wait_ms):
    """The rest of cached() once its cache.get answered GOT: a hit is
    returned; on a miss LOADER runs and its value is filled under the
    lease, which is given back when LOADER raises or the fill fails, so
    the next reader loads at once instead of waiting the lease out."""
    if got["hit"]:
        return _value_of(serializer, key, got["value"])
    lease = _lease_of(got, key, wait_ms)
    try:
        text = _value_text(serializer, key, loader())
        call("cache.fill", **_fill_fields(key, lease, text, ttl_ms))
    except BaseException:
        with contextlib.suppress(LeasedError):
            call("cache.release", key=key, lease=lease)
        raise
    # What a reader that hits gets: the loader's value read back.
    return _value_of(serializer, key, text)


def _open(target, timeout):
    """A blocking socket connected to TARGET, or a LeasedConnectionError
    that names it."""
    hp = _split_target(target)
    sock = None
    try:
        if hp:
            sock = socket.create_connection(hp, timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(target)
    except OSError as e:
        if sock is not None:
            sock.close()
        raise _connect_error(target, e) from e
    sock.settimeout(None)
    return sock


_JSON = JSONSerializer()


# --- the shared near cache ---------------------------------------------------
#
# leased may publish its near cache in a read-only shared memory segment
# (hello's feature "shared_near"; leased-protocol(7), "Shared near cache";
# the layout is lib/leased/near_layout.h). A connection on the Unix socket
# maps it at its first cached() and reads a key there before asking the
# daemon. The daemon writes; nothing in the segment is trusted: every rule
# of the layout is checked on every read, and anything out of place sends
# the read to the socket as if there were no segment.

_NEAR_MAGIC = b"LDNEAR01"
# magic, layout, header_bytes, total_bytes, nbuckets, ways, buckets_off,
# ring_off, ring_bytes, stale_ns: fixed for the segment's life.
_NEAR_GEOMETRY = struct.Struct("<8sIIQIIQQQQ")
# epoch and heartbeat_ns (u64 at offset 64 and 72) and state (u32 at 80):
# read on every lookup, through NearSegment's views.
# A bucket's seq, then each way's hash and klen as one number (hash |
# klen << 32, little-endian): the bucket's index in one unpack of five
# numbers, searched with tuple.index from 1 (the seq itself is read apart,
# through NearSegment's views). A way starts at 8 + 40 * n.
_NEAR_INDEX = struct.Struct("<I4x" + "Q32x" * 3 + "Q")
# A way's vlen, flags, off and deadline_ns (from its byte 8).
_NEAR_WAY = struct.Struct("<IIQQ")
_NEAR_REC = struct.Struct("<II")
_NEAR_HDR_BYTES = 256
_NEAR_BUCKET_BYTES = 168
_NEAR_REC_BYTES = 16
_NEAR_LIVE_STATE = 1
_NEAR_NULL = 1
# A bucket that stays odd, or keeps moving, this many times sends the read
# to the socket: the daemon is writing it, and waiting would cost more.
_NEAR_TRIES = 8
# How often a connection tells the daemon what the segment served
# (near.hits): after this many lookups, or this long, whichever is first.
_NEAR_REPORT_EVERY = 1000
_NEAR_REPORT_NS = 1000000000
# Asking for a segment again (after it closed, or near.map failed): at
# most this often.
_NEAR_RETRY_S = 1.0
# NearSegment.text keeps what it copied for this many keys, this long.
_NEAR_MEMO_KEYS = 1024
_NEAR_MEMO_NS = 1000000000

# What NearSegment.get answers when it has no answer: ask the daemon.
_NEAR_MISS = object()
# The segment is closed (a reload replaced it): map it again.
_NEAR_CLOSED = object()

_monotonic_ns = time.monotonic_ns
_crc32 = zlib.crc32


class NearSegment:
    """One mapped segment of the shared near cache (read-only). get(key)
    answers the value's bytes, None for a cached "not found", or
    _NEAR_MISS / _NEAR_CLOSED when the daemon must be asked; it never
    raises for anything the segment holds, whatever its bytes."""

    def __init__(self, fd):
        """Maps the whole of FD (the caller keeps and closes FD). Raises
        ValueError for a segment that is no layout 1 segment or whose
        header names space outside the file."""
        size = os.fstat(fd).st_size
        if size < _NEAR_HDR_BYTES:
            raise ValueError("a shared near segment of %d bytes" % size)
        if sys.byteorder != "little":
            # The views below read in the host's order; layout 1 is
            # little-endian.
            raise ValueError("a little-endian segment on a %s-endian host"
                             % sys.byteorder)
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            self._check(size)
        except BaseException:
            self._mm.close()
            raise
        self._mv = memoryview(self._mm)
        # The seqs, the epoch and the heartbeat are read through views of
        # their own width: an element of a memoryview cast to "I" or "Q"
        # is read with one load of that width, where a struct unpack may
        # read the bytes one by one and put together a seq that never was
        # from before and after a write, equal to the seq read first.
        whole = self._mv[:size & ~7]
        self._mv32 = whole.cast("I")
        self._mv64 = whole.cast("Q")
        whole.release()
        self._memo = {}
        self.size = size

    def _check(self, size):
        (magic, layout, header_bytes, total, nbuckets, ways, buckets_off,
         ring_off, ring_bytes, stale_ns) = _NEAR_GEOMETRY.unpack_from(
             self._mm, 0)
        if magic != _NEAR_MAGIC or layout != 1 or ways != 4:
            raise ValueError("not a layout 1 shared near segment")
        if total > size or header_bytes < _NEAR_HDR_BYTES or \
                header_bytes > size:
            raise ValueError("the segment's header names %d bytes of %d"
                             % (max(total, header_bytes), size))
        if nbuckets == 0 or nbuckets & (nbuckets - 1):
            raise ValueError("%d buckets is no power of two" % nbuckets)
        if buckets_off % 8 or buckets_off < _NEAR_HDR_BYTES or \
                buckets_off + nbuckets * _NEAR_BUCKET_BYTES > size:
            raise ValueError("the buckets lie outside the segment")
        if ring_off % 8 or ring_off < _NEAR_HDR_BYTES or \
                ring_off + ring_bytes > size:
            raise ValueError("the ring lies outside the segment")
        if stale_ns == 0:
            raise ValueError("the segment has no staleness bound")
        self._mask = nbuckets - 1
        self._buckets_off = buckets_off
        self._ring_off = ring_off
        self._ring_bytes = ring_bytes
        self.stale_ns = stale_ns
        self.now = 0

    def close(self):
        self._memo = {}
        mv, self._mv = self._mv, None
        if mv is not None:
            self._mv32.release()
            self._mv64.release()
            mv.release()
            self._mm.close()

    def _live(self):
        """(epoch, now) while the segment may be read; else _NEAR_MISS or
        _NEAR_CLOSED."""
        mv64 = self._mv64
        epoch, beat = mv64[8], mv64[9]
        if self._mv32[20] != _NEAR_LIVE_STATE:
            return _NEAR_CLOSED
        self.now = now = _monotonic_ns()
        stale = self.stale_ns
        # A beat from the future is as wrong as an old one.
        if now - beat > stale or beat - now > stale:
            return _NEAR_MISS
        return epoch, now

    def get(self, kb):
        """KB's value (bytes) from the segment, None for a cached null,
        else _NEAR_MISS (ask the daemon) or _NEAR_CLOSED."""
        try:
            live = self._live()
            if type(live) is not tuple:
                return live
            got = self._lookup(kb, *live)
            return got if got is _NEAR_MISS else got[0]
        except (TypeError, ValueError, IndexError, struct.error):
            return _NEAR_MISS

    def text(self, key):
        """KEY's value as text (None for a cached null), or _NEAR_MISS /
        _NEAR_CLOSED. A key read again is answered from what the last
        full lookup copied as long as its bucket's seq, the epoch and the
        heartbeat say the segment still holds it: the same rules as a
        full lookup, where the copy was checked, and a tenth of its
        work. The copy is kept at most _NEAR_MEMO_NS, far less than the
        2^31 writes to one bucket that could bring its seq round."""
        try:
            live = self._live()
            if type(live) is not tuple:
                return live
            epoch, now = live
            mv = self._mv
            m = self._memo.get(key)
            if m is not None and m[0] == epoch and now < m[3] and \
                    now - m[4] < _NEAR_MEMO_NS and \
                    self._mv32[m[1] >> 2] == m[2] and \
                    self._mv64[8] == epoch:
                return m[5]
            got = self._lookup(key.encode(), epoch, now)
            if got is _NEAR_MISS:
                return got
            val, boff, seq, deadline = got
            text = None if val is None else val.decode()
        except (TypeError, ValueError, IndexError, struct.error):
            # Not UTF-8 (UnicodeDecodeError is a ValueError), a released
            # mapping, or offsets no check foresaw: the socket answers.
            return _NEAR_MISS
        memo = self._memo
        if len(memo) >= _NEAR_MEMO_KEYS:
            memo.clear()
        memo[key] = (epoch, boff, seq, deadline, now, text)
        return text

    def _lookup(self, kb, epoch, now):
        """(value bytes or None, bucket offset, seq, deadline) of KB,
        following every rule of the layout; _NEAR_MISS when it is not
        there or the bucket would not hold still."""
        mv = self._mv
        mv32 = self._mv32
        klen = len(kb)
        if not klen:
            return _NEAR_MISS   # an empty way says klen 0
        h = _crc32(kb)
        want = h | klen << 32
        boff = self._buckets_off + (h & self._mask) * _NEAR_BUCKET_BYTES
        for _ in range(_NEAR_TRIES):
            seq = mv32[boff >> 2]
            b = _NEAR_INDEX.unpack_from(mv, boff)
            if seq & 1:
                continue
            i = 0
            while True:
                try:
                    i = b.index(want, i + 1)
                except ValueError:
                    return _NEAR_MISS   # not in the bucket
                vlen, flags, off, deadline = _NEAR_WAY.unpack_from(
                    mv, boff + i * 40 - 24)
                if deadline <= now or off & 7 or \
                        off + _NEAR_REC_BYTES + klen + vlen > \
                        self._ring_bytes:
                    val = _NEAR_MISS   # expired, or torn: the seq says
                    break
                rec = self._ring_off + off
                kstart = rec + _NEAR_REC_BYTES
                vstart = kstart + klen
                if _NEAR_REC.unpack_from(mv, rec) != (klen, vlen) or \
                        mv[kstart:vstart] != kb:
                    continue    # another key of this hash, or torn
                val = None if flags & _NEAR_NULL else \
                    mv[vstart:vstart + vlen].tobytes()
                break
            if mv32[boff >> 2] != seq:
                continue    # the daemon wrote the bucket meanwhile
            if val is _NEAR_MISS or \
                    self._mv64[8] != epoch:
                return _NEAR_MISS
            return val, boff, seq, deadline
        return _NEAR_MISS


class _NearReads:
    """AsyncLeased's side of the shared near cache: the segment, when to
    ask for it again, and the counts near.hits reports."""

    def __init__(self):
        self.seg = None
        self.off = False        # this session has none (TCP, no feature)
        self.mapping = False    # a near.map is under way
        self.retry = 0.0
        self.hits = self.falls = 0
        self.last = _monotonic_ns()

    def reset(self):
        """A new session: its segment is asked for anew."""
        seg, self.seg = self.seg, None
        if seg is not None:
            seg.close()
        self.off = False
        self.retry = 0.0

    def may_map(self):
        now = time.monotonic()
        if self.mapping or now < self.retry:
            return False
        self.retry = now + _NEAR_RETRY_S
        return True

    def lookup(self, key):
        """KEY's value text from the segment (None: a cached null), or
        _NEAR_MISS; counted."""
        seg = self.seg
        got = seg.text(key)
        if got is _NEAR_CLOSED:
            self.seg = None
            seg.close()
            got = _NEAR_MISS
        if got is _NEAR_MISS:
            self.falls += 1
        else:
            self.hits += 1
        return got

    def due(self):
        return self.hits + self.falls >= _NEAR_REPORT_EVERY or \
            _monotonic_ns() - self.last >= _NEAR_REPORT_NS

    def take(self):
        """near.hits' fields, the counts starting again."""
        fields = {"hits": self.hits, "fallbacks": self.falls}
        self.hits = self.falls = 0
        self.last = _monotonic_ns()
        return fields


def _near_map_side(target, hello, timeout):
    """The segment, through a short connection of its own (hello, then
    near.map): asyncio's streams cannot receive a descriptor. A
    NearSegment, or None when there is none."""
    fds = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(target)
            s.sendall(_encode(dict(hello, op="hello", id=1)).encode() +
                      b'\n{"op":"near.map","id":2}\n')
            buf = b""
            while True:
                data = _recv_fds(s, fds)
                if not data:
                    return None
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    msg = _decode(line) if line.strip() else None
                    if msg is None or msg.get("id") != 2:
                        continue
                    if not msg.get("ok") or msg.get("layout") != 1 or \
                            not fds:
                        return None
                    return NearSegment(fds[0])
    except (OSError, ValueError, LeasedError):
        return None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _recv_fds(sock, fds):
    """One recvmsg of SOCK with room for descriptors, which go to FDS;
    the bytes are returned."""
    data, anc, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(16))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[:len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return data


class Leased:
    def __init__(self, target=None, timeout=30.0, client=None, auth=None,
                 on_event=None, serializer=_JSON, _holds=None):
        """TARGET: a Unix socket path or "host:port" ($LEASED_SOCKET, else
        the default socket, when None). ON_EVENT, when given, is called
        with every event (from the watcher thread too, and with the
        socket lock held: it must not make calls on this connection).
        SERIALIZER turns cached values into the text leased stores and
        back (dumps and loads): JSON by default; None stores str as it
        is."""
        self.target = _target(target)
        self.serializer = _serializer(serializer)
        self.sock = None
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._tail = b""
        self._lines = []
        self._io = threading.Lock()
        self._holds = _holds if _holds is not None else _Holds()
        self._threads = threading.local()   # .owner: see _owner
        # A Pool lends a connection to one thread at a time, and a lock()
        # block keeps it: its calls need no owner of the thread's.
        self._pooled = _holds is not None
        self._thread_n = itertools.count()
        self._late = {}     # id of a timed-out request -> its cleanup
        self._watcher = None
        self._wake = None
        self._closed = False
        self.on_event = on_event
        self.events = []
        self.session = None
        self.features = []
        self._hello = {}
        if client is not None:
            self._hello["client"] = client
        if auth is not None:
            self._hello["auth"] = auth
        # The shared near cache: the mapped segment (None until mapped),
        # _near_off when this session cannot have one (TCP, or no
        # shared_near in hello's features), when to ask again, what the
        # segment served and what it sent to the socket since the last
        # near.hits, and a near.hits line to go out with the next request.
        self._near = None
        self._near_off = False
        self._near_retry = 0.0
        self._near_hits = 0
        self._near_falls = 0
        self._near_last = 0
        self._near_pre = b""
        self._fds = None    # descriptors received while near.map is read
        self._greeted = False
        with self._io:
            self._connect()

    # --- plumbing ----------------------------------------------------------

    def close(self):
        if self._closed:
            return
        if self._near_hits or self._near_falls:
            with contextlib.suppress(LeasedError, OSError):
                self._near_report(False)
        self._closed = True
        seg, self._near = self._near, None
        if seg is not None:
            seg.close()
        watcher = self._watcher
        self._stop_watcher()
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(5)
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()

    def _connect(self):
        """Open the connection (with the socket lock held): at the start,
        and again at the first call after the previous one failed (a new
        session then). Says hello when asked to."""
        self.sock = _open(self.target, self.timeout)
        # Blocking mode with SO_RCVTIMEO/SO_SNDTIMEO as the timeout: with
        # settimeout() Python polls before every send and recv, two system
        # calls per request that the kernel's own timeouts make needless.
        self._set_timeout(self.timeout)
        self._sndtimeo(self.timeout)
        # A new session: its namespace's segment is asked for anew.
        self._greeted = False
        self._near_off = False
        self._near_retry = 0.0
        seg, self._near = self._near, None
        if seg is not None:
            seg.close()
        if not self._hello:
            return
        self._greet()

    def _greet(self):
        """hello (with the socket lock held)."""
        fields = dict(self._hello, op="hello", id=next(self._ids))
        hello = self._exchange(fields["id"], _encode(fields).encode() + b"\n",
                               0, None)
        if not hello.get("ok"):
            self._drop()
            _raise_for(hello)
        self.session = hello.get("session")
        self.features = hello.get("features", [])
        self._greeted = True

    def _drop(self):
        """The connection failed (with the socket lock held): close it.
        Its session's locks went with it (their held.lost is set); the
        next call opens a new connection."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        self._stop_watcher()
        with contextlib.suppress(OSError):
            sock.close()
        self._tail = b""
        self._lines = []
        self._late.clear()
        self.session = None
        self._holds.gone(self)

    def _idle_check(self):
        """Drop the connection when the daemon closed it while it was idle
        (a restart, say), so that the next call opens a new one instead of
        failing: what redis-py's pool does with the connections it hands
        out. Events that came meanwhile (the daemon's "shutdown" before it
        closes) are taken as the watcher takes them."""
        sock = self.sock
        if sock is None:
            return
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return      # the usual case: nothing came, nothing to do
        except OSError:
            pass
        with self._io:
            while self.sock is sock:
                try:
                    chunk = sock.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                except OSError:
                    chunk = b""
                if not chunk:
                    self._drop()
                    return
                self._take_events(chunk)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _set_timeout(self, seconds):
        """The receive timeout; None waits without limit."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                             _timeval(seconds))

    def _sndtimeo(self, seconds):
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                             _timeval(seconds))

    def _event(self, msg):
        self.events.append(msg)
        if msg.get("event") in ("lock_lost", "sem_lost"):
            self._holds.lost(msg)
        elif msg.get("event") in _RISK_EVENTS:
            self._holds.risk(msg)
        if self.on_event is not None:
            self.on_event(msg)

    def _fill(self, chunk):
        # Complete lines go to _lines; the partial last one waits in
        # _tail, a bytearray that grows in place while a long line comes
        # in many chunks. One split per chunk that ends lines, however
        # many lines it carries.
        if chunk.find(b"\n") < 0:
            if not isinstance(self._tail, bytearray):
                self._tail = bytearray(self._tail)
            self._tail += chunk
            return
        if self._tail:
            self._tail += chunk
            chunk = bytes(self._tail)
        parts = chunk.split(b"\n")
        self._tail = parts.pop()
        self._lines.extend(parts)

    def _read_msg(self, deadline):
        while not self._lines:
            try:
                if self._fds is None:
                    chunk = self.sock.recv(65536)
                else:
                    chunk = _recv_fds(self.sock, self._fds)
            except BlockingIOError:
                # SO_RCVTIMEO ran out.
                raise LeasedTimeout("timeout", "no reply from leased at %s "
                                    "in time" % self.target) from None
            if not chunk:
                raise LeasedConnectionError(
                    "io", "leased at %s closed the connection" % self.target)
            if chunk[0] == 123 and not self._tail and \
                    chunk.find(b"\n") == len(chunk) - 1:
                # The usual reply: one whole line ({...}\n) in one chunk,
                # nothing buffered before it; decoded without splitting.
                return _decode(chunk)
            self._fill(chunk)
            if not self._lines and deadline is not None and \
                    time.monotonic() >= deadline:
                raise LeasedTimeout("timeout", "no reply from leased at %s "
                                    "in time" % self.target)
        line = self._lines.pop(0)
        return _decode(line) if line.strip() else None

    def call(self, op, _on_late=None, **fields):
        """Send one request and return its reply; raise LeasedError on
        {"ok":false}. A request that asks the daemon to wait (wait_ms) gets
        that much longer than the timeout; -1 waits without limit. When
        the reply does not come in time, _ON_LATE(reply) is called if it
        comes later (so a late grant can be given back)."""
        wait_ms = fields.get("wait_ms")
        if wait_ms is None:
            # cache.get waits cache.wait_ms (3 s by default) unless told.
            wait_ms = 3000 if op.startswith("cache.") else 0
        rid = next(self._ids)
        fields["op"] = op
        fields["id"] = rid
        line = _encode(fields).encode() + b"\n"
        return self._request(rid, line, wait_ms, _on_late)

    def _key_call(self, op, key, _on_late=None, token=None, owner=None):
        """call() of the hot shapes {"op":OP,"key":KEY} and, with TOKEN
        or OWNER, {"op":OP,"key":KEY,"token":TOKEN} or "owner", from a
        template."""
        rid = next(self._ids)
        line = _key_line(op, rid, key, token, owner)
        return self._request(rid, line, 0, _on_late)

    def _request(self, rid, line, wait_ms, _on_late):
        with self._io:
            if self._closed:
                raise LeasedConnectionError(
                    "io", "the connection to leased at %s was closed"
                    % self.target)
            if self.sock is None:
                self._connect()
            if self._near_pre:
                # What the segment served goes out with this request.
                line = self._near_pre + line
                self._near_pre = b""
            reply = self._exchange(rid, line, wait_ms, _on_late)
        if not reply.get("ok"):
            _raise_for(reply)
        return reply

    def _exchange(self, rid, line, wait_ms, _on_late):
        """Send LINE and read up to its reply (with the socket lock held).
        A connection that fails is dropped: the error is a
        LeasedConnectionError, the next call opens a new connection."""
        if wait_ms:
            self._set_timeout(None if wait_ms < 0 else
                              self.timeout + wait_ms / 1000.0)
        try:
            self._send(line)
            return self._read_reply(rid, wait_ms, _on_late)
        except LeasedTimeout:
            raise
        except LeasedConnectionError:
            self._drop()
            raise
        except OSError as e:
            self._drop()
            raise LeasedConnectionError(
                "io", "the connection to leased at %s failed: %s; its "
                "session and the session's locks are gone"
                % (self.target, e.strerror or e)) from e
        finally:
            if wait_ms and self.sock is not None:
                self._set_timeout(self.timeout)

    def _send(self, line):
        try:
            self.sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            # The daemon closed the connection while it was idle (it
            # restarted, say): no session read LINE, so it goes out on a
            # new connection instead of failing the call.
            self._drop()
            self._connect()
            self.sock.sendall(line)

    def _read_reply(self, rid, wait_ms, _on_late):
        deadline = None if wait_ms < 0 else \
            time.monotonic() + self.timeout + wait_ms / 1000.0
        late = False
        while True:
            try:
                if late and not self._lines and \
                        time.monotonic() >= deadline:
                    # Events kept coming, the reply did not.
                    raise LeasedTimeout("timeout", "no reply from leased at "
                                        "%s in time" % self.target)
                msg = self._read_msg(deadline)
            except LeasedTimeout:
                if _on_late is not None:
                    self._late[rid] = _on_late
                    if "cancel" in self.features:
                        # Its wait ends now; a grant that won the race
                        # still reaches _ON_LATE.
                        self._post("cancel", target=rid)
                raise
            if msg is None:
                continue
            mid = msg.get("id")
            if mid == rid:
                return msg
            if mid is None and "event" in msg:
                self._event(msg)
            elif mid in self._late:
                self._late.pop(mid)(msg)
            elif mid is None:
                # A reply without an id answers a line the daemon could
                # not read; with one request at a time that is ours.
                # Other ids are late replies to requests that timed out.
                return msg
            late = deadline is not None

    def _post(self, op, **fields):
        """Send a request whose reply nobody reads (a cleanup, from a
        reader that holds the socket lock)."""
        fields["op"] = op
        fields["id"] = next(self._ids)
        with contextlib.suppress(OSError):
            self.sock.sendall(_encode(fields).encode() + b"\n")

    def _start_watcher(self):
        with self._io:
            if self._watcher is not None or self._closed or \
                    self.sock is None:
                return
            wake, self._wake = socket.socketpair()
            self._watcher = threading.Thread(target=self._watch,
                                             args=(self.sock, wake),
                                             daemon=True,
                                             name="leased-watcher")
            self._watcher.start()

    def _stop_watcher(self):
        """Wake the watcher so that it ends; it closes its own end."""
        wake, self._wake = self._wake, None
        self._watcher = None
        if wake is not None:
            with contextlib.suppress(OSError):
                wake.send(b"x")
            wake.close()

    def _watch(self, sock, wake):
        try:
            self._watch_loop(sock, wake)
        finally:
            wake.close()

    def _watch_loop(self, sock, wake):
        """Read events while no call is in progress (see the module's
        docstring). Woken by readable data; a reply a call is reading
        meanwhile is left to it: after taking the socket lock the watcher
        reads only what is still unread."""
        while True:
            try:
                r, _, _ = select.select([sock, wake], [], [])
            except (OSError, ValueError):
                return
            if wake in r:
                return
            with self._io:
                if self._closed or self.sock is not sock:
                    return
                try:
                    r, _, _ = select.select([sock], [], [], 0)
                    if not r:
                        continue
                    chunk = sock.recv(65536)
                except (OSError, ValueError):
                    chunk = b""
                if not chunk:
                    # The daemon ended the session (a stop, a restart, a
                    # limit): the holds are gone with it, and the next
                    # call opens a new connection.
                    self._drop()
                    return
                self._take_events(chunk)

    def _take_events(self, chunk):
        """CHUNK read while no call was in progress (with the socket lock
        held): only events can be in it, and late replies, since calls
        read up to their own reply."""
        self._fill(chunk)
        while self._lines:
            line = self._lines.pop(0)
            if not line.strip():
                continue
            msg = _decode(line)
            mid = msg.get("id")
            if mid is None and "event" in msg:
                self._event(msg)
            elif mid in self._late:
                self._late.pop(mid)(msg)

    # --- locks ---------------------------------------------------------------

    def _owner(self, owner):
        """OWNER, or the calling thread's when it is None: the session's
        default "" for the first thread that locks here, an owner of its
        own for any other. A Leased is one thread's, but nothing stops two
        threads from sharing one, and as one owner they would reenter each
        other's holds; so they exclude each other. A thread that ends takes
        its owner along (a new thread never inherits it, even with the
        same ident). A Pool's connections keep "" (see _pooled)."""
        if owner is not None or self._pooled:
            return owner
        try:
            return self._threads.owner
        except AttributeError:
            n = next(self._thread_n)
            self._threads.owner = None if n == 0 else "py-thread-%d" % n
            return self._threads.owner

    def try_lock(self, key, wait_ms=0, ttl_ms=None, owner=None, **extra):
        """The lock reply: {"acquired":true,"token":..,"fence":..} or
        {"acquired":false,"ttl_ms":..}. EXTRA goes into the request as
        it is (e.g. detach=True, token=...). A lock granted after the
        call timed out is unlocked when its reply is read. Without OWNER
        the thread's (see _owner): a thread reenters its own holds."""
        owner = self._owner(owner)
        if (not wait_ms and ttl_ms is None and not extra
                and isinstance(key, str)
                and (owner is None or isinstance(owner, str))):
            return self._key_call(b"lock", key,
                                  functools.partial(self._late_unlock, key,
                                                    {}), owner=owner)
        return self.call("lock",
                         _on_late=functools.partial(self._late_unlock, key,
                                                    _mode(extra)),
                         **_lock_fields(key, wait_ms, ttl_ms, owner, extra))

    def _late_unlock(self, key, mode, reply):
        if reply.get("acquired"):
            self._post("unlock", token=reply["token"], **_key_fields(key),
                       **mode)

    def unlock(self, key, owner=None, token=None, request_id=None,
               **extra):
        """REQUEST_ID (1 to 64 printable ASCII characters, e.g.
        uuid.uuid4().hex) makes the call safe to repeat: sent again with
        the same token (or owner) and id after a lost answer (a
        connection error, or redis_unavailable with outcome unknown), it
        gets the first answer and releases no second hold."""
        if request_id is not None:
            extra["request_id"] = request_id
        if token is None:
            owner = self._owner(owner)
        if not extra and isinstance(key, str) and (
                token is None and (owner is None or isinstance(owner, str))
                or owner is None and isinstance(token, str)):
            return self._key_call(b"unlock", key, token=token, owner=owner)
        fields = _key_fields(key)
        if owner is not None:
            fields["owner"] = owner
        if token is not None:
            fields["token"] = token
        fields.update(extra)
        return self.call("unlock", **fields)

    def extend(self, key, ttl_ms, owner=None, token=None, **extra):
        """EXTRA goes into the request (mode="read"|"write" for a side of
        a read-write lock)."""
        if token is None:
            owner = self._owner(owner)
        fields = dict(_key_fields(key), ttl_ms=ttl_ms)
        if owner is not None:
            fields["owner"] = owner
        if token is not None:
            fields["token"] = token
        fields.update(extra)
        return self.call("extend", **fields)

    @contextlib.contextmanager
    def lock(self, key, wait_ms=0, ttl_ms=None, owner=None, **extra):
        """Hold KEY for the with-block (renewed by the daemon while this
        session lives, unless ttl_ms is given) and yield a Held: held.lost
        is set when the daemon reports the lock lost, also while the
        application is idle inside the block. Raises LockNotAcquired."""
        reply = self.try_lock(key, wait_ms=wait_ms, ttl_ms=ttl_ms,
                              owner=owner, **extra)
        if not reply["acquired"]:
            raise LockNotAcquired(key, reply.get("ttl_ms"))
        held = Held(reply, key, owner, threading.Event())
        held._conn = self
        self._holds.add(held)
        self._start_watcher()
        try:
            yield held
        finally:
            try:
                _end_hold(held, functools.partial(
                    self.unlock, key, owner=owner, **_mode(extra)))
            finally:
                self._holds.remove(held)

    def rwlock(self, key):
        """The read and the write side of KEY (see RWLock)."""
        return RWLock(self, key)

    # --- semaphores ----------------------------------------------------------

    def try_semaphore(self, key, limit, permits=1, wait_ms=0, ttl_ms=None,
                      **extra):
        """The sem.acquire reply: {"acquired":true,"token":..,
        "available":..} or {"acquired":false,"available":..}. A grant that
        comes after the call timed out is released when it is read."""

        def late(reply):
            if reply.get("acquired"):
                self._post("sem.release", key=key, token=reply["token"])

        return self.call("sem.acquire", _on_late=late,
                         **_sem_fields(key, limit, permits, wait_ms, ttl_ms,
                                       extra))

    def sem_release(self, key, token):
        return self.call("sem.release", key=_one_key(key), token=token)

    def sem_info(self, key, limit):
        return self.call("sem.info", key=_one_key(key), limit=limit)

    def rate_acquire(self, key, rate, per_ms, burst=None, permits=1,
                     wait_ms=0, **extra):
        """rate.acquire: {"acquired":bool,"retry_after_ms":ms}. BURST
        None is the daemon's default (the rate); with WAIT_MS the daemon
        waits until the permits are free, up to that long."""
        return self.call("rate.acquire",
                         **_rate_fields(key, rate, per_ms, burst, permits,
                                        wait_ms, extra))

    @contextlib.contextmanager
    def semaphore(self, key, limit, permits=1, wait_ms=0, ttl_ms=None,
                  **extra):
        """Hold PERMITS of the LIMIT permits of KEY for the with-block
        (renewed while this session lives, unless ttl_ms is given) and
        yield a Held (the grant: .token; .lost is set on sem_lost, also
        while the application is idle in the block). Raises NoPermit."""
        reply = self.try_semaphore(key, limit, permits, wait_ms, ttl_ms,
                                   **extra)
        if not reply["acquired"]:
            raise NoPermit(key, reply.get("available"))
        held = Held(reply, key, None, threading.Event())
        held._conn = self
        self._holds.add(held)
        self._start_watcher()
        try:
            yield held
        finally:
            try:
                # Lost or its lease ran out: nothing left to give back.
                _end_hold(held, functools.partial(
                    self.sem_release, key, reply["token"]), any_not_held=True)
            finally:
                self._holds.remove(held)

    # --- cache-aside ---------------------------------------------------------

    def cached(self, key, loader, ttl_ms=None, wait_ms=None, bloom=None):
        """The read path: the cached value, or LOADER() loaded once
        cluster-wide and filled. WAIT_MS (cache.wait_ms, 3000, when None)
        is how long to wait for a load that runs elsewhere; past it a
        LeasedTimeout (code "timeout") is raised and LOADER is not called,
        so a key is loaded once per fill lease, however slow the load.
        Values go through the serializer (JSON by default): what is
        returned is LOADER's value read back, as every reader that hits
        gets it. A loader returning None caches "not found". A loader
        that raises, or a value that cannot be filled, gives the fill
        lease back (and raises), and so does a get that timed out when
        its lease comes later. BLOOM names a Bloom filter (hello's
        feature "bloom"): a key it rules out is "not found" (None) at once,
        LOADER not called."""

        if not self._near_off:
            text = self._near_get(key)
            if text is not _NEAR_MISS:
                return _value_of(self.serializer, key, text)

        def late(reply):
            if reply.get("lease"):
                self._post("cache.release", key=key, lease=reply["lease"])

        got = self.call("cache.get", _on_late=late,
                        **_get_fields(key, wait_ms, bloom))
        return _load_through(self.call, self.serializer, got, key, loader,
                             ttl_ms, wait_ms)

    def _near_get(self, key):
        """KEY's value text (None for a cached null) from the shared
        segment, or _NEAR_MISS: the daemon answers."""
        seg = self._near
        if seg is None:
            seg = self._near_map()
            if seg is None:
                return _NEAR_MISS
        if type(key) is not str:
            return _NEAR_MISS   # the socket path says what is wrong
        got = seg.text(key)
        if got is _NEAR_MISS or got is _NEAR_CLOSED:
            if got is _NEAR_CLOSED:
                # A reload replaced the segment: ask for the new one.
                self._near = None
                seg.close()
            self._near_falls += 1
            if self._near_falls + self._near_hits >= _NEAR_REPORT_EVERY or \
                    seg.now - self._near_last >= _NEAR_REPORT_NS:
                self._near_report(True)
            return _NEAR_MISS
        self._near_hits += 1
        if self._near_hits + self._near_falls >= _NEAR_REPORT_EVERY or \
                seg.now - self._near_last >= _NEAR_REPORT_NS:
            self._near_report(False)
        return got

    def _near_report(self, with_next):
        """near.hits: what the segment served and what went to the
        socket since the last report; WITH_NEXT puts it in front of the
        next request (a socket call follows), else it goes out now. Its
        answer is read and dropped as a late reply is."""
        line = b'{"op":"near.hits","id":%d,"hits":%d,"fallbacks":%d}\n' % (
            next(self._ids), self._near_hits, self._near_falls)
        self._near_hits = self._near_falls = 0
        self._near_last = _monotonic_ns()
        if with_next:
            self._near_pre += line
            return
        with self._io:
            if self.sock is None or self._closed:
                return
            try:
                self.sock.sendall(self._near_pre + line)
                self._near_pre = b""
            except OSError:
                self._drop()

    def _near_map(self):
        """Map this session's segment (near.map); None when there is none
        (then the daemon answers every read)."""
        if time.monotonic() < self._near_retry:
            return None
        if _split_target(self.target):
            self._near_off = True   # descriptors cross Unix sockets only
            return None
        fds = []
        try:
            with self._io:
                if self._closed:
                    return None
                if self.sock is None:
                    self._connect()     # (which forgets _near_retry)
                self._near_retry = time.monotonic() + _NEAR_RETRY_S
                if not self._greeted:
                    self._greet()
                if "shared_near" not in self.features:
                    self._near_off = True
                    return None
                rid = next(self._ids)
                self._fds = fds
                try:
                    reply = self._exchange(
                        rid, b'{"op":"near.map","id":%d}\n' % rid, 0, None)
                finally:
                    self._fds = None
            if not reply.get("ok") or reply.get("layout") != 1 or not fds:
                return None
            seg = NearSegment(fds[0])
        except (LeasedError, OSError, ValueError):
            return None
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._near = seg
        self._near_last = _monotonic_ns()
        return seg

    def invalidate(self, keys, delay_ms=None):
        """Delete KEYS (one key as a str, or a list or tuple of them) now
        and once more after delay_ms (the daemon's default double delete
        when None)."""
        return self.call("cache.invalidate",
                         **_invalidate_fields(keys, delay_ms))

    def update(self, keys, writer):
        """The write path: WRITER() commits to the database first, then
        the cached copies of KEYS (as for invalidate) are invalidated.
        Returns WRITER's result."""
        keys = _keys(keys)
        result = writer()
        self.invalidate(keys)
        return result

    def bloom_create(self, filter, capacity, error_rate, **extra):
        """bloom.create (hello's feature "bloom"): a filter for CAPACITY
        keys at ERROR_RATE false positives. Returns the reply ("created"
        false when it existed alike; "bits", "hashes", "bytes"); other
        parameters than the filter has raise bad_request."""
        return self.call("bloom.create",
                         **_bloom_create_fields(filter, capacity, error_rate,
                                                extra))

    def bloom_add(self, filter, keys, **extra):
        """Add KEYS (a str, or a list or tuple, at most 1000) to FILTER:
        a list of booleans, True where the key was surely not in it."""
        return self.call("bloom.add",
                         **_bloom_keys_fields(filter, keys, extra))["added"]

    def bloom_check(self, filter, keys, **extra):
        """A list of booleans for KEYS: False where the key was surely
        never added to FILTER."""
        return self.call("bloom.check",
                         **_bloom_keys_fields(filter, keys, extra))["maybe"]

    def warm(self, entries, ttl_ms=None):
        """Bulk warm-up (cache.mset; hello's feature "mset"): store ENTRIES
        (a dict {key: value}, or (key, value) and (key, value, ttl_ms)
        tuples; at most 1000) as cached() would have filled them, values
        through the serializer (None: "not found"), TTL_MS for those
        without their own (the daemon's default when None). Returns the
        reply: "stored" counts what was stored, "results" has one result
        per entry in order, {"ok": False, "error": {...}} for an entry
        that failed alone."""
        return self.call("cache.mset",
                         **_warm_fields(self.serializer, entries, ttl_ms))

    # --- versioned writes (hello's feature "versioned") -----------------

    def read(self, key, lease=False, wait_ms=None):
        """A cache.get that returns a Versioned: the value (through the
        serializer) with its version, for a later write() or fill() with
        if_version. LEASE true asks for the fill lease on a miss (and may
        wait, as cached() does)."""
        return _versioned(self.serializer, key,
                          self.call("cache.get",
                                    **_read_fields(key, lease, wait_ms)))

    def write(self, key, value, ttl_ms=None, if_version=None):
        """cache.set of VALUE (through the serializer; None: "not found").
        With IF_VERSION, only when the entry's version is that one (0:
        only when there is none): a compare-and-set. Returns a Written;
        stored False carries the current version, to read and retry."""
        return _written(self.call("cache.set",
                                  **_write_fields(self.serializer, key, value,
                                                  ttl_ms, if_version)))

    def fill(self, key, lease, value, ttl_ms=None, if_version=None):
        """cache.fill under LEASE (from read(key, lease=True)), with
        IF_VERSION as write() has it. Returns a Written."""
        return _written(self.call("cache.fill",
                                  **_write_fields(self.serializer, key, value,
                                                  ttl_ms, if_version,
                                                  lease=lease)))


def _key_line(op, rid, key, token, owner=None):
    if owner is not None:
        return b'{"op":"%s","id":%d,"key":%s,"owner":%s}\n' % (
            op, rid, _quote(key).encode(), _quote(owner).encode())
    if token is None:
        return b'{"op":"%s","id":%d,"key":%s}\n' % (op, rid,
                                                   _quote(key).encode())
    return b'{"op":"%s","id":%d,"key":%s,"token":%s}\n' % (
        op, rid, _quote(key).encode(), _quote(token).encode())


def _mode(extra):
    # unlock of a read-write lock names the same mode as its lock.
    return {"mode": extra["mode"]} if "mode" in extra else {}


class RWLock:
    """The two sides of the read-write lock KEY (leased-protocol(7), "Read-
    write locks") on a Leased, Pool or AsyncLeased: any number of readers
    hold it together, a writer excludes readers and writers.

        rw = ld.rwlock("doc:7")
        with rw.read_lock(wait_ms=1000) as held:     # shared
            ...
        with rw.write_lock(wait_ms=1000) as held:    # exclusive
            ...                                      # held.fence
        async with ard.rwlock("doc:7").read_lock():  # AsyncLeased
            ...

    Each takes the arguments of lock() and gives what lock() gives (a
    Held with .lost; LockNotAcquired when not granted in wait_ms); the
    unlock at the end of the block names the same mode. A writer may
    also take the read side of its key (downgrade). A plain lock and a
    read-write lock on one key are a "wrong_type" LeasedError."""

    def __init__(self, ld, key):
        self.ld = ld
        self.key = key

    def read_lock(self, wait_ms=0, ttl_ms=None, owner=None, **extra):
        return self.ld.lock(self.key, wait_ms, ttl_ms, owner, mode="read",
                            **extra)

    def write_lock(self, wait_ms=0, ttl_ms=None, owner=None, **extra):
        return self.ld.lock(self.key, wait_ms, ttl_ms, owner, mode="write",
                            **extra)


class Pool:
    """A thread-safe client: up to SIZE connections, each used by one
    thread at a time. A call borrows a connection for its duration; a
    lock() block keeps its connection for the whole block, and calls the
    same thread makes inside the block use that connection too, so
    reentry (same key, same owner) works and a thread never waits for a
    second connection while holding one.

    A held lock is bound to its connection's session; a connection that
    fails is closed (its locks go, their holders see held.lost) and
    replaced. Events go to on_event and to held.lost as with Leased.
    """

    def __init__(self, target=None, size=8, timeout=30.0, client=None,
                 auth=None, on_event=None, serializer=_JSON):
        self.target = _target(target)
        self.size = size
        self._kw = {"timeout": timeout, "client": client, "auth": auth,
                    "on_event": on_event, "serializer": serializer}
        # The idle connections, last in first out; list.pop and append
        # are atomic, so a call that finds one idle takes no lock. Only
        # a thread that has to wait for one uses the condition.
        self._idle = []
        self._made = 0
        self._waiting = 0
        self._cv = threading.Condition(threading.Lock())
        self._local = threading.local()
        self._holds = _Holds()
        self._anon = self._holds.anon = _Anon()
        self._closed = False
        self.timeout = timeout

    def _new(self):
        return Leased(self.target, _holds=self._holds, **self._kw)

    @contextlib.contextmanager
    def connection(self):
        """Borrow a connection (the thread's current one inside a lock()
        block)."""
        mine = getattr(self._local, "conn", None)
        if mine is not None:
            yield mine
            return
        conn = self._checkout()
        self._local.conn = conn
        broken = False
        try:
            yield conn
        except (OSError, ValueError):
            broken = True
            raise
        finally:
            self._local.conn = None
            self._checkin(conn, broken)

    def _checkout(self):
        if self._closed:
            raise LeasedConnectionError("io", "the pool is closed")
        try:
            conn = self._idle.pop()
        except IndexError:
            pass
        else:
            conn._idle_check()
            return conn
        deadline = time.monotonic() + self.timeout
        conn = None
        with self._cv:
            # Counted before looking, so a checkin that comes after the
            # look sees the count and notifies.
            self._waiting += 1
            try:
                while True:
                    if self._idle:
                        conn = self._idle.pop()
                        break
                    if self._made < self.size:
                        self._made += 1
                        break
                    if self._closed:
                        raise LeasedConnectionError("io", "the pool is closed")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise LeasedTimeout("timeout",
                                            "no free connection in the pool")
                    self._cv.wait(left)
            finally:
                self._waiting -= 1
        if conn is not None:
            conn._idle_check()
            return conn
        try:
            return self._new()
        except BaseException:
            self._forget()
            raise

    def _forget(self):
        with self._cv:
            self._made -= 1
            self._cv.notify()

    def _checkin(self, conn, broken):
        if broken or self._closed or conn._closed:
            conn.close()
            self._forget()
            return
        self._idle.append(conn)
        if self._waiting:
            with self._cv:
                self._cv.notify()

    def _use(self, method, *args, **kw):
        """METHOD of a borrowed connection (the thread's own inside a
        lock() block), called without the generator machinery of
        connection(): the per-call cost of the hot calls."""
        mine = getattr(self._local, "conn", None)
        if mine is not None:
            return method(mine, *args, **kw)
        conn = self._checkout()
        broken = False
        try:
            return method(conn, *args, **kw)
        except (OSError, ValueError):
            broken = True
            raise
        finally:
            self._checkin(conn, broken)

    def close(self):
        self._closed = True
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                break
        with self._cv:
            self._cv.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, op, **fields):
        return self._use(Leased.call, op, **fields)

    def rate_acquire(self, key, rate, per_ms, burst=None, permits=1,
                     wait_ms=0, **extra):
        return self._use(Leased.rate_acquire, key, rate, per_ms, burst,
                         permits, wait_ms, **extra)

    def try_lock(self, key, wait_ms=0, ttl_ms=None, owner=None, **extra):
        """A lock that outlives the call is bound to a connection that
        goes back to the pool, where other threads use its session:
        without an owner it gets one of its own (see _Anon), and unlock()
        or extend() naming neither owner nor token find it by its token
        (any connection). Inside a lock() block the thread's connection
        is its alone, and the call reenters as on a Leased."""
        anon = (getattr(self._local, "conn", None) is None
                and _Anon.wanted(owner, extra))
        if anon:
            owner = self._anon.owner()
        reply = self._use(Leased.try_lock, key, wait_ms, ttl_ms, owner,
                          **extra)
        if anon:
            self._anon.keep(key, extra, reply)
        return reply

    def unlock(self, key, owner=None, token=None, request_id=None,
               **extra):
        token = self._anon.token(key, owner, token, extra, True)
        return self._use(Leased.unlock, key, owner, token, request_id,
                         **extra)

    def extend(self, key, ttl_ms, owner=None, token=None, **extra):
        token = self._anon.token(key, owner, token, extra, False)
        return self._use(Leased.extend, key, ttl_ms, owner, token, **extra)

    @contextlib.contextmanager
    def lock(self, key, wait_ms=0, ttl_ms=None, owner=None, **extra):
        with self.connection() as c:
            with c.lock(key, wait_ms, ttl_ms, owner, **extra) as held:
                yield held

    @contextlib.contextmanager
    def semaphore(self, key, limit, permits=1, wait_ms=0, ttl_ms=None,
                  **extra):
        with self.connection() as c:
            with c.semaphore(key, limit, permits, wait_ms, ttl_ms,
                             **extra) as grant:
                yield grant

    def rwlock(self, key):
        """The read and the write side of KEY (see RWLock); each block
        keeps its connection as lock() does."""
        return RWLock(self, key)

    def cached(self, key, loader, ttl_ms=None, wait_ms=None, bloom=None):
        # One connection for the whole read path, LOADER included: the
        # waiters for KEY may hold every other connection inside cache.get
        # (up to wait_ms), so a lease holder that gave its connection back
        # could not send its fill, and the waiters would time out and each
        # load: no single flight in exactly the pool's busiest case.
        with self.connection() as c:
            return c.cached(key, loader, ttl_ms, wait_ms, bloom)

    def bloom_create(self, filter, capacity, error_rate, **extra):
        return self._use(Leased.bloom_create, filter, capacity, error_rate,
                         **extra)

    def bloom_add(self, filter, keys, **extra):
        return self._use(Leased.bloom_add, filter, keys, **extra)

    def bloom_check(self, filter, keys, **extra):
        return self._use(Leased.bloom_check, filter, keys, **extra)

    def invalidate(self, keys, delay_ms=None):
        with self.connection() as c:
            return c.invalidate(keys, delay_ms)

    def warm(self, entries, ttl_ms=None):
        with self.connection() as c:
            return c.warm(entries, ttl_ms)

    def read(self, key, lease=False, wait_ms=None):
        with self.connection() as c:
            return c.read(key, lease, wait_ms)

    def write(self, key, value, ttl_ms=None, if_version=None):
        with self.connection() as c:
            return c.write(key, value, ttl_ms, if_version)

    def fill(self, key, lease, value, ttl_ms=None, if_version=None):
        with self.connection() as c:
            return c.fill(key, lease, value, ttl_ms, if_version)

    def update(self, keys, writer):
        keys = _keys(keys)
        result = writer()
        self.invalidate(keys)
        return result


# --- asyncio -----------------------------------------------------------------

class AsyncLeased:
    """The asyncio client: one connection, requests pipelined and matched
    by id, a reader task that routes events (so held.lost, an
    asyncio.Event, is set while the application awaits something else).

        ld = await AsyncLeased.connect("/run/leased/leased.sock")
        async with ld.lock("order:42", wait_ms=5000) as held:
            ...
        value = await ld.cached("user:7", load_user)
        await ld.close()

    Cancelling a task that awaits lock() or cached(): when the daemon
    announces "cancel" in hello's features, a {"op":"cancel"} is sent for
    the waiting request. In any case a lock granted after its caller was
    cancelled is unlocked at once, and a fill lease granted so is given
    back, so a cancelled wait never leaks a lock or holds up other
    readers.
    """

    def __init__(self, reader, writer, timeout=30.0, serializer=_JSON):
        self.serializer = _serializer(serializer)
        self._reader = reader
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._out = []      # lines of this loop iteration, sent together
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending = {}
        self._holds = {}
        self._anon = _Anon()
        self._closed = False
        self.on_event = None
        self.events = []
        self.session = None
        self.features = []
        self.target = "the socket given"
        # Set by connect(), which can open the connection again.
        self._hello = None
        self._shut = False      # close() was called
        self._reopening = asyncio.Lock()
        self._nr = _NearReads()
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, target=None, timeout=30.0, client=None,
                      auth=None, serializer=_JSON):
        target = _target(target)
        r, w = await _open_async(target, timeout)
        self = cls(r, w, timeout, serializer)
        self.target = target
        self._hello = {}
        if client is not None:
            self._hello["client"] = client
        if auth is not None:
            self._hello["auth"] = auth
        try:
            await self._say_hello()
        except BaseException:
            await self.close()
            raise
        return self

    async def _say_hello(self):
        # Always: hello says which features (e.g. cancel) exist.
        hello = await self.call("hello", **self._hello)
        self.session = hello.get("session")
        self.features = hello.get("features", [])

    async def _reopen(self):
        """The connection ended without close() (the daemon restarted,
        say): open a new one, a new session, at the next call, as Leased
        does. Its session's holds were marked lost when it ended."""
        if self._shut or self._hello is None:
            raise self._closed_error()
        async with self._reopening:
            if not self._closed:
                return      # another task opened it meanwhile
            self._reader, self._writer = await _open_async(self.target,
                                                           self.timeout)
            self._out = []
            self._closed = False
            self._nr.reset()
            self._task = self._loop.create_task(self._read())
            await self._say_hello()

    async def close(self):
        self._shut = True
        nr = self._nr
        if nr.hits or nr.falls:
            self._fire("near.hits", **nr.take())
        nr.reset()
        nr.off = True
        if not self._closed:
            self._flush()
            self._closed = True
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _read(self):
        err = LeasedConnectionError("io", "leased at %s closed the connection"
                                    % self.target)
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                msg = _decode(line)
                mid = msg.get("id")
                if mid is None and "event" in msg:
                    self._event(msg)
                    continue
                if mid is None:
                    # Answers a line the daemon could not read: the
                    # oldest request still waiting.
                    mid = next(iter(self._pending), None)
                handler = self._pending.pop(mid, None)
                if handler is not None:
                    handler(msg)
        except asyncio.CancelledError:
            err = self._closed_error()
            raise
        except OSError as e:
            err = LeasedConnectionError(
                "io", "the connection to leased at %s failed: %s"
                % (self.target, e.strerror or e))
            err.__cause__ = e
        except Exception as e:  # noqa: BLE001 - handed to every waiter
            err = e
        finally:
            self._closed = True
            pending, self._pending = self._pending, {}
            for handler in pending.values():
                handler(err)
            # The session ended: its session-bound locks went with it.
            for lst in list(self._holds.values()):
                for held in lst:
                    _lose(held)

    def _closed_error(self):
        return LeasedConnectionError("io", "the connection to leased at %s "
                                     "was closed" % self.target)

    def _event(self, msg):
        self.events.append(msg)
        holds = list(self._holds.get((msg.get("key"), msg.get("token")),
                                     ()))
        if msg.get("event") == "lock_lost":
            self._anon.forget(msg.get("token"))
        if msg.get("event") in ("lock_lost", "sem_lost"):
            for held in holds:
                held.lost_event = msg
                held.lost.set()
        elif msg.get("event") in _RISK_EVENTS:
            for held in holds:
                held._risk(msg)
        if self.on_event is not None:
            self.on_event(msg)

    def _send(self, op, fields):
        rid = next(self._ids)
        fields["op"] = op
        fields["id"] = rid
        self._queue(_encode(fields).encode() + b"\n")
        return rid

    def _queue(self, line):
        # The requests that tasks make in one iteration of the loop (say,
        # all those woken by one read of replies) go out in one write,
        # one system call, at the start of the next.
        self._out.append(line)
        if len(self._out) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self):
        if not self._out:
            return
        out, self._out = self._out, []
        if not self._closed:
            self._writer.write(out[0] if len(out) == 1 else b"".join(out))

    async def call(self, op, _on_abandon=None, **fields):
        """One request; the reply, or LeasedError. Cancelling the awaiting
        task leaves the request to _ON_ABANDON(reply) when it is given,
        else to nobody."""
        if self._closed:
            await self._reopen()
        wait_ms = fields.get("wait_ms")
        if wait_ms is None:
            wait_ms = 3000 if op.startswith("cache.") else 0
        rid = next(self._ids)
        fields["op"] = op
        fields["id"] = rid
        return await self._request(rid, _encode(fields).encode() + b"\n",
                                   wait_ms, _on_abandon)

    async def _key_call(self, op, key, _on_abandon=None, token=None,
                        owner=None):
        """call() of the hot shapes, as Leased._key_call."""
        if self._closed:
            await self._reopen()
        rid = next(self._ids)
        line = _key_line(op, rid, key, token, owner)
        return await self._request(rid, line, 0, _on_abandon)

    async def _request(self, rid, line, wait_ms, _on_abandon):
        fut = self._loop.create_future()

        def done(msg):
            if not fut.done():
                fut.set_result(msg)

        self._queue(line)
        self._pending[rid] = done
        # A timer on the future itself: lighter than asyncio.wait_for,
        # which wraps every call in more futures and callbacks.
        timer = None if wait_ms < 0 else self._loop.call_later(
            self.timeout + wait_ms / 1000.0, done, _TIMED_OUT)
        try:
            msg = await fut
        except asyncio.CancelledError:
            self._abandon(rid, _on_abandon)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if msg is _TIMED_OUT:
            self._abandon(rid, _on_abandon)
            raise LeasedTimeout("timeout", "no reply from leased at %s in "
                                "time" % self.target)
        if isinstance(msg, BaseException):
            raise msg
        if not msg.get("ok"):
            _raise_for(msg)
        return msg

    def _abandon(self, rid, on_abandon):
        if rid not in self._pending:
            return
        if on_abandon is None:
            self._pending.pop(rid, None)
            return

        def late(msg):
            if isinstance(msg, dict) and msg.get("ok"):
                on_abandon(msg)

        self._pending[rid] = late
        if "cancel" in self.features and not self._closed:
            # The reply to the cancelled request still comes (acquired
            # false, or true when the grant won the race): late() sees it.
            cid = self._send("cancel", {"target": rid})
            self._pending[cid] = lambda msg: None

    def _fire(self, op, **fields):
        """A request whose reply nobody awaits (cleanup after a cancel)."""
        if self._closed:
            return
        rid = self._send(op, fields)
        self._pending[rid] = lambda msg: None

    # --- locks ---------------------------------------------------------------

    async def try_lock(self, key, wait_ms=0, ttl_ms=None, owner=None,
                       **extra):
        """The lock reply. Tasks share the session: without an owner the
        call gets one of its own (no reentry), and unlock() or extend()
        naming neither owner nor token find its hold by token."""
        anon = _Anon.wanted(owner, extra)
        if anon:
            owner = self._anon.owner()
        fields = _lock_fields(key, wait_ms, ttl_ms, owner, extra)
        mode = _mode(extra)

        def granted_too_late(reply):
            if reply.get("acquired"):
                self._fire("unlock", token=reply["token"], **_key_fields(key),
                           **mode)

        if isinstance(key, str) and (
                len(fields) == 1 or len(fields) == 2 and
                isinstance(fields.get("owner"), str)):
            reply = await self._key_call(b"lock", key, granted_too_late,
                                         owner=owner)
        else:
            reply = await self.call("lock", _on_abandon=granted_too_late,
                                    **fields)
        if anon:
            self._anon.keep(key, extra, reply)
        return reply

    async def unlock(self, key, owner=None, token=None, request_id=None,
                     **extra):
        """REQUEST_ID: as for Leased.unlock."""
        if request_id is not None:
            extra["request_id"] = request_id
        token = self._anon.token(key, owner, token, extra, True)
        fields = _key_fields(key)
        if owner is not None:
            fields["owner"] = owner
        if token is not None:
            fields["token"] = token
        fields.update(extra)
        if isinstance(key, str) and (
                len(fields) == 1 or len(fields) == 2 and
                isinstance(fields.get("token"), str)):
            reply = await self._key_call(b"unlock", key, token=token)
        else:
            reply = await self.call("unlock", **fields)
        if reply.get("released"):
            # The hold of an awaited lock() ends here, not in a block.
            keys = _norm_key(key)
            keys = keys if isinstance(keys, tuple) else (keys,)
            for k in [k for k in self._holds if k[0] in keys]:
                self._holds[k] = [h for h in self._holds[k]
                                  if h.owner != owner and h.token != token]
                if not self._holds[k]:
                    del self._holds[k]
        return reply

    async def extend(self, key, ttl_ms, owner=None, token=None, **extra):
        token = self._anon.token(key, owner, token, extra, False)
        fields = dict(_key_fields(key), ttl_ms=ttl_ms)
        if owner is not None:
            fields["owner"] = owner
        if token is not None:
            fields["token"] = token
        fields.update(extra)
        return await self.call("extend", **fields)

    def lock(self, key, wait_ms=0, ttl_ms=None, owner=None, **extra):
        """`async with ld.lock(...) as held:` holds KEY for the block;
        `held = await ld.lock(...)` takes it (unlock it yourself, with
        owner=held.owner or token=held.token). Without OWNER each call
        gets an owner of its own, so concurrent tasks exclude each other
        (and do not reenter). Raises LockNotAcquired."""
        return _AsyncLock(self, key, wait_ms, ttl_ms, owner, extra)

    alock = lock

    def rwlock(self, key):
        """The read and the write side of KEY (see RWLock):
        `async with ld.rwlock(k).read_lock(): ...`."""
        return RWLock(self, key)

    def _add_hold(self, held):
        for k in _hold_keys(held):
            self._holds.setdefault(k, []).append(held)
        if self._closed:
            # The connection ended right after the grant was read.
            held.lost_event = {"event": "lock_lost", "key": held.key,
                               "token": held.token,
                               "reason": "connection_closed"}
            held.lost.set()

    def _remove_hold(self, held):
        for k in _hold_keys(held):
            lst = self._holds.get(k)
            if lst and held in lst:
                lst.remove(held)
                if not lst:
                    del self._holds[k]

    # --- semaphores ----------------------------------------------------------

    async def try_semaphore(self, key, limit, permits=1, wait_ms=0,
                            ttl_ms=None, **extra):
        """As Leased.try_semaphore. Cancelling the awaiting task (also by
        asyncio.wait_for's timeout) sends cancel for the wait, and a grant
        that still comes is released."""

        def granted_too_late(reply):
            if reply.get("acquired"):
                self._fire("sem.release", key=key, token=reply["token"])

        return await self.call("sem.acquire", _on_abandon=granted_too_late,
                               **_sem_fields(key, limit, permits, wait_ms,
                                             ttl_ms, extra))

    async def sem_release(self, key, token):
        return await self.call("sem.release", key=_one_key(key), token=token)

    async def sem_info(self, key, limit):
        return await self.call("sem.info", key=_one_key(key), limit=limit)

    async def rate_acquire(self, key, rate, per_ms, burst=None, permits=1,
                           wait_ms=0, **extra):
        """As Leased.rate_acquire."""
        return await self.call("rate.acquire",
                               **_rate_fields(key, rate, per_ms, burst,
                                              permits, wait_ms, extra))

    def semaphore(self, key, limit, permits=1, wait_ms=0, ttl_ms=None,
                  **extra):
        """`async with ld.semaphore("pool", 4) as grant:` holds a permit
        for the block; `grant = await ld.semaphore(...)` takes it (release
        it with sem_release(key, grant["token"])). Raises NoPermit."""
        return _AsyncSem(self, key, limit, permits, wait_ms, ttl_ms, extra)

    # --- cache-aside ---------------------------------------------------------

    async def cached(self, key, loader, ttl_ms=None, wait_ms=None,
                     bloom=None):
        """As Leased.cached; LOADER may be a coroutine function. Values go
        through the serializer given to connect() (JSON by default)."""
        nr = self._nr
        if not nr.off:
            if nr.seg is None:
                self._near_map()
            elif type(key) is str:
                text = nr.lookup(key)
                if nr.due():
                    # Goes out with this iteration's other requests.
                    self._fire("near.hits", **nr.take())
                if text is not _NEAR_MISS:
                    return _value_of(self.serializer, key, text)

        def lease_too_late(reply):
            if reply.get("lease"):
                self._fire("cache.release", key=key, lease=reply["lease"])

        got = await self.call("cache.get", _on_abandon=lease_too_late,
                              **_get_fields(key, wait_ms, bloom))
        if got["hit"]:
            return _value_of(self.serializer, key, got["value"])
        lease = _lease_of(got, key, wait_ms)
        try:
            value = loader()
            if asyncio.iscoroutine(value) or isinstance(value,
                                                        asyncio.Future):
                value = await value
            text = _value_text(self.serializer, key, value)
            await self.call("cache.fill",
                            **_fill_fields(key, lease, text, ttl_ms))
        except BaseException:
            # The loader failed, or the fill: the next reader loads at
            # once instead of waiting the lease out.
            self._fire("cache.release", key=key, lease=lease)
            raise
        return _value_of(self.serializer, key, text)

    def _near_map(self):
        """Start mapping the session's segment in a thread (the reads go
        to the socket meanwhile), as Leased does at its first cached()."""
        nr = self._nr
        if not nr.may_map():
            return
        if self._hello is None or _split_target(self.target) or \
                "shared_near" not in self.features:
            nr.off = True
            return
        nr.mapping = True
        fut = self._loop.run_in_executor(None, _near_map_side, self.target,
                                         self._hello, self.timeout)

        def mapped(f):
            nr.mapping = False
            seg = None if f.cancelled() or f.exception() else f.result()
            if seg is not None and (nr.off or nr.seg is not None):
                seg.close()     # closed, or reopened, meanwhile
            elif seg is not None:
                nr.seg = seg
                nr.last = _monotonic_ns()

        fut.add_done_callback(mapped)

    async def invalidate(self, keys, delay_ms=None):
        return await self.call("cache.invalidate",
                               **_invalidate_fields(keys, delay_ms))

    async def bloom_create(self, filter, capacity, error_rate, **extra):
        """As Leased.bloom_create."""
        return await self.call("bloom.create",
                               **_bloom_create_fields(filter, capacity,
                                                      error_rate, extra))

    async def bloom_add(self, filter, keys, **extra):
        """As Leased.bloom_add."""
        r = await self.call("bloom.add",
                            **_bloom_keys_fields(filter, keys, extra))
        return r["added"]

    async def bloom_check(self, filter, keys, **extra):
        """As Leased.bloom_check."""
        r = await self.call("bloom.check",
                            **_bloom_keys_fields(filter, keys, extra))
        return r["maybe"]

    async def warm(self, entries, ttl_ms=None):
        """As Leased.warm."""
        return await self.call("cache.mset",
                               **_warm_fields(self.serializer, entries,
                                              ttl_ms))

    async def read(self, key, lease=False, wait_ms=None):
        """As Leased.read."""
        got = await self.call("cache.get",
                              **_read_fields(key, lease, wait_ms))
        return _versioned(self.serializer, key, got)

    async def write(self, key, value, ttl_ms=None, if_version=None):
        """As Leased.write."""
        return _written(await self.call(
            "cache.set", **_write_fields(self.serializer, key, value, ttl_ms,
                                         if_version)))

    async def fill(self, key, lease, value, ttl_ms=None, if_version=None):
        """As Leased.fill."""
        return _written(await self.call(
            "cache.fill", **_write_fields(self.serializer, key, value, ttl_ms,
                                          if_version, lease=lease)))

    async def update(self, keys, writer):
        keys = _keys(keys)
        result = writer()
        if asyncio.iscoroutine(result):
            result = await result
        await self.invalidate(keys)
        return result


async def _end_hold_async(held, release, any_not_held=False):
    """_end_hold for AsyncLeased: RELEASE is the awaitable that gives
    HELD back."""
    try:
        await release
    except LeasedConnectionError:
        _lose(held)
    except LeasedError as e:
        if e.code != "not_held" or not (any_not_held or held.lost.is_set()):
            raise


async def _open_async(target, timeout):
    """(reader, writer) of a connection to TARGET, or a
    LeasedConnectionError that names it."""
    hp = _split_target(target)
    # Values up to the daemon's request limit must fit in one line.
    limit = 64 << 20
    try:
        if hp:
            return await asyncio.wait_for(
                asyncio.open_connection(hp[0], hp[1], limit=limit), timeout)
        return await asyncio.wait_for(
            asyncio.open_unix_connection(target, limit=limit), timeout)
    except OSError as e:
        raise _connect_error(target, e) from e


_async_owners = itertools.count(1)
# What the timer of an AsyncLeased request hands its future.
_TIMED_OUT = object()


class _AsyncLock:
    def __init__(self, ld, key, wait_ms, ttl_ms, owner, extra):
        if owner is None:
            # Tasks share the connection, so the session; holds of one
            # session and owner are reentrant, so without an owner of its
            # own two tasks would hold the key at once.
            owner = "task-%d-%d" % (os.getpid(), next(_async_owners))
        self.ld = ld
        self.args = (key, wait_ms, ttl_ms, owner)
        self.extra = extra
        self.held = None

    async def _take(self):
        key, wait_ms, ttl_ms, owner = self.args
        reply = await self.ld.try_lock(key, wait_ms, ttl_ms, owner,
                                       **self.extra)
        if not reply["acquired"]:
            raise LockNotAcquired(key, reply.get("ttl_ms"))
        held = Held(reply, key, owner, asyncio.Event())
        self.ld._add_hold(held)
        return held

    def __await__(self):
        return self._take().__await__()

    async def __aenter__(self):
        self.held = await self._take()
        return self.held

    async def __aexit__(self, *exc):
        held, self.held = self.held, None
        try:
            await _end_hold_async(held, self.ld.unlock(
                held.key, owner=held.owner, **_mode(self.extra)))
        finally:
            self.ld._remove_hold(held)


class _AsyncSem:
    def __init__(self, ld, key, limit, permits, wait_ms, ttl_ms, extra):
        self.ld = ld
        self.args = (key, limit, permits, wait_ms, ttl_ms)
        self.extra = extra
        self.grant = None

    async def _take(self):
        key = self.args[0]
        reply = await self.ld.try_semaphore(*self.args, **self.extra)
        if not reply["acquired"]:
            raise NoPermit(key, reply.get("available"))
        held = Held(reply, key, None, asyncio.Event())
        self.ld._add_hold(held)
        return held

    def __await__(self):
        return self._take().__await__()

    async def __aenter__(self):
        self.grant = await self._take()
        return self.grant

    async def __aexit__(self, *exc):
        grant, self.grant = self.grant, None
        try:
            await _end_hold_async(grant, self.ld.sem_release(
                self.args[0], grant["token"]), any_not_held=True)
        finally:
            self.ld._remove_hold(grant)
