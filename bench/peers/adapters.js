'use strict';
// The only place the bench touches the leased Node client: a change of
// its API is a change here, not in the workloads.

const path = require('path');
const { Leased } = require(path.join(__dirname, '..', '..', 'clients',
  'node', 'leased.js'));

module.exports = {
  connect: (sock) => Leased.connect(sock),
  // One Pool of N sessions for all the workers of a process.
  pool: (sock, n) => Leased.connect(sock, { connections: n }),
  // -> {acquired, fence}
  lock: (ld, key, waitMs) => ld.lock(key, waitMs ? { wait_ms: waitMs } : {}),
  unlock: (ld, key) => ld.unlock(key),
  cached: (ld, key, loader) => ld.cached(key, loader),
  close: (ld) => ld.close(),
};
