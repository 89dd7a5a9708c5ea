package leased

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// WaitForever as a Wait waits without limit (wait_ms -1); the call's
// context still ends the wait.
const WaitForever time.Duration = -1

// unlockTimeout bounds an Unlock whose own context had already ended.
const unlockTimeout = 10 * time.Second

// LockOptions are the fields of a lock request; the zero value tries
// once for a session-bound lock renewed by the daemon's watchdog.
type LockOptions struct {
	// Owner names the holder inside the session. Locking again with the
	// same Owner reenters (the hold count goes up). Empty: an owner of
	// its own for each call, so goroutines exclude each other.
	Owner string
	// TTL is a fixed lease; 0 leaves the lock to the watchdog.
	TTL time.Duration
	// Wait is how long to wait for the lock: 0 tries once, WaitForever
	// waits until ctx ends. Cancelling ctx sends cancel for the wait.
	Wait time.Duration
	// Detach makes the lock outlive the session (needs TTL); it is
	// unlocked by token.
	Detach bool
	// Token reenters a lock held under this token.
	Token string
}

// Held is one acquisition of a lock, a group of locks or a semaphore
// grant.
type Held struct {
	Key     string           // the key ("" for a group)
	Keys    []string         // the keys of a group
	Token   string           // the lock's token (shared by reentries)
	Fence   int64            // the fencing token (one key)
	Fences  map[string]int64 // the fence of each key of a group
	Count   int              // the hold count after this acquisition
	Lease   time.Duration    // guaranteed lease from the grant
	Permits int              // a semaphore grant's permits

	kind   string // "lock" or "sem"
	mode   string
	owner  string
	detach bool
	c      *conn
	grant  *reply
	done   chan struct{}

	mu       sync.Mutex
	reason   string
	released bool
	risky    map[string]bool // keys at risk (lock_at_risk, sem_at_risk)
	riskC    chan struct{}   // closed while at risk; new after safe
}

// AtRisk reports whether the hold is at risk: a renewal of it (of any
// key, for a group) failed or is late and its lease may end, so finish
// or pause the writes. It is true from lock_at_risk (sem_at_risk) until
// lock_safe (sem_safe) or the loss.
func (h *Held) AtRisk() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.risky) > 0
}

// AtRiskC is closed while the hold is at risk. After lock_safe it
// returns a new channel, closed at the next episode; select on it and on
// Done.
func (h *Held) AtRiskC() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.riskC == nil {
		h.riskC = make(chan struct{})
	}
	return h.riskC
}

func (h *Held) setRisk(key string, atRisk bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.riskC == nil {
		h.riskC = make(chan struct{})
	}
	was := len(h.risky) > 0
	if atRisk {
		if h.risky == nil {
			h.risky = make(map[string]bool)
		}
		h.risky[key] = true
	} else {
		delete(h.risky, key)
	}
	switch now := len(h.risky) > 0; {
	case now && !was:
		close(h.riskC)
	case !now && was:
		h.riskC = make(chan struct{})
	}
}

// Done is closed when the daemon reports the lock lost (lock_lost,
// sem_lost) or the session that held it ended: stop writing under it.
func (h *Held) Done() <-chan struct{} { return h.done }

// Reason says why Done was closed: the event's reason (expired, taken,
// redis_unavailable, ...) or connection_closed; "" while held.
func (h *Held) Reason() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

func (h *Held) lose(reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reason != "" {
		return
	}
	h.reason = reason
	close(h.done)
}

// Unlock releases this acquisition (one count of a reentrant lock, or
// the whole semaphore grant). It is meant for defer: when ctx has
// already ended it uses a fresh one (bounded by 10 s) instead, so a
// cancelled caller does not leave its lock behind. Unlocking a hold
// that was lost (Done closed) is not an error: the unlock still goes
// out, for the keys of a group that were not lost, unless the session
// ended. A hold already unlocked returns nil.
func (h *Held) Unlock(ctx context.Context) error {
	h.mu.Lock()
	skip := h.released || h.reason == "connection_closed"
	h.released = true
	h.mu.Unlock()
	if skip {
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), unlockTimeout)
		defer cancel()
	}
	_, err := h.c.call(ctx, h.unlockReq(), nil)
	if err == nil || Code(err) == "not_held" || h.lost() {
		h.c.untrack(h)
		if h.lost() {
			// The loss was reported; the lock went with its lease or
			// its session.
			return nil
		}
		return err
	}
	// Not sent or no answer: the hold is still there to unlock.
	h.mu.Lock()
	h.released = false
	h.mu.Unlock()
	return err
}

func (h *Held) lost() bool { return h.Reason() != "" }

func (h *Held) unlockReq() map[string]any {
	if h.kind == "sem" {
		return map[string]any{"op": "sem.release", "key": h.Key,
			"token": h.Token}
	}
	req := h.target("unlock")
	return req
}

// target names this hold in a request: by owner on its own session, by
// token when detached.
func (h *Held) target(op string) map[string]any {
	req := map[string]any{"op": op}
	if len(h.Keys) > 0 {
		req["keys"] = h.Keys
	} else {
		req["key"] = h.Key
	}
	if h.detach {
		req["token"] = h.Token
	} else {
		req["owner"] = h.owner
	}
	if h.mode != "" {
		req["mode"] = h.mode
	}
	return req
}

// Extend sets the remaining lease of the lock to ttl.
func (h *Held) Extend(ctx context.Context, ttl time.Duration) error {
	if h.kind != "lock" {
		return newErr("invalid", "only a lock can be extended")
	}
	req := h.target("extend")
	req["ttl_ms"] = ms(ttl)
	r, err := h.c.call(ctx, req, nil)
	if err == nil {
		h.Lease = time.Duration(r.LeaseMS) * time.Millisecond
	}
	return err
}

func (c *conn) untrack(h *Held) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hs := c.holds[h.Token]
	for i, x := range hs {
		if x == h {
			hs = append(hs[:i:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(c.holds, h.Token)
	} else {
		c.holds[h.Token] = hs
	}
}

// Lock takes key, waiting up to opts.Wait. Not acquired in time is an
// error with code not_acquired (errors.Is(err, ErrNotAcquired)).
//
//	held, err := ld.Lock(ctx, "order:42", &leased.LockOptions{Wait: 5 * time.Second})
//	if err != nil { return err }
//	defer held.Unlock(ctx)
func (cl *Client) Lock(ctx context.Context, key string, opts *LockOptions) (*Held, error) {
	return must(cl.lock(ctx, []string{key}, false, "", opts))
}

// TryLock is Lock that returns (nil, nil) when the lock was not
// acquired within opts.Wait.
func (cl *Client) TryLock(ctx context.Context, key string, opts *LockOptions) (*Held, error) {
	return cl.lock(ctx, []string{key}, false, "", opts)
}

// LockKeys takes several keys at once, all or none, under one token;
// Held.Fences has each key's fence and Done closes when any of them is
// lost.
func (cl *Client) LockKeys(ctx context.Context, keys []string, opts *LockOptions) (*Held, error) {
	return must(cl.lock(ctx, keys, true, "", opts))
}

// TryLockKeys is LockKeys that returns (nil, nil) when not acquired.
func (cl *Client) TryLockKeys(ctx context.Context, keys []string, opts *LockOptions) (*Held, error) {
	return cl.lock(ctx, keys, true, "", opts)
}

func must(h *Held, err error) (*Held, error) {
	if err == nil && h == nil {
		return nil, newErr("not_acquired", "the lock was not acquired in time")
	}
	return h, err
}

func (cl *Client) lock(ctx context.Context, keys []string, group bool,
	mode string, opts *LockOptions) (*Held, error) {
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &LockOptions{}
	}
	h := &Held{kind: "lock", mode: mode, owner: opts.Owner,
		detach: opts.Detach, done: make(chan struct{})}
	if h.owner == "" {
		h.owner = cl.newOwner()
	}
	req := map[string]any{"op": "lock", "owner": h.owner}
	if group {
		h.Keys = keys
		req["keys"] = keys
	} else {
		h.Key = keys[0]
		req["key"] = keys[0]
	}
	lockFields(req, opts, mode)
	r, _, err := cl.call(ctx, keys, req, h.onGrant)
	if err != nil || !r.Acquired {
		return nil, err
	}
	return h, nil
}

func lockFields(req map[string]any, opts *LockOptions, mode string) {
	if opts.TTL > 0 {
		req["ttl_ms"] = ms(opts.TTL)
	}
	if opts.Wait != 0 {
		req["wait_ms"] = waitMS(opts.Wait)
	}
	if opts.Detach {
		req["detach"] = true
	}
	if opts.Token != "" {
		req["token"] = opts.Token
	}
	if mode != "" {
		req["mode"] = mode
	}
}

// onGrant runs in the connection's reader (c.mu held): the hold is
// tracked before a lock_lost for it can be read.
func (h *Held) onGrant(c *conn, r *reply) {
	if !r.OK || !r.Acquired {
		return
	}
	h.Token, h.Count, h.Fence, h.Fences = r.Token, r.Count, r.Fence, r.Fences
	h.Permits = r.Permits
	h.Lease = time.Duration(r.LeaseMS) * time.Millisecond
	h.grant = r
	h.c = c
	c.holds[r.Token] = append(c.holds[r.Token], h)
}

// RWLock gives the two sides of the read-write lock of key.
func (cl *Client) RWLock(key string) *RWLock { return &RWLock{cl: cl, key: key} }

// RWLock is a read-write lock: any number of readers, or one writer.
type RWLock struct {
	cl  *Client
	key string
}

// RLock takes the read side (shared); not acquired is not_acquired.
func (rw *RWLock) RLock(ctx context.Context, opts *LockOptions) (*Held, error) {
	return must(rw.cl.lock(ctx, []string{rw.key}, false, "read", opts))
}

// Lock takes the write side (exclusive); not acquired is not_acquired.
func (rw *RWLock) Lock(ctx context.Context, opts *LockOptions) (*Held, error) {
	return must(rw.cl.lock(ctx, []string{rw.key}, false, "write", opts))
}

// TryRLock is RLock that returns (nil, nil) when not acquired.
func (rw *RWLock) TryRLock(ctx context.Context, opts *LockOptions) (*Held, error) {
	return rw.cl.lock(ctx, []string{rw.key}, false, "read", opts)
}

// TryLock is Lock that returns (nil, nil) when not acquired.
func (rw *RWLock) TryLock(ctx context.Context, opts *LockOptions) (*Held, error) {
	return rw.cl.lock(ctx, []string{rw.key}, false, "write", opts)
}

// SemOptions are the fields of sem.acquire besides key and limit.
type SemOptions struct {
	Permits int           // default 1
	Wait    time.Duration // as for LockOptions
	TTL     time.Duration // 0: session-bound with watchdog renewal
	Detach  bool
}

// Semaphore takes permits of the semaphore key of limit permits; none
// in time is an error with code no_permit. Unlock releases the grant.
func (cl *Client) Semaphore(ctx context.Context, key string, limit int, opts *SemOptions) (*Held, error) {
	h, err := cl.TrySemaphore(ctx, key, limit, opts)
	if err == nil && h == nil {
		return nil, newErr("no_permit", "no permit of %q in time", key)
	}
	return h, err
}

// TrySemaphore is Semaphore that returns (nil, nil) without a permit.
func (cl *Client) TrySemaphore(ctx context.Context, key string, limit int, opts *SemOptions) (*Held, error) {
	if err := checkKeys([]string{key}); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &SemOptions{}
	}
	h := &Held{kind: "sem", Key: key, detach: true, done: make(chan struct{})}
	req := map[string]any{"op": "sem.acquire", "key": key, "limit": limit}
	if opts.Permits > 0 {
		req["permits"] = opts.Permits
	}
	lockFields(req, &LockOptions{TTL: opts.TTL, Wait: opts.Wait,
		Detach: opts.Detach}, "")
	r, _, err := cl.call(ctx, []string{key}, req, h.onGrant)
	if err != nil || !r.Acquired {
		return nil, err
	}
	return h, nil
}

// checkKeys refuses a call without a key; what a key may be (not empty,
// at most limits.max_key_bytes) is the daemon's to say (bad_request).
func checkKeys(keys []string) error {
	if len(keys) == 0 {
		return newErr("invalid", "no key given")
	}
	return nil
}

func ms(d time.Duration) int64 {
	n := int64((d + time.Millisecond - 1) / time.Millisecond)
	if n < 1 {
		n = 1
	}
	return n
}

func waitMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return ms(d)
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// UnlockOptions name the lock Client.Unlock releases: by Owner on the
// session that locked it, or by Token (any session; a detached lock).
type UnlockOptions struct {
	Owner string
	Token string
	// Mode is "read" or "write" for a side of a read-write lock.
	Mode string
	// RequestID (1 to 64 printable ASCII characters, unique among the
	// unlocks of one hold) makes the unlock safe to send again: a repeat
	// with the same token or owner and id within the lease gets the first
	// answer and releases no second hold. Repeat with it after a lost
	// answer (an io or timeout error, or OutcomeUnknown); use a new one
	// for each hold meant to be released.
	RequestID string
}

// Unlocked is the answer of an unlock: Released when the lock is free
// now, else the hold Count that is left.
type Unlocked struct {
	Released bool
	Count    int
}

// Unlock releases one hold of key named by opts, outside of a Held:
// for a lock of another process (by token) or an unlock that must be
// safe to retry (opts.RequestID). An owner-named unlock goes out on the
// connection key locks on, so it names the same session's owner.
func (cl *Client) Unlock(ctx context.Context, key string, opts *UnlockOptions) (*Unlocked, error) {
	if err := checkKeys([]string{key}); err != nil {
		return nil, err
	}
	if opts == nil || (opts.Owner == "" && opts.Token == "") {
		return nil, newErr("invalid", "unlock needs an owner or a token")
	}
	req := map[string]any{"op": "unlock", "key": key}
	if opts.Owner != "" {
		req["owner"] = opts.Owner
	}
	if opts.Token != "" {
		req["token"] = opts.Token
	}
	if opts.Mode != "" {
		req["mode"] = opts.Mode
	}
	if opts.RequestID != "" {
		req["request_id"] = opts.RequestID
	}
	r, _, err := cl.call(ctx, []string{key}, req, nil)
	if err != nil {
		return nil, err
	}
	return &Unlocked{Released: string(r.Released) == "true", Count: r.Count},
		nil
}

// RateOptions are the fields of rate.acquire besides key, rate and per.
type RateOptions struct {
	// Burst is how many permits may be taken at once after a quiet
	// spell; 0: the daemon's default, the rate.
	Burst int
	// Permits taken all or none; 0: 1.
	Permits int
	// Wait lets the daemon try again when the permits will be free, up
	// to this long; 0 decides once. The call's context still ends it.
	Wait time.Duration
}

// Rate is the answer of rate.acquire. A refusal is not an error.
type Rate struct {
	Acquired bool
	// RetryAfter: refused, how long until the permits could be granted;
	// granted, until one more could be (0: one is free now).
	RetryAfter time.Duration
}

// RateAcquire takes permits from the rate limiter key, which allows
// rate permits every per (GCRA, decided on Redis time, exact across
// daemons and clients):
//
//	r, err := ld.RateAcquire(ctx, "api:user42", 20, time.Second, nil)
//	if err == nil && !r.Acquired { /* retry after r.RetryAfter */ }
//
// redis_unavailable with OutcomeUnknown(err) may have granted them.
func (cl *Client) RateAcquire(ctx context.Context, key string, rate int,
	per time.Duration, opts *RateOptions) (*Rate, error) {
	if err := checkKeys([]string{key}); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &RateOptions{}
	}
	req := map[string]any{"op": "rate.acquire", "key": key, "rate": rate,
		"per_ms": ms(per)}
	if opts.Burst > 0 {
		req["burst"] = opts.Burst
	}
	if opts.Permits > 0 {
		req["permits"] = opts.Permits
	}
	if opts.Wait > 0 {
		req["wait_ms"] = ms(opts.Wait)
	}
	r, _, err := cl.call(ctx, []string{key}, req, nil)
	if err != nil {
		return nil, err
	}
	return &Rate{Acquired: r.Acquired,
		RetryAfter: time.Duration(r.RetryMS) * time.Millisecond}, nil
}
