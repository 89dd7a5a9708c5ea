'use strict';
// The Node side of make bench-peers: one cell per run, one JSON line on
// stdout.
//
//   node peers.js lock --contender=leased|leased-pool|redlock|semaphore|
//       redlock-shared|semaphore-shared [--pool=2]
//       --shape=uncontended|contended --workers=50 --dur=5 --warm=0.5
//       --retry=default|tuned --tuned-ms=10 --hold-ms=1 --sock=PATH
//       --redis=PORT --referee=PORT --tag=RUNID [--overlap=local|redis]
//   node peers.js storm --contender=leased|cachemgr --readers=25
//       --key=K --loader-ms=50 --sock=PATH
//       --redis=PORT --referee=PORT
//
// The referee is a second redis-server that only the bench uses: the
// loader-call counter of the miss storm (which spans processes) lives
// there. All the workers of a lock cell are in this one process and
// thread, so its overlap counter is a count of holders per key here:
// exact, and it costs every contender next to nothing
// (--overlap=redis counts on the referee instead: INCR on entry, DECR on
// exit, two round trips per hold that every contender pays alike).
//
// Two ways to connect, each the same for leased and the peers: a
// connection per worker (leased, redlock, semaphore), or one client
// object per process shared by all the workers (leased-pool: one Pool of
// --pool connections; *-shared: one ioredis client), which is how an app
// with many async callers uses any of them.

const { performance } = require('perf_hooks');
const Redis = require('ioredis');
const ld = require('./adapters.js');

const argv = process.argv.slice(2);
const mode = argv.shift();
const opt = {};
for (const a of argv) {
  const m = /^--([^=]+)=(.*)$/.exec(a);
  if (!m) {
    throw new Error(`bad argument ${a}`);
  }
  opt[m[1]] = m[2];
}
const num = (k, d) => (opt[k] === undefined ? d : Number(opt[k]));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

function redisClient(port) {
  return new Redis({ host: '127.0.0.1', port: Number(port),
    maxRetriesPerRequest: 1, enableOfflineQueue: true });
}

// The ioredis connection of a peer's worker: its own, or, for the
// *-shared contenders, one client for all the workers of the process, as
// an app creates one ioredis client and hands it to Redlock or to every
// Mutex.
let sharedRedis = null;
async function peerRedis(shared) {
  if (!shared) {
    const r = redisClient(opt.redis);
    await r.ping();
    return r;
  }
  if (!sharedRedis) {
    sharedRedis = redisClient(opt.redis);
    await sharedRedis.ping();
  }
  return sharedRedis;
}

// ---------------------------------------------------------------- locks
// A contender: setup() -> worker state; acquire(state, key) -> handle or
// null (gave up, try again); release(state, handle).
const WAIT_MS = 10000;   // leased: one request waits this long at most

function leasedContender() {
  return {
    async setup() {
      return { c: await ld.connect(opt.sock) };
    },
    async acquire(s, key, contended) {
      const r = await ld.lock(s.c, key, contended ? WAIT_MS : 0);
      return r.acquired ? { fence: r.fence } : null;
    },
    async release(s, key) {
      await ld.unlock(s.c, key);
    },
    teardown(s) {
      ld.close(s.c);
    },
    hasFence: true,
  };
}

// All workers share one Pool of POOL connections (the key of each
// worker routes its lock and unlock to one session), as an app with many
// concurrent callers would use the client.
function leasedPoolContender(size) {
  let shared = null;
  const base = leasedContender();
  return {
    ...base,
    async setup() {
      if (!shared) shared = ld.pool(opt.sock, size);
      return { c: await shared };
    },
    teardown(s) {
      ld.close(s.c);
    },
  };
}

function redlockContender(tuned, tunedMs, shared) {
  const Redlock = require('redlock').default;
  const { ExecutionError } = require('redlock');
  // Tuned: only the interval (and its jitter with it); the retry count
  // stays at the default, a give-up is simply tried again.
  const settings = tuned ? { retryDelay: tunedMs,
    retryJitter: Math.max(1, Math.round(tunedMs / 2)) } : {};
  return {
    async setup() {
      const r = await peerRedis(shared);
      return { r, rl: new Redlock([r], settings) };
    },
    async acquire(s, key) {
      try {
        return await s.rl.acquire([key], 10000);
      } catch (e) {
        if (e instanceof ExecutionError) {
          return null;
        }
        throw e;
      }
    },
    async release(s, key, h) {
      await h.release();
    },
    teardown(s) {
      s.r.disconnect();
    },
    hasFence: false,
  };
}

function semaphoreContender(tuned, tunedMs, shared) {
  const { Mutex, TimeoutError } = require('redis-semaphore');
  const o = { lockTimeout: 10000 };
  if (tuned) {
    o.retryInterval = tunedMs;
  }
  return {
    async setup() {
      return { r: await peerRedis(shared) };
    },
    async acquire(s, key) {
      const m = new Mutex(s.r, key, o);
      try {
        await m.acquire();
        return m;
      } catch (e) {
        if (e instanceof TimeoutError) {
          return null;
        }
        throw e;
      }
    },
    async release(s, key, h) {
      await h.release();
    },
    teardown(s) {
      s.r.disconnect();
    },
    hasFence: false,
  };
}

function pct(sorted, p) {
  if (sorted.length === 0) {
    return null;
  }
  const i = Math.min(sorted.length - 1,
    Math.ceil(p / 100 * sorted.length) - 1);
  return sorted[Math.max(0, i)];
}

async function lockCell() {
  const contended = opt.shape === 'contended';
  const tuned = opt.retry === 'tuned';
  const tunedMs = num('tuned-ms', 10);
  const workers = num('workers', 50);
  const dur = num('dur', 5) * 1000;
  const warm = num('warm', 0.5) * 1000;
  const holdMs = num('hold-ms', 1);
  const tag = opt.tag || String(process.pid);
  const shared = /-shared$/.test(opt.contender);
  const who = opt.contender.replace(/-shared$/, '');
  const c = opt.contender === 'leased' ? leasedContender()
    : opt.contender === 'leased-pool' ? leasedPoolContender(num('pool', 2))
      : who === 'redlock' ? redlockContender(tuned, tunedMs, shared)
        : who === 'semaphore' ? semaphoreContender(tuned, tunedMs, shared)
          : null;
  if (!c) {
    throw new Error(`unknown contender ${opt.contender}`);
  }
  const onRedis = (opt.overlap || 'local') === 'redis';
  const ref = onRedis ? redisClient(opt.referee) : null;
  if (ref) {
    await ref.ping();
  }
  const insideN = new Map(); // key -> holders inside now (local count)
  const states = [];
  for (let w = 0; w < workers; w++) {
    states.push(await c.setup());
  }
  const keyOf = (w) => (contended ? `peers:${tag}:one`
    : `peers:${tag}:w${w}`);
  const grants = new Array(workers).fill(0);
  const lastFence = new Map();
  const lat = [];
  let done = 0;
  let gaveUp = 0;
  let overlaps = 0;
  let backwards = 0;
  let handoffs = 0;
  let lastHolder = -1;
  let errors = 0;
  let firstError = null;
  const t0 = now();
  const cpu0 = process.cpuUsage();
  let pairs = 0;
  const ws = t0 + warm;
  const we = ws + dur;

  async function worker(w) {
    const s = states[w];
    const key = keyOf(w);
    const rkey = `inside:${key}`;
    while (now() < we) {
      const a0 = now();
      let h = null;
      while (h === null && now() < we + WAIT_MS) {
        try {
          h = await c.acquire(s, key, contended);
        } catch (e) {
          errors++;
          firstError = firstError || String(e && e.message);
          await sleep(10);
          continue;
        }
        if (h === null) {
          gaveUp++;
        }
      }
      if (h === null) {
        break;
      }
      const a1 = now();
      let inside;
      if (ref) {
        inside = await ref.incr(rkey);
      } else {
        inside = (insideN.get(key) || 0) + 1;
        insideN.set(key, inside);
      }
      if (inside > 1) {
        overlaps++;
      }
      if (c.hasFence) {
        const f = Number(h.fence);
        const prev = lastFence.get(key);
        if (prev !== undefined && !(f > prev)) {
          backwards++;
        }
        lastFence.set(key, f);
      }
      const counted = a1 >= ws && a1 <= we;
      if (contended) {
        if (counted && lastHolder !== -1 && lastHolder !== w) {
          handoffs++;
        }
        lastHolder = w;
        await sleep(holdMs);
      }
      if (ref) {
        await ref.decr(rkey);
      } else {
        insideN.set(key, insideN.get(key) - 1);
      }
      const r0 = now();
      try {
        await c.release(s, key, h);
      } catch (e) {
        errors++;
        firstError = firstError || String(e && e.message);
      }
      const r1 = now();
      pairs++;
      if (contended ? counted : (a0 >= ws && r1 <= we)) {
        done++;
        grants[w]++;
        // Uncontended: the pair (lock call + unlock call); contended:
        // the wait for the grant.
        lat.push(contended ? a1 - a0 : (a1 - a0) + (r1 - r0));
      }
    }
  }

  await Promise.all(states.map((_, w) => worker(w)));
  const cpu = process.cpuUsage(cpu0);
  for (const s of states) {
    c.teardown(s);
  }
  if (ref) {
    ref.disconnect();
  }
  lat.sort((x, y) => x - y);
  const mean = done / workers;
  const out = {
    lang: 'node', kind: 'lock', contender: opt.contender,
    shape: opt.shape, retry: opt.retry || 'default', workers,
    dur_s: dur / 1000, count: done, per_s: done / (dur / 1000),
    p50_ms: pct(lat, 50), p99_ms: pct(lat, 99),
    max_ms: lat.length ? lat[lat.length - 1] : null,
    handoffs_s: contended ? handoffs / (dur / 1000) : null,
    grants_min: Math.min(...grants), grants_max: Math.max(...grants),
    grants_mean: mean,
    grants_dev_pct: mean > 0 ? Math.max(...grants.map(
      (g) => Math.abs(g - mean))) / mean * 100 : null,
    overlaps, fence_backwards: c.hasFence ? backwards : null,
    gave_up: gaveUp, errors, first_error: firstError,
    // The whole process (the contender and the bench around it) per
    // pair, warm-up included.
    client_cpu_us: pairs ? (cpu.user + cpu.system) / pairs : null,
    overlap_counter: ref ? 'redis' : 'local',
  };
  process.stdout.write(JSON.stringify(out) + '\n');
}

// ---------------------------------------------------------------- storm
async function stormCell() {
  const readers = num('readers', 25);
  const loaderMs = num('loader-ms', 50);
  const key = opt.key;
  const ref = redisClient(opt.referee);
  await ref.ping();
  const want = `value-of-${key}`;
  let localLoads = 0;
  const loader = async () => {
    localLoads++;
    await ref.incr(`loads:${key}`);
    await sleep(loaderMs);
    return want;
  };
  let read;
  let teardown;
  if (opt.contender === 'leased') {
    const c = await ld.connect(opt.sock);
    read = () => ld.cached(c, key, loader);
    teardown = () => ld.close(c);
  } else if (opt.contender === 'cachemgr') {
    const { createCache } = require('cache-manager');
    const { createKeyv } = require('@keyv/redis');
    const store = createKeyv(`redis://127.0.0.1:${opt.redis}`);
    const cache = createCache({ stores: [store] });
    // One round trip so the connection is up before the start.
    await cache.get(`warm:${key}`);
    read = () => cache.wrap(key, loader, 600000);
    teardown = () => cache.disconnect();
  } else {
    throw new Error(`unknown contender ${opt.contender}`);
  }
  // Ready, then the start time from run.sh once every process is.
  await ref.incr(`ready:${key}`);
  const go = await ref.blpop(`go:${key}`, 120);
  if (!go) {
    throw new Error('no start from run.sh');
  }
  const startAt = Number(go[1]);
  const late = Date.now() - startAt;
  if (late < 0) {
    await sleep(-late);
  }
  let errors = 0;
  let wrong = 0;
  let firstError = null;
  let last = 0;
  await Promise.all(Array.from({ length: readers }, async () => {
    try {
      const v = await read();
      if (v !== want) {
        wrong++;
      }
    } catch (e) {
      errors++;
      firstError = firstError || String(e && e.message);
    }
    last = Math.max(last, Date.now() - startAt);
  }));
  await teardown();
  ref.disconnect();
  process.stdout.write(JSON.stringify({
    lang: 'node', kind: 'storm', contender: opt.contender, readers,
    late_ms: Math.max(0, late), done_ms: last, local_loads: localLoads,
    wrong, errors, first_error: firstError,
  }) + '\n');
}

(mode === 'lock' ? lockCell() : mode === 'storm' ? stormCell()
  : Promise.reject(new Error(`usage: peers.js lock|storm --opt=...`)))
  .then(() => process.exit(0), (e) => {
    process.stderr.write(`peers.js: ${e && e.stack}\n`);
    process.exit(1);
  });
