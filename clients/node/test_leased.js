'use strict';
// Proof from Node.js: four processes share a counter file under one
// leased lock, and share one database load through the cache.
//
//   node test_leased.js SOCKET
//
// Each worker does ROUNDS rounds of lock / read / increment / write /
// unlock. A file created with O_EXCL while inside the lock catches any
// overlap; the fence of every acquisition must exceed the last one
// written, and the final count must be WORKERS * ROUNDS.

const assert = require('assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { fork } = require('child_process');
const { Leased } = require('./leased');

const WORKERS = 4;
const ROUNDS = 25;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function worker(sock, dir, tag) {
  const ld = await Leased.connect(sock, { client: `node-worker-${process.pid}` });
  const lost = [];
  ld.on('lock_lost', (ev) => lost.push(ev));

  // Every worker asks for the same key at about the same time; the loader
  // (the "database") must run once in all of them together.
  const value = await ld.cached(`${tag}:config`, async () => {
    fs.appendFileSync(path.join(dir, 'loads'), `${process.pid}\n`);
    await sleep(300);
    return 'loaded-once';
  });
  assert.strictEqual(value, 'loaded-once');

  const key = `${tag}:counter`;
  for (let i = 0; i < ROUNDS; i++) {
    const held = await ld.lock(key, { wait_ms: 20000 });
    assert.ok(held.acquired, `round ${i}: lock not acquired: ${JSON.stringify(held)}`);
    const inside = path.join(dir, 'inside');
    fs.writeFileSync(inside, String(process.pid), { flag: 'wx' }); // EEXIST: overlap
    const fenceFile = path.join(dir, 'fence');
    const lastFence = Number(fs.readFileSync(fenceFile, 'utf8'));
    assert.ok(held.fence > lastFence, `fence ${held.fence} after ${lastFence}`);
    fs.writeFileSync(fenceFile, String(held.fence));
    const counterFile = path.join(dir, 'counter');
    const n = Number(fs.readFileSync(counterFile, 'utf8'));
    await sleep(1);
    fs.writeFileSync(counterFile, String(n + 1));
    fs.unlinkSync(inside);
    const r = await ld.unlock(key);
    assert.strictEqual(r.released, true);
  }
  assert.deepStrictEqual(lost, []);
  ld.close();
}

function runWorker(sock, dir, tag) {
  return new Promise((resolve) => {
    const child = fork(__filename, ['worker', sock, dir, tag]);
    child.on('exit', (code, signal) => resolve(signal ? 128 : code));
  });
}

async function main() {
  const sock = process.argv[2] || process.env.LEASED_SOCKET;
  if (!sock) {
    console.error('usage: node test_leased.js SOCKET');
    process.exit(64);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leased-node-'));
  const tag = `node-${process.pid}`;
  fs.writeFileSync(path.join(dir, 'counter'), '0');
  fs.writeFileSync(path.join(dir, 'fence'), '0');
  fs.writeFileSync(path.join(dir, 'loads'), '');
  const timer = setTimeout(() => {
    console.error('not ok - workers did not finish in 90 s');
    process.exit(1);
  }, 90000);
  try {
    const codes = await Promise.all(
      Array.from({ length: WORKERS }, () => runWorker(sock, dir, tag)));
    assert.deepStrictEqual(codes, Array(WORKERS).fill(0), 'a worker failed');
    const count = Number(fs.readFileSync(path.join(dir, 'counter'), 'utf8'));
    assert.strictEqual(count, WORKERS * ROUNDS, 'lost increments');
    console.log(`ok 1 - ${WORKERS} processes x ${ROUNDS} rounds, count ${count}, no overlap`);
    const loads = fs.readFileSync(path.join(dir, 'loads'), 'utf8').trim().split('\n');
    assert.strictEqual(loads.length, 1, `loader ran ${loads.length} times`);
    console.log('ok 2 - one load for four concurrent readers');
  } finally {
    clearTimeout(timer);
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[2] === 'worker') {
  const [, , , sock, dir, tag] = process.argv;
  worker(sock, dir, tag).then(
    () => process.exit(0),
    (e) => {
      console.error(`worker ${process.pid}: ${e.stack || e}`);
      process.exit(1);
    });
} else {
  main().catch((e) => {
    console.error(`not ok - ${e.stack || e}`);
    process.exit(1);
  });
}
