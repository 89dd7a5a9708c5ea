// Types for leased.js, the Node.js client of leased (leased-protocol(7)).
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
  owner?: string;
  detach?: boolean;
  token?: string;
  mode?: 'read' | 'write';
  /** Aborting it ends the wait at once (cancel is sent; a late grant is
   *  unlocked). */
  signal?: AbortSignal;
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
export interface LockLostError extends Error {
  code: 'lock_lost' | 'sem_lost' | 'connection_closed';
  event?: LockLostEvent;
}

export type Using<T> = (signal: AbortSignal, held: LockReply) => Promise<T> | T;

export declare class LeasedError extends Error {
  code: string;
  reason?: string;
  reply: Reply;
}

export interface ConnectOptions {
  client?: string;
  auth?: string;
}

export declare class Leased extends EventEmitter {
  /** TARGET: a Unix socket path or "host:port" ($LEASED_SOCKET, else
   *  /run/leased/leased.sock). */
  static connect(target?: string, opts?: ConnectOptions): Promise<Leased>;
  session?: string;
  features: string[];
  close(): void;
  call(op: string, fields?: Record<string, unknown>,
       opts?: CallOptions): Promise<Reply>;
  lock(key: Key, opts?: LockOptions): Promise<LockReply>;
  unlock(key: Key, opts?: { owner?: string; token?: string }):
    Promise<UnlockReply>;
  extend(key: Key, ttl_ms: number,
         opts?: { owner?: string; token?: string }): Promise<Reply>;
  /** Holds KEY while FN runs; SIGNAL aborts on lock_lost; the lock is
   *  released when FN settles. Rejects with code 'not_acquired'. */
  using<T>(key: Key, opts: LockOptions, fn: Using<T>): Promise<T>;
  using<T>(key: Key, fn: Using<T>): Promise<T>;
  withLock<T>(key: Key, opts: LockOptions | undefined,
              fn: (held: LockReply) => Promise<T> | T): Promise<T>;
  cached<T extends string | null>(key: string,
                                  loader: () => Promise<T> | T,
                                  opts?: { ttl_ms?: number }): Promise<T>;
  invalidate(keys: string | string[], opts?: { delay_ms?: number }):
    Promise<Reply>;
  semAcquire(key: string, limit: number, opts?: SemOptions): Promise<SemReply>;
  semRelease(key: string, token: string): Promise<Reply>;
  semInfo(key: string, limit: number): Promise<SemInfoReply>;
  /** Holds permits of KEY while FN runs; released when FN settles.
   *  Rejects with code 'no_permit'. */
  withSemaphore<T>(key: string, limit: number, opts: SemOptions | undefined,
                   fn: (grant: SemReply, signal: AbortSignal) => Promise<T> | T):
    Promise<T>;
  on(event: 'lock_lost', listener: (ev: LockLostEvent) => void): this;
  on(event: 'event', listener: (ev: Record<string, unknown>) => void): this;
  on(event: 'close', listener: (err: Error) => void): this;
  on(event: string, listener: (...args: any[]) => void): this;
}

export declare class Pool extends EventEmitter {
  constructor(opts?: { path?: string; size?: number } & ConnectOptions);
  call(op: string, fields?: Record<string, unknown>): Promise<Reply>;
  lock(key: Key, opts?: LockOptions): Promise<LockReply>;
  unlock(key: Key, opts?: { owner?: string; token?: string }):
    Promise<UnlockReply>;
  extend(key: Key, ttl_ms: number,
         opts?: { owner?: string; token?: string }): Promise<Reply>;
  using<T>(key: string, opts: LockOptions, fn: Using<T>): Promise<T>;
  withLock<T>(key: Key, opts: LockOptions | undefined,
              fn: (held: LockReply) => Promise<T> | T): Promise<T>;
  cached<T extends string | null>(key: string,
                                  loader: () => Promise<T> | T,
                                  opts?: { ttl_ms?: number }): Promise<T>;
  invalidate(keys: string | string[], opts?: { delay_ms?: number }):
    Promise<Reply>;
  semAcquire(key: string, limit: number, opts?: SemOptions): Promise<SemReply>;
  semRelease(key: string, token: string): Promise<Reply>;
  semInfo(key: string, limit: number): Promise<SemInfoReply>;
  withSemaphore<T>(key: string, limit: number, opts: SemOptions | undefined,
                   fn: (grant: SemReply, signal: AbortSignal) => Promise<T> | T):
    Promise<T>;
  close(): void;
}
