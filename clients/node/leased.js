'use strict';
// A small client for leased: Node's net module only, promises.
//
//   const { Leased } = require('./leased');
//   const ld = await Leased.connect('/run/leased/leased.sock');
//   const held = await ld.lock('order:42', { wait_ms: 5000 });
//   try { ... } finally { await ld.unlock('order:42'); }
//   const user = await ld.cached('user:7', () => db.loadUser(7));
//   ld.on('lock_lost', (ev) => { ... stop writing under ev.key ... });
//   ld.close();
//
// Requests may be in flight together (pipelined); replies are matched by
// id, and events (lock_lost, shutdown) are emitted as 'event' and under
// their own name. One Leased is one session: closing it releases its
// session-bound locks.

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

class Leased extends EventEmitter {
  constructor(socket) {
    super();
    this.socket = socket;
    this.nextId = 1;
    this.pending = new Map();
    this.buf = '';
    this.closed = false;
    socket.setEncoding('utf8');
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

  _data(chunk) {
    this.buf += chunk;
    let nl;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (line.trim() === '') continue;
      let msg;
      try {
        msg = JSON.parse(line);
      } catch (e) {
        this._closed(new Error(`leased sent a line that is not JSON: ${e.message}`));
        this.socket.destroy();
        return;
      }
      if (msg.event !== undefined && msg.id === undefined) {
        this.emit('event', msg);
        this.emit(msg.event, msg);
        continue;
      }
      // Without an id it answers a line the daemon could not read: the
      // oldest request still waiting.
      const id = msg.id !== undefined ? msg.id : this.pending.keys().next().value;
      const waiter = this.pending.get(id);
      if (!waiter) continue;
      this.pending.delete(id);
      if (msg.ok) waiter.resolve(msg);
      else waiter.reject(new LeasedError(msg));
    }
  }

  _closed(err) {
    for (const waiter of this.pending.values()) waiter.reject(err);
    this.pending.clear();
    if (!this.closed) {
      this.closed = true;
      this.emit('close', err);
    }
  }

  // One request; resolves with the reply, rejects with LeasedError.
  call(op, fields = {}) {
    if (this.closed) return Promise.reject(new Error('connection closed'));
    const id = this.nextId++;
    const req = { op, id };
    for (const [k, v] of Object.entries(fields)) {
      if (v !== undefined) req[k] = v;
    }
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.socket.write(JSON.stringify(req) + '\n');
    });
  }

  // {acquired, token, count, fence, lease_ms} or {acquired:false, ttl_ms}.
  lock(key, { wait_ms, ttl_ms, owner } = {}) {
    return this.call('lock', { key, wait_ms, ttl_ms, owner });
  }

  unlock(key, { owner, token } = {}) {
    return this.call('unlock', { key, owner, token });
  }

  // Run FN while holding KEY; throws when the lock was not acquired.
  async withLock(key, opts, fn) {
    const held = await this.lock(key, opts);
    if (!held.acquired) {
      const e = new Error(`lock ${key} held elsewhere (${held.ttl_ms} ms left)`);
      e.code = 'not_acquired';
      throw e;
    }
    try {
      return await fn(held);
    } finally {
      await this.unlock(key, { owner: opts && opts.owner });
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

module.exports = { Leased, LeasedError };
