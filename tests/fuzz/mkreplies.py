#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_reply (see the layout in fuzz_reply.c):
requests of each op with replies of the shapes the scripts return, and a
few a hostile Redis would send. Run: tests/fuzz/mkreplies.py DIR"""
import os
import struct
import sys


def bulk(s):
    if s is None:
        return b"$-1\r\n"
    b = s.encode() if isinstance(s, str) else s
    return b"$%d\r\n%s\r\n" % (len(b), b)


def arr(*items):
    if items == (None,):
        return b"*-1\r\n"
    return b"*%d\r\n" % len(items) + b"".join(items)


def i(n):
    return b":%d\r\n" % n


def err(s):
    return b"-" + s.encode() + b"\r\n"


def seed(requests, *replies, piece=0):
    req = "".join(r + "\n" for r in requests).encode()
    return bytes([piece]) + struct.pack("<H", len(req)) + req + \
        b"".join(replies)


LOCK = '{"id":1,"op":"lock","key":"k"}'
LOCKW = '{"id":1,"op":"lock","key":"k","wait_ms":50}'
UNLOCK = '{"id":2,"op":"unlock","key":"k"}'
EXTEND = '{"id":2,"op":"extend","key":"k","lease_ms":5000}'
INFO = '{"id":1,"op":"lock.info","key":"k"}'
GET = '{"id":1,"op":"cache.get","key":"u:1"}'
GETNL = '{"id":1,"op":"cache.get","key":"u:1","lease":false}'
MGET = '{"id":1,"op":"cache.mget","keys":["a","b","c"]}'
SET = '{"id":1,"op":"cache.set","key":"u:1","value":"v"}'
FILL = '{"id":1,"op":"cache.fill","key":"u:1","lease":"L1","value":"v"}'
REL = '{"id":1,"op":"cache.release","key":"u:1","lease":"L1"}'
INV = '{"id":1,"op":"cache.invalidate","key":"u:1"}'
INVS = '{"id":1,"op":"cache.invalidate","keys":["a","b"]}'
GRANTED = arr(i(1), i(1), bulk("7"), i(30000))

SEEDS = {
    "lock-granted": seed([LOCK], GRANTED, arr(i(1), i(0))),
    "lock-taken": seed([LOCK], arr(i(0), i(12000))),
    "lock-wrongtype": seed([LOCK], arr(i(-1))),
    "lock-wait-taken": seed([LOCKW], arr(i(0), i(10)), arr(i(0), i(5))),
    "lock-unlock": seed([LOCK, UNLOCK], GRANTED, arr(i(1), i(0))),
    "lock-extend": seed([LOCK, EXTEND], GRANTED, arr(i(1), i(5000), i(1)),
                        arr(i(1), i(0))),
    "lock-info": seed([INFO], arr(i(1), i(2), bulk("7"), i(1000))),
    "lock-noscript": seed([LOCK], err("NOSCRIPT No matching script"),
                          GRANTED),
    "lock-readonly": seed([LOCK], err("READONLY You can't write")),
    "lock-fence-huge": seed([LOCK], arr(i(1), i(1),
                            bulk("99999999999999999999999"), i(-5))),
    "lock-nested": seed([LOCK], arr(arr(arr(i(1))), bulk(None), arr(None))),
    "get-hit": seed([GET], arr(bulk("hit"), bulk('{"a":1}'))),
    "get-held": seed([GET], arr(bulk("held"), i(100))),
    "get-granted": seed([GET], arr(bulk("granted"))),
    "get-null": seed([GETNL], arr(bulk("null"))),
    "get-miss": seed([GETNL], arr(bulk("miss"))),
    "get-wrongtype": seed([GET], arr(bulk("wrong_type"))),
    "get-binary": seed([GET], arr(bulk("hit"), bulk(b"\x00\xff\xfe\"\\"))),
    "get-int": seed([GET], i(5)),
    # Under cache.layout 2 (piece's high bit): the probe's answer is a
    # string, an entry (byte 0xF5, "L", kind, version, ":", load time,
    # ":", value) or one that only begins like it; a cache.mget's probes
    # are one MGET.
    "get-text-hit": seed([GET], bulk(b'\xf5Lv17::{"a":1}'), piece=0x80),
    "get-text-null": seed([GET], bulk(b"\xf5Ln17::"), piece=0x80),
    "get-text-load-time": seed([GET], bulk(b"\xf5Lv17:250:x"),
                               arr(bulk("hit"), bulk("x"), i(17)),
                               piece=0x80),
    "get-text-bad": seed([GET], bulk(b"\xf5Lv99999999999999999:x:"),
                         arr(bulk("wrong_type")), piece=0x80),
    "get-text-cut": seed([GET], bulk(b"\xf5Lv"), arr(bulk("miss")),
                         piece=0x80),
    "mget-text": seed([MGET], arr(bulk(b"\xf5Lv1::a"), bulk(None),
                                  bulk(b"\xf5Ln2::")), i(1), piece=0x80),
    "mget-text-short": seed([MGET], arr(bulk(b"\xf5Lv1::a")), piece=0x87),
    # Under layout 1 a string answers the HMGET: the same reading.
    "get-text-layout1": seed([GET], bulk(b"\xf5Lv17::x")),
    "mget": seed([MGET], arr(arr(bulk("hit"), bulk("1")),
                             arr(bulk("miss")), arr(bulk("granted")))),
    "mget-short": seed([MGET], arr(arr(bulk("hit"), bulk("1")))),
    "set": seed([SET], i(1)),
    "set-status": seed([SET], b"+OK\r\n"),
    "fill": seed([FILL], i(1)),
    "fill-refused": seed([FILL], i(0)),
    "release": seed([REL], i(1)),
    "invalidate": seed([INV], i(1), i(1)),
    "invalidate-keys": seed([INVS], i(2), i(1), i(1)),
    "invalidate-err": seed([INV], err("ERR oops"), err("LOADING")),
    "mixed": seed([LOCK, GET, SET, UNLOCK, INV], GRANTED,
                  arr(bulk("hit"), bulk("x")), i(1), arr(i(1), i(0)), i(1),
                  piece=7),
    "cut-bulk": seed([GET], b"*2\r\n$3\r\nhit\r\n$100\r\nabc"),
    "huge-bulk": seed([GET], b"*2\r\n$3\r\nhit\r\n$2147483648\r\n"),
    "huge-array": seed([MGET], b"*2147483647\r\n:1\r\n"),
    "deep-array": seed([LOCK], b"*1\r\n" * 12 + b":1\r\n"),
    "bad-type": seed([LOCK], b"?what\r\n"),
    "pubsub-message": seed([LOCKW], arr(i(0), i(100)),
                           arr(bulk("message"), bulk("x"), bulk("y"))),
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
