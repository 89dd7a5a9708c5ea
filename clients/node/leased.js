'use strict';
// A small client for leased: Node's net module only, promises.
//
//   const { Leased } = require('./leased');
//   const ld = await Leased.connect('/run/leased/leased.sock');
//   const held = await ld.lock('order:42', { wait_ms: 5000 });
//   try { ... } finally { await ld.unlock('order:42'); }
//   const user = await ld.cached('user:7', () => db.loadUser(7));
//   ld.on('lock_lost', (ev) => { ... stop writing under ev.key ... });
//   await ld.using('order:42', { wait_ms: 5000 }, async (signal, held) => {
//     ... signal.aborted once the lock is lost ...
//   });
//   await ld.withSemaphore('pool:db', 4, {}, async (grant) => { ... });
//   const ac = new AbortController();   // ac.abort() ends a wait:
//   await ld.lock('k', { wait_ms: -1, signal: ac.signal });
//   ld.close();
//
// Requests may be in flight together (pipelined); replies are matched by
// id, and events (lock_lost, shutdown) are emitted as 'event' and under
// their own name. One Leased is one session: closing it releases its
// session-bound locks. Requests written in one tick of the event loop go
// out in one write.

const net = require('net');
const { EventEmitter } = require('events');

const DEFAULT_SOCKET = '/run/leased/leased.sock';

class LeasedError extends Error {
  constructor(reply) {
    const err = reply.error || {};
    super(`${err.code}: ${err.message}`);
    this.code = err.code;
    this.reason = err.reason;
    this.reply = reply;
  }
}

function notAcquired(key, reply) {
  const e = new Error(`lock ${key} held elsewhere (${reply.ttl_ms} ms left)`);
  e.code = 'not_acquired';
  e.ttl_ms = reply.ttl_ms;
  return e;
}

function noPermit(key, reply) {
  const e = new Error(`semaphore ${key}: no permit (${reply.available} available)`);
  e.code = 'no_permit';
  e.available = reply.available;
  return e;
}

function abortError(signal) {
  if (signal.reason !== undefined) return signal.reason;
  const e = new Error('The operation was aborted');
  e.name = 'AbortError';
  e.code = 'ABORT_ERR';
  return e;
}

let owners = 0;

function ownOwner(opts) {
  opts = Object.assign({}, opts);
  if (opts.owner === undefined) opts.owner = `using-${process.pid}-${++owners}`;
  return opts;
}

// KEY names one lock, or, as an array, a group of keys locked together
// (leased-protocol(7), "Several keys at once").
function keyField(key) {
  return Array.isArray(key) ? { keys: key } : { key };
}

class Leased extends EventEmitter {
  constructor(socket) {
    super();
    this.socket = socket;
    this.nextId = 1;
    this.pending = new Map();
    this.chunks = [];       // the unfinished line, as received
    this.holds = new Map(); // key + '\0' + token -> Set of AbortControllers
    this.corked = false;
    this.closed = false;
    this.features = [];
    socket.setNoDelay && socket.setNoDelay(true);
    socket.on('data', (chunk) => this._data(chunk));
    socket.on('close', () => this._closed(new Error('leased closed the connection')));
    socket.on('error', (e) => this._closed(e));
  }

  // TARGET: a Unix socket path or "host:port"; $LEASED_SOCKET, else the
  // default socket, when omitted.
  static connect(target, { client, auth } = {}) {
    target = target || process.env.LEASED_SOCKET || DEFAULT_SOCKET;
    const m = /^\[?([^/]*?)\]?:(\d+)$/.exec(target);
    const opts = m ? { host: m[1], port: Number(m[2]) } : { path: target };
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(opts);
      sock.once('error', reject);
      sock.once('connect', async () => {
        sock.removeListener('error', reject);
        const ld = new Leased(sock);
        try {
          if (client !== undefined || auth !== undefined) {
            const r = await ld.call('hello', { client, auth });
            ld.session = r.session;
            ld.features = r.features || [];
          }
          resolve(ld);
        } catch (e) {
          ld.close();
          reject(e);
        }
      });
    });
  }

  close() {
    this.closed = true;
    this.socket.end();
    this.socket.destroy();
  }

  // Split on newline bytes (UTF-8 never has 0x0a inside a character);
  // a partial line is kept as its chunks and joined once, when its end
  // arrives, instead of re-concatenating a growing string per chunk.
  _data(chunk) {
    let start = 0;
    let nl = chunk.indexOf(10);
    if (nl < 0) {
      this.chunks.push(chunk);
      return;
    }
    while (nl >= 0) {
      let line;
      if (this.chunks.length) {
        this.chunks.push(chunk.subarray(start, nl));
        line = Buffer.concat(this.chunks).toString('utf8');
        this.chunks = [];
      } else {
        line = chunk.toString('utf8', start, nl);
      }
      if (!this._line(line)) return;
      start = nl + 1;
      nl = chunk.indexOf(10, start);
    }
    if (start < chunk.length) this.chunks.push(chunk.subarray(start));
  }

  _line(line) {
    if (line.length === 0 || line.trim() === '') return true;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (e) {
      this._closed(new Error(`leased sent a line that is not JSON: ${e.message}`));
      this.socket.destroy();
      return false;
    }
    let id = msg.id;
    if (id === undefined) {
      if (msg.event !== undefined) {
        this._event(msg);
        return true;
      }
      // Without an id it answers a line the daemon could not read: the
      // oldest request still waiting.
      id = this.pending.keys().next().value;
    }
    const waiter = this.pending.get(id);
    if (!waiter) return true;
    this.pending.delete(id);
    if (msg.ok) waiter.resolve(msg);
    else waiter.reject(new LeasedError(msg));
    return true;
  }

  _event(msg) {
    if (msg.event === 'lock_lost' || msg.event === 'sem_lost') {
      const set = this.holds.get(`${msg.key}\0${msg.token}`);
      if (set) {
        for (const ac of set) {
          const what = msg.event === 'lock_lost' ? 'lock' : 'semaphore grant';
          const e = new Error(`${what} ${msg.key} lost (${msg.reason})`);
          e.code = msg.event;
          e.event = msg;
          ac.abort(e);
        }
      }
    }
    this.emit('event', msg);
    this.emit(msg.event, msg);
  }

  _closed(err) {
    for (const waiter of this.pending.values()) waiter.reject(err);
    this.pending.clear();
    // The session ended: its session-bound locks went with it.
    for (const set of this.holds.values()) {
      for (const ac of set) {
        const e = new Error('connection to leased closed: lock released');
        e.code = 'connection_closed';
        e.cause = err;
        ac.abort(e);
      }
    }
    this.holds.clear();
    if (!this.closed) {
      this.closed = true;
      this.emit('close', err);
    }
  }

  // One request; resolves with the reply, rejects with LeasedError.
  // SIGNAL (an AbortSignal) ends a wait: aborting it rejects at once with
  // signal.reason and sends {"op":"cancel"} for the request; its reply
  // still comes and goes to ONLATE (which gives back a grant that won
  // the race).
  call(op, fields = {}, { signal, onLate } = {}) {
    if (this.closed) return Promise.reject(new Error('connection closed'));
    if (signal && signal.aborted) return Promise.reject(abortError(signal));
    const id = this.nextId++;
    // JSON.stringify leaves out fields whose value is undefined.
    const req = Object.assign({ op, id }, fields);
    const line = JSON.stringify(req) + '\n';
    if (!this.corked) {
      // Everything written until the next tick goes out as one write.
      this.corked = true;
      this.socket.cork();
      process.nextTick(() => {
        this.corked = false;
        this.socket.uncork();
      });
    }
    return new Promise((resolve, reject) => {
      if (!signal) {
        this.pending.set(id, { resolve, reject });
        this.socket.write(line);
        return;
      }
      const onAbort = () => {
        if (!this.pending.has(id)) return;
        this.pending.set(id, { resolve: (msg) => onLate && onLate(msg), reject() {} });
        if (!this.closed) {
          const cid = this.nextId++;
          // A daemon without cancel answers unknown_op: ignored, the
          // late reply still reaches ONLATE.
          this.pending.set(cid, { resolve() {}, reject() {} });
          this.socket.write(JSON.stringify({ op: 'cancel', id: cid, target: id }) + '\n');
        }
        reject(abortError(signal));
      };
      const done = (fn) => (v) => {
        signal.removeEventListener('abort', onAbort);
        fn(v);
      };
      this.pending.set(id, { resolve: done(resolve), reject: done(reject) });
      this.socket.write(line);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  // {acquired, token, count, fence, lease_ms} or {acquired:false, ttl_ms}.
  // A group (KEY an array): {acquired, token, fences: {key: fence}, lease_ms}.
  // SIGNAL: see call(); a lock granted after the abort is unlocked.
  lock(key, { wait_ms, ttl_ms, owner, signal } = {}) {
    const onLate = (r) => {
      if (r.acquired) {
        this.call('unlock', { ...keyField(key), token: r.token }).catch(() => {});
      }
    };
    return this.call('lock', { ...keyField(key), wait_ms, ttl_ms, owner },
      { signal, onLate });
  }

  unlock(key, { owner, token } = {}) {
    return this.call('unlock', { ...keyField(key), owner, token });
  }

  extend(key, ttl_ms, { owner, token } = {}) {
    return this.call('extend', { ...keyField(key), ttl_ms, owner, token });
  }

  // Hold KEY while FN(signal, held) runs and release it when FN settles,
  // also when it throws (redlock's using()). SIGNAL, an AbortSignal, is
  // aborted when the daemon reports the lock lost (signal.reason.event is
  // the lock_lost event): stop writing under the lock then. Throws an
  // error with code 'not_acquired' when the lock was not acquired within
  // wait_ms. OPTS: wait_ms, ttl_ms, owner as for lock().
  //
  // Without an owner each call gets one of its own: async callers share
  // the connection, hence the session, and one session's holds of a key
  // under one owner are reentrant, so two concurrent using() calls would
  // otherwise both hold the key.
  async using(key, opts, fn) {
    if (typeof opts === 'function') {
      fn = opts;
      opts = {};
    }
    opts = ownOwner(opts);
    const held = await this.lock(key, opts);
    if (!held.acquired) throw notAcquired(key, held);
    const ac = new AbortController();
    // A group's lock_lost names one of its keys.
    const hks = (Array.isArray(key) ? key : [key])
      .map((k) => `${k}\0${held.token}`);
    for (const hk of hks) {
      if (!this.holds.has(hk)) this.holds.set(hk, new Set());
      this.holds.get(hk).add(ac);
    }
    if (this.closed) {
      // The connection ended right after the grant was read.
      const e = new Error('connection to leased closed: lock released');
      e.code = 'connection_closed';
      ac.abort(e);
    }
    try {
      return await fn(ac.signal, held);
    } finally {
      for (const hk of hks) {
        const set = this.holds.get(hk);
        if (!set) continue;
        set.delete(ac);
        if (set.size === 0) this.holds.delete(hk);
      }
      try {
        await this.unlock(key, { owner: opts.owner });
      } catch (e) {
        // A lost lock is not ours to unlock; FN was told by the signal.
        if (!(e.code === 'not_held' && ac.signal.aborted)) throw e;
      }
    }
  }

  // Run FN while holding KEY; throws when the lock was not acquired.
  // Exclusive between concurrent callers as using() is.
  async withLock(key, opts, fn) {
    opts = ownOwner(opts);
    const held = await this.lock(key, opts);
    if (!held.acquired) throw notAcquired(key, held);
    try {
      return await fn(held);
    } finally {
      await this.unlock(key, { owner: opts.owner });
    }
  }

  // Semaphores: {acquired, token, permits, available, lease_ms} or
  // {acquired:false, available}. SIGNAL as for lock(); a grant that
  // comes after the abort is released.
  semAcquire(key, limit, { permits, wait_ms, ttl_ms, detach, signal } = {}) {
    const onLate = (r) => {
      if (r.acquired) this.semRelease(key, r.token).catch(() => {});
    };
    return this.call('sem.acquire', { key, limit, permits, wait_ms, ttl_ms, detach },
      { signal, onLate });
  }

  semRelease(key, token) {
    return this.call('sem.release', { key, token });
  }

  semInfo(key, limit) {
    return this.call('sem.info', { key, limit });
  }

  // Run FN(grant, signal) holding permits of KEY and release them when
  // FN settles; throws an error with code 'no_permit' when none came
  // within wait_ms. SIGNAL is aborted on sem_lost (signal.reason.event)
  // or when the connection ends. OPTS as for semAcquire().
  async withSemaphore(key, limit, opts, fn) {
    if (typeof opts === 'function') {
      fn = opts;
      opts = {};
    }
    const grant = await this.semAcquire(key, limit, opts);
    if (!grant.acquired) throw noPermit(key, grant);
    const ac = new AbortController();
    const hk = `${key}\0${grant.token}`;
    let set = this.holds.get(hk);
    if (!set) this.holds.set(hk, (set = new Set()));
    set.add(ac);
    try {
      return await fn(grant, ac.signal);
    } finally {
      set.delete(ac);
      if (set.size === 0) this.holds.delete(hk);
      try {
        await this.semRelease(key, grant.token);
      } catch (e) {
        // Its lease ran out meanwhile: nothing left to give back.
        if (e.code !== 'not_held') throw e;
      }
    }
  }

  // Cache-aside read: the cached value, or LOADER() loaded once
  // cluster-wide and filled (null caches "not found"). A failing loader
  // gives its fill lease back.
  async cached(key, loader, { ttl_ms } = {}) {
    const got = await this.call('cache.get', { key });
    if (got.hit) return got.value;
    let value;
    try {
      value = await loader();
    } catch (e) {
      if (got.lease) await this.call('cache.release', { key, lease: got.lease });
      throw e;
    }
    if (got.lease) {
      await this.call('cache.fill', { key, lease: got.lease, value, ttl_ms });
    }
    return value;
  }

  // Write path: call after the database write committed.
  invalidate(keys, { delay_ms } = {}) {
    return this.call('cache.invalidate', { keys: [].concat(keys), delay_ms });
  }
}

// SIZE connections; each request goes to the one with the fewest
// requests in flight. A lock is bound to the session (connection) that
// took it: using() keeps lock and unlock on one connection; after a bare
// lock(), unlock by token ({ token: held.token }) or through conn(key).
class Pool extends EventEmitter {
  constructor({ path, size = 4, client, auth } = {}) {
    super();
    this.target = path;
    this.size = size;
    this.opts = { client, auth };
    this.conns = [];
    this.connecting = null;
    this.closed = false;
  }

  async _conn() {
    if (this.conns.length < this.size) {
      if (!this.connecting) {
        this.connecting = Leased.connect(this.target, this.opts).then((ld) => {
          this.connecting = null;
          if (this.closed) {
            ld.close();
            throw new Error('pool closed');
          }
          ld.on('event', (ev) => {
            this.emit('event', ev);
            this.emit(ev.event, ev);
          });
          ld.on('close', () => {
            this.conns = this.conns.filter((c) => c !== ld);
          });
          this.conns.push(ld);
          return ld;
        }, (e) => {
          this.connecting = null;
          throw e;
        });
      }
      return this.connecting;
    }
    let best = this.conns[0];
    for (const c of this.conns) {
      if (c.pending.size < best.pending.size) best = c;
    }
    return best;
  }

  async call(op, fields) {
    return (await this._conn()).call(op, fields);
  }

  async lock(key, opts) {
    return (await this._conn()).lock(key, opts);
  }

  async unlock(key, opts) {
    return (await this._conn()).unlock(key, opts);
  }

  async extend(key, ttl_ms, opts) {
    return (await this._conn()).extend(key, ttl_ms, opts);
  }

  async using(key, opts, fn) {
    return (await this._conn()).using(key, opts, fn);
  }

  async withLock(key, opts, fn) {
    return (await this._conn()).withLock(key, opts, fn);
  }

  async cached(key, loader, opts) {
    return (await this._conn()).cached(key, loader, opts);
  }

  async invalidate(keys, opts) {
    return (await this._conn()).invalidate(keys, opts);
  }

  async semAcquire(key, limit, opts) {
    return (await this._conn()).semAcquire(key, limit, opts);
  }

  async semRelease(key, token) {
    return (await this._conn()).semRelease(key, token);
  }

  async semInfo(key, limit) {
    return (await this._conn()).semInfo(key, limit);
  }

  async withSemaphore(key, limit, opts, fn) {
    return (await this._conn()).withSemaphore(key, limit, opts, fn);
  }

  close() {
    this.closed = true;
    for (const c of this.conns) c.close();
    this.conns = [];
  }
}

module.exports = { Leased, LeasedError, Pool };
