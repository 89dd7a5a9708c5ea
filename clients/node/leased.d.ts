// Types for leased.js, the Node.js client of leased (leased-protocol(7)).
// They use Node's own types (EventEmitter, AbortSignal, Buffer): install
// @types/node (an optional peer dependency) to check against them.
/// <reference types="node" />
import { EventEmitter } from 'events';

export interface Reply {
  id?: string | number;
  ok: boolean;
  [field: string]: unknown;
}

export interface LockOptions {
  /** 0 tries once (default); positive waits that long; -1 without limit. */
  wait_ms?: number;
  /** A fixed lease; without it the daemon renews the lock (watchdog). */
  ttl_ms?: number;
  /** Reentry is per owner. Without owner and token, lock() gets an owner
   *  of its own (callers sharing the connection exclude each other), and
   *  unlock()/extend() naming neither find its hold. */
  owner?: string;
  detach?: boolean;
  token?: string;
  /** A side of a read-write lock (see rwlock()); without it, a plain
   *  lock. */
  mode?: 'read' | 'write';
  /** Aborting it ends the wait at once (cancel is sent; a late grant is
   *  unlocked). */
  signal?: AbortSignal;
}

export interface RateOptions {
  /** At most this many at once after a quiet spell (default: the rate). */
  burst?: number;
  /** How many permits to take, all or none (default 1). */
  permits?: number;
  /** 0 decides once (default); positive lets the daemon wait that long. */
  wait_ms?: number;
  /** Aborting it ends the wait at once (cancel is sent). */
  signal?: AbortSignal;
}

export interface BloomCreateReply extends Reply {
  /** False when the filter existed with these very parameters. */
  created: boolean;
  bits: number;
  hashes: number;
  /** The bitmap's size when full. */
  bytes: number;
}

export interface RateReply extends Reply {
  acquired: boolean;
  /** Refused: ms until the permits could be granted; granted: ms until
   *  one more could be (0: now). */
  retry_after_ms: number;
}

export interface SemOptions {
  /** How many permits this grant takes (default 1). */
  permits?: number;
  /** 0 tries once (default); positive waits that long; -1 without limit. */
  wait_ms?: number;
  /** A fixed lease; without it the daemon renews the grant (watchdog). */
  ttl_ms?: number;
  detach?: boolean;
  /** Aborting it ends the wait at once (cancel is sent; a late grant is
   *  released). */
  signal?: AbortSignal;
}

export interface SemReply extends Reply {
  acquired: boolean;
  token?: string;
  permits?: number;
  available: number;
  lease_ms?: number;
}

export interface SemInfoReply extends Reply {
  available: number;
  held: number;
}

export interface CallOptions {
  signal?: AbortSignal;
  /** Gets the reply that comes after SIGNAL aborted the call. */
  onLate?: (reply: Reply) => void;
}

/** One lock, or a group of keys locked all or none under one token. */
export type Key = string | string[];

export interface LockReply extends Reply {
  acquired: boolean;
  token?: string;
  count?: number;
  fence?: number;
  /** A group of keys: each key's fence. */
  fences?: Record<string, number>;
  lease_ms?: number;
  /** The holder's remaining lease when not acquired (-1 unknown). */
  ttl_ms?: number;
}

export interface UnlockReply extends Reply {
  released: boolean;
  count: number;
}

export interface LockLostEvent {
  event: 'lock_lost';
  key: string;
  token: string;
  reason: 'expired' | 'taken' | 'redis_unavailable' | 'max_hold' | 'failover';
}

/** signal.reason of using(): the lock_lost event, or the connection
 *  (so the session and its locks) ended. */
export interface LockLostError extends LeasedError {
  code: 'lock_lost' | 'sem_lost' | 'connection_closed';
  event?: LockLostEvent;
}

/** lock_at_risk / sem_at_risk: a renewal failed or is late; the lease
 *  may still hold for lease_left_ms. lock_safe / sem_safe: a renewal
 *  confirmed it again, for lease_ms. */
export interface RiskEvent {
  event: 'lock_at_risk' | 'sem_at_risk' | 'lock_safe' | 'sem_safe';
  key: string;
  token: string;
  lease_left_ms?: number;
  lease_ms?: number;
}

/** What using() and withSemaphore() add to the held lock or grant (both
 *  non-enumerable). atRisk is true from lock_at_risk (sem_at_risk) of a
 *  key until lock_safe (sem_safe); for a group while any key is at risk.
 *  risk emits 'at_risk' and 'safe' with the event, once per episode. */
export interface RiskState {
  readonly atRisk: boolean;
  readonly risk: import('events').EventEmitter;
}

export type Using<T> = (signal: AbortSignal,
  held: LockReply & RiskState) => Promise<T> | T;

/** Every error of the client. CODE is the daemon's error code (REPLY
 *  its reply), or the client's own: 'connect' (leased could not be
 *  reached; the message names the target and what to check),
 *  'connection_closed' (the connection ended, e.g. a restart: its
 *  session's locks went with it), 'protocol', 'invalid' (a bad argument
 *  or a value the serializer cannot take), 'not_acquired', 'no_permit',
 *  'lock_lost', 'sem_lost'. An aborted signal rejects with its own
 *  reason instead. */
export declare class LeasedError extends Error {
  constructor(reply: Reply);
  constructor(code: string, message: string);
  code: string;
  reason?: string;
  /** The daemon's reply, for the daemon's errors. */
  reply?: Reply;
  /** not_acquired: the holder's lease left. */
  ttl_ms?: number;
  /** no_permit: the permits available. */
  available?: number;
  /** connect: the target that could not be reached. */
  target?: string;
}

/** How cached() stores values as text: JSON (the default) has this
 *  shape. */
export interface Serializer {
  stringify(value: any): string;
  parse(text: string): any;
}

/** Strings as they are (another type is refused): for entries that
 *  other clients and leasectl read and write as plain text. */
export declare const RAW: Serializer;

export interface ConnectOptions {
  client?: string;
  auth?: string;
  /** The default serializer of cached() (JSON). */
  serializer?: Serializer;
  /** A Bloom filter (hello's feature "bloom"): a key it rules out is
   *  "not found" (null) at once, LOADER not called. */
  bloom?: string;
}

/** One entry of warm() (cache.mset). */
export interface WarmEntry {
  key: string;
  value: unknown;
  ttl_ms?: number;
}

/** warm()'s answer: how many were stored, and each entry's result in
 *  order ({ok: true}, or {ok: false, error: {code, message}}). */
export interface WarmReply extends Reply {
  stored: number;
  results: Array<{ ok: boolean; error?: { code: string; message: string } }>;
}

/** read()'s answer (versioned writes): the value with its version (0 on
 *  a miss), and the fill lease of a miss read with {lease: true}. */
export interface VersionedRead<T = unknown> {
  hit: boolean;
  value: T | null;
  version: number;
  lease: string | null;
}

/** write() and fill(): whether it stored, and the version it stored, or
 *  when it did not the entry's current one (0: none). */
export interface VersionedWrite {
  stored: boolean;
  version: number;
}

export interface WriteOptions {
  ttl_ms?: number;
  /** Store only when the entry's version is this one (0: only when there
   *  is none). */
  if_version?: number;
  serializer?: Serializer;
}

export interface CachedOptions {
  ttl_ms?: number;
  /** How long to wait for another caller's fill (default the daemon's
   *  cache.wait_ms, 3000). Past it this caller loads too, and fills only
   *  when the daemon handed it a lease. */
  wait_ms?: number;
  serializer?: Serializer;
}

export interface UnlockOptions {
  owner?: string;
  token?: string;
  /** The mode the lock was taken in (read-write locks). */
  mode?: 'read' | 'write';
  /** 1 to 64 printable ASCII characters: the same unlock sent again
   *  with the same id (after a lost answer) gets the first answer and
   *  releases no second hold. */
  request_id?: string;
}

/** Leased or Pool: what an RWLock runs on. */
export interface Locker {
  lock(key: Key, opts?: LockOptions): Promise<LockReply>;
  unlock(key: Key, opts?: UnlockOptions): Promise<UnlockReply>;
  using<T>(key: Key, opts: LockOptions, fn: Using<T>): Promise<T>;
}

/** The read and the write side of one read-write lock
 *  (leased-protocol(7), "Read-write locks"): readers share it, a writer
 *  excludes readers and writers. The daemon announces "rwlock" in
 *  hello's features when it has them. */
export declare class RWLock {
  constructor(ld: Locker, key: string);
  readonly key: string;
  readLock(opts?: Omit<LockOptions, 'mode'>): Promise<LockReply>;
  writeLock(opts?: Omit<LockOptions, 'mode'>): Promise<LockReply>;
  unlockRead(opts?: Omit<UnlockOptions, 'mode'>): Promise<UnlockReply>;
  unlockWrite(opts?: Omit<UnlockOptions, 'mode'>): Promise<UnlockReply>;
  /** using() on the read side: the signal aborts on lock_lost. */
  usingRead<T>(opts: Omit<LockOptions, 'mode'>, fn: Using<T>): Promise<T>;
  usingRead<T>(fn: Using<T>): Promise<T>;
  usingWrite<T>(opts: Omit<LockOptions, 'mode'>, fn: Using<T>): Promise<T>;
  usingWrite<T>(fn: Using<T>): Promise<T>;
}

export declare class Leased extends EventEmitter {
  /** CONNECTIONS sessions in a Pool (see Pool). */
  static connect(target: string | undefined,
                 opts: ConnectOptions & { connections: number }):
    Promise<Pool>;
  /** TARGET: a Unix socket path or "host:port" ($LEASED_SOCKET, else
   *  /run/leased/leased.sock). */
  static connect(target?: string,
                 opts?: ConnectOptions & { connections?: undefined }):
    Promise<Leased>;
  /** cached()'s default serializer (JSON). */
  serializer: Serializer;
  session?: string;
  features: string[];
  close(): void;
  call(op: string, fields?: Record<string, unknown>,
       opts?: CallOptions): Promise<Reply>;
  lock(key: Key, opts?: LockOptions): Promise<LockReply>;
  unlock(key: Key, opts?: UnlockOptions): Promise<UnlockReply>;
  extend(key: Key, ttl_ms: number, opts?: UnlockOptions): Promise<Reply>;
  rwlock(key: string): RWLock;
  /** Holds KEY while FN runs; SIGNAL aborts on lock_lost; the lock is
   *  released when FN settles. Rejects with code 'not_acquired'. */
  using<T>(key: Key, opts: LockOptions, fn: Using<T>): Promise<T>;
  using<T>(key: Key, fn: Using<T>): Promise<T>;
  withLock<T>(key: Key, opts: LockOptions | undefined,
              fn: (held: LockReply) => Promise<T> | T): Promise<T>;
  /** The value of KEY, or LOADER's loaded once cluster-wide and filled
   *  (null: "not found"). The fill lease is given back when the load or
   *  the fill fails. */
  cached<T>(key: string, loader: () => Promise<T> | T,
            opts?: CachedOptions): Promise<T>;
  invalidate(keys: string | string[], opts?: { delay_ms?: number }):
    Promise<Reply>;
  /** cache.mset: ENTRIES stored as fills store them (values through the
   *  serializer, null: "not found"); one result per entry. */
  warm(entries: WarmEntry[], opts?: { ttl_ms?: number;
    serializer?: Serializer }): Promise<WarmReply>;
  /** cache.get with the version of the value (feature "versioned"). */
  read<T = unknown>(key: string, opts?: { lease?: boolean; wait_ms?: number;
    serializer?: Serializer }): Promise<VersionedRead<T>>;
  /** cache.set, with if_version a compare-and-set. */
  write(key: string, value: unknown, opts?: WriteOptions):
    Promise<VersionedWrite>;
  /** cache.fill under LEASE, with if_version as write() has it. */
  fill(key: string, lease: string, value: unknown, opts?: WriteOptions):
    Promise<VersionedWrite>;
  semAcquire(key: string, limit: number, opts?: SemOptions): Promise<SemReply>;
  semRelease(key: string, token: string): Promise<Reply>;
  semInfo(key: string, limit: number): Promise<SemInfoReply>;
  rateAcquire(key: string, rate: number, per_ms: number,
              opts?: RateOptions): Promise<RateReply>;
  /** bloom.create: other parameters than the filter has reject with
   *  bad_request. */
  bloomCreate(filter: string, capacity: number, error_rate: number):
    Promise<BloomCreateReply>;
  /** true where the key was surely not in FILTER before. */
  bloomAdd(filter: string, keys: string | string[]): Promise<boolean[]>;
  /** false where the key was surely never added to FILTER. */
  bloomCheck(filter: string, keys: string | string[]): Promise<boolean[]>;
  /** Holds permits of KEY while FN runs; released when FN settles.
   *  Rejects with code 'no_permit'. */
  withSemaphore<T>(key: string, limit: number, opts: SemOptions | undefined,
                   fn: (grant: SemReply & RiskState, signal: AbortSignal) =>
                     Promise<T> | T):
    Promise<T>;
  withSemaphore<T>(key: string, limit: number,
                   fn: (grant: SemReply & RiskState, signal: AbortSignal) =>
                     Promise<T> | T):
    Promise<T>;
  on(event: 'lock_lost', listener: (ev: LockLostEvent) => void): this;
  on(event: 'event', listener: (ev: Record<string, unknown>) => void): this;
  on(event: 'close', listener: (err: Error) => void): this;
  on(event: string, listener: (...args: any[]) => void): this;
}

/** SIZE sessions. A request that names a key goes to the connection the
 *  key hashes to, so a lock, its extend and its unlock meet the session
 *  that holds it; requests without a key go to the least busy one. A
 *  connection that ends is opened again by the next request routed to
 *  it (its locks ended with it). */
export declare class Pool extends EventEmitter {
  constructor(opts?: { path?: string; size?: number } & ConnectOptions);
  /** A Pool with all its connections open (default 4). */
  static connect(target?: string,
                 opts?: ConnectOptions & { connections?: number }):
    Promise<Pool>;
  readonly size: number;
  /** The open connections. */
  readonly conns: Leased[];
  /** hello's features, from the first open connection. */
  readonly features: string[];
  call(op: string, fields?: Record<string, unknown>,
       opts?: CallOptions): Promise<Reply>;
  lock(key: Key, opts?: LockOptions): Promise<LockReply>;
  unlock(key: Key, opts?: UnlockOptions): Promise<UnlockReply>;
  extend(key: Key, ttl_ms: number, opts?: UnlockOptions): Promise<Reply>;
  rwlock(key: string): RWLock;
  using<T>(key: Key, opts: LockOptions, fn: Using<T>): Promise<T>;
  using<T>(key: Key, fn: Using<T>): Promise<T>;
  withLock<T>(key: Key, opts: LockOptions | undefined,
              fn: (held: LockReply) => Promise<T> | T): Promise<T>;
  /** The value of KEY, or LOADER's loaded once cluster-wide and filled
   *  (null: "not found"). The fill lease is given back when the load or
   *  the fill fails. */
  cached<T>(key: string, loader: () => Promise<T> | T,
            opts?: CachedOptions): Promise<T>;
  invalidate(keys: string | string[], opts?: { delay_ms?: number }):
    Promise<Reply>;
  /** cache.mset: ENTRIES stored as fills store them (values through the
   *  serializer, null: "not found"); one result per entry. */
  warm(entries: WarmEntry[], opts?: { ttl_ms?: number;
    serializer?: Serializer }): Promise<WarmReply>;
  /** cache.get with the version of the value (feature "versioned"). */
  read<T = unknown>(key: string, opts?: { lease?: boolean; wait_ms?: number;
    serializer?: Serializer }): Promise<VersionedRead<T>>;
  /** cache.set, with if_version a compare-and-set. */
  write(key: string, value: unknown, opts?: WriteOptions):
    Promise<VersionedWrite>;
  /** cache.fill under LEASE, with if_version as write() has it. */
  fill(key: string, lease: string, value: unknown, opts?: WriteOptions):
    Promise<VersionedWrite>;
  semAcquire(key: string, limit: number, opts?: SemOptions): Promise<SemReply>;
  semRelease(key: string, token: string): Promise<Reply>;
  semInfo(key: string, limit: number): Promise<SemInfoReply>;
  rateAcquire(key: string, rate: number, per_ms: number,
              opts?: RateOptions): Promise<RateReply>;
  /** bloom.create: other parameters than the filter has reject with
   *  bad_request. */
  bloomCreate(filter: string, capacity: number, error_rate: number):
    Promise<BloomCreateReply>;
  /** true where the key was surely not in FILTER before. */
  bloomAdd(filter: string, keys: string | string[]): Promise<boolean[]>;
  /** false where the key was surely never added to FILTER. */
  bloomCheck(filter: string, keys: string | string[]): Promise<boolean[]>;
  withSemaphore<T>(key: string, limit: number, opts: SemOptions | undefined,
                   fn: (grant: SemReply & RiskState, signal: AbortSignal) =>
                     Promise<T> | T):
    Promise<T>;
  withSemaphore<T>(key: string, limit: number,
                   fn: (grant: SemReply & RiskState, signal: AbortSignal) =>
                     Promise<T> | T):
    Promise<T>;
  close(): void;
}
