'use strict';
// A small client for leased: Node's net module only, promises.
//
//   const { Leased } = require('./leased');
//   const ld = await Leased.connect('/run/leased/leased.sock');
//   const held = await ld.lock('order:42', { wait_ms: 5000 });
//   try { ... } finally { await ld.unlock('order:42'); }
//   const user = await ld.cached('user:7', () => db.loadUser(7)); // JSON
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
// out in one write. Leased.connect(target, { connections: N }) gives a
// Pool of N sessions instead (see Pool).

const net = require('net');
const { EventEmitter } = require('events');

const DEFAULT_SOCKET = '/run/leased/leased.sock';

// lock_at_risk and sem_at_risk put a key of a hold at risk (true), their
// _safe events take it out (false).
const RISK_EVENTS = {
  lock_at_risk: true, sem_at_risk: true, lock_safe: false, sem_safe: false,
};

// A hold inside using() or withSemaphore(): the controller its signal
// comes from, and the at-risk state shown on the held object. HELD gets
// atRisk (true while any of its keys is at risk: a renewal failed or is
// late and the lease may end) and risk, an EventEmitter of 'at_risk' and
// 'safe' with the daemon's event; both non-enumerable, so the reply's
// fields stay as they were.
class Hold {
  constructor(held) {
    this.ac = new AbortController();
    this.keys = new Set();
    const risk = new EventEmitter();
    Object.defineProperty(held, 'risk', { value: risk });
    Object.defineProperty(held, 'atRisk', { get: () => this.keys.size > 0 });
    this.emitter = risk;
  }

  mark(ev, atRisk) {
    const was = this.keys.size > 0;
    if (atRisk) this.keys.add(ev.key);
    else this.keys.delete(ev.key);
    // A group is at risk from its first key to its last one safe.
    if (was !== this.keys.size > 0) {
      this.emitter.emit(atRisk ? 'at_risk' : 'safe', ev);
    }
  }
}

// Every error of the client: the daemon's (CODE its error code, REPLY
// the reply) and the client's own, built with clientError (CODE one of
// connect, connection_closed, protocol, invalid, not_acquired, no_permit,
// lock_lost, sem_lost; no REPLY). Abort signals reject with their own
// reason, as fetch() does.
class LeasedError extends Error {
  constructor(reply, message) {
    if (typeof reply === 'string') {
      super(`${reply}: ${message}`);
      this.code = reply;
      return;
    }
    const err = reply.error || {};
    super(`${err.code}: ${err.message}`);
    this.code = err.code;
    this.reason = err.reason;
    this.reply = reply;
  }
}

function clientError(code, message, props) {
  return Object.assign(new LeasedError(code, message), props);
}

function notAcquired(key, reply) {
  return clientError('not_acquired',
    `lock ${key} held elsewhere (${reply.ttl_ms} ms left)`,
    { ttl_ms: reply.ttl_ms });
}

function noPermit(key, reply) {
  return clientError('no_permit',
    `semaphore ${key}: no permit (${reply.available} available)`,
    { available: reply.available });
}

// What an application can check when TARGET cannot be reached: error E
// of connecting (errno codes as Node names them).
function connectError(target, tcp, e) {
  let hint;
  if (e.code === 'EACCES' || e.code === 'EPERM') {
    hint = 'permission denied: is this user in the socket\'s group ' +
      '(listen.unix_group in leased.yml(5))?';
  } else if (tcp) {
    hint = 'is leased running and listening there (listen.tcp)?';
  } else if (e.code === 'ENOENT') {
    hint = 'no such socket: is leased running, and is the path (or ' +
      '$LEASED_SOCKET) the one in its listen.unix?';
  } else {
    hint = 'is leased running? Check the path (or $LEASED_SOCKET) ' +
      'against its listen.unix';
  }
  return clientError('connect',
    `cannot connect to leased at ${target}: ${e.code || e.message}; ${hint}`,
    { target, cause: e });
}

function poolClosed() {
  return clientError('connection_closed', 'the pool was closed');
}

function closedError(cause) {
  return clientError('connection_closed',
    'the connection to leased ended (daemon stopped or restarted?); its ' +
    'session\'s locks went with it', cause ? { cause } : undefined);
}

// A key is a string; a group of keys (where GROUP allows one) a non-empty
// array of strings. Returns the LeasedError that refuses KEY, or null.
function badKey(key, group) {
  if (typeof key === 'string') return null;
  if (group && Array.isArray(key) && key.length > 0 &&
      key.every((k) => typeof k === 'string')) {
    return null;
  }
  const got = Array.isArray(key) ? 'an array holding a non-string or none'
    : key === null ? 'null' : typeof key;
  return clientError('invalid', `a key must be a string${group
    ? ' or a non-empty array of strings' : ''}, not ${got}`);
}

// Values as they are: strings only (another type is refused).
const RAW = { stringify: (v) => v, parse: (s) => s };

// VALUE of KEY as the text cached() fills; null stays null ("not found").
function toText(key, value, ser) {
  if (value === null) return null;
  if (value === undefined) {
    throw clientError('invalid', `the loader of ${key} returned undefined ` +
      '(return null to cache "not found")');
  }
  const text = ser.stringify(value);
  if (typeof text !== 'string') {
    throw clientError('invalid', `the serializer made no string of the ` +
      `loader's ${typeof value} for ${key}`);
  }
  return text;
}

function fromText(key, text, ser) {
  if (text === null) return null;
  try {
    return ser.parse(text);
  } catch (e) {
    throw clientError('invalid', `the cached value of ${key} cannot be ` +
      `parsed (${e.message}); written as plain text by another client? ` +
      'Pass { serializer: RAW }', { cause: e });
  }
}

function abortError(signal) {
  if (signal.reason !== undefined) return signal.reason;
  const e = new Error('The operation was aborted');
  e.name = 'AbortError';
  e.code = 'ABORT_ERR';
  return e;
}

const NO_OPTS = Object.freeze({});
let owners = 0;
const OWNER_PREFIX = `using-${process.pid}-`;

function newOwner() {
  return OWNER_PREFIX + ++owners;
}

function ownOwner(opts) {
  opts = Object.assign({}, opts);
  if (opts.owner === undefined) opts.owner = newOwner();
  return opts;
}

// At most this many anonymous holds are kept per connection, the oldest
// forgotten first (a lock taken and never unlocked, left to expire): one
// forgotten so is unlocked by its token only.
const ANON_MAX = 10000;

// The anonymous holds of a connection (see Leased.lock): for each key
// and mode, a slot with their tokens, newest last; and each token's slot,
// so that a token unlocked by itself or reported lost is forgotten. A
// plain key is its own name in the map (a string's hash is kept with it,
// so the caller's key costs no new string per call); a group (by its
// sorted keys) or a side of a read-write lock goes in another.
class AnonHolds {
  constructor() {
    this.plain = new Map();
    this.other = new Map();
    this.byToken = new Map();
  }

  get size() {
    return this.byToken.size;
  }

  _slot(key, mode, make) {
    const plain = typeof key === 'string' && mode === undefined;
    const map = plain ? this.plain : this.other;
    const k = plain ? key
      : `${mode}\0${Array.isArray(key) ? JSON.stringify([...key].sort()) : key}`;
    let slot = map.get(k);
    if (slot === undefined && make) {
      slot = { map, k, read: mode === 'read', ts: [] };
      map.set(k, slot);
    }
    return slot;
  }

  // An exclusive grant ends every earlier anonymous hold of its key here
  // (lost or expired: no two holders); read holds share the key.
  keep(key, mode, token) {
    const slot = this._slot(key, mode, true);
    if (!slot.read && slot.ts.length !== 0) {
      for (const t of slot.ts) this.byToken.delete(t);
      slot.ts.length = 0;
    }
    slot.ts.push(token);
    this.byToken.set(token, slot);
    if (this.byToken.size > ANON_MAX) this.forget(this.byToken.keys().next().value);
  }

  // The token of the latest hold of KEY and MODE (TAKE: forgotten).
  latest(key, mode, take) {
    const slot = this._slot(key, mode, false);
    if (slot === undefined) return undefined;
    const token = slot.ts[slot.ts.length - 1];
    if (take) this.forget(token);
    return token;
  }

  forget(token) {
    const slot = this.byToken.get(token);
    if (slot === undefined) return;
    this.byToken.delete(token);
    const { ts } = slot;
    ts.splice(ts.lastIndexOf(token), 1);
    if (ts.length === 0) slot.map.delete(slot.k);
  }

  clear() {
    this.plain.clear();
    this.other.clear();
    this.byToken.clear();
  }
}

// KEY names one lock, or, as an array, a group of keys locked together
// (leased-protocol(7), "Several keys at once").
function keyField(key) {
  return Array.isArray(key) ? { keys: key } : { key };
}

// The request's fields after "id" as JSON text (',"key":"k",...'), or ''.
// JSON.stringify leaves out fields whose value is undefined.
function body(fields) {
  const s = JSON.stringify(fields);
  return s.length > 2 ? ',' + s.slice(1, -1) : '';
}

// The body of a lock/unlock that names only KEY: the hot shape, written
// without building and serialising an object (JSON.stringify of the
// string alone escapes it).
function keyBody(key) {
  return typeof key === 'string' ? ',"key":' + JSON.stringify(key) : null;
}

// ',"NAME":V' as JSON.stringify would write it for a string, a finite
// number or a boolean V; '' for undefined; null for anything else.
function field(name, v) {
  switch (typeof v) {
    case 'undefined':
      return '';
    case 'string':
      return `,"${name}":${JSON.stringify(v)}`;
    case 'number':
      return Number.isFinite(v) ? `,"${name}":${v}` : null;
    case 'boolean':
      return `,"${name}":${v}`;
    default:
      return null;
  }
}

// The body of a lock or unlock of the string KEY with the options of O,
// written as text, the same as body() of the object; null when a value
// needs JSON.stringify (then the object is built). Not only cheaper:
// with 50 callers on a Pool, lock(key, {}) through the object promoted
// ~1 MB per young collection of V8 (pauses of 2-3 ms), through the text
// 11 kB (bench/peers/results.md).
function lockBody(key, o, owner) {
  if (typeof key !== 'string') return null;
  const a = field('wait_ms', o.wait_ms);
  const b = field('ttl_ms', o.ttl_ms);
  const c = field('owner', owner);
  const d = field('mode', o.mode);
  const e = field('detach', o.detach);
  const f = field('token', o.token);
  if (a === null || b === null || c === null || d === null || e === null ||
      f === null) {
    return null;
  }
  return ',"key":' + JSON.stringify(key) + a + b + c + d + e + f;
}

function unlockBody(key, o) {
  if (typeof key !== 'string') return null;
  const a = field('owner', o.owner);
  const b = field('token', o.token);
  const c = field('mode', o.mode);
  const d = field('request_id', o.request_id);
  if (a === null || b === null || c === null || d === null) return null;
  return ',"key":' + JSON.stringify(key) + a + b + c + d;
}

// The requests waiting for their reply, by id; each waiter carries its
// id. Not a Map: a Map added to and deleted from at the request rate
// leaves its replaced tables in the old generation, where V8 treats
// them as roots in young collections until the next full one, so every
// waiter and reply they ever pointed to survives and is promoted: with
// a Pool shared by 50 callers in a process with a real heap, ~2 MB per
// scavenge and pauses of 3-6 ms instead of ~1 ms, which set the p99.
// Ids are sequential, so a ring indexed by the id's low bits holds them
// (doubled when half full); a waiter still in its slot when the ring
// comes round to it (a long lock wait) moves to a Map, which then changes
// only at that rate.
class Pending {
  constructor() {
    this.ring = new Array(64).fill(null);
    this.mask = 63;
    this.used = 0; // waiters in the ring
    this.old = new Map();
    this.size = 0;
  }

  get(id) {
    const w = this.ring[id & this.mask];
    if (w !== null && w.id === id) return w;
    return this.old.size === 0 ? undefined : this.old.get(id);
  }

  has(id) {
    return this.get(id) !== undefined;
  }

  // Adds W (W.id === ID), or replaces the waiter of ID.
  set(id, w) {
    const i = id & this.mask;
    const cur = this.ring[i];
    if (cur !== null && cur.id === id) {
      this.ring[i] = w;
      return;
    }
    if (this.old.size !== 0 && this.old.has(id)) {
      this.old.set(id, w);
      return;
    }
    if (cur === null) {
      this.ring[i] = w;
      this.used++;
    } else if (this.used * 2 >= this.ring.length) {
      this._grow();
      this.set(id, w);
      return;
    } else {
      this.old.set(cur.id, cur);
      this.ring[i] = w;
    }
    this.size++;
  }

  delete(id) {
    const i = id & this.mask;
    const w = this.ring[i];
    if (w !== null && w.id === id) {
      this.ring[i] = null;
      this.used--;
      this.size--;
    } else if (this.old.size !== 0 && this.old.delete(id)) {
      this.size--;
    }
  }

  // Doubling keeps waiters of different slots apart: slot i goes to i
  // or i + the old length.
  _grow() {
    const ring = new Array(this.ring.length * 2).fill(null);
    const mask = ring.length - 1;
    for (const w of this.ring) {
      if (w !== null) ring[w.id & mask] = w;
    }
    this.ring = ring;
    this.mask = mask;
  }

  // The waiter with the smallest id: the oldest request still waiting.
  first() {
    let best;
    for (const w of this.ring) {
      if (w !== null && (best === undefined || w.id < best.id)) best = w;
    }
    for (const w of this.old.values()) {
      if (best === undefined || w.id < best.id) best = w;
    }
    return best;
  }

  values() {
    return this.ring.filter((w) => w !== null).concat([...this.old.values()]);
  }

  clear() {
    this.ring.fill(null);
    this.used = 0;
    this.old.clear();
    this.size = 0;
  }
}

class Leased extends EventEmitter {
  constructor(socket) {
    super();
    this.socket = socket;
    this.nextId = 1;
    this.pending = new Pending();
    this.chunks = [];       // the unfinished line, as received
    this.holds = new Map(); // key + '\0' + token -> Set of Hold
    this.anon = new AnonHolds();
    this.out = [];          // lines written in this tick, sent together
    this.flush = () => this._flush();
    this.closed = false;
    this.features = [];
    this.serializer = JSON; // cached(): values as JSON text
    socket.setNoDelay && socket.setNoDelay(true);
    socket.on('data', (chunk) => this._data(chunk));
    socket.on('close', () => this._closed(closedError()));
    socket.on('error', (e) => this._closed(closedError(e)));
  }

  // TARGET: a Unix socket path or "host:port"; $LEASED_SOCKET, else the
  // default socket, when omitted. With CONNECTIONS, a Pool of that many
  // (also of 1). SERIALIZER: the default of cached()'s.
  static connect(target, { client, auth, connections, serializer } = {}) {
    target = target || process.env.LEASED_SOCKET || DEFAULT_SOCKET;
    if (connections !== undefined) {
      return Pool.connect(target, { client, auth, connections, serializer });
    }
    const m = /^\[?([^/]*?)\]?:(\d+)$/.exec(target);
    const opts = m ? { host: m[1], port: Number(m[2]) } : { path: target };
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(opts);
      const refused = (e) => reject(connectError(target, m !== null, e));
      sock.once('error', refused);
      sock.once('connect', async () => {
        sock.removeListener('error', refused);
        const ld = new Leased(sock);
        if (serializer !== undefined) ld.serializer = serializer;
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
    // Requests of this tick still go out (an unlock right before close).
    if (this.out.length) this._flush();
    this.closed = true;
    this.socket.end();
    this.socket.destroy();
  }

  // Split on newline bytes (UTF-8 never has 0x0a inside a character):
  // everything up to the chunk's last newline is decoded once and split
  // as a string; the partial line after it is kept as Buffers and joined
  // once, when its end arrives, instead of re-concatenating a growing
  // string per chunk.
  _data(chunk) {
    const last = chunk.lastIndexOf(10);
    if (last < 0) {
      this.chunks.push(chunk);
      return;
    }
    let text;
    if (this.chunks.length) {
      this.chunks.push(chunk.subarray(0, last));
      text = Buffer.concat(this.chunks).toString('utf8');
      this.chunks = [];
    } else {
      text = chunk.toString('utf8', 0, last);
    }
    if (last + 1 < chunk.length) this.chunks.push(chunk.subarray(last + 1));
    let start = 0;
    let nl = text.indexOf('\n');
    while (nl >= 0) {
      if (!this._line(text.slice(start, nl))) return;
      start = nl + 1;
      nl = text.indexOf('\n', start);
    }
    this._line(start === 0 ? text : text.slice(start));
  }

  _line(line) {
    // Blank lines carry nothing; a reply starts with '{' (code 123), so
    // only other lines need the look for white space.
    if (line.charCodeAt(0) !== 123 && line.trim() === '') return true;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (e) {
      this._closed(clientError('protocol',
        `leased sent a line that is not JSON: ${e.message}`));
      this.socket.destroy();
      return false;
    }
    let waiter;
    if (msg.id === undefined) {
      if (msg.event !== undefined) {
        this._event(msg);
        return true;
      }
      // Without an id it answers a line the daemon could not read: the
      // oldest request still waiting.
      waiter = this.pending.first();
    } else {
      waiter = this.pending.get(msg.id);
    }
    if (!waiter) return true;
    this.pending.delete(waiter.id);
    if (msg.ok) {
      if (waiter.anon !== undefined && msg.acquired) {
        this.anon.keep(waiter.anon, waiter.mode, msg.token);
      }
      waiter.resolve(msg);
    } else {
      waiter.reject(new LeasedError(msg));
    }
    return true;
  }

  _event(msg) {
    if (msg.event === 'lock_lost' && this.anon.size !== 0) {
      this.anon.forget(msg.token);
    }
    const set = this.holds.get(`${msg.key}\0${msg.token}`);
    if (set && (msg.event === 'lock_lost' || msg.event === 'sem_lost')) {
      for (const h of set) {
        const what = msg.event === 'lock_lost' ? 'lock' : 'semaphore grant';
        h.ac.abort(clientError(msg.event,
          `${what} ${msg.key} lost (${msg.reason})`, { event: msg }));
      }
    } else if (set && RISK_EVENTS[msg.event] !== undefined) {
      for (const h of set) h.mark(msg, RISK_EVENTS[msg.event]);
    }
    this.emit('event', msg);
    this.emit(msg.event, msg);
  }

  _closed(err) {
    for (const waiter of this.pending.values()) waiter.reject(err);
    this.pending.clear();
    // The session ended: its session-bound locks went with it.
    for (const set of this.holds.values()) {
      for (const { ac } of set) {
        ac.abort(clientError('connection_closed',
          'connection to leased closed: lock released', { cause: err }));
      }
    }
    this.holds.clear();
    this.anon.clear();
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
  call(op, fields = {}, opts) {
    return this._call(JSON.stringify(op), body(fields), opts);
  }

  // Everything written until the next tick goes out as one string in
  // one write: one system call for all the requests a burst of replies
  // set off, and no per-line conversion as with cork() and writev.
  _write(line) {
    if (this.out.push(line) === 1) process.nextTick(this.flush);
  }

  _flush() {
    const out = this.out;
    this.out = [];
    if (this.closed) return;
    this.socket.write(out.length === 1 ? out[0] : out.join(''));
  }

  // OP: the op as a JSON string; BODY: the request's JSON after its id
  // (see body()).
  // ANON, MODE: the key and mode of a lock whose grant the connection
  // keeps (see lock()), kept when the reply is read, before anything
  // else runs.
  _call(op, body, { signal, onLate } = NO_OPTS, anon = undefined,
    mode = undefined) {
    if (this.closed) return Promise.reject(closedError());
    if (signal && signal.aborted) return Promise.reject(abortError(signal));
    const id = this.nextId++;
    const line = `{"op":${op},"id":${id}${body}}\n`;
    return new Promise((resolve, reject) => {
      if (!signal) {
        this.pending.set(id, { id, resolve, reject, anon, mode });
        this._write(line);
        return;
      }
      const onAbort = () => {
        if (!this.pending.has(id)) return;
        this.pending.set(id, { id, resolve: (msg) => onLate && onLate(msg),
          reject() {} });
        if (!this.closed) {
          const cid = this.nextId++;
          // A daemon without cancel answers unknown_op: ignored, the
          // late reply still reaches ONLATE.
          this.pending.set(cid, { id: cid, resolve() {}, reject() {} });
          this._write(`{"op":"cancel","id":${cid},"target":${id}}\n`);
        }
        reject(abortError(signal));
      };
      const done = (fn) => (v) => {
        signal.removeEventListener('abort', onAbort);
        fn(v);
      };
      this.pending.set(id, { id, resolve: done(resolve),
        reject: done(reject), anon, mode });
      this._write(line);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  // {acquired, token, count, fence, lease_ms} or {acquired:false, ttl_ms}.
  // A group (KEY an array): {acquired, token, fences: {key: fence}, lease_ms}.
  // SIGNAL: see call(); a lock granted after the abort is unlocked.
  // MODE 'read' or 'write' takes a side of a read-write lock (see
  // rwlock()); DETACH and TOKEN as in leased-protocol(7).
  // A lock that names neither an owner nor a token is anonymous: it gets
  // an owner of its own. Callers share the connection, hence the session,
  // and one session's holds of a key under one owner are reentrant, so two
  // callers locking as the session's owner "" would both hold the key. Its
  // token is kept for an unlock() or extend() that names neither (the
  // latest anonymous hold of the key and mode); reentry needs an owner.
  lock(key, opts) {
    if (typeof key !== 'string' && badKey(key, true)) {
      return Promise.reject(badKey(key, true));
    }
    if (opts === undefined) {
      // The hot shape: the owner is digits and a dash, no escaping.
      if (typeof key === 'string') {
        return this._call('"lock"', `${keyBody(key)},"owner":"${newOwner()}"`,
          NO_OPTS, key);
      }
      opts = {};
    }
    const own = opts.owner === undefined && opts.token === undefined;
    const owner = own ? newOwner() : opts.owner;
    const anon = own ? key : undefined;
    if (!opts.signal) {
      const b = lockBody(key, opts, owner);
      if (b !== null) return this._call('"lock"', b, NO_OPTS, anon, opts.mode);
    }
    const { wait_ms, ttl_ms, mode, detach, token, signal } = opts;
    const fields = { ...keyField(key), wait_ms, ttl_ms, owner, mode, detach,
      token };
    if (!signal) return this._call('"lock"', body(fields), NO_OPTS, anon, mode);
    const onLate = (r) => {
      if (r.acquired) {
        this.call('unlock', { ...keyField(key), token: r.token, mode })
          .catch(() => {});
      }
    };
    return this._call('"lock"', body(fields), { signal, onLate }, anon, mode);
  }

  // The token of the latest anonymous hold of KEY when OPTS names
  // neither an owner nor a token, else undefined (TAKE: for the unlock,
  // which forgets it).
  _anonToken(key, opts, take) {
    if (this.anon.size === 0) return undefined;
    if (opts !== undefined && (opts.owner !== undefined ||
        opts.token !== undefined)) {
      if (take && typeof opts.token === 'string') this.anon.forget(opts.token);
      return undefined;
    }
    return this.anon.latest(key, opts && opts.mode, take);
  }

  // opts.request_id (1 to 64 printable ASCII characters) makes the call
  // safe to repeat: sent again with the same token (or owner) and id
  // after a lost answer (a connection error, or redis_unavailable with
  // outcome unknown), it gets the first answer and releases no second
  // hold (leased-protocol(7), unlock).
  unlock(key, opts) {
    if (typeof key !== 'string' && badKey(key, true)) {
      return Promise.reject(badKey(key, true));
    }
    const anon = this._anonToken(key, opts, true);
    if (anon !== undefined) {
      if (opts === undefined && typeof key === 'string') {
        return this._call('"unlock"', `${keyBody(key)},"token":${JSON.stringify(anon)}`);
      }
      opts = { ...opts, token: anon };
    }
    const b = opts === undefined ? keyBody(key) : unlockBody(key, opts);
    if (b !== null) return this._call('"unlock"', b);
    const { owner, token, mode, request_id } = opts || {};
    return this._call('"unlock"', body({ ...keyField(key), owner, token,
      mode, request_id }));
  }

  extend(key, ttl_ms, opts) {
    if (badKey(key, true)) return Promise.reject(badKey(key, true));
    const { owner, token = this._anonToken(key, opts, false), mode } =
      opts || {};
    return this.call('extend', { ...keyField(key), ttl_ms, owner, token,
      mode });
  }

  // The two sides of the read-write lock KEY (leased-protocol(7), "Read-
  // write locks"): readers share it, a writer excludes everyone.
  rwlock(key) {
    return new RWLock(this, key);
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
    // A group's lock_lost names one of its keys.
    const hks = (Array.isArray(key) ? key : [key])
      .map((k) => `${k}\0${held.token}`);
    const hold = this._track(hks, held);
    const { ac } = hold;
    if (this.closed) {
      // The connection ended right after the grant was read.
      ac.abort(clientError('connection_closed',
        'connection to leased closed: lock released'));
    }
    try {
      return await fn(ac.signal, held);
    } finally {
      this._untrack(hks, hold);
      try {
        await this.unlock(key, { owner: opts.owner, mode: opts.mode });
      } catch (e) {
        // A lost lock (also with the connection, after a restart) is not
        // ours to unlock; FN was told by the signal.
        if (!(ac.signal.aborted && (e.code === 'not_held' ||
              e.code === 'connection_closed'))) {
          throw e;
        }
      }
    }
  }

  // Register HELD (a lock reply or grant) under HKS for the events of
  // its hold: lost aborts the Hold's controller, at risk and safe mark it.
  _track(hks, held) {
    const h = new Hold(held);
    for (const hk of hks) {
      if (!this.holds.has(hk)) this.holds.set(hk, new Set());
      this.holds.get(hk).add(h);
    }
    return h;
  }

  _untrack(hks, hold) {
    for (const hk of hks) {
      const set = this.holds.get(hk);
      if (!set) continue;
      set.delete(hold);
      if (set.size === 0) this.holds.delete(hk);
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
      await this.unlock(key, { owner: opts.owner, mode: opts.mode });
    }
  }

  // Semaphores: {acquired, token, permits, available, lease_ms} or
  // {acquired:false, available}. SIGNAL as for lock(); a grant that
  // comes after the abort is released.
  semAcquire(key, limit, { permits, wait_ms, ttl_ms, detach, signal } = {}) {
    if (badKey(key, false)) return Promise.reject(badKey(key, false));
    const onLate = (r) => {
      if (r.acquired) this.semRelease(key, r.token).catch(() => {});
    };
    return this.call('sem.acquire', { key, limit, permits, wait_ms, ttl_ms, detach },
      { signal, onLate });
  }

  semRelease(key, token) {
    if (badKey(key, false)) return Promise.reject(badKey(key, false));
    return this.call('sem.release', { key, token });
  }

  semInfo(key, limit) {
    if (badKey(key, false)) return Promise.reject(badKey(key, false));
    return this.call('sem.info', { key, limit });
  }

  // The rate limiter: {acquired, retry_after_ms}. BURST defaults to the
  // rate in the daemon; with WAIT_MS the daemon waits until the permits
  // are free, up to that long. SIGNAL as for lock().
  rateAcquire(key, rate, per_ms, { burst, permits, wait_ms, signal } = {}) {
    if (badKey(key, false)) return Promise.reject(badKey(key, false));
    return this.call('rate.acquire', { key, rate, per_ms, burst, permits, wait_ms },
      { signal });
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
    const hks = [`${key}\0${grant.token}`];
    const hold = this._track(hks, grant);
    const { ac } = hold;
    try {
      return await fn(grant, ac.signal);
    } finally {
      this._untrack(hks, hold);
      try {
        await this.semRelease(key, grant.token);
      } catch (e) {
        // Its lease ran out meanwhile, or it went with the connection:
        // nothing left to give back.
        if (e.code !== 'not_held' &&
            !(ac.signal.aborted && e.code === 'connection_closed')) {
          throw e;
        }
      }
    }
  }

  // Cache-aside read: the cached value, or LOADER() loaded once
  // cluster-wide and filled (null caches "not found"). Values are stored
  // as text through SERIALIZER ({stringify, parse}; JSON unless connect()
  // was given another; RAW stores strings as they are). WAIT_MS: how long
  // to wait for another caller's fill (the daemon's cache.wait_ms when
  // omitted); past it this caller loads too, and fills only when the
  // daemon handed it a lease. The fill lease is given back (cache.release)
  // whenever the load, its serialisation or the fill fails.
  // BLOOM names a Bloom filter (hello's feature "bloom"): a key it rules
  // out is "not found" (null) at once, LOADER not called.
  async cached(key, loader, { ttl_ms, wait_ms, serializer, bloom } = {}) {
    if (badKey(key, false)) throw badKey(key, false);
    const ser = serializer || this.serializer;
    const got = await this.call('cache.get', { key, wait_ms, bloom });
    if (got.hit) return fromText(key, got.value, ser);
    let value;
    try {
      value = await loader();
      const text = toText(key, value, ser);
      if (got.lease) {
        await this.call('cache.fill', { key, lease: got.lease, value: text,
          ttl_ms });
      }
    } catch (e) {
      if (got.lease) {
        // Not after a fill that failed for the connection: the lease then
        // runs out with cache.fill_lease_ms.
        await this.call('cache.release', { key, lease: got.lease })
          .catch(() => {});
      }
      throw e;
    }
    return value;
  }

  // Bloom filters (hello's feature "bloom"). bloomCreate: a filter for
  // CAPACITY keys at ERROR_RATE false positives; {created, bits, hashes,
  // bytes}, created false when it existed alike (other parameters reject
  // with bad_request).
  bloomCreate(filter, capacity, error_rate) {
    if (badKey(filter, false)) return Promise.reject(badKey(filter, false));
    return this.call('bloom.create', { filter, capacity, error_rate });
  }

  // Add KEYS (one key or an array, at most 1000) to FILTER: an array of
  // booleans, true where the key was surely not in it before.
  async bloomAdd(filter, keys) {
    if (badKey(filter, false)) throw badKey(filter, false);
    if (badKey(keys, true)) throw badKey(keys, true);
    return (await this.call('bloom.add', { filter, keys: [].concat(keys) })).added;
  }

  // An array of booleans for KEYS: false where the key was surely never
  // added to FILTER.
  async bloomCheck(filter, keys) {
    if (badKey(filter, false)) throw badKey(filter, false);
    if (badKey(keys, true)) throw badKey(keys, true);
    return (await this.call('bloom.check', { filter, keys: [].concat(keys) })).maybe;
  }

  // Write path: call after the database write committed. KEYS: one key,
  // or an array of them.
  invalidate(keys, { delay_ms } = {}) {
    if (badKey(keys, true)) return Promise.reject(badKey(keys, true));
    return this.call('cache.invalidate', { keys: [].concat(keys), delay_ms });
  }

  // Bulk warm-up (cache.mset, hello's feature "mset"): ENTRIES, an array
  // of {key, value, ttl_ms} (at most 1000; ttl_ms optional, else TTL_MS,
  // else the daemon's default), each stored as a fill stores it, its
  // value through SERIALIZER as cached() reads it (null: "not found").
  // Resolves to {stored, results}: one result per entry, {ok:true} or
  // {ok:false, error:{code, message}} for an entry that failed alone.
  warm(entries, { ttl_ms, serializer } = {}) {
    let fields;
    try {
      fields = warmFields(entries, ttl_ms, serializer || this.serializer);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.call('cache.mset', fields);
  }

  // Versioned writes (hello's feature "versioned"). read(): a cache.get
  // that resolves to {hit, value, version, lease}: the value through
  // SERIALIZER, its version (0 on a miss), and with LEASE true the fill
  // lease of a miss (it may then wait, as cached() does).
  async read(key, { lease = false, wait_ms, serializer } = {}) {
    if (badKey(key, false)) throw badKey(key, false);
    const got = await this.call('cache.get',
      lease ? { key, wait_ms } : { key, lease: false });
    if (!got.hit) {
      return { hit: false, value: null, version: 0,
        lease: got.lease || null };
    }
    return { hit: true,
      value: fromText(key, got.value, serializer || this.serializer),
      version: got.version || 0, lease: null };
  }

  // cache.set of VALUE (null: "not found"); with IF_VERSION only when the
  // entry's version is that one (0: only when there is none), a
  // compare-and-set. Resolves to {stored, version}: the version stored,
  // or with stored false the current one, to read again and retry.
  async write(key, value, { ttl_ms, if_version, serializer } = {}) {
    if (badKey(key, false)) throw badKey(key, false);
    const text = toText(key, value, serializer || this.serializer);
    const r = await this.call('cache.set', { key, value: text, ttl_ms,
      if_version });
    return { stored: r.stored === true, version: r.version || 0 };
  }

  // cache.fill under LEASE (from read(key, {lease: true})), with
  // IF_VERSION as write() has it; resolves to {stored, version}.
  async fill(key, lease, value, { ttl_ms, if_version, serializer } = {}) {
    if (badKey(key, false)) throw badKey(key, false);
    const text = toText(key, value, serializer || this.serializer);
    const r = await this.call('cache.fill', { key, lease, value: text,
      ttl_ms, if_version });
    return { stored: r.stored === true, version: r.version || 0 };
  }
}

function warmFields(entries, ttl_ms, ser) {
  if (!Array.isArray(entries) || entries.length === 0) {
    throw clientError('invalid', 'warm() takes a non-empty array of ' +
      '{key, value, ttl_ms}');
  }
  return {
    entries: entries.map((e) => {
      if (e === null || typeof e !== 'object' || badKey(e.key, false)) {
        throw clientError('invalid', 'each entry of warm() is ' +
          '{key: string, value, ttl_ms}');
      }
      const out = { key: e.key, value: toText(e.key, e.value, ser) };
      const ttl = e.ttl_ms !== undefined ? e.ttl_ms : ttl_ms;
      if (ttl !== undefined) out.ttl_ms = ttl;
      return out;
    }),
  };
}

// The read and the write side of one read-write lock; LD is a Leased or
// a Pool. A writer may also take the read side of its key (downgrade:
// unlock the write, keep the read). Each call without an owner of its
// own in using*() gets one, as with using().
class RWLock {
  constructor(ld, key) {
    this.ld = ld;
    this.key = key;
  }

  readLock(opts) {
    return this.ld.lock(this.key, { ...opts, mode: 'read' });
  }

  writeLock(opts) {
    return this.ld.lock(this.key, { ...opts, mode: 'write' });
  }

  unlockRead(opts) {
    return this.ld.unlock(this.key, { ...opts, mode: 'read' });
  }

  unlockWrite(opts) {
    return this.ld.unlock(this.key, { ...opts, mode: 'write' });
  }

  usingRead(opts, fn) {
    if (typeof opts === 'function') return this.usingRead({}, opts);
    return this.ld.using(this.key, { ...opts, mode: 'read' }, fn);
  }

  usingWrite(opts, fn) {
    if (typeof opts === 'function') return this.usingWrite({}, opts);
    return this.ld.using(this.key, { ...opts, mode: 'write' }, fn);
  }
}

// The connection of a key: FNV-1a of the key (of a group, of its
// smallest key, so any order of the same group agrees) modulo N.
function slotOf(key, n) {
  if (Array.isArray(key)) {
    key = key.reduce((a, b) => (b < a ? b : a));
  }
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  }
  return (h >>> 0) % n;
}

// SIZE sessions, each its own connection. Locks (and semaphore grants)
// are bound to the session that took them, so a request that names a key
// goes to the connection that key hashes to: a lock, its extend and its
// unlock, using() and the reentrant holds of one key all meet one
// session, whoever calls. Requests without a key go to the connection
// with the fewest requests in flight. When one connection ends, its
// locks end with it (using() aborts their signals); the next request
// routed to it opens a new one. Requests of one tick on one connection
// still go out in one write, so N connections shared by many callers
// cost fewer system calls than one connection per caller.
class Pool extends EventEmitter {
  constructor({ path, size = 4, client, auth, serializer } = {}) {
    super();
    this.target = path;
    this.size = size;
    this.opts = { client, auth, serializer };
    this.slots = new Array(size).fill(null); // Leased or Promise<Leased>
    this.closed = false;
  }

  // A connected Pool of CONNECTIONS sessions (Leased.connect with
  // { connections }).
  static async connect(target, { client, auth, connections = 4,
    serializer } = {}) {
    const pool = new Pool({ path: target, size: connections, client, auth,
      serializer });
    try {
      await Promise.all(pool.slots.map((_, i) => pool._slot(i)));
    } catch (e) {
      pool.close();
      throw e;
    }
    return pool;
  }

  get conns() {
    return this.slots.filter((c) => c instanceof Leased);
  }

  get features() {
    const c = this.conns[0];
    return c ? c.features : [];
  }

  _slot(i) {
    const cur = this.slots[i];
    if (cur !== null && !(cur instanceof Leased && cur.closed)) return cur;
    if (this.closed) return Promise.reject(poolClosed());
    const p = Leased.connect(this.target, this.opts).then((ld) => {
      if (this.closed) {
        ld.close();
        throw poolClosed();
      }
      ld.on('event', (ev) => {
        this.emit('event', ev);
        this.emit(ev.event, ev);
      });
      this.slots[i] = ld;
      return ld;
    }, (e) => {
      this.slots[i] = null;
      throw e;
    });
    this.slots[i] = p;
    return p;
  }

  // Runs FN(connection) on KEY's connection (the least busy one when
  // KEY is undefined), synchronously when it is connected.
  _on(key, fn) {
    let i = 0;
    if (key !== undefined) {
      if (badKey(key, true)) return Promise.reject(badKey(key, true));
      i = slotOf(key, this.size);
    } else {
      let best = -1;
      for (let j = 0; j < this.size; j++) {
        const c = this.slots[j];
        if (!(c instanceof Leased) || c.closed) {
          if (best < 0) i = j;
          continue;
        }
        if (best < 0 || c.pending.size < best) {
          best = c.pending.size;
          i = j;
        }
      }
    }
    const c = this._slot(i);
    return c instanceof Leased ? fn(c) : c.then(fn);
  }

  call(op, fields = {}, opts) {
    const key = typeof fields.key === 'string' ? fields.key : fields.keys;
    return this._on(key, (c) => c.call(op, fields, opts));
  }

  lock(key, opts) {
    return this._on(key, (c) => c.lock(key, opts));
  }

  unlock(key, opts) {
    return this._on(key, (c) => c.unlock(key, opts));
  }

  extend(key, ttl_ms, opts) {
    return this._on(key, (c) => c.extend(key, ttl_ms, opts));
  }

  rwlock(key) {
    return new RWLock(this, key);
  }

  using(key, opts, fn) {
    return this._on(key, (c) => c.using(key, opts, fn));
  }

  withLock(key, opts, fn) {
    return this._on(key, (c) => c.withLock(key, opts, fn));
  }

  cached(key, loader, opts) {
    return this._on(key, (c) => c.cached(key, loader, opts));
  }

  invalidate(keys, opts) {
    return this._on(undefined, (c) => c.invalidate(keys, opts));
  }

  warm(entries, opts) {
    return this._on(undefined, (c) => c.warm(entries, opts));
  }

  read(key, opts) {
    return this._on(key, (c) => c.read(key, opts));
  }

  write(key, value, opts) {
    return this._on(key, (c) => c.write(key, value, opts));
  }

  fill(key, lease, value, opts) {
    return this._on(key, (c) => c.fill(key, lease, value, opts));
  }

  semAcquire(key, limit, opts) {
    return this._on(key, (c) => c.semAcquire(key, limit, opts));
  }

  semRelease(key, token) {
    return this._on(key, (c) => c.semRelease(key, token));
  }

  semInfo(key, limit) {
    return this._on(key, (c) => c.semInfo(key, limit));
  }

  rateAcquire(key, rate, per_ms, opts) {
    return this._on(key, (c) => c.rateAcquire(key, rate, per_ms, opts));
  }

  bloomCreate(filter, capacity, error_rate) {
    return this._on(undefined, (c) => c.bloomCreate(filter, capacity, error_rate));
  }

  bloomAdd(filter, keys) {
    return this._on(undefined, (c) => c.bloomAdd(filter, keys));
  }

  bloomCheck(filter, keys) {
    return this._on(undefined, (c) => c.bloomCheck(filter, keys));
  }

  withSemaphore(key, limit, opts, fn) {
    return this._on(key, (c) => c.withSemaphore(key, limit, opts, fn));
  }

  close() {
    this.closed = true;
    for (const c of this.slots) {
      if (c instanceof Leased) c.close();
    }
    this.slots.fill(null);
  }
}

module.exports = { Leased, LeasedError, Pool, RWLock, RAW };
