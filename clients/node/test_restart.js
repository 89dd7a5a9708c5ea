'use strict';
// A daemon restart as a Node application sees it:
//
//   node test_restart.js SOCKET FLAG
//
// check_clients restarts the daemon as soon as FLAG exists, which this
// script creates from inside a using() scope. The scope must end without
// an error (its signal says the lock went with the session), a call on
// the old connection must fail with a LeasedError, and a Pool must carry
// on with new connections once the daemon is back; while it is down,
// every error must be a LeasedError with a code.

const assert = require('assert');
const fs = require('fs');
const { Leased, LeasedError } = require('./leased');

const WAIT_MS = 30000;

async function main(sock, flag) {
  const ld = await Leased.connect(sock);
  const pool = await Leased.connect(sock, { connections: 2 });
  const key = `node-restart-${process.pid}`;
  assert.strictEqual((await pool.lock(key)).acquired, true);

  const code = await ld.using(`${key}:scope`, async (signal) => {
    fs.writeFileSync(flag, '');
    await new Promise((r) => signal.addEventListener('abort', r));
    return signal.reason.code;
  });
  assert.strictEqual(code, 'connection_closed');
  console.log('ok 1 - leaving using() after the restart is no error');

  await assert.rejects(ld.lock(key), (e) => e instanceof LeasedError &&
    e.code === 'connection_closed');
  console.log('ok 2 - the old connection fails with a LeasedError');

  // Until the new daemon answers, the Pool's attempts fail with
  // LeasedErrors; the lock it held went with its old session.
  const deadline = Date.now() + WAIT_MS;
  const codes = new Set();
  for (;;) {
    try {
      const held = await pool.lock(key, { wait_ms: 5000 });
      assert.strictEqual(held.acquired, true);
      break;
    } catch (e) {
      if (!(e instanceof LeasedError) || Date.now() > deadline) throw e;
      codes.add(e.code);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  assert.deepStrictEqual([...codes].filter((c) =>
    c !== 'connect' && c !== 'connection_closed'), []);
  assert.strictEqual((await pool.unlock(key)).released, true);
  console.log('ok 3 - the Pool reconnected to the restarted daemon');
  ld.close();
  pool.close();
}

const [, , sock, flag] = process.argv;
if (!sock || !flag) {
  console.error('usage: node test_restart.js SOCKET FLAG');
  process.exit(64);
}
const timer = setTimeout(() => {
  console.error(`not ok - not done within ${WAIT_MS * 2} ms`);
  process.exit(1);
}, WAIT_MS * 2);
main(sock, flag).then(() => clearTimeout(timer), (e) => {
  console.error(`not ok - ${e.stack || e}`);
  process.exit(1);
});
