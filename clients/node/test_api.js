'use strict';
// The package's API against a running leased, with node's test runner:
//
//   LEASED_SOCKET=... LEASED_TEST_REDIS=127.0.0.1:6379 node --test test_api.js
//
// check_clients runs it with its own daemon (lock.watchdog_ms 1500) and
// Redis. The lock_lost test deletes the lock's key in Redis directly.

const test = require('node:test');
const assert = require('assert');
const fs = require('fs');
const net = require('net');
const os = require('os');
const path = require('path');
const { execFileSync, spawnSync } = require('child_process');
const { Leased, LeasedError, Pool, RAW } = require('./leased');

const SOCK = process.env.LEASED_SOCKET;
const REDIS = process.env.LEASED_TEST_REDIS;
const TAG = `nodeapi-${process.pid}`;
const WAIT_MS = 30000;

function redisDel(key) {
  const [host, port] = REDIS.split(':');
  const name = Buffer.from(`leased:lock:{${key}}`);
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ host, port: Number(port) }, () => {
      s.write(`*2\r\n$3\r\nDEL\r\n$${name.length}\r\n`);
      s.write(Buffer.concat([name, Buffer.from('\r\n')]));
    });
    s.once('data', (d) => {
      s.destroy();
      if (d.toString().startsWith(':1')) resolve();
      else reject(new Error(`DEL answered ${d}`));
    });
    s.once('error', reject);
  });
}

function within(ms, promise, what) {
  let t;
  return Promise.race([promise, new Promise((_, reject) => {
    t = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  })]).finally(() => clearTimeout(t));
}

test('an array of keys locks them as a group', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  try {
    const keys = [`${TAG}:grp:1`, `${TAG}:grp:2`];
    const held = await a.lock(keys);
    assert.strictEqual(held.acquired, true);
    assert.deepStrictEqual(Object.keys(held.fences).sort(), keys.slice().sort());
    assert.strictEqual((await b.lock(keys[1])).acquired, false);
    assert.strictEqual((await b.lock(keys)).acquired, false);
    const x = await b.extend(keys, 60000, { token: held.token });
    assert.strictEqual(x.lease_ms, 60000);
    assert.strictEqual((await a.unlock(keys)).released, true);
    const got = await b.using(keys, async (signal, h) => {
      assert.strictEqual(signal.aborted, false);
      return Object.keys(h.fences).length;
    });
    assert.strictEqual(got, 2);
    assert.strictEqual((await a.lock(keys)).acquired, true);
  } finally {
    a.close();
    b.close();
  }
});

test('a group key found lost aborts using()', { skip: !REDIS && 'LEASED_TEST_REDIS not set' },
  async () => {
    const ld = await Leased.connect(SOCK);
    try {
      const keys = [`${TAG}:glost:1`, `${TAG}:glost:2`];
      await ld.using(keys, async (signal, held) => {
        const aborted = new Promise((r) => signal.addEventListener('abort', r));
        await redisDel(keys[1]);
        await within(WAIT_MS, aborted, 'abort');
        assert.strictEqual(signal.reason.event.key, keys[1]);
        assert.strictEqual(signal.reason.event.token, held.token);
      });
      const info = await ld.call('lock.info', { key: keys[0] });
      assert.strictEqual(info.locked, false);
    } finally {
      ld.close();
    }
  });

test('using() aborts its signal on lock_lost', { skip: !REDIS && 'LEASED_TEST_REDIS not set' },
  async () => {
    const ld = await Leased.connect(SOCK);
    try {
      const key = `${TAG}:lost`;
      const result = await ld.using(key, { wait_ms: 1000 }, async (signal, held) => {
        assert.strictEqual(signal.aborted, false);
        assert.ok(held.fence > 0);
        const aborted = new Promise((r) => signal.addEventListener('abort', r));
        await redisDel(key);
        // Idle until the daemon's renewal finds the key gone.
        await within(WAIT_MS, aborted, 'abort');
        assert.strictEqual(signal.reason.code, 'lock_lost');
        assert.strictEqual(signal.reason.event.token, held.token);
        return 'done';
      });
      // The lost lock is not unlocked with an error.
      assert.strictEqual(result, 'done');
    } finally {
      ld.close();
    }
  });

test('using() aborts its signal when the connection ends', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  const sockPath = path.join(dir, 's.sock');
  // A peer that grants the lock and then closes, as a stopping daemon.
  const srv = net.createServer((c) => {
    c.once('data', (d) => {
      const req = JSON.parse(d.toString().split('\n')[0]);
      c.end(JSON.stringify({ id: req.id, ok: true, acquired: true,
        token: 't1', count: 1, fence: 1, lease_ms: 30000 }) + '\n');
    });
  });
  await new Promise((r) => srv.listen(sockPath, r));
  const ld = await Leased.connect(sockPath);
  try {
    // The lock went with the session: FN is told by its signal, and
    // leaving using() is no error, as for a lock_lost.
    const got = await ld.using('k', async (signal) => {
      if (!signal.aborted) {
        await within(WAIT_MS, new Promise((r) =>
          signal.addEventListener('abort', r)), 'abort');
      }
      assert.ok(signal.reason instanceof LeasedError);
      assert.strictEqual(signal.reason.code, 'connection_closed');
      return 'told';
    });
    assert.strictEqual(got, 'told');
  } finally {
    ld.close();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('held.atRisk follows lock_at_risk and lock_safe of its keys', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  const sockPath = path.join(dir, 's.sock');
  let peer;
  // A peer that grants the group and then says what the daemon says
  // when a renewal stalls.
  const srv = net.createServer((c) => {
    peer = c;
    c.on('data', (d) => {
      for (const line of d.toString().split('\n').filter(Boolean)) {
        const req = JSON.parse(line);
        c.write(JSON.stringify(req.op === 'lock'
          ? { id: req.id, ok: true, acquired: true, token: 't1', count: 1,
            fences: { a: 1, b: 2 }, lease_ms: 30000 }
          : { id: req.id, ok: true, released: true }) + '\n');
      }
    });
  });
  await new Promise((r) => srv.listen(sockPath, r));
  const ld = await Leased.connect(sockPath);
  const say = (event, key, extra) => peer.write(JSON.stringify(
    { event, key, token: 't1', ...extra }) + '\n');
  try {
    const seen = [];
    await ld.using(['a', 'b'], async (signal, held) => {
      assert.strictEqual(held.atRisk, false);
      assert.ok(!Object.keys(held).includes('atRisk'));
      held.risk.on('at_risk', (ev) => seen.push(`at_risk ${ev.key}`));
      held.risk.on('safe', (ev) => seen.push(`safe ${ev.key}`));
      const atRisk = new Promise((r) => held.risk.once('at_risk', r));
      say('lock_at_risk', 'a', { lease_left_ms: 1850 });
      say('lock_at_risk', 'b', { lease_left_ms: 1800 });
      const ev = await within(WAIT_MS, atRisk, 'at_risk');
      assert.strictEqual(ev.lease_left_ms, 1850);
      assert.strictEqual(held.atRisk, true);
      // Still at risk while one key of the group is.
      const sawA = new Promise((r) => ld.once('lock_safe', r));
      say('lock_safe', 'a', { lease_ms: 30000 });
      await within(WAIT_MS, sawA, 'lock_safe a');
      assert.strictEqual(held.atRisk, true);
      const safe = new Promise((r) => held.risk.once('safe', r));
      say('lock_safe', 'b', { lease_ms: 30000 });
      assert.strictEqual((await within(WAIT_MS, safe, 'safe')).lease_ms, 30000);
      assert.strictEqual(held.atRisk, false);
      assert.strictEqual(signal.aborted, false);
    });
    assert.deepStrictEqual(seen, ['at_risk a', 'safe b']);
  } finally {
    ld.close();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('grant.atRisk follows sem_at_risk and sem_safe', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  const sockPath = path.join(dir, 's.sock');
  let peer;
  const srv = net.createServer((c) => {
    peer = c;
    c.on('data', (d) => {
      for (const line of d.toString().split('\n').filter(Boolean)) {
        const req = JSON.parse(line);
        c.write(JSON.stringify(req.op === 'sem.acquire'
          ? { id: req.id, ok: true, acquired: true, token: 's1', permits: 1,
            available: 1, lease_ms: 30000 }
          : { id: req.id, ok: true, released: 1 }) + '\n');
      }
    });
  });
  await new Promise((r) => srv.listen(sockPath, r));
  const ld = await Leased.connect(sockPath);
  const say = (event, extra) => peer.write(JSON.stringify(
    { event, key: 'pool', token: 's1', ...extra }) + '\n');
  try {
    await ld.withSemaphore('pool', 2, async (grant) => {
      const atRisk = new Promise((r) => grant.risk.once('at_risk', r));
      say('sem_at_risk', { lease_left_ms: 900 });
      await within(WAIT_MS, atRisk, 'at_risk');
      assert.strictEqual(grant.atRisk, true);
      const safe = new Promise((r) => grant.risk.once('safe', r));
      say('sem_safe', { lease_ms: 30000 });
      await within(WAIT_MS, safe, 'safe');
      assert.strictEqual(grant.atRisk, false);
    });
  } finally {
    ld.close();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('using() releases the lock when the callback throws', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  try {
    const key = `${TAG}:throws`;
    await assert.rejects(a.using(key, async (signal) => {
      assert.strictEqual(signal.aborted, false);
      const r = await b.lock(key);
      assert.strictEqual(r.acquired, false);
      throw new Error('boom');
    }), /boom/);
    const r = await b.lock(key);
    assert.strictEqual(r.acquired, true);
    await b.unlock(key);
    // Held elsewhere: using() rejects with not_acquired and never runs fn.
    await b.lock(key);
    let ran = false;
    await assert.rejects(a.using(key, { wait_ms: 0 }, async () => { ran = true; }),
      (e) => e.code === 'not_acquired');
    assert.strictEqual(ran, false);
  } finally {
    a.close();
    b.close();
  }
});

test('many requests in flight, and lines split across reads', async () => {
  const ld = await Leased.connect(SOCK);
  try {
    const n = 200;
    const keys = Array.from({ length: n }, (_, i) => `${TAG}:many:${i}`);
    const held = await Promise.all(keys.map((k) => ld.lock(k)));
    assert.ok(held.every((h) => h.acquired));
    const un = await Promise.all(keys.map((k) => ld.unlock(k)));
    assert.ok(un.every((u) => u.released));
    // A value long enough to come in several chunks, with multi-byte
    // characters that a chunk boundary may cut.
    const big = 'é€😀x'.repeat(40000);
    const v = await ld.cached(`${TAG}:big`, () => big);
    assert.strictEqual(v, big);
    const got = await ld.call('cache.get', { key: `${TAG}:big` });
    assert.strictEqual(got.value, JSON.stringify(big));
  } finally {
    ld.close();
  }
});

test('a request waits while hundreds of others come and go', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  try {
    const key = `${TAG}:longwait`;
    assert.strictEqual((await b.lock(key)).acquired, true);
    const waiting = a.lock(key, { wait_ms: WAIT_MS });
    // More requests in flight at once than the waiters' first ring holds,
    // and many turns of it while the first request still waits.
    for (let round = 0; round < 5; round++) {
      const keys = Array.from({ length: 150 },
        (_, i) => `${TAG}:lw:${round}:${i}`);
      const held = await Promise.all(keys.map((k) => a.lock(k)));
      assert.ok(held.every((h) => h.acquired));
      const un = await Promise.all(keys.map((k) => a.unlock(k)));
      assert.ok(un.every((u) => u.released));
    }
    assert.strictEqual(a.pending.size, 1);
    assert.strictEqual((await b.unlock(key)).released, true);
    const got = await within(WAIT_MS, waiting, 'the waiting lock');
    assert.strictEqual(got.acquired, true);
    assert.strictEqual(a.pending.size, 0);
    assert.strictEqual((await a.unlock(key)).released, true);
  } finally {
    a.close();
    b.close();
  }
});

test('replies in any order; one without an id goes to the oldest', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  const sockPath = path.join(dir, 's.sock');
  const n = 100;
  // A peer that waits for N requests, answers the oldest with an error
  // that has no id (as for a line it could not read), then the rest
  // newest first.
  const srv = net.createServer((c) => {
    let buf = '';
    c.on('data', (d) => {
      buf += d.toString();
      const ids = buf.split('\n').filter((l) => l).map((l) => JSON.parse(l).id);
      if (ids.length < n) return;
      let text = '{"ok":false,"error":{"code":"bad_request","message":"x"}}\n';
      for (const id of ids.slice(1).reverse()) {
        text += `{"id":${id},"ok":true,"v":${id}}\n`;
      }
      c.write(text);
    });
  });
  await new Promise((r) => srv.listen(sockPath, r));
  const ld = await Leased.connect(sockPath);
  try {
    const calls = Array.from({ length: n }, () => ld.call('ping'));
    const first = calls[0].then(() => null, (e) => e.code);
    const rest = await within(WAIT_MS, Promise.all(calls.slice(1)), 'replies');
    assert.strictEqual(await within(WAIT_MS, first, 'the oldest'),
      'bad_request');
    assert.deepStrictEqual(rest.map((r) => r.v),
      Array.from({ length: n - 1 }, (_, i) => i + 2));
    assert.strictEqual(ld.pending.size, 0);
  } finally {
    ld.close();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('lock and unlock options written as JSON writes them', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  const sockPath = path.join(dir, 's.sock');
  const lines = [];
  // A peer that records every request and answers it.
  const srv = net.createServer((c) => {
    let buf = '';
    c.on('data', (d) => {
      buf += d.toString();
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        lines.push(line);
        c.write(`{"id":${JSON.parse(line).id},"ok":true}\n`);
      }
    });
  });
  await new Promise((r) => srv.listen(sockPath, r));
  const ld = await Leased.connect(sockPath);
  const odd = 'o"\\é\n\u2028😀';
  const cases = [
    ['lock', 'k', { wait_ms: 5, ttl_ms: 1.5, owner: odd, mode: 'read',
      detach: true, token: odd }],
    ['lock', odd, {}],
    ['lock', 'k', { wait_ms: -1, detach: false, extra: 1 }],
    ['lock', 'k', { wait_ms: NaN, owner: null }],
    ['lock', ['a', odd], { wait_ms: 7 }],
    ['unlock', 'k', { owner: odd, token: 't', mode: 'write' }],
    ['unlock', odd, { token: 7 }],
    ['unlock', 'k', { owner: null }],
    ['unlock', 'k', { token: 't', request_id: 'r-1' }],
    ['unlock', odd, { owner: 'o', request_id: odd }],
    ['unlock', ['a', 'b'], { token: 't', request_id: 'r-2' }],
  ];
  try {
    await within(WAIT_MS, Promise.all(cases.map(([op, k, o]) => ld[op](k, o))),
      'replies');
    assert.strictEqual(lines.length, cases.length);
    cases.forEach(([op, k, o], i) => {
      const names = op === 'lock'
        ? ['wait_ms', 'ttl_ms', 'owner', 'mode', 'detach', 'token']
        : ['owner', 'token', 'mode', 'request_id'];
      const want = { op, id: i + 1,
        ...(Array.isArray(k) ? { keys: k } : { key: k }) };
      for (const n of names) want[n] = o[n];
      if (op === 'lock' && o.owner === undefined && o.token === undefined) {
        const { owner } = JSON.parse(lines[i]);
        assert.match(owner, /^using-\d+-\d+$/, `case ${i}: an owner of its own`);
        want.owner = owner;
      }
      assert.strictEqual(lines[i], JSON.stringify(want), `case ${i}`);
    });
  } finally {
    ld.close();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('Pool spreads work and keeps using() on one connection', async () => {
  const pool = new Pool({ path: SOCK, size: 3 });
  try {
    const key = `${TAG}:pool`;
    let inside = 0;
    let count = 0;
    await Promise.all(Array.from({ length: 12 }, () =>
      pool.using(key, { wait_ms: 20000 }, async () => {
        inside++;
        assert.strictEqual(inside, 1, 'overlap');
        await new Promise((r) => setTimeout(r, 2));
        count++;
        inside--;
      })));
    assert.strictEqual(count, 12);
    assert.ok(pool.conns.length >= 1 && pool.conns.length <= 3);
  } finally {
    pool.close();
  }
});

test('withSemaphore() holds a permit for the callback', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  try {
    const key = `${TAG}:sem`;
    const out = await a.withSemaphore(key, 2, {}, async (grant) => {
      assert.ok(grant.token);
      assert.strictEqual(grant.available, 1);
      await b.withSemaphore(key, 2, { wait_ms: 100 }, async () => {
        assert.strictEqual((await a.semInfo(key, 2)).held, 2);
        await assert.rejects(b.withSemaphore(key, 2, () => 0),
          (e) => e.code === 'no_permit' && e.available === 0);
      });
      return 'done';
    });
    assert.strictEqual(out, 'done');
    assert.strictEqual((await b.semInfo(key, 2)).held, 0);
    await assert.rejects(a.semAcquire(key, 2, { permits: 3 }),
      (e) => e.code === 'bad_request');
  } finally {
    a.close();
    b.close();
  }
});

test('rateAcquire() grants, refuses with retry_after_ms and waits', async () => {
  const a = await Leased.connect(SOCK);
  const pool = new Pool({ path: SOCK, size: 1 });
  try {
    const key = `${TAG}:rate`;
    let r = await a.rateAcquire(key, 2, 60000, { burst: 2 });
    assert.deepStrictEqual([r.acquired, r.retry_after_ms], [true, 0]);
    r = await pool.rateAcquire(key, 2, 60000, { burst: 2 });
    assert.strictEqual(r.acquired, true);
    r = await a.rateAcquire(key, 2, 60000, { burst: 2 });
    assert.strictEqual(r.acquired, false);
    assert.ok(r.retry_after_ms > 0 && r.retry_after_ms <= 30000, `${r.retry_after_ms}`);
    await assert.rejects(a.rateAcquire(key, 2, 60000, { burst: 2, permits: 3 }),
      (e) => e.code === 'bad_request');
    const wkey = `${TAG}:rate-wait`;
    assert.strictEqual((await a.rateAcquire(wkey, 1, 300, { burst: 1 })).acquired, true);
    r = await a.rateAcquire(wkey, 1, 300, { burst: 1, wait_ms: 10000 });
    assert.strictEqual(r.acquired, true);
  } finally {
    a.close();
    pool.close();
  }
});

test('bloomCreate/Add/Check, and cached() with bloom skips the loader', async () => {
  const a = await Leased.connect(SOCK);
  const pool = new Pool({ path: SOCK, size: 1 });
  try {
    const f = `${TAG}:bloom`;
    const [k1, k2, k3] = [`${TAG}:b1`, `${TAG}:b2`, `${TAG}:b3`];
    let r = await a.bloomCreate(f, 100, 0.01);
    assert.deepStrictEqual([r.created, r.hashes], [true, 7]);
    assert.strictEqual((await pool.bloomCreate(f, 100, 0.01)).created, false);
    await assert.rejects(a.bloomCreate(f, 200, 0.01), (e) => e.code === 'bad_request');
    assert.deepStrictEqual(await a.bloomAdd(f, [k1, k2]), [true, true]);
    assert.deepStrictEqual(await pool.bloomAdd(f, k1), [false]);
    assert.deepStrictEqual(await a.bloomCheck(f, [k1, k2, k3]), [true, true, false]);
    assert.deepStrictEqual(await pool.bloomCheck(f, k3), [false]);
    await assert.rejects(a.bloomCheck(`${TAG}:no-such-filter`, k1),
      (e) => e.code === 'bad_request');
    let loads = 0;
    const loader = () => { loads++; return { n: 1 }; };
    assert.strictEqual(await a.cached(k3, loader, { bloom: f }), null);
    assert.strictEqual(await pool.cached(k3, loader, { bloom: f }), null);
    assert.strictEqual(loads, 0);
    assert.deepStrictEqual(await a.cached(k1, loader, { bloom: f }), { n: 1 });
    assert.strictEqual(loads, 1);
  } finally {
    a.close();
    pool.close();
  }
});

function redisDelKeys(names) {
  const [host, port] = REDIS.split(':');
  const parts = ['DEL', ...names].map((x) => Buffer.from(x));
  const cmd = [Buffer.from(`*${parts.length}\r\n`)];
  for (const p of parts) cmd.push(Buffer.from(`$${p.length}\r\n`), p, Buffer.from('\r\n'));
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ host, port: Number(port) }, () => {
      s.write(Buffer.concat(cmd));
    });
    s.once('data', (d) => {
      s.destroy();
      resolve(d.toString());
    });
    s.once('error', reject);
  });
}

test('withSemaphore() aborts its signal on sem_lost', { skip: !REDIS && 'LEASED_TEST_REDIS not set' },
  async () => {
    const ld = await Leased.connect(SOCK);
    try {
      const key = `${TAG}:semlost`;
      await ld.withSemaphore(key, 1, {}, async (grant, signal) => {
        const aborted = new Promise((r) => signal.addEventListener('abort', r));
        await redisDelKeys([`leased:lock:{${key}}:sem`, `leased:lock:{${key}}:sem:permits`]);
        await within(WAIT_MS, aborted, 'abort');
        assert.strictEqual(signal.reason.code, 'sem_lost');
        assert.strictEqual(signal.reason.event.token, grant.token);
      });
    } finally {
      ld.close();
    }
  });

async function waiters(ld, n) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const st = (await ld.call('stats')).stats;
    if (st.lock_waiters === n) return st;
    if (Date.now() > deadline) throw new Error(`lock_waiters never ${n}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test('an AbortSignal ends a lock or semaphore wait and takes nothing', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  try {
    const key = `${TAG}:abort`;
    const grant = await a.semAcquire(key, 1);
    assert.ok(grant.acquired);
    await a.lock(key);
    const before = (await a.call('stats')).stats.cancelled;

    const ac1 = new AbortController();
    const semWait = b.semAcquire(key, 1, { wait_ms: -1, signal: ac1.signal });
    const ac2 = new AbortController();
    const lockWait = b.lock(key, { wait_ms: -1, signal: ac2.signal });
    await waiters(a, 2);
    const t0 = Date.now();
    ac1.abort();
    ac2.abort();
    await assert.rejects(semWait, (e) => e.name === 'AbortError');
    await assert.rejects(lockWait, (e) => e.name === 'AbortError');
    assert.ok(Date.now() - t0 < 1000);
    const st = await waiters(a, 0);
    assert.strictEqual(st.cancelled, before + 2);

    // Freed now: neither aborted wait takes it.
    await a.semRelease(key, grant.token);
    await a.unlock(key);
    assert.strictEqual((await b.semInfo(key, 1)).held, 0);
    assert.strictEqual((await b.call('lock.info', { key })).locked, false);
    // Already aborted: nothing is sent.
    await assert.rejects(b.semAcquire(key, 1, { signal: AbortSignal.abort() }),
      (e) => e.name === 'AbortError');
  } finally {
    a.close();
    b.close();
  }
});

test('an unlock repeated with its request_id releases one hold', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  const key = `${TAG}:rid`;
  try {
    const held = await a.lock(key, { ttl_ms: 60000, detach: true });
    await a.lock(key, { token: held.token });
    const first = await a.unlock(key, { token: held.token, request_id: 'n1' });
    assert.deepStrictEqual([first.released, first.count], [false, 1]);
    const again = await b.unlock(key, { token: held.token, request_id: 'n1' });
    assert.deepStrictEqual([again.released, again.count], [false, 1]);
    const info = await b.call('lock.info', { key, token: held.token });
    assert.strictEqual(info.count, 1);
    await assert.rejects(b.unlock(key, { token: held.token, request_id: '' }),
      (e) => e.code === 'bad_request');
    const last = await b.unlock(key, { token: held.token, request_id: 'n2' });
    assert.strictEqual(last.released, true);
  } finally {
    a.close();
    b.close();
  }
});

test('keys that need escaping go through the short lock path intact', async () => {
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  try {
    for (const k of ['q"uote', 'back\\slash', 'new\nline', 'tab\t', 'é€😀', '\u0001']) {
      const key = `${TAG}:esc:${k}`;
      const held = await a.lock(key);
      assert.strictEqual(held.acquired, true, key);
      const info = await b.call('lock.info', { key });
      assert.strictEqual(info.locked, true, key);
      assert.strictEqual((await b.lock(key)).acquired, false, key);
      assert.strictEqual((await a.unlock(key)).released, true, key);
      // And by token, the other short unlock.
      const again = await a.lock(key);
      await assert.rejects(b.unlock(key, { token: '0'.repeat(32) }),
        (e) => e.code === 'not_held');
      assert.strictEqual((await a.unlock(key, { token: again.token })).released,
        true, key);
    }
  } finally {
    a.close();
    b.close();
  }
});

test('callers sharing a connection exclude each other; unlock and extend by key find it', async () => {
  const single = await Leased.connect(SOCK);
  const pool = await Leased.connect(SOCK, { connections: 2 });
  const other = await Leased.connect(SOCK);
  try {
    for (const [name, ld] of [['Leased', single], ['Pool', pool]]) {
      const key = `${TAG}:share:${name}`;
      const both = await Promise.all([ld.lock(key), ld.lock(key)]);
      assert.deepStrictEqual(both.map((r) => r.acquired).sort(), [false, true], name);
      const [held] = both.filter((r) => r.acquired);
      assert.strictEqual(held.count, 1, name);
      assert.strictEqual((await ld.lock(key)).acquired, false,
        `${name}: no reentry without an owner`);
      const ext = await ld.extend(key, 60000);
      assert.ok(ext.lease_ms > 30000, `${name}: extended by key: ${JSON.stringify(ext)}`);
      const info = await other.call('lock.info', { key, token: held.token });
      assert.ok(info.ttl_ms > 30000, `${name}: the caller's hold was extended`);
      assert.strictEqual((await ld.unlock(key)).released, true, name);
      assert.strictEqual((await other.lock(key)).acquired, true, `${name}: free`);
      await other.unlock(key);
      // A waiter granted after the holder's unlock is the one unlock(key) finds.
      const first = await ld.lock(key);
      const waiting = ld.lock(key, { wait_ms: WAIT_MS });
      assert.strictEqual((await ld.unlock(key)).released, true, name);
      const second = await waiting;
      assert.strictEqual(second.acquired, true, name);
      assert.notStrictEqual(second.token, first.token, name);
      assert.strictEqual((await ld.unlock(key)).released, true, `${name}: the waiter's hold`);
      await assert.rejects(ld.unlock(key), (e) => e.code === 'not_held', name);
      // Readers share; each unlock(key) of the side gives one read hold back.
      const reads = await Promise.all([ld.lock(key, { mode: 'read' }),
        ld.lock(key, { mode: 'read' })]);
      assert.ok(reads.every((r) => r.acquired), name);
      await ld.unlock(key, { mode: 'read' });
      assert.strictEqual((await other.lock(key, { mode: 'write' })).acquired, false, name);
      await ld.unlock(key, { mode: 'read' });
      assert.strictEqual((await other.lock(key, { mode: 'write' })).acquired, true,
        `${name}: both reads given back`);
      await other.unlock(key, { mode: 'write' });
      // A group, and its unlock by key in another order.
      const grp = [`${key}:g2`, `${key}:g1`];
      const gs = await Promise.all([ld.lock(grp), ld.lock(grp)]);
      assert.deepStrictEqual(gs.map((r) => r.acquired).sort(), [false, true],
        `${name}: a group`);
      assert.strictEqual((await ld.unlock(grp.slice().reverse())).released, true,
        `${name}: the group by key`);
      assert.strictEqual((await other.lock(grp)).acquired, true, `${name}: group free`);
      await other.unlock(grp);
      // A named owner reenters.
      await ld.lock(key, { owner: 'w' });
      assert.strictEqual((await ld.lock(key, { owner: 'w' })).count, 2, name);
      await ld.unlock(key, { owner: 'w' });
      assert.strictEqual((await ld.unlock(key, { owner: 'w' })).released, true, name);
    }
  } finally {
    single.close();
    pool.close();
    other.close();
  }
});

test('anonymous holds unlocked by token or lost are forgotten; a bounded number kept', async () => {
  const ld = await Leased.connect(SOCK);
  try {
    const keys = [0, 1, 2].map((i) => `${TAG}:forget:${i}`);
    const held = await Promise.all(keys.map((k) => ld.lock(k)));
    assert.strictEqual(ld.anon.size, 3);
    await ld.unlock(keys[0], { token: held[0].token });
    assert.strictEqual(ld.anon.size, 2, 'unlocked by its token');
    const lost = new Promise((resolve) => ld.once('lock_lost', resolve));
    await redisDel(keys[1]);
    assert.strictEqual((await within(WAIT_MS, lost, 'lock_lost')).key, keys[1]);
    assert.strictEqual(ld.anon.size, 1, 'lost');
    assert.strictEqual((await ld.unlock(keys[2])).released, true);
    assert.strictEqual(ld.anon.size, 0);
    // Locks left to expire: the oldest are forgotten past the bound.
    for (let i = 0; i < 20000; i++) ld.anon.keep(`k${TAG}:${i}`, undefined, `t${i}`);
    assert.ok(ld.anon.size > 0 && ld.anon.size <= 10000, String(ld.anon.size));
    assert.strictEqual(ld.anon.latest(`k${TAG}:0`, undefined, false), undefined);
    assert.strictEqual(ld.anon.latest(`k${TAG}:19999`, undefined, false), 't19999');
  } finally {
    ld.close();
  }
});

test('a Pool sends each key to one session: lock and unlock meet', async () => {
  const pool = await Leased.connect(SOCK, { connections: 3 });
  const other = await Leased.connect(SOCK);
  try {
    assert.ok(pool instanceof Pool);
    assert.strictEqual(pool.conns.length, 3);
    const keys = Array.from({ length: 30 }, (_, i) => `${TAG}:route:${i}`);
    const held = await Promise.all(keys.map((k) => pool.lock(k)));
    assert.ok(held.every((h) => h.acquired));
    // The keys are spread over the connections.
    assert.ok(pool.conns.filter((c) => c.nextId > 2).length >= 2);
    for (const k of keys) {
      assert.strictEqual((await other.lock(k)).acquired, false);
    }
    // Unlocked by key, without the token: only the holding session can.
    const un = await Promise.all(keys.map((k) => pool.unlock(k)));
    assert.ok(un.every((u) => u.released), JSON.stringify(un));
    // A group, given in another order at unlock, meets the same session.
    const grp = [`${TAG}:route:g1`, `${TAG}:route:g2`];
    assert.strictEqual((await pool.lock(grp)).acquired, true);
    assert.strictEqual((await pool.unlock(grp.slice().reverse())).released, true);
    // A connection that ends takes its locks; the next request for its
    // keys opens a new one.
    const k0 = keys[0];
    assert.strictEqual((await pool.lock(k0)).acquired, true);
    for (const c of pool.conns) c.close();
    const again = await pool.lock(k0, { wait_ms: 5000 });
    assert.strictEqual(again.acquired, true);
    assert.strictEqual((await pool.unlock(k0)).released, true);
  } finally {
    pool.close();
    other.close();
  }
});

test('requests written in one tick go out in one write', async () => {
  const ld = await Leased.connect(SOCK);
  try {
    let writes = 0;
    const orig = ld.socket.write.bind(ld.socket);
    ld.socket.write = (...args) => {
      writes++;
      return orig(...args);
    };
    const keys = Array.from({ length: 20 }, (_, i) => `${TAG}:tick:${i}`);
    const held = await Promise.all(keys.map((k) => ld.lock(k)));
    assert.ok(held.every((h) => h.acquired));
    assert.strictEqual(writes, 1);
    await Promise.all(keys.map((k) => ld.unlock(k)));
    // An unlock right before close() still goes out.
    const k = `${TAG}:tick:close`;
    await ld.lock(k);
    ld.unlock(k).catch(() => {});
    ld.close();
    const b = await Leased.connect(SOCK);
    try {
      assert.strictEqual((await b.lock(k, { wait_ms: 5000 })).acquired, true);
    } finally {
      b.close();
    }
  } finally {
    ld.close();
  }
});

async function rwlockDaemon(t) {
  const probe = await Leased.connect(SOCK, { client: 'test_api' });
  const has = probe.features.includes('rwlock');
  probe.close();
  if (!has) t.skip('this leased does not announce "rwlock" in hello');
  return has;
}

test('rwlock(): readers share, a writer is refused while read-held', async (t) => {
  if (!await rwlockDaemon(t)) return;
  const a = await Leased.connect(SOCK);
  const b = await Leased.connect(SOCK);
  const c = await Leased.connect(SOCK);
  try {
    const key = `${TAG}:rw`;
    const ra = await a.rwlock(key).readLock();
    const rb = await b.rwlock(key).readLock({ wait_ms: 1000 });
    assert.strictEqual(ra.acquired, true);
    assert.strictEqual(rb.acquired, true);
    assert.strictEqual((await c.rwlock(key).writeLock({ wait_ms: 0 })).acquired,
      false);
    assert.strictEqual((await a.rwlock(key).unlockRead()).released, true);
    assert.strictEqual((await c.rwlock(key).writeLock()).acquired, false);
    assert.strictEqual((await b.rwlock(key).unlockRead()).released, true);
    const w = await c.rwlock(key).writeLock();
    assert.strictEqual(w.acquired, true);
    assert.ok(w.fence > 0);
    assert.strictEqual((await a.rwlock(key).readLock()).acquired, false);
    assert.strictEqual((await c.rwlock(key).unlockWrite()).released, true);
  } finally {
    a.close();
    b.close();
    c.close();
  }
});

test('using() with mode read: two readers at once, no writer meanwhile',
  async (t) => {
    if (!await rwlockDaemon(t)) return;
    const a = await Leased.connect(SOCK);
    const pool = await Leased.connect(SOCK, { connections: 2 });
    try {
      const key = `${TAG}:rwusing`;
      let inside = 0;
      let both = false;
      let release;
      const gate = new Promise((r) => { release = r; });
      const reader = (ld) => ld.using(key, { mode: 'read' }, async (signal) => {
        assert.strictEqual(signal.aborted, false);
        inside++;
        if (inside === 2) {
          both = true;
          const wr = await pool.rwlock(key).writeLock({ wait_ms: 0 });
          assert.strictEqual(wr.acquired, false);
          release();
        }
        await gate;
        inside--;
      });
      await within(WAIT_MS, Promise.all([reader(a), reader(pool)]), 'readers');
      assert.strictEqual(both, true);
      // Both read holds were unlocked (with their mode): a writer gets it.
      const got = await pool.rwlock(key).usingWrite({ wait_ms: 5000 },
        async (signal, held) => held.fence);
      assert.ok(got > 0);
    } finally {
      a.close();
      pool.close();
    }
  });

test('blank lines, replies cut anywhere and several in one chunk', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  const sockPath = path.join(dir, 's.sock');
  // A peer that answers three pings with its bytes cut at odd places.
  const srv = net.createServer((c) => {
    let buf = '';
    c.on('data', (d) => {
      buf += d.toString();
      const ids = buf.split('\n').filter((l) => l).map((l) => JSON.parse(l).id);
      if (ids.length < 3) return;
      const v = 'é€😀';
      const text = `  \r\n\n{"id":${ids[0]},"ok":true,"v":"${v}"}\n` +
        `{"id":${ids[1]},"ok":true,"v":"${v}"}\n{"id":${ids[2]},"ok":true,"v":"${v}"}\n`;
      const bytes = Buffer.from(text);
      // Cut inside the first multi-byte character and inside a line.
      const cut1 = bytes.indexOf(Buffer.from('€')) + 1;
      c.write(bytes.subarray(0, cut1));
      setTimeout(() => c.write(bytes.subarray(cut1)), 20);
    });
  });
  await new Promise((r) => srv.listen(sockPath, r));
  const ld = await Leased.connect(sockPath);
  try {
    const got = await within(WAIT_MS, Promise.all([ld.call('ping'),
      ld.call('ping'), ld.call('ping')]), 'replies');
    assert.deepStrictEqual(got.map((r) => r.v), ['é€😀', 'é€😀', 'é€😀']);
  } finally {
    ld.close();
    srv.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('npm pack --dry-run', (t) => {
  const npm = spawnSync('npm', ['--version'], { encoding: 'utf8' });
  if (npm.error || npm.status !== 0) {
    t.skip('npm is not installed');
    return;
  }
  // A cache of its own: offline, and nothing left in $HOME.
  const cache = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-npm-'));
  let out;
  try {
    out = execFileSync('npm', ['pack', '--dry-run', '--json', '--offline'], {
      cwd: __dirname, encoding: 'utf8',
      env: { ...process.env, npm_config_update_notifier: 'false',
             npm_config_cache: cache },
    });
  } finally {
    fs.rmSync(cache, { recursive: true, force: true });
  }
  const files = JSON.parse(out)[0].files.map((f) => f.path).sort();
  assert.deepStrictEqual(files, ['README.md', 'leased.d.ts', 'leased.js', 'package.json']);
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// N concurrent cached() of one key on LD, each with a loader of MS ms;
// resolves with the loader's calls and the values.
async function herd(ld, key, n, ms, opts) {
  let calls = 0;
  const values = await Promise.all(Array.from({ length: n }, () =>
    ld.cached(key, async () => {
      calls++;
      await sleep(ms);
      return { loaded: key };
    }, opts)));
  return { calls, values };
}

test('a Pool keeps single flight: 20 cached() of one key, 1 load', async () => {
  const pool = await Leased.connect(SOCK, { connections: 4 });
  try {
    const key = `${TAG}:herd`;
    const { calls, values } = await within(WAIT_MS,
      herd(pool, key, 20, 500), 'cached()');
    assert.strictEqual(calls, 1);
    assert.ok(values.every((v) => v.loaded === key), JSON.stringify(values));
  } finally {
    pool.close();
  }
});

test('cached() waits wait_ms for a fill: a loader slower than cache.wait_ms',
  async () => {
    const pool = await Leased.connect(SOCK, { connections: 2 });
    try {
      // 3500 ms: past the daemon's cache.wait_ms (3000), within its
      // cache.fill_lease_ms (5000).
      const slow = await within(WAIT_MS,
        herd(pool, `${TAG}:slowfill`, 20, 3500, { wait_ms: 8000 }), 'slow');
      assert.strictEqual(slow.calls, 1);
      // wait_ms 0: nobody waits for the holder's fill; each loads.
      const eager = await within(WAIT_MS,
        herd(pool, `${TAG}:nowait`, 5, 300, { wait_ms: 0 }), 'eager');
      assert.strictEqual(eager.calls, 5);
    } finally {
      pool.close();
    }
  });

// The entry of KEY as a plain read: {hit, value, lease}.
function peek(ld, key) {
  return ld.call('cache.get', { key, lease: false });
}

// A lease for KEY at once (wait_ms 0): the last fill lease was given
// back. Released after.
async function leaseFree(ld, key) {
  const got = await ld.call('cache.get', { key, wait_ms: 0 });
  if (got.lease) await ld.call('cache.release', { key, lease: got.lease });
  return !got.hit && typeof got.lease === 'string';
}

test('cached() stores any JSON value and gives the lease back on failure',
  async () => {
    const ld = await Leased.connect(SOCK);
    try {
      const key = `${TAG}:obj`;
      const user = { id: 7, name: 'Grace', tags: ['a'] };
      assert.deepStrictEqual(await ld.cached(key, () => user), user);
      assert.strictEqual((await peek(ld, key)).value, JSON.stringify(user));
      assert.deepStrictEqual(await ld.cached(key, () => assert.fail('loaded')),
        user);
      for (const v of [42, ['x'], 'text', false]) {
        const k = `${key}:${JSON.stringify(v)}`;
        assert.deepStrictEqual(await ld.cached(k, () => v), v);
        assert.deepStrictEqual(await ld.cached(k, () => null), v);
      }

      // Refused after the load, each with its lease given back.
      const bad = [
        ['undefined', () => undefined, {}, /undefined/],
        ['raw number', () => 7, { serializer: RAW }, /no string/],
        ['throwing serializer', () => 'v',
          { serializer: { stringify() { throw new Error('nope'); } } }, /nope/],
        ['loader throws', () => { throw new Error('db down'); }, {}, /db down/],
        // Over limits.max_request_bytes: the daemon refuses the fill.
        ['fill refused', () => 'x'.repeat(1100000), {}, /too_large/],
      ];
      for (const [what, loader, opts, re] of bad) {
        const k = `${key}:bad:${what}`;
        await assert.rejects(ld.cached(k, loader, opts), re, what);
        assert.strictEqual(await leaseFree(ld, k), true, what);
      }

      // RAW: strings as they are, as other clients and leasectl write them.
      const rk = `${key}:raw`;
      assert.strictEqual(await ld.cached(rk, () => 'plain', { serializer: RAW }),
        'plain');
      assert.strictEqual((await peek(ld, rk)).value, 'plain');
      await assert.rejects(ld.cached(rk, () => 'x'),
        (e) => e instanceof LeasedError && e.code === 'invalid' &&
          /RAW/.test(e.message));
      const rawLd = await Leased.connect(SOCK, { serializer: RAW });
      try {
        assert.strictEqual(await rawLd.cached(rk, () => 'x'), 'plain');
      } finally {
        rawLd.close();
      }
    } finally {
      ld.close();
    }
  });

test('warm() stores entries as cached() reads them, each with its result',
  async () => {
    const ld = await Leased.connect(SOCK);
    const pool = await Leased.connect(SOCK, { connections: 2 });
    try {
      for (const [i, c] of [ld, pool].entries()) {
        const k = `${TAG}:warm${i}`;
        const user = { id: 7, name: 'Grace' };
        const r = await c.warm([
          { key: `${k}:a`, value: user },
          { key: `${k}:n`, value: null, ttl_ms: 30000 },
          { key: '', value: 'x' },
          { key: `${k}:t`, value: 'v', ttl_ms: 0 },
        ], { ttl_ms: 60000 });
        assert.strictEqual(r.stored, 2);
        assert.deepStrictEqual(r.results.map((x) => x.ok),
          [true, true, false, false]);
        assert.strictEqual(r.results[2].error.code, 'bad_request');
        assert.strictEqual(r.results[3].error.code, 'bad_request');
        assert.deepStrictEqual(await c.cached(`${k}:a`,
          () => assert.fail('loaded')), user);
        const n = await peek(c, `${k}:n`);
        assert.strictEqual(n.hit, true);
        assert.strictEqual(n.value, null);
      }
      for (const bad of [[], null, 'x', [{ value: 1 }], [{ key: 'k' }]]) {
        await assert.rejects(ld.warm(bad), (e) => e instanceof LeasedError &&
          e.code === 'invalid', JSON.stringify(bad));
      }
    } finally {
      ld.close();
      pool.close();
    }
  });

test('read() carries the version; write() and fill() take if_version',
  async () => {
    const ld = await Leased.connect(SOCK);
    const pool = await Leased.connect(SOCK, { connections: 2 });
    try {
      for (const [i, c] of [ld, pool].entries()) {
        const k = `${TAG}:ver${i}`;
        assert.deepStrictEqual(await c.read(`${k}:a`),
          { hit: false, value: null, version: 0, lease: null });
        const w1 = await c.write(`${k}:a`, { n: 1 }, { if_version: 0 });
        assert.strictEqual(w1.stored, true);
        assert.ok(w1.version > 0);
        const r1 = await c.read(`${k}:a`);
        assert.deepStrictEqual(r1, { hit: true, value: { n: 1 },
          version: w1.version, lease: null });
        // Compare-and-set: the second writer over the same version loses.
        const w2 = await c.write(`${k}:a`, { n: 2 },
          { if_version: r1.version });
        assert.strictEqual(w2.stored, true);
        assert.ok(w2.version > w1.version);
        assert.deepStrictEqual(await c.write(`${k}:a`, { n: 9 },
          { if_version: r1.version }), { stored: false, version: w2.version });
        assert.deepStrictEqual((await c.read(`${k}:a`)).value, { n: 2 });
        // A fill under the lease of a miss, over version 0.
        const miss = await c.read(`${k}:f`, { lease: true });
        assert.ok(miss.lease);
        assert.deepStrictEqual(await c.fill(`${k}:f`, miss.lease, 'x',
          { if_version: 3 }), { stored: false, version: 0 });
        const f = await c.fill(`${k}:f`, miss.lease, null, { if_version: 0 });
        assert.strictEqual(f.stored, true);
        const got = await c.read(`${k}:f`);
        assert.deepStrictEqual([got.hit, got.value, got.version],
          [true, null, f.version]);
      }
      await assert.rejects(ld.write(`${TAG}:ver`, 'x', { if_version: -1 }),
        (e) => e instanceof LeasedError && e.code === 'bad_request');
    } finally {
      ld.close();
      pool.close();
    }
  });

test('a key is a string, keys a string or an array of strings', async () => {
  const ld = await Leased.connect(SOCK);
  const pool = await Leased.connect(SOCK, { connections: 2 });
  try {
    const key = `${TAG}:inv`;
    for (const c of [ld, pool]) {
      await c.cached(key, () => 'v');
      assert.strictEqual((await c.invalidate(key, { delay_ms: 0 })).deleted, 1);
      assert.strictEqual((await peek(c, key)).hit, false);
    }
    const refused = [
      (c) => c.invalidate(42), (c) => c.invalidate(new Set([key])),
      (c) => c.invalidate([]), (c) => c.invalidate([key, 1]),
      (c) => c.invalidate(null), (c) => c.lock(7), (c) => c.lock([]),
      (c) => c.unlock({ key }), (c) => c.extend([1], 1000),
      (c) => c.using(Buffer.from(key), () => assert.fail('ran')),
      (c) => c.cached([key], () => assert.fail('loaded')),
      (c) => c.semAcquire(undefined, 1), (c) => c.semInfo([key], 1),
    ];
    for (const c of [ld, pool]) {
      for (const call of refused) {
        await assert.rejects(call(c), (e) => e instanceof LeasedError &&
          e.code === 'invalid' && /must be a string/.test(e.message),
          call.toString());
      }
    }
  } finally {
    ld.close();
    pool.close();
  }
});

// A peer that answers every request with ok and acquired, until
// restart() drops every connection and listens again at the same path,
// as a restarted daemon does; stop() leaves nothing listening.
async function restartingPeer(sockPath) {
  const conns = new Set();
  const listen = () => {
    const srv = net.createServer((c) => {
      conns.add(c);
      c.on('close', () => conns.delete(c));
      let buf = '';
      c.on('data', (d) => {
        buf += d.toString();
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const req = JSON.parse(buf.slice(0, nl));
          buf = buf.slice(nl + 1);
          c.write(JSON.stringify({ id: req.id, ok: true, acquired: true,
            token: 't', fence: 1, released: true }) + '\n');
        }
      });
    });
    return new Promise((r) => srv.listen(sockPath, () => r(srv)));
  };
  let srv = await listen();
  const stop = () => {
    for (const c of conns) c.destroy();
    return new Promise((r) => srv.close(r));
  };
  return {
    stop,
    async restart() {
      await stop();
      srv = await listen();
    },
  };
}

function closed(ld) {
  return ld.closed ? Promise.resolve() : new Promise((r) => ld.once('close', r));
}

test('after a restart: scopes end quietly, a Pool reconnects, errors are LeasedErrors',
  async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
    const sockPath = path.join(dir, 's.sock');
    const peer = await restartingPeer(sockPath);
    const ld = await Leased.connect(sockPath);
    const pool = await Leased.connect(sockPath, { connections: 2 });
    try {
      let inside;
      const entered = new Promise((r) => { inside = r; });
      const scope = ld.using('k', async (signal) => {
        inside();
        await within(WAIT_MS, new Promise((r) =>
          signal.addEventListener('abort', r)), 'abort');
        return signal.reason.code;
      });
      const plain = ld.withLock('k2', {}, async () => {
        await entered;
        await closed(ld);
      });
      await entered;
      await peer.restart();
      assert.strictEqual(await within(WAIT_MS, scope, 'using'),
        'connection_closed');
      await assert.rejects(plain, (e) => e instanceof LeasedError &&
        e.code === 'connection_closed');
      await assert.rejects(ld.lock('k'), (e) => e instanceof LeasedError &&
        e.code === 'connection_closed' && /restarted/.test(e.message));

      await Promise.all(pool.slots.map(closed));
      assert.strictEqual((await pool.lock('k')).acquired, true);
      assert.strictEqual((await pool.call('ping')).ok, true);

      // Not there at all: the error says where and what to check.
      await peer.stop();
      await Promise.all(pool.slots.map(closed));
      await assert.rejects(pool.lock('k'), (e) => e instanceof LeasedError &&
        e.code === 'connect' && e.message.includes(sockPath) &&
        /is leased running/.test(e.message) && /LEASED_SOCKET/.test(e.message));
    } finally {
      ld.close();
      pool.close();
      await peer.stop().catch(() => {});
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

test('connection errors name the target and what to check', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-api-'));
  try {
    const missing = path.join(dir, 'missing.sock');
    await assert.rejects(Leased.connect(missing), (e) =>
      e instanceof LeasedError && e.code === 'connect' &&
      e.cause.code === 'ENOENT' && e.message.includes(missing) &&
      /is leased running/.test(e.message) && /LEASED_SOCKET/.test(e.message));
    const port = await new Promise((r) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const p = s.address().port;
        s.close(() => r(p));
      });
    });
    await assert.rejects(Leased.connect(`127.0.0.1:${port}`), (e) =>
      e.code === 'connect' && e.message.includes(`127.0.0.1:${port}`) &&
      /listen\.tcp/.test(e.message));

    // A socket this user may not open: as nobody when run as root, in
    // a directory of /tmp (TMPDIR may be private to this user).
    const open = fs.mkdtempSync('/tmp/leased-api-');
    const sockPath = path.join(open, 'closed.sock');
    const srv = net.createServer();
    await new Promise((r) => srv.listen(sockPath, r));
    try {
      fs.chmodSync(sockPath, 0o600);
      fs.chmodSync(open, 0o755);
      // A copy beside the socket: nobody may not read the source tree
      // (a checkout in a home directory of mode 0700).
      const lib = path.join(open, 'leased.js');
      fs.copyFileSync(path.join(__dirname, 'leased.js'), lib);
      fs.chmodSync(lib, 0o644);
      const script = `require(${JSON.stringify(lib)})` +
        `.Leased.connect(${JSON.stringify(sockPath)}).then(() => ` +
        'console.log("connected"), (e) => console.log(e.code, e.message))';
      const opts = { encoding: 'utf8', timeout: WAIT_MS };
      if (process.getuid() === 0) {
        Object.assign(opts, { uid: 65534, gid: 65534 });
      } else {
        fs.chmodSync(sockPath, 0);
      }
      const child = spawnSync(process.execPath, ['-e', script], opts);
      const out = child.stdout;
      assert.match(out, /^connect .*EACCES.*socket's group/,
        `${out} ${child.stderr}`);
      assert.ok(out.includes(sockPath), out);
    } finally {
      srv.close();
      fs.rmSync(open, { recursive: true, force: true });
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('connect() with connections gives a Pool, also of one; Pool.using(key, fn)',
  async () => {
    const pool = await Leased.connect(SOCK, { connections: 1 });
    try {
      assert.ok(pool instanceof Pool);
      const key = `${TAG}:pool1`;
      assert.strictEqual(await pool.using(key, async (signal, held) => {
        assert.strictEqual(signal.aborted, false);
        return held.acquired;
      }), true);
      assert.strictEqual((await pool.lock(key)).acquired, true);
    } finally {
      pool.close();
    }
  });

test('package.json declares the types\' one dependency, @types/node', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(__dirname, 'package.json')));
  const types = fs.readFileSync(path.join(__dirname, pkg.types), 'utf8');
  assert.match(types, /reference types="node"/);
  assert.ok(pkg.peerDependencies['@types/node']);
  assert.strictEqual(pkg.peerDependenciesMeta['@types/node'].optional, true);
  assert.strictEqual(pkg.dependencies, undefined, 'no runtime dependencies');
});
