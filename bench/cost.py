#!/usr/bin/env python3
"""Instructions redis-server executes per op pair, through leased and for
what an app would send without it (Redisson's scripts by EVALSHA, plain
GET and MGET, pipelined SET PX). Run by bench/cost.sh, which starts redis-server under
callgrind and leased natively; prints one key=value line per case.

Each case runs its pairs one after the other on one connection, between a
zeroing and a dump of redis-server's counters (callgrind_control), so the
window holds the case's work and little else (serverCron)."""

import argparse
import glob
import itertools
import json
import os
import re
import socket
import subprocess
import time

VALUE = 'v' * 100
MGET_KEYS = 10
MSET_ENTRIES = 10
TTL_MS = 3600000
SEM_HELD = 20


class Resp:
    def __init__(self, port):
        self.s = socket.create_connection(('127.0.0.1', port))
        self.f = self.s.makefile('rb')

    @staticmethod
    def encode(args):
        out = [b'*%d\r\n' % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b'$%d\r\n%s\r\n' % (len(a), a))
        return b''.join(out)

    def call(self, *args):
        self.s.sendall(self.encode(args))
        return self.read()

    def pipeline(self, cmds):
        """CMDS sent in one write, then their replies read."""
        self.s.sendall(b''.join(self.encode(c) for c in cmds))
        return [self.read() for _ in cmds]

    def read(self):
        line = self.f.readline()[:-2]
        t, rest = line[:1], line[1:]
        if t == b'-':
            raise RuntimeError(rest.decode())
        if t in (b'+', b':'):
            return int(rest) if t == b':' else rest.decode()
        if t == b'$':
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            # An entry of cache.layout 2 begins with the byte 0xF5.
            return data.decode('utf-8', 'surrogateescape')
        n = int(rest)
        return None if n < 0 else [self.read() for _ in range(n)]


class Leased:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile('rb')

    def call(self, **req):
        self.s.sendall(json.dumps(req).encode() + b'\n')
        while True:
            r = json.loads(self.f.readline())
            if 'event' not in r:
                break
        if not r.get('ok'):
            raise RuntimeError(json.dumps(r))
        return r

    def pipeline(self, reqs):
        """REQS sent in one write, then their answers read."""
        self.s.sendall(b''.join(json.dumps(q).encode() + b'\n'
                                for q in reqs))
        out = []
        while len(out) < len(reqs):
            r = json.loads(self.f.readline())
            if 'event' in r:
                continue
            if not r.get('ok'):
                raise RuntimeError(json.dumps(r))
            out.append(r)
        return out


class Callgrind:
    def __init__(self, pid, out):
        self.pid, self.out = pid, out

    def zero(self):
        subprocess.run(['callgrind_control', '-z', str(self.pid)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def dump(self):
        n = len(glob.glob(self.out + '.[0-9]*')) + 1
        subprocess.run(['callgrind_control', '-d', str(self.pid)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        path = '%s.%d' % (self.out, n)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with open(path) as f:
                    text = f.read()
                if re.search(r'^totals:', text, re.M):
                    return int(re.search(r'^summary: *(\d+)', text,
                                         re.M).group(1))
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        raise RuntimeError('no callgrind dump in ' + path)

    def window(self, fn, ops):
        """Instructions of OPS calls of FN, and their seconds."""
        self.zero()
        t0 = time.monotonic()
        for i in range(ops):
            fn(i)
        secs = time.monotonic() - t0
        return self.dump(), secs


def load(r, srcdir, name):
    with open(os.path.join(srcdir, 'bench', 'redisson', name + '.lua')) as f:
        return r.call('SCRIPT', 'LOAD', f.read())


def sem_cases(a, ld, tag=''):
    """leased's semaphore pairs: alone, and with SEM_HELD grants held by
    others all along (detached with a long lease: no renewal in the
    window). TAG names the cases of a second daemon's run, on keys of
    their own."""
    key = 'cost.s' + re.sub(r'\W+', '.', tag)
    held = key + '%d' % SEM_HELD
    other = Leased(a.sock)
    for _ in range(SEM_HELD):
        other.call(op='sem.acquire', key=held, limit=100, detach=True,
                   ttl_ms=TTL_MS)

    def pair(k, limit):
        def one(i):
            t = ld.call(op='sem.acquire', key=k, limit=limit)['token']
            ld.call(op='sem.release', key=k, token=t)
        return one
    return {'leased sem' + tag: pair(key, 10),
            'leased sem %d held%s' % (SEM_HELD, tag): pair(held, 100)}


def cache_cases(ld, r, tag):
    """leased's cache ops on 100 B values, on keys of their own for each
    TAG (the run of a daemon configured otherwise): a hit, ten hits in one
    cache.mget, a cached null, a miss with its fill and with its release,
    a cache.mset of MSET_ENTRIES and as many cache.set pipelined. Beside
    them, what a hit's command costs alone, sent by R (the client of the
    plain GET) on the entry cache.set wrote: HGET of the value's field and
    HGETALL of a hash, GET of a string (cache.layout 2)."""
    # The keys of a tagged run differ in their first letters, not in
    # their length: a longer name costs Redis more to hash and compare.
    p = 'cost.' if not tag else 'cst2.'
    cases = {}
    keys = [p + 'h%d' % k for k in range(MGET_KEYS)]
    for k in keys:
        ld.call(op='cache.set', key=k, value=VALUE, ttl_ms=TTL_MS)
    entry = 'leased:cache:{%s}' % keys[0]
    if r.call('TYPE', entry) == 'hash':
        if r.call('HGET', entry, 'v') != VALUE:
            raise RuntimeError('no value where cost.py looks: %s' % entry)
        cases['HGET v of the entry' + tag] = lambda i: r.call(
            'HGET', entry, 'v')
        cases['HGETALL of the entry' + tag] = lambda i: r.call(
            'HGETALL', entry)
    else:
        if not r.call('GET', entry).endswith(VALUE):
            raise RuntimeError('no value where cost.py looks: %s' % entry)
        cases['GET of the entry' + tag] = lambda i: r.call('GET', entry)

    def hit(i):
        if ld.call(op='cache.get', key=keys[0])['value'] != VALUE:
            raise RuntimeError('cache.get did not hit')
    cases['leased cache.get hit 100 B' + tag] = hit
    cases['leased cache.mget %d hits%s' % (MGET_KEYS, tag)] = \
        lambda i: ld.call(op='cache.mget', keys=keys)
    null_key = p + 'null'
    null_set = []

    def null_get(i):
        # Set by its own first warm-up call: a null lives
        # cache.null_ttl_ms (60 s), less than the cases before it may take
        # under callgrind.
        if not null_set:
            ld.call(op='cache.set', key=null_key, value=None)
            null_set.append(True)
        g = ld.call(op='cache.get', key=null_key)
        if not g['hit'] or g['value'] is not None:
            raise RuntimeError('cache.get did not read the cached null')
    cases['leased cache.get cached null' + tag] = null_get

    # A key read once each: its miss, then the release of its lease.
    gone = itertools.count()

    def miss_release(i):
        k = p + 'r%d' % next(gone)
        g = ld.call(op='cache.get', key=k)
        if g['hit'] or not ld.call(op='cache.release', key=k,
                                   lease=g['lease'])['released']:
            raise RuntimeError('no miss and release of ' + k)
    cases['leased cache.get miss + cache.release' + tag] = miss_release

    # Cache-aside's miss: a key never read before each time (the warm-up
    # and the window take their own), its fill lease and the fill.
    fresh = itertools.count()

    def miss_fill(i):
        k = p + 'f%d' % next(fresh)
        g = ld.call(op='cache.get', key=k)
        if g['hit'] or not ld.call(op='cache.fill', key=k, lease=g['lease'],
                                   value=VALUE, ttl_ms=TTL_MS)['stored']:
            raise RuntimeError('no miss and fill of ' + k)
    cases['leased cache.get miss + cache.fill' + tag] = miss_fill

    # Bulk writes: one cache.mset, as many cache.set pipelined.
    ments = [{'key': p + 'm%d' % k, 'value': VALUE,
              'ttl_ms': TTL_MS} for k in range(MSET_ENTRIES)]

    def mset(i):
        if ld.call(op='cache.mset', entries=ments)['stored'] != MSET_ENTRIES:
            raise RuntimeError('cache.mset did not store every entry')
    cases['leased cache.mset %d%s' % (MSET_ENTRIES, tag)] = mset
    cases['leased cache.set x%d pipelined%s' % (MSET_ENTRIES, tag)] = \
        lambda i: ld.pipeline([dict(op='cache.set', **e) for e in ments])
    return cases


def pairs(a):
    """The cases of op pairs: name -> (setup, one pair)."""
    r = Resp(a.port)
    ld = Leased(a.sock)
    sha = {n: load(r, a.srcdir, n) for n in (
        'lock_acquire', 'lock_release', 'read_acquire', 'read_release',
        'write_acquire', 'write_release', 'sem_acquire', 'sem_release',
        'psem_acquire', 'psem_release', 'rate_acquire', 'flock_acquire')}
    holder = 'c0ffee00-0000-4000-8000-000000000001:1'
    lease = 30000
    cases = {}

    cases['leased lock+unlock'] = lambda i: (
        ld.call(op='lock', key='cost.l'), ld.call(op='unlock', key='cost.l'))
    cases['redisson RLock'] = lambda i: (
        r.call('EVALSHA', sha['lock_acquire'], 1, 'cost.rl', lease, holder),
        r.call('EVALSHA', sha['lock_release'], 2, 'cost.rl',
               'redisson_lock__channel:{cost.rl}', 0, lease, holder))
    # RFencedLock: RLock with a token (a fence) from a counter beside the
    # lock on every grant, as leased gives; its release is RLock's.
    cases['redisson RFencedLock'] = lambda i: (
        r.call('EVALSHA', sha['flock_acquire'], 2, 'cost.rfl',
               'redisson_lock_token:{cost.rfl}', lease, holder),
        r.call('EVALSHA', sha['lock_release'], 2, 'cost.rfl',
               'redisson_lock__channel:{cost.rfl}', 0, lease, holder))
    for m in ('read', 'write'):
        cases['leased rw %s' % m] = (lambda m: lambda i: (
            ld.call(op='lock', key='cost.rw', mode=m),
            ld.call(op='unlock', key='cost.rw', mode=m)))(m)
    tmo = '{cost.rrw}:%s:rwlock_timeout' % holder
    cases['redisson RReadWriteLock read'] = lambda i: (
        r.call('EVALSHA', sha['read_acquire'], 2, 'cost.rrw', tmo, lease,
               holder, holder + ':write'),
        r.call('EVALSHA', sha['read_release'], 4, 'cost.rrw',
               'redisson_rwlock:{cost.rrw}', tmo, '{cost.rrw}', 0, holder))
    cases['redisson RReadWriteLock write'] = lambda i: (
        r.call('EVALSHA', sha['write_acquire'], 1, 'cost.rrw', lease,
               holder + ':write'),
        r.call('EVALSHA', sha['write_release'], 2, 'cost.rrw',
               'redisson_rwlock:{cost.rrw}', 0, lease, holder + ':write'))

    cases.update(sem_cases(a, ld))
    r.call('SET', 'cost.rs', 10)
    cases['redisson RSemaphore'] = lambda i: (
        r.call('EVALSHA', sha['sem_acquire'], 1, 'cost.rs', 1),
        r.call('EVALSHA', sha['sem_release'], 2, 'cost.rs',
               'redisson_sc:{cost.rs}', 1))

    # RPermitExpirableSemaphore: the counter at 10 as trySetPermits leaves
    # it; each acquire takes one permit with a lease and a fresh id of 16
    # random bytes (Redisson sends the bytes of its hex id), and the
    # release gives that id back.
    r.call('SET', 'cost.rps', 10)
    ps_keys = ['cost.rps', '{cost.rps}:timeout', 'redisson_sc:{cost.rps}']

    def rpsem(i):
        pid = os.urandom(16)
        now = int(time.time() * 1000)
        got = r.call('EVALSHA', sha['psem_acquire'], 3, *ps_keys, 1,
                     now + lease, now, 922337203685477, 'publish', pid)
        if got != 'OK':
            raise RuntimeError('RPermitExpirableSemaphore refused: %r' % got)
        r.call('EVALSHA', sha['psem_release'], 3, ps_keys[0], ps_keys[2],
               ps_keys[1], pid, 1, int(time.time() * 1000), 'publish')
    cases['redisson RPermitExpirableSemaphore'] = rpsem

    r.call('SET', 'cost.rps%d' % SEM_HELD, 100)
    ph_keys = ['cost.rps%d' % SEM_HELD, '{cost.rps%d}:timeout' % SEM_HELD,
               'redisson_sc:{cost.rps%d}' % SEM_HELD]
    now = int(time.time() * 1000)
    for _ in range(SEM_HELD):
        r.call('EVALSHA', sha['psem_acquire'], 3, *ph_keys, 1, now + TTL_MS,
               now, 922337203685477, 'publish', os.urandom(16))

    def rpsem_held(i):
        pid = os.urandom(16)
        now = int(time.time() * 1000)
        if r.call('EVALSHA', sha['psem_acquire'], 3, *ph_keys, 1, now + lease,
                  now, 922337203685477, 'publish', pid) != 'OK':
            raise RuntimeError('RPermitExpirableSemaphore refused')
        r.call('EVALSHA', sha['psem_release'], 3, ph_keys[0], ph_keys[2],
               ph_keys[1], pid, 1, int(time.time() * 1000), 'publish')
    cases['redisson RPermitExpirableSemaphore %d held' % SEM_HELD] = \
        rpsem_held

    # A granted decision: limits far above the pace of the run, the same
    # on both sides (a million a second). Redisson logs every grant for
    # one interval, so its sorted set holds a second of this run's grants
    # and each try gives back about as many as it takes: its steady state.
    def rate(i):
        if not ld.call(op='rate.acquire', key='cost.rt', rate=1000000,
                       per_ms=1000)['acquired']:
            raise RuntimeError('rate.acquire refused')
    cases['leased rate.acquire granted'] = rate
    r.call('HSET', 'cost.rrt', 'rate', 1000000, 'interval', 1000,
           'type', 0, 'keepAliveTime', 0)
    rkeys = ['cost.rrt', '{cost.rrt}:value', '{cost.rrt}:value:c0ffee',
             '{cost.rrt}:permits', '{cost.rrt}:permits:c0ffee']

    def rrate(i):
        if r.call('EVALSHA', sha['rate_acquire'], len(rkeys), *rkeys, 1,
                  int(time.time() * 1000), os.urandom(8)) is not None:
            raise RuntimeError('RRateLimiter refused')
    cases['redisson RRateLimiter'] = rrate

    cases['SET PX x%d pipelined' % MSET_ENTRIES] = lambda i: r.pipeline(
        [('SET', 'plain:cost.m%d' % k, VALUE, 'PX', TTL_MS)
         for k in range(MSET_ENTRIES)])

    # The Bloom filter: 10000 keys in a filter for 1000000 at 1%, and
    # keys never stored that it rules out (asked once here, so that each
    # case below reads the same absent keys and none is let through).
    ld.call(op='bloom.create', filter='cost.bf', capacity=1000000,
            error_rate=0.01)
    # Batches of 100: Redis under callgrind answers a bloom.add of 1000
    # keys later than leased's redis.timeout_ms.
    for b in range(0, 10000, 100):
        ld.call(op='bloom.add', filter='cost.bf',
                keys=['cost.e%d' % k for k in range(b, b + 100)])
    absent = []
    for b in range(0, 4000, 100):
        cand = ['cost.a%d' % k for k in range(b, b + 100)]
        maybe = ld.call(op='bloom.check', filter='cost.bf',
                        keys=cand)['maybe']
        absent += [k for k, m in zip(cand, maybe) if not m]

    def bloom_get(i):
        if not ld.call(op='cache.get', key=absent[i % len(absent)],
                       bloom='cost.bf').get('bloom'):
            raise RuntimeError('the filter did not rule the key out')
    cases['leased cache.get bloom ruled out'] = bloom_get

    plain = itertools.count()

    def get_set(i):
        k = 'plain:cost.f%d' % next(plain)
        if r.call('GET', k) is not None:
            raise RuntimeError('GET of %s found a value' % k)
        r.call('SET', k, VALUE, 'PX', TTL_MS)
    cases['GET miss + SET PX'] = get_set
    cases['GET absent'] = lambda i: r.call(
        'GET', 'plain:' + absent[i % len(absent)])
    for n in (1, 100):
        def check(i, n=n):
            ks = [absent[(i + j) % len(absent)] for j in range(n)]
            if any(ld.call(op='bloom.check', filter='cost.bf',
                           keys=ks)['maybe']):
                raise RuntimeError('bloom.check let a key through')
        cases['leased bloom.check %d' % n] = check

    keys = ['cost.h%d' % k for k in range(MGET_KEYS)]
    for k in keys:
        r.call('SET', 'plain:' + k, VALUE)
    cases['GET 100 B'] = lambda i: r.call('GET', 'plain:' + keys[0])
    cases.update(cache_cases(ld, r, ''))
    cases['MGET %d' % MGET_KEYS] = lambda i: r.call(
        'MGET', *['plain:' + k for k in keys])
    return cases


def renewal_leased(a, cg):
    """Watchdog renewals of N held locks: a window of one whole pass
    (leased runs with a short lock.watchdog_ms)."""
    n = a.renew_locks
    ld = Leased(a.sock)
    for k in range(n):
        ld.call(op='lock', key='cost.w%d' % k)
    st = Leased(a.sock)

    def done():
        return st.call(op='stats')['stats'].get('lock_renewals_ok', 0)
    # Between two passes the count stands still.
    def still():
        c = done()
        while True:
            time.sleep(0.2)
            d = done()
            if d == c:
                return d
            c = d
    held = st.call(op='stats')['stats'].get('locks_held', n)
    # One pass, from a still count to its last renewal answered: dense
    # enough that serverCron's share of the window (at most the 2 s wait
    # for the pass) stays small.
    c0 = still()
    cg.zero()
    while done() < c0 + held:
        time.sleep(0.01)
    ir = cg.dump()
    renewed = done() - c0
    ld.s.close()
    return ir, renewed


def renewal_redisson(a, cg):
    r = Resp(a.port)
    sha = load(r, a.srcdir, 'renew')
    n = a.renew_locks
    holder = 'c0ffee00-0000-4000-8000-000000000001:1'
    for k in range(n):
        r.call('HSET', 'cost.rw%d' % k, holder, 1)
    ir, _ = cg.window(lambda i: r.call('EVALSHA', sha, 1,
                                       'cost.rw%d' % (i % n), 30000, holder),
                      n)
    return ir, n


def window_all(cg, a, cases):
    # ops_s: the pace under callgrind. Redisson's rate limiter logs every
    # grant for its interval, so what a try costs it depends on it.
    for name, fn in cases.items():
        if not re.search(a.cases, name):
            continue
        for i in range(min(300, a.ops)):
            fn(i)
        ir, secs = cg.window(fn, a.ops)
        print('mode=cost case="%s" ops=%d ir=%d ir_per_op=%.0f ops_s=%.0f'
              % (name, a.ops, ir, ir / a.ops, a.ops / secs), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--port', type=int, required=True)
    p.add_argument('--sock', required=True)
    p.add_argument('--pid', type=int, required=True)
    p.add_argument('--cg-out', required=True)
    p.add_argument('--srcdir', default='.')
    p.add_argument('--ops', type=int, default=3000)
    p.add_argument('--renew-locks', type=int, default=1000)
    p.add_argument('--cases', default='',
                   help='only the cases whose name matches this regex')
    p.add_argument('--tag', default='',
                   help="the semaphore's and the cache's cases alone, "
                   'their names ending with this (a daemon configured '
                   'otherwise)')
    a = p.parse_args()
    cg = Callgrind(a.pid, a.cg_out)
    if a.tag:
        ld = Leased(a.sock)
        cases = sem_cases(a, ld, a.tag)
        cases.update(cache_cases(ld, Resp(a.port), a.tag))
        window_all(cg, a, cases)
        return
    window_all(cg, a, pairs(a))
    for name, fn in (('leased watchdog renewal', renewal_leased),
                     ('redisson renewal', renewal_redisson)):
        if not re.search(a.cases, name):
            continue
        ir, n = fn(a, cg)
        print('mode=cost case="%s" ops=%d ir=%d ir_per_op=%.0f'
              % (name, n, ir, ir / n), flush=True)


if __name__ == '__main__':
    main()
