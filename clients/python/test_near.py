"""The shared near cache read from Python: the segment reader against
segments these tests write byte by byte (lib/leased/near_layout.h, a
writer of their own below), hostile segments, a writer racing the reader
in another process, and the connection's near.map and near.hits against a
peer that speaks the protocol.

    python3 test_near.py            # needs nothing else
    LEASED_BIN=... LEASED_TEST_REDIS=host:port python3 test_near.py
                                    # also against a real daemon
"""

import asyncio
import json
import mmap
import os
import random
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import leased  # noqa: E402
from leased import Leased, NearSegment  # noqa: E402

MISS = leased._NEAR_MISS
CLOSED = leased._NEAR_CLOSED
PAGE = 4096
# Long enough that no test depends on the machine's speed; the tests of
# staleness set the heartbeat back past it.
STALE_NS = 5 * 10**9
BUCKET = 168
WAY = 40


class Writer:
    """A writer of layout 1, as the header says it: buckets of four ways
    under a seqlock, records in a ring (bump allocation; the tests write
    little), a header with epoch, heartbeat and state."""

    def __init__(self, size=1 << 20, nbuckets=64, stale_ns=STALE_NS,
                 fd=None):
        self.fd = os.memfd_create("near-test") if fd is None else fd
        if fd is None:
            os.ftruncate(self.fd, size)
        self.size = size
        self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        # Seqs and the header's numbers are stored with one store of their
        # width, as the daemon's atomics do (a struct pack may store the
        # bytes one by one: a reader could see a seq that never was).
        self.mv32 = memoryview(self.mm).cast("I")
        self.mv64 = memoryview(self.mm).cast("Q")
        self.nbuckets = nbuckets
        self.buckets_off = PAGE
        self.ring_off = (PAGE + nbuckets * BUCKET + PAGE - 1) // PAGE * PAGE
        self.ring_bytes = size - self.ring_off
        self.cursor = 0
        if fd is None:
            self.mm[0:8] = b"LDNEAR01"
            struct.pack_into("<IIQIIQQQQ", self.mm, 8, 1, PAGE, size,
                             nbuckets, 4, self.buckets_off, self.ring_off,
                             self.ring_bytes, stale_ns)
            self.beat()
            self.state(1)

    def close(self):
        self.mv32.release()
        self.mv64.release()
        self.mm.close()
        os.close(self.fd)

    def u32(self, off, v):
        self.mv32[off >> 2] = v

    def u64(self, off, v):
        self.mv64[off >> 3] = v

    def beat(self, now=None):
        self.u64(72, time.monotonic_ns() if now is None else now)

    def state(self, v):
        self.u32(80, v)

    def epoch(self):
        return struct.unpack_from("<Q", self.mm, 64)[0]

    def flush(self):
        for b in range(self.nbuckets):
            boff = self.bucket(b)
            seq = struct.unpack_from("<I", self.mm, boff)[0]
            self.u32(boff, seq + 1)
            self.mm[boff + 8:boff + BUCKET] = bytes(BUCKET - 8)
            self.u32(boff, seq + 2)
        self.u64(64, self.epoch() + 1)

    def bucket(self, b):
        return self.buckets_off + b * BUCKET

    def way_of(self, key):
        """(bucket offset, way offset) for KEY: its way, else a free one."""
        h = zlib.crc32(key)
        boff = self.bucket(h & (self.nbuckets - 1))
        free = None
        for i in range(4):
            w = boff + 8 + i * WAY
            wh, wk = struct.unpack_from("<II", self.mm, w)
            if wk == len(key) and wh == h:
                return boff, w
            if wk == 0 and free is None:
                free = w
        return boff, free

    def put(self, key, value, ttl_ns=60 * 10**9, null=False, version=0,
            off=None):
        key = key.encode() if isinstance(key, str) else key
        value = b"" if null else value
        need = (16 + len(key) + len(value) + 7) // 8 * 8
        if off is None:
            if self.cursor + need > self.ring_bytes:
                self.cursor = 0
            off, self.cursor = self.cursor, self.cursor + need
        boff, w = self.way_of(key)
        seq = struct.unpack_from("<I", self.mm, boff)[0]
        self.u32(boff, seq + 1)
        rec = self.ring_off + off
        struct.pack_into("<IIII", self.mm, rec, len(key), len(value),
                         (boff - self.buckets_off) // BUCKET,
                         (w - boff - 8) // WAY)
        self.mm[rec + 16:rec + 16 + len(key)] = key
        self.mm[rec + 16 + len(key):rec + 16 + len(key) + len(value)] = value
        struct.pack_into("<IIIIQQQ", self.mm, w, zlib.crc32(key), len(key),
                         len(value), 1 if null else 0, off,
                         time.monotonic_ns() + ttl_ns, version)
        self.u32(boff, seq + 2)
        return boff, w

    def delete(self, key):
        key = key.encode()
        boff, w = self.way_of(key)
        seq = struct.unpack_from("<I", self.mm, boff)[0]
        self.u32(boff, seq + 1)
        self.mm[w:w + WAY] = bytes(WAY)
        self.u32(boff, seq + 2)

    def reader(self):
        return NearSegment(self.fd)


class Reads(unittest.TestCase):
    def setUp(self):
        self.w = Writer()
        self.seg = self.w.reader()

    def tearDown(self):
        self.seg.close()
        self.w.close()

    def test_hit_null_and_miss(self):
        self.w.put("user:7", b'"Ada"')
        self.w.put("gone", b"", null=True)
        self.assertEqual(self.seg.get(b"user:7"), b'"Ada"')
        self.assertIsNone(self.seg.get(b"gone"))
        self.assertIs(self.seg.get(b"user:8"), MISS)
        self.w.delete("user:7")
        self.assertIs(self.seg.get(b"user:7"), MISS)

    def test_value_replaced_is_read_new(self):
        self.w.put("k", b"one")
        self.assertEqual(self.seg.get(b"k"), b"one")
        self.w.put("k", b"two, longer")
        self.assertEqual(self.seg.get(b"k"), b"two, longer")

    def test_expired_entry_is_a_miss(self):
        self.w.put("k", b"v", ttl_ns=-1)
        self.assertIs(self.seg.get(b"k"), MISS)

    def test_an_entry_without_expiry_is_a_hit(self):
        _, w = self.w.put("k", b"v")
        self.w.u64(w + 24, 2**64 - 1)
        self.assertEqual(self.seg.get(b"k"), b"v")

    def test_stale_or_future_heartbeat_is_a_miss(self):
        self.w.put("k", b"v")
        self.w.beat(time.monotonic_ns() - STALE_NS - 10**6)
        self.assertIs(self.seg.get(b"k"), MISS)
        self.w.beat(time.monotonic_ns() + STALE_NS + 10**9)
        self.assertIs(self.seg.get(b"k"), MISS)
        self.w.beat()
        self.assertEqual(self.seg.get(b"k"), b"v")

    def test_closed_segment(self):
        self.w.put("k", b"v")
        self.w.state(0)
        self.assertIs(self.seg.get(b"k"), CLOSED)

    def test_flush_moves_the_epoch_and_empties(self):
        self.w.put("k", b"v")
        self.w.flush()
        self.assertIs(self.seg.get(b"k"), MISS)

    def test_seq_stuck_odd_is_a_miss_in_bounded_time(self):
        boff, _ = self.w.put("k", b"v")
        seq = struct.unpack_from("<I", self.w.mm, boff)[0]
        self.w.u32(boff, seq + 1)
        start = time.monotonic()
        self.assertIs(self.seg.get(b"k"), MISS)
        # Bounded (a few tries), not waiting for the writer: seconds
        # only on a machine that does not run this process.
        self.assertLess(time.monotonic() - start, 5)

    def test_same_hash_and_length_other_key_is_a_miss(self):
        # A way that claims the key's hash and length but holds other
        # bytes (a collision, or a torn copy) is not the key.
        _, w = self.w.put("ab", b"v")
        struct.pack_into("<I", self.w.mm, w, zlib.crc32(b"cd"))
        self.assertIs(self.seg.get(b"cd"), MISS)

    def test_bad_way_fields(self):
        """Offsets past the ring, huge lengths, misaligned offsets and
        records that disagree with their way: each a miss."""
        cases = [
            (16, struct.pack("<Q", self.w.ring_bytes)),     # off at end
            (16, struct.pack("<Q", 2**64 - 8)),            # off huge
            (16, struct.pack("<Q", 4)),                    # misaligned
            (8, struct.pack("<I", 2**32 - 1)),             # vlen huge
            (8, struct.pack("<I", 3)),                     # vlen != rec's
        ]
        for at, raw in cases:
            with self.subTest(at=at, raw=raw):
                _, w = self.w.put("k", b"value", off=0)
                self.assertEqual(self.seg.get(b"k"), b"value")
                boff = w - (w - self.w.buckets_off) % BUCKET
                seq = struct.unpack_from("<I", self.w.mm, boff)[0]
                self.w.mm[w + at:w + at + len(raw)] = raw
                self.w.u32(boff, seq + 2)
                self.assertIs(self.seg.get(b"k"), MISS)
                self.w.delete("k")

    def test_text_answers_a_key_read_again_only_while_it_stands(self):
        """text() keeps what a full lookup copied; every way the segment
        can say the copy is gone is heard: a new value, a delete, a
        flush, an old heartbeat, the deadline, a closed segment."""
        seg = self.seg
        self.w.put("k", b"one")
        self.assertEqual(seg.text("k"), "one")
        self.assertEqual(seg.text("k"), "one")     # the kept copy
        self.w.put("k", b"two")
        self.assertEqual(seg.text("k"), "two")
        self.w.put("other in the bucket? no matter", b"x")
        self.w.delete("k")
        self.assertIs(seg.text("k"), MISS)
        self.w.put("k", b"three")
        self.assertEqual(seg.text("k"), "three")
        self.w.flush()
        self.assertIs(seg.text("k"), MISS)
        self.w.put("k", b"four")
        self.assertEqual(seg.text("k"), "four")
        self.w.beat(time.monotonic_ns() - STALE_NS - 10**6)
        self.assertIs(seg.text("k"), MISS)
        self.w.beat()
        self.assertEqual(seg.text("k"), "four")
        self.w.state(0)
        self.assertIs(seg.text("k"), CLOSED)
        self.w.state(1)
        self.w.put("null", b"", null=True)
        self.assertIsNone(seg.text("null"))
        self.assertIsNone(seg.text("null"))
        # The deadline: a copy is not kept past the entry's own.
        self.w.put("short", b"v", ttl_ns=10**9)
        deadline = time.monotonic_ns() + 10**9
        self.assertEqual(seg.text("short"), "v")
        self.assertTrue(wait_for(lambda: seg.text("short") is MISS, 10))
        self.assertGreaterEqual(time.monotonic_ns(), deadline - 10**6)

    def test_text_of_bytes_that_are_no_utf8_is_a_miss(self):
        self.w.put("k", b"\xff\xfe")
        self.assertEqual(self.seg.get(b"k"), b"\xff\xfe")
        self.assertIs(self.seg.text("k"), MISS)

    def test_a_released_segment_is_a_miss(self):
        self.w.put("k", b"v")
        self.assertEqual(self.seg.text("k"), "v")
        self.seg.close()
        self.assertIs(self.seg.get(b"k"), MISS)
        self.assertIs(self.seg.text("k"), MISS)


def memfd_of(data, size=None):
    fd = os.memfd_create("near-hostile")
    os.write(fd, data)
    if size is not None:
        os.ftruncate(fd, size)
    return fd


class Hostile(unittest.TestCase):
    """Whatever the bytes, NearSegment either refuses the segment
    (ValueError) or answers get() with bytes, None or a miss: no other
    exception, no crash, no read past the mapping."""

    def probe(self, fd, keys):
        try:
            seg = NearSegment(fd)
        except ValueError:
            return 0
        try:
            n = 0
            for k in keys:
                got = seg.get(k)
                self.assertTrue(got is MISS or got is CLOSED or got is None
                                or isinstance(got, bytes))
                n += got is not MISS and got is not CLOSED
            return n
        finally:
            seg.close()

    def test_random_bytes(self):
        rnd = random.Random(33)
        for _ in range(200):
            fd = memfd_of(rnd.randbytes(rnd.choice([0, 100, 256, 4096,
                                                     65536])))
            try:
                self.probe(fd, [rnd.randbytes(rnd.randrange(1, 20))
                                for _ in range(50)])
            finally:
                os.close(fd)

    def test_a_good_header_over_random_buckets_and_ring(self):
        """The header passes every check; the buckets and ring are noise,
        heartbeat fresh: every way is followed as far as its checks let
        it go. Keys are the ones the noise may name (their hashes
        match), so the record checks run too."""
        rnd = random.Random(7)
        for round_ in range(30):
            w = Writer(size=1 << 16, nbuckets=16)
            try:
                w.mm[PAGE:] = rnd.randbytes(w.size - PAGE)
                # Some ways with a real key's hash and length, pointing
                # anywhere: past the ring, into noise, at a good record.
                keys = []
                for b in range(16):
                    k = b"key-%d-%d" % (round_, b)
                    keys.append(k)
                    boff, way = w.way_of(k)
                    way = way or boff + 8
                    struct.pack_into("<II", w.mm, way, zlib.crc32(k), len(k))
                    struct.pack_into("<Q", w.mm, way + 24,
                                     time.monotonic_ns() + 10**10)
                    if rnd.random() < 0.5:
                        struct.pack_into("<I", w.mm, boff, 0)
                w.beat()
                fd = os.dup(w.fd)
                try:
                    self.probe(fd, keys)
                finally:
                    os.close(fd)
            finally:
                w.close()

    def test_headers_that_name_space_past_the_file(self):
        w = Writer(size=1 << 16)
        try:
            good = bytes(w.mm[:256])
        finally:
            w.close()
        bad = {
            "total past the file": (16, "<Q", 1 << 20),
            "buckets past the end": (32, "<Q", (1 << 16) - 100),
            # The seqs are read with aligned loads.
            "buckets not 8-aligned": (32, "<Q", 4096 + 4),
            "ring past the end": (48, "<Q", 1 << 17),
            "ring offset huge": (40, "<Q", 2**64 - 8),
            "nbuckets not a power of two": (24, "<I", 48),
            "nbuckets zero": (24, "<I", 0),
            "nbuckets huge": (24, "<I", 1 << 31),
            "header_bytes past the file": (12, "<I", 1 << 30),
            "layout 2": (8, "<I", 2),
            "ways 8": (28, "<I", 8),
            "no staleness bound": (56, "<Q", 0),
        }
        for name, (at, fmt, v) in bad.items():
            with self.subTest(name):
                hdr = bytearray(good)
                struct.pack_into(fmt, hdr, at, v)
                fd = memfd_of(bytes(hdr), 1 << 16)
                try:
                    with self.assertRaises(ValueError):
                        NearSegment(fd).close()
                finally:
                    os.close(fd)
        # Truncated: the file is shorter than the segment it describes.
        fd = memfd_of(good, 8192)
        try:
            with self.assertRaises(ValueError):
                NearSegment(fd).close()
        finally:
            os.close(fd)


RACE_WRITER = r"""
import mmap, os, struct, sys, time
sys.path.insert(0, %(here)r)
from test_near import Writer
w = Writer(size=%(size)d, nbuckets=4, fd=int(sys.argv[1]))
w.cursor = 0
end = time.monotonic() + float(sys.argv[2])
n = 0
# The value of k is always one byte repeated, its length changing; every
# write reuses the same ring bytes, so a copy that raced a write is torn
# (two different bytes, or a length that does not match) unless the seq
# check throws it away.
while time.monotonic() < end:
    for c in b"abcdefgh":
        w.put(b"k", bytes([c]) * (50 + n %% 700), off=0)
        w.beat()
        n += 1
print(n)
"""


class Race(unittest.TestCase):
    def test_a_writer_racing_the_reader_never_yields_a_torn_value(self):
        """Another process rewrites one key in the same ring bytes as
        fast as it can, each write a single repeated byte; the reader
        must only ever see whole values."""
        size = 1 << 16
        w = Writer(size=size, nbuckets=4)
        w.put(b"k", b"a" * 50, off=0)
        seg = w.reader()
        script = RACE_WRITER % {"here": HERE, "size": size}
        proc = subprocess.Popen([sys.executable, "-c", script, str(w.fd),
                                 "2.0"], pass_fds=[w.fd],
                                stdout=subprocess.PIPE)
        hits = torn = misses = 0
        try:
            while proc.poll() is None:
                # The full lookup and text(), which keeps a copy between
                # reads of a bucket that did not move.
                for got in (seg.get(b"k"), seg.text("k")):
                    if got is MISS:
                        misses += 1
                        continue
                    hits += 1
                    if len(got) < 50 or got.count(got[:1]) != len(got):
                        torn += 1
            writes = int(proc.communicate()[0])
        finally:
            proc.wait()
            proc.stdout.close()
            seg.close()
            w.close()
        self.assertEqual(torn, 0, "%d torn of %d hits" % (torn, hits))
        self.assertGreater(writes, 1000)
        self.assertGreater(hits, 1000, "misses %d" % misses)


# --- the connection: near.map, lookups, near.hits ----------------------------

class Peer:
    """A Unix socket peer that speaks enough of the protocol: hello (with
    shared_near when asked), near.map (the descriptor of WRITER's segment
    with the reply's first byte), cache.get (always a hit of "socket"),
    near.hits (kept in .reports). Every request is kept in .ops."""

    def __init__(self, path, writer, feature=True, map_error=False):
        self.writer = writer
        self.feature = feature
        self.map_error = map_error
        self.ops = []
        self.reports = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def close(self):
        self.srv.close()

    def serve(self):
        try:
            while True:
                conn, _ = self.srv.accept()
                threading.Thread(target=self.session, args=(conn,),
                                 daemon=True).start()
        except OSError:
            return

    def session(self, conn):
        buf = b""
        with conn:
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self.answer(conn, json.loads(line))

    def answer(self, conn, req):
        op = req["op"]
        self.ops.append(op)
        out = {"id": req["id"], "ok": True}
        fds = []
        if op == "hello":
            out.update(session="s1", features=["cancel"] +
                       (["shared_near"] if self.feature else []))
        elif op == "near.map" and self.map_error:
            out = {"id": req["id"], "ok": False,
                   "error": {"code": "unsupported",
                             "message": "cache.near.shared_bytes is 0"}}
        elif op == "near.map":
            out.update(bytes=self.writer.size, layout=1, stale_ms=50)
            fds = [os.open("/proc/self/fd/%d" % self.writer.fd, os.O_RDONLY)]
        elif op == "cache.get":
            out.update(hit=True, value='"socket"')
        elif op == "near.hits":
            self.reports.append((req["hits"], req["fallbacks"]))
        data = json.dumps(out).encode() + b"\n"
        try:
            if fds:
                socket.send_fds(conn, [data[:1]], fds)
                conn.sendall(data[1:])
            else:
                conn.sendall(data)
        except OSError:
            pass    # the client went away (close() reports and leaves)
        finally:
            for fd in fds:
                os.close(fd)


def wait_for(cond, timeout=10):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Connection(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "near.sock")
        self.w = Writer()

    def tearDown(self):
        self.w.close()
        self.dir.cleanup()

    def peer(self, **kw):
        p = Peer(self.path, self.w, **kw)
        self.addCleanup(p.close)
        return p

    def test_hits_from_the_segment_misses_from_the_socket(self):
        p = self.peer()
        self.w.put("user:7", b'"Ada"')
        self.w.put("user:404", b"", null=True)
        with Leased(self.path, client="test_near") as ld:
            self.assertEqual(ld.cached("user:7", lambda: 1 / 0), "Ada")
            self.assertIsNone(ld.cached("user:404", lambda: 1 / 0))
            self.assertEqual(ld.cached("user:8", lambda: 1 / 0), "socket")
            self.assertEqual(p.ops, ["hello", "near.map", "cache.get"])

    def test_hits_are_reported(self):
        p = self.peer()
        self.w.put("k", b'"v"')
        with Leased(self.path, client="test_near") as ld:
            for _ in range(2500):
                self.assertEqual(ld.cached("k", lambda: 1 / 0), "v")
            ld.cached("other", lambda: 1 / 0)
            self.assertTrue(wait_for(lambda: sum(h for h, _ in p.reports)
                                     >= 2000), p.reports)
        # close() reports what was left.
        self.assertTrue(wait_for(lambda: sum(h for h, _ in p.reports)
                                 == 2500), p.reports)
        self.assertEqual(sum(f for _, f in p.reports), 1)
        self.assertEqual(p.ops.count("cache.get"), 1)

    def test_without_the_feature_nothing_is_mapped(self):
        p = self.peer(feature=False)
        self.w.put("k", b'"v"')
        with Leased(self.path, client="test_near") as ld:
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "socket")
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "socket")
        self.assertNotIn("near.map", p.ops)

    def test_a_refused_map_leaves_the_socket_path(self):
        p = self.peer(map_error=True)
        self.w.put("k", b'"v"')
        with Leased(self.path, client="test_near") as ld:
            for _ in range(3):
                self.assertEqual(ld.cached("k", lambda: 1 / 0), "socket")
        # Asked once, not on every read.
        self.assertEqual(p.ops.count("near.map"), 1)

    def test_a_segment_that_is_no_segment_leaves_the_socket_path(self):
        p = self.peer()
        self.w.put("k", b'"v"')
        self.w.mm[0:8] = b"NOTNEAR!"
        with Leased(self.path, client="test_near") as ld:
            for _ in range(3):
                self.assertEqual(ld.cached("k", lambda: 1 / 0), "socket")
            self.assertIsNone(ld._near)
        self.assertEqual(p.ops.count("near.map"), 1)

    def test_hello_is_said_first_when_the_connection_did_not(self):
        p = self.peer()
        self.w.put("k", b'"v"')
        with Leased(self.path) as ld:
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "v")
        self.assertEqual(p.ops[:2], ["hello", "near.map"])

    def test_a_closed_segment_is_mapped_again_at_most_once_a_second(self):
        p = self.peer()
        self.w.put("k", b'"v"')
        with Leased(self.path, client="test_near") as ld:
            start = time.monotonic()    # the first near.map comes later
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "v")
            self.w.state(0)
            # The old segment says closed: the socket answers, and
            # near.map is asked again once the second has passed.
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "socket")
            self.w.state(1)
            self.w.beat()
            got = "socket"
            while got == "socket" and time.monotonic() - start < 10:
                self.w.beat()
                got = ld.cached("k", lambda: 1 / 0)
            self.assertEqual(got, "v")
            self.assertGreaterEqual(time.monotonic() - start, 0.99)
            self.assertEqual(p.ops.count("near.map"), 2)

    def test_async_maps_in_a_thread_and_reads_the_segment(self):
        p = self.peer()
        self.w.put("k", b'"v"')
        self.w.put("none", b"", null=True)

        async def run():
            ld = await leased.AsyncLeased.connect(self.path, client="t")
            try:
                # The first read asks for the segment and is answered by
                # the socket meanwhile.
                self.assertEqual(await ld.cached("k", lambda: 1 / 0),
                                 "socket")
                deadline = time.monotonic() + 10
                while ld._nr.seg is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                gets = p.ops.count("cache.get")
                for _ in range(1500):
                    self.assertEqual(await ld.cached("k", lambda: 1 / 0),
                                     "v")
                self.assertIsNone(await ld.cached("none", lambda: 1 / 0))
                self.assertEqual(p.ops.count("cache.get"), gets)
            finally:
                await ld.close()

        asyncio.run(run())
        self.assertTrue(wait_for(lambda: sum(h for h, _ in p.reports)
                                 == 1501), p.reports)
        self.assertEqual(p.ops.count("near.map"), 1)

    def test_a_stale_heartbeat_sends_reads_to_the_socket(self):
        self.peer()
        self.w.put("k", b'"v"')
        with Leased(self.path, client="test_near") as ld:
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "v")
            self.w.beat(time.monotonic_ns() - STALE_NS - 10**6)
            self.assertEqual(ld.cached("k", lambda: 1 / 0), "socket")


# --- against a real daemon --------------------------------------------------

LEASED_BIN = os.environ.get("LEASED_BIN", "")
REDIS = os.environ.get("LEASED_TEST_REDIS", "")
STALE_MS = 50


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A leased of the test's own on LEASED_TEST_REDIS, near cache and
    shared segment on (shared_stale_ms 50), a TCP listener (whose
    sessions never map) and a metrics listener."""

    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "near.sock")
        self.tcp = "127.0.0.1:%d" % free_port()
        self.metrics = "127.0.0.1:%d" % free_port()
        self.tmp = tmp
        self.conf = conf = os.path.join(tmp, "near.yml")
        self.log = os.path.join(tmp, "near.log")
        self.configure(STALE_MS)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([LEASED_BIN, "-f", "-c", conf],
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.sock)
                break
            except OSError:
                if self.proc.poll() is not None or \
                        time.monotonic() > deadline:
                    with open(self.log) as f:
                        raise AssertionError("leased did not start: " +
                                             f.read())
                time.sleep(0.02)

    def configure(self, stale_ms):
        with open(self.conf, "w") as f:
            f.write('listen:\n  unix: "%s"\n  tcp: "%s"\n'
                    'metrics:\n  listen: "%s"\nredis:\n  address: "%s"\n'
                    'journal:\n  path: "%s"\nlog:\n  level: info\n'
                    'cache:\n  near: { enabled: true, shared_stale_ms: %d }\n'
                    % (self.sock, self.tcp, self.metrics, REDIS,
                       os.path.join(self.tmp, "journal"), stale_ms))

    def metric(self, name):
        with urllib.request.urlopen("http://%s/metrics" % self.metrics,
                                    timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@unittest.skipUnless(LEASED_BIN and REDIS,
                     "LEASED_BIN or LEASED_TEST_REDIS not set")
class RealDaemon(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.d = Daemon(self.dir.name)
        self.addCleanup(self.dir.cleanup)
        self.addCleanup(self.d.stop)
        self.ld = Leased(self.d.sock, client="test_near", serializer=None)
        self.addCleanup(self.ld.close)
        self.key = "near-py-%d-%s" % (os.getpid(), self._testMethodName)

    def near_has(self, key, value):
        """KEY read until the segment holds VALUE (the daemon keeps a key
        near once read); True when it does."""
        def there():
            got = self.ld.cached(key, None)
            seg = self.ld._near
            return got == value and seg is not None and \
                seg.get(key.encode()) == value.encode()
        return wait_for(there, 10)

    def test_a_hit_is_what_the_socket_answers(self):
        self.assertIn("shared_near", self.ld.features)
        with Leased(self.d.tcp, client="tcp", serializer=None) as tcp:
            for i, value in enumerate(["plain", "üñí \"quoted\"\n", ""]):
                key = "%s-%d" % (self.key, i)
                self.ld.call("cache.set", key=key, value=value)
                # near_has read it from the segment through the
                # connection, and found it there.
                self.assertTrue(self.near_has(key, value), value)
                got = tcp.call("cache.get", key=key)
                self.assertEqual(got["value"], value)
            self.assertIsNone(tcp._near)

    def test_after_a_set_the_old_value_is_never_read(self):
        writer = Leased(self.d.sock, client="writer", serializer=None)
        self.addCleanup(writer.close)
        writer.call("cache.set", key=self.key, value="v0")
        self.assertTrue(self.near_has(self.key, "v0"))
        served = 0
        for i in range(1, 300):
            want = "v%d" % i
            writer.call("cache.set", key=self.key, value=want)
            # Answered: from here on no reader may see v(i-1).
            for _ in range(3):
                served += self.ld._near.text(self.key) == want
                self.assertEqual(self.ld.cached(self.key, None), want)
        # The segment held some of them (the daemon keeps a key near
        # again once read), so the check above covered the segment path.
        self.assertGreater(served, 0)

    def test_a_stopped_daemon_sends_readers_to_the_socket(self):
        self.ld.call("cache.set", key=self.key, value="v")
        self.assertTrue(self.near_has(self.key, "v"))
        seg = self.ld._near
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic_ns()
        try:
            # Whenever this process gets the CPU, a hit is only allowed
            # while the daemon's last beat (before the stop) is younger
            # than shared_stale_ms: the bound is on when the lookup ran,
            # not on how fast this loop turns.
            last_hit = None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                t = time.monotonic_ns()
                got = seg.get(self.key.encode())
                if got is MISS:
                    break
                last_hit = t
            else:
                self.fail("the segment still answered 10 s after SIGSTOP")
            if last_hit is not None:
                late_ms = (last_hit - stopped) / 1e6
                self.assertLessEqual(late_ms, STALE_MS + 5,
                                     "a hit %.1f ms after SIGSTOP" % late_ms)
            self.assertLessEqual((t - stopped) / 1e6, 10000)
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)
        # Alive again: the heartbeat moves and the segment answers.
        self.assertTrue(wait_for(lambda: seg.get(self.key.encode()) == b"v",
                                 10))

    def test_a_reload_that_replaces_the_segment_is_followed(self):
        """A reload that changes shared_stale_ms closes the segment; the
        connection reads through the socket, maps the new one (at most
        once a second) and reads there again."""
        self.ld.call("cache.set", key=self.key, value="v")
        self.assertTrue(self.near_has(self.key, "v"))
        old = self.ld._near
        maps = self.d.metric("leased_near_shared_maps_total")
        self.d.configure(STALE_MS * 2)
        os.kill(self.d.proc.pid, signal.SIGHUP)
        self.assertTrue(wait_for(lambda: old.get(b"x") is CLOSED, 10))
        self.assertEqual(self.ld.cached(self.key, None), "v")
        self.assertTrue(self.near_has(self.key, "v"))
        self.assertIsNot(self.ld._near, old)
        self.assertEqual(self.ld._near.stale_ns, STALE_MS * 2 * 10**6)
        self.assertEqual(self.d.metric("leased_near_shared_maps_total"),
                         maps + 1)

    def test_async_reads_the_segment_and_never_an_old_value(self):
        writer = Leased(self.d.sock, client="writer", serializer=None)
        self.addCleanup(writer.close)
        writer.call("cache.set", key=self.key, value="v0")

        async def run():
            ld = await leased.AsyncLeased.connect(self.d.sock, client="a",
                                                  serializer=None)
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    got = await ld.cached(self.key, None)
                    seg = ld._nr.seg
                    if got == "v0" and seg is not None and \
                            seg.text(self.key) == "v0":
                        break
                    await asyncio.sleep(0.005)
                else:
                    self.fail("the key never reached the async segment")
                served = 0
                for i in range(1, 200):
                    want = "v%d" % i
                    writer.call("cache.set", key=self.key, value=want)
                    for _ in range(3):
                        served += ld._nr.seg.text(self.key) == want
                        self.assertEqual(await ld.cached(self.key, None),
                                         want)
                self.assertGreater(served, 0)
            finally:
                await ld.close()

        asyncio.run(run())

    def test_hits_move_the_daemons_metric(self):
        def reported():
            return (self.d.metric("leased_near_shared_hits_total") or 0) + \
                (self.d.metric("leased_near_shared_fallbacks_total") or 0)
        before = self.d.metric("leased_near_shared_hits_total") or 0
        self.ld.call("cache.set", key=self.key, value="v")
        self.assertTrue(self.near_has(self.key, "v"))
        for _ in range(1500):
            self.assertEqual(self.ld.cached(self.key, None), "v")
        # Every 1000 lookups (hits and fallbacks) a report goes out,
        # unasked.
        self.assertTrue(wait_for(lambda: reported() >= before + 1000, 10))
        # A key the segment does not have is a fallback; close() reports
        # what is left.
        falls = self.d.metric("leased_near_shared_fallbacks_total") or 0
        self.ld.cached(self.key + "-absent", lambda: None)
        self.ld.close()
        self.assertTrue(wait_for(
            lambda: (self.d.metric("leased_near_shared_hits_total") or 0)
            >= before + 1500, 10))
        self.assertTrue(wait_for(
            lambda: (self.d.metric("leased_near_shared_fallbacks_total")
                     or 0) >= falls + 1, 10))


if __name__ == "__main__":
    # check_clients passes the shared daemon's socket first: not needed.
    if len(sys.argv) > 1 and os.path.exists(sys.argv[1]) and \
            stat.S_ISSOCK(os.stat(sys.argv[1]).st_mode):
        sys.argv.pop(1)
    unittest.main(argv=[sys.argv[0]] + sys.argv[1:])
