'use strict';
// The client's own CPU per uncontended lock+unlock pair (make
// bench-clientcpu, clientcpu.sh): WORKERS async workers, each on its own
// key, do PAIRS pairs in all; the process's user+system CPU time over
// them (process.cpuUsage) divided by PAIRS. CPU time, unlike pairs/s,
// hardly depends on what else the machine runs.
//
//   node clientcpu.js --client=PATH/leased.js --sock=PATH [--workers=50]
//       [--pairs=100000] [--conns=W|--pool=N] [--label=TEXT]
//   node clientcpu.js --peer=semaphore --redis=PORT ...
//
// --conns=W (the default): one connection per worker, as in
// bench-peers; --pool=N: one Pool of N connections shared by all.
// --peer=semaphore measures redis-semaphore's Mutex over ioredis (one
// connection per worker) the same way. One JSON line on stdout.

const path = require('path');
const { performance } = require('perf_hooks');

const opt = {};
for (const a of process.argv.slice(2)) {
  const m = /^--([^=]+)=(.*)$/.exec(a);
  if (!m) throw new Error(`bad argument ${a}`);
  opt[m[1]] = m[2];
}
const workers = Number(opt.workers || 50);
const pairs = Number(opt.pairs || 100000);
const warm = Math.min(pairs, Number(opt.warm || 2000));

function leasedSide() {
  const mod = require(path.resolve(opt.client));
  return {
    async setup() {
      if (opt.pool) {
        const p = new mod.Pool({ path: opt.sock, size: Number(opt.pool) });
        return Array.from({ length: workers }, () => p);
      }
      const cs = [];
      for (let w = 0; w < workers; w++) cs.push(await mod.Leased.connect(opt.sock));
      return cs;
    },
    async pair(c, key) {
      const r = await c.lock(key);
      if (!r.acquired) throw new Error(`${key} not acquired`);
      const u = await c.unlock(key, opt.pool ? { token: r.token } : undefined);
      // A lock that stayed held would be taken again reentrantly.
      if (!u.released) throw new Error(`${key} not released`);
    },
    teardown(cs) {
      for (const c of new Set(cs)) c.close();
    },
  };
}

function semaphoreSide() {
  const Redis = require('ioredis');
  const { Mutex } = require('redis-semaphore');
  return {
    async setup() {
      const cs = [];
      for (let w = 0; w < workers; w++) {
        const r = new Redis({ host: '127.0.0.1', port: Number(opt.redis) });
        await r.ping();
        cs.push(r);
      }
      return cs;
    },
    async pair(r, key) {
      const m = new Mutex(r, key, { lockTimeout: 10000 });
      await m.acquire();
      await m.release();
    },
    teardown(cs) {
      for (const r of cs) r.disconnect();
    },
  };
}

async function run(side, cs, n, tag) {
  let left = n;
  await Promise.all(cs.map(async (c, w) => {
    const key = `clientcpu:${tag}:${process.pid}:${w}`;
    while (left > 0) {
      left--;
      await side.pair(c, key);
    }
  }));
}

async function main() {
  const side = opt.peer === 'semaphore' ? semaphoreSide() : leasedSide();
  const cs = await side.setup();
  await run(side, cs, warm, 'warm');
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await run(side, cs, pairs, 'm');
  const t1 = performance.now();
  const c = process.cpuUsage(c0);
  side.teardown(cs);
  process.stdout.write(JSON.stringify({
    lang: 'node', label: opt.label || opt.peer || 'leased', workers,
    pairs, conns: opt.pool ? `pool ${opt.pool}` : workers,
    cpu_us_per_pair: (c.user + c.system) / pairs,
    pairs_per_s: pairs / ((t1 - t0) / 1000),
  }) + '\n');
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`clientcpu.js: ${e && e.stack}\n`);
  process.exit(1);
});
