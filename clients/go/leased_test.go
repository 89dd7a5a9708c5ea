package leased_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"leased.dev/leased"
)

// The tests run against a real daemon at LEASED_SOCKET
// (tests/integration/check_client_go starts one).
func dial(t *testing.T) *leased.Client {
	t.Helper()
	if os.Getenv("LEASED_SOCKET") == "" {
		t.Fatal("LEASED_SOCKET is not set")
	}
	ld, err := leased.Dial(context.Background(), leased.Options{Client: "go-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ld.Close() })
	return ld
}

func bg() context.Context { return context.Background() }

// k names a key of this run, so a run never meets an earlier one's data.
func k(name string) string { return "go:" + runID + ":" + name }

var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

func TestLockUnlock(t *testing.T) {
	ld := dial(t)
	h, err := ld.Lock(bg(), k("lock"), nil)
	if err != nil || h.Fence <= 0 || h.Token == "" || h.Count != 1 {
		t.Fatalf("lock: %+v %v", h, err)
	}
	other, err := ld.TryLock(bg(), k("lock"), nil)
	if other != nil || err != nil {
		t.Fatalf("a second owner got the lock: %+v %v", other, err)
	}
	if _, err := ld.Lock(bg(), k("lock"), nil); !errors.Is(err, leased.ErrNotAcquired) {
		t.Fatalf("Lock of a held key: %v", err)
	}
	if err := h.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
	h2, err := ld.Lock(bg(), k("lock"), nil)
	if err != nil || h2.Fence <= h.Fence {
		t.Fatalf("relock: %+v %v", h2, err)
	}
	h2.Unlock(bg())
}

func TestReentry(t *testing.T) {
	ld := dial(t)
	o := &leased.LockOptions{Owner: "w"}
	h1, err := ld.Lock(bg(), k("re"), o)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := ld.Lock(bg(), k("re"), o)
	if err != nil || h2.Count != 2 || h2.Token != h1.Token {
		t.Fatalf("reentry: %+v %v", h2, err)
	}
	h2.Unlock(bg())
	if h, _ := ld.TryLock(bg(), k("re"), nil); h != nil {
		t.Fatal("free after one of two unlocks")
	}
	h1.Unlock(bg())
	if h, _ := ld.TryLock(bg(), k("re"), nil); h == nil {
		t.Fatal("held after two unlocks")
	}
}

// A waiting Lock whose context is cancelled returns at once, sends
// cancel, and leaves nothing held.
func TestCancelWait(t *testing.T) {
	ld := dial(t)
	h, err := ld.Lock(bg(), k("cancel"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cancelled := stat(t, ld, "cancelled")
	ctx, cancel := context.WithCancel(bg())
	errc := make(chan error, 1)
	go func() {
		_, err := ld.Lock(ctx, k("cancel"), &leased.LockOptions{Wait: leased.WaitForever})
		errc <- err
	}()
	waitStat(t, ld, "lock_waiters", 1)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || leased.Code(err) != "cancelled" {
			t.Fatalf("cancelled wait: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a cancelled wait did not return")
	}
	waitStat(t, ld, "lock_waiters", 0)
	waitStat(t, ld, "cancelled", cancelled+1)
	h.Unlock(bg())
	h3, err := ld.TryLock(bg(), k("cancel"), nil)
	if h3 == nil || err != nil {
		t.Fatalf("the cancelled waiter took the lock: %v", err)
	}
	h3.Unlock(bg())
}

// A wait that runs past the context's deadline is a timeout.
func TestDeadline(t *testing.T) {
	ld := dial(t)
	h, _ := ld.Lock(bg(), k("deadline"), nil)
	defer h.Unlock(bg())
	ctx, cancel := context.WithTimeout(bg(), 200*time.Millisecond)
	defer cancel()
	_, err := ld.Lock(ctx, k("deadline"), &leased.LockOptions{Wait: 10 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, leased.ErrTimeout) {
		t.Fatalf("deadline: %v", err)
	}
}

func stat(t *testing.T, ld *leased.Client, name string) float64 {
	t.Helper()
	r, err := ld.Do(bg(), map[string]any{"op": "stats"})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := r["stats"].(map[string]any)
	n, ok := st[name].(float64)
	if !ok {
		t.Fatalf("no stats figure %s", name)
	}
	return n
}

// waitStat polls the daemon's stats until NAME is WANT.
func waitStat(t *testing.T, ld *leased.Client, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for stat(t, ld, name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("stats %s: %v, want %v", name, stat(t, ld, name), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// held.Done() is closed on lock_lost, with its reason; Unlock of the
// lost hold is not an error.
func TestDoneOnLockLost(t *testing.T) {
	ld := dial(t)
	h, err := ld.Lock(bg(), k("lost"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ld.Do(bg(), map[string]any{"op": "lock.force_unlock",
		"key": k("lost")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed on lock_lost")
	}
	if h.Reason() != "taken" {
		t.Fatalf("reason %q", h.Reason())
	}
	if err := h.Unlock(bg()); err != nil {
		t.Fatalf("unlock of a lost hold: %v", err)
	}
}

// defer held.Unlock(ctx) still releases when ctx was cancelled.
func TestUnlockAfterCancel(t *testing.T) {
	ld := dial(t)
	ctx, cancel := context.WithCancel(bg())
	h, err := ld.Lock(ctx, k("defer"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if h2, _ := ld.TryLock(bg(), k("defer"), nil); h2 == nil {
		t.Fatal("still held after Unlock with a cancelled context")
	}
}

func TestRWLock(t *testing.T) {
	ld := dial(t)
	rw := ld.RWLock(k("rw"))
	r1, err := rw.RLock(bg(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rw.RLock(bg(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := rw.TryLock(bg(), nil); w != nil {
		t.Fatal("a writer beside readers")
	}
	r1.Unlock(bg())
	r2.Unlock(bg())
	w, err := rw.Lock(bg(), &leased.LockOptions{Wait: time.Second})
	if err != nil || w.Fence <= 0 {
		t.Fatalf("write lock: %+v %v", w, err)
	}
	if r, _ := rw.TryRLock(bg(), nil); r != nil {
		t.Fatal("a reader beside a writer")
	}
	w.Unlock(bg())
}

func TestLockKeys(t *testing.T) {
	ld := dial(t)
	h, err := ld.LockKeys(bg(), []string{k("m:a"), k("m:b")}, nil)
	if err != nil || len(h.Fences) != 2 {
		t.Fatalf("group: %+v %v", h, err)
	}
	if o, _ := ld.TryLock(bg(), k("m:b"), nil); o != nil {
		t.Fatal("a key of a held group was free")
	}
	if err := h.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
	if o, _ := ld.TryLockKeys(bg(), []string{k("m:b"), k("m:a")}, nil); o == nil {
		t.Fatal("the group was not released")
	}
}

func TestSemaphore(t *testing.T) {
	ld := dial(t)
	var hs []*leased.Held
	for i := 0; i < 2; i++ {
		h, err := ld.Semaphore(bg(), k("sem"), 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	if _, err := ld.Semaphore(bg(), k("sem"), 2, nil); !errors.Is(err, leased.ErrNoPermit) {
		t.Fatalf("third permit: %v", err)
	}
	hs[0].Unlock(bg())
	h, err := ld.Semaphore(bg(), k("sem"), 2, &leased.SemOptions{Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h.Unlock(bg())
	hs[1].Unlock(bg())
}

type user struct {
	Name string `json:"name"`
	ID   int    `json:"id"`
}

// Many goroutines reading one missing key: one load, one value.
func TestCachedSingleFlight(t *testing.T) {
	ld := dial(t)
	var loads int32
	loader := func(context.Context) (user, error) {
		atomic.AddInt32(&loads, 1)
		time.Sleep(200 * time.Millisecond)
		return user{Name: "Ada", ID: 7}, nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := leased.Cached(bg(), ld, k("user:7"), loader, nil)
			if err == nil && u.Name != "Ada" {
				err = errors.New("wrong value " + u.Name)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := atomic.LoadInt32(&loads); n != 1 {
		t.Fatalf("%d loads", n)
	}
}

// A failing loader gives the fill lease back: the next reader loads at
// once instead of waiting for the lease to run out.
func TestCachedLoaderErrorReleasesLease(t *testing.T) {
	ld := dial(t)
	boom := errors.New("db down")
	_, err := leased.Cached(bg(), ld, k("fail"), func(context.Context) (string, error) {
		return "", boom
	}, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("loader error: %v", err)
	}
	start := time.Now()
	v, err := leased.Cached(bg(), ld, k("fail"), func(context.Context) (string, error) {
		return "ok", nil
	}, nil)
	if err != nil || v != "ok" || time.Since(start) > time.Second {
		t.Fatalf("after a failed load: %q %v in %v", v, err, time.Since(start))
	}
}

func TestCachedNotFound(t *testing.T) {
	ld := dial(t)
	for i := 0; i < 2; i++ {
		_, err := leased.Cached(bg(), ld, k("none"), func(context.Context) (int, error) {
			if i > 0 {
				t.Fatal("a cached not-found was loaded again")
			}
			return 0, leased.ErrNotFound
		}, nil)
		if !errors.Is(err, leased.ErrNotFound) {
			t.Fatalf("not found: %v", err)
		}
	}
}

func TestUpdateInvalidates(t *testing.T) {
	ld := dial(t)
	name := "Ada"
	load := func(context.Context) (string, error) { return name, nil }
	if v, _ := leased.Cached(bg(), ld, k("name"), load, nil); v != "Ada" {
		t.Fatalf("first read %q", v)
	}
	err := ld.Update(bg(), func(context.Context) error { name = "Grace"; return nil }, k("name"))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := leased.Cached(bg(), ld, k("name"), load, nil); v != "Grace" {
		t.Fatalf("after update %q", v)
	}
	if err := ld.Invalidate(bg(), k("name"), k("other")); err != nil {
		t.Fatal(err)
	}
	if err := ld.Update(bg(), func(context.Context) error {
		t.Fatal("the write ran for no key")
		return nil
	}); !errors.Is(err, leased.ErrInvalid) {
		t.Fatalf("update without keys: %v", err)
	}
}

func TestErrors(t *testing.T) {
	_, err := leased.Dial(bg(), leased.Options{Address: "/nonexistent/leased.sock"})
	if leased.Code(err) != "connect" || !strings.Contains(err.Error(), "/nonexistent/leased.sock") ||
		!strings.Contains(err.Error(), "LEASED_SOCKET") {
		t.Fatalf("dial error: %v", err)
	}
	ld := dial(t)
	_, err = ld.Lock(bg(), strings.Repeat("k", 2000), nil)
	if leased.Code(err) != "bad_request" {
		t.Fatalf("long key: %v", err)
	}
	if _, err := ld.Lock(bg(), "", nil); leased.Code(err) != "bad_request" {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := ld.LockKeys(bg(), nil, nil); !errors.Is(err, leased.ErrInvalid) {
		t.Fatalf("no key: %v", err)
	}
	h, _ := ld.Lock(bg(), k("err"), nil)
	if _, err := ld.Do(bg(), map[string]any{"op": "unlock", "key": k("err"),
		"owner": "nobody"}); !errors.Is(err, leased.ErrNotHeld) {
		t.Fatalf("unlock by another owner: %v", err)
	}
	h.Unlock(bg())
}

// Goroutines sharing one client exclude each other on one key.
func TestConcurrentExclusion(t *testing.T) {
	ld := dial(t)
	var inside, most int32
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 5; j++ {
				h, err := ld.Lock(bg(), k("excl"), &leased.LockOptions{Wait: 10 * time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				n := atomic.AddInt32(&inside, 1)
				if n > atomic.LoadInt32(&most) {
					atomic.StoreInt32(&most, n)
				}
				atomic.AddInt32(&inside, -1)
				h.Unlock(bg())
			}
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Fatalf("%d holders at once", most)
	}
}

// proxy forwards a socket of its own to the daemon; drop() closes every
// connection through it, as a daemon restart does.
type proxy struct {
	path  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T) *proxy {
	p := &proxy{path: filepath.Join(t.TempDir(), "proxy.sock")}
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	t.Cleanup(func() { ln.Close(); p.drop() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("unix", os.Getenv("LEASED_SOCKET"))
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, d)
			p.mu.Unlock()
			go func() { io.Copy(d, c); d.Close() }()
			go func() { io.Copy(c, d); c.Close() }()
		}
	}()
	return p
}

func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// When the connection ends, its holds' Done() closes with
// connection_closed, their Unlock is not an error, and the next call
// opens a new session.
func TestReconnectAfterConnectionLoss(t *testing.T) {
	p := newProxy(t)
	ld, err := leased.Dial(bg(), leased.Options{Address: p.path, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Close()
	h, err := ld.Lock(bg(), k("reconnect"), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.drop()
	select {
	case <-h.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed when the connection ended")
	}
	if h.Reason() != "connection_closed" {
		t.Fatalf("reason %q", h.Reason())
	}
	if err := h.Unlock(bg()); err != nil {
		t.Fatalf("unlock after the connection ended: %v", err)
	}
	h2, err := ld.Lock(bg(), k("reconnect"), &leased.LockOptions{Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("lock on a new connection: %v", err)
	}
	h2.Unlock(bg())
}

// Keys and values that need escaping reach the daemon as they were.
func TestEscapedStrings(t *testing.T) {
	ld := dial(t)
	for _, s := range []string{`quote " and \ back`, "tab\tnew\nline", "ünï\u2028cödé", "<&>"} {
		key := k(s)
		v, err := leased.Cached(bg(), ld, key, func(context.Context) (string, error) {
			return s, nil
		}, &leased.CacheOptions{TTL: time.Minute})
		if err != nil || v != s {
			t.Fatalf("%q: %q %v", s, v, err)
		}
		r, err := ld.Do(bg(), map[string]any{"op": "cache.get", "key": key, "lease": false})
		var stored string
		if err == nil {
			err = json.Unmarshal([]byte(r["value"].(string)), &stored)
		}
		if err != nil || stored != s {
			t.Fatalf("%q stored as %q (%v)", s, r["value"], err)
		}
	}
}

// A loader that panics gives the fill lease back as the panic passes.
func TestCachedLoaderPanicReleasesLease(t *testing.T) {
	ld := dial(t)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the loader's panic did not reach the caller")
			}
		}()
		leased.Cached(bg(), ld, k("panic"), func(context.Context) (string, error) {
			panic("loader bug")
		}, nil)
	}()
	start := time.Now()
	v, err := leased.Cached(bg(), ld, k("panic"), func(context.Context) (string, error) {
		return "ok", nil
	}, nil)
	if err != nil || v != "ok" || time.Since(start) > time.Second {
		t.Fatalf("after a panicking load: %q %v in %v", v, err, time.Since(start))
	}
}

// A value the serializer refuses is an invalid error, and the lease is
// given back.
func TestCachedBadValueReleasesLease(t *testing.T) {
	ld := dial(t)
	_, err := leased.Cached(bg(), ld, k("bytes"), func(context.Context) ([]byte, error) {
		return []byte("raw"), nil
	}, nil)
	if !errors.Is(err, leased.ErrInvalid) {
		t.Fatalf("[]byte value: %v", err)
	}
	start := time.Now()
	v, err := leased.Cached(bg(), ld, k("bytes"), func(context.Context) (string, error) {
		return "ok", nil
	}, nil)
	if err != nil || v != "ok" || time.Since(start) > time.Second {
		t.Fatalf("after a refused value: %q %v in %v", v, err, time.Since(start))
	}
}

// A group with one key lost: Done closes, and Unlock still releases the
// keys that were not lost.
func TestGroupLostKeyUnlocksTheRest(t *testing.T) {
	ld := dial(t)
	h, err := ld.LockKeys(bg(), []string{k("g:a"), k("g:b")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ld.Do(bg(), map[string]any{"op": "lock.force_unlock",
		"key": k("g:a")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed when a key of the group was lost")
	}
	if err := h.Unlock(bg()); err != nil {
		t.Fatalf("unlock of a group with a lost key: %v", err)
	}
	o, err := ld.TryLock(bg(), k("g:b"), nil)
	if o == nil || err != nil {
		t.Fatalf("the group's other key stayed held: %v", err)
	}
	o.Unlock(bg())
}

// Two goroutines unlocking one hold release one count, not two.
func TestUnlockTwiceReleasesOnce(t *testing.T) {
	ld := dial(t)
	o := &leased.LockOptions{Owner: "twice"}
	h1, err := ld.Lock(bg(), k("twice"), o)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := ld.Lock(bg(), k("twice"), o)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); h2.Unlock(bg()) }()
	}
	wg.Wait()
	if x, _ := ld.TryLock(bg(), k("twice"), nil); x != nil {
		t.Fatal("free after one hold of two was unlocked twice")
	}
	h1.Unlock(bg())
}

// fakeDaemon answers hello and lock on a socket of its own, and hands
// the test the connection, to say what the daemon says when a renewal
// stalls (a stall of Redis itself is driven by the conformance suite).
func fakeDaemon(t *testing.T) (string, <-chan net.Conn) {
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		conns <- c
		dec := json.NewDecoder(c)
		for {
			var req map[string]any
			if dec.Decode(&req) != nil {
				return
			}
			rep := map[string]any{"id": req["id"], "ok": true,
				"session": "s1", "protocol": 1, "acquired": true,
				"token": "t1", "count": 1, "lease_ms": 30000,
				"fences": map[string]int{"a": 1, "b": 2}, "released": true}
			if req["op"] == "rate.acquire" {
				// A decision that left for Redis and got no answer.
				rep = map[string]any{"id": req["id"], "ok": false,
					"error": map[string]any{"code": "redis_unavailable",
						"message": "no answer", "outcome": "unknown"}}
			}
			b, _ := json.Marshal(rep)
			c.Write(append(b, '\n'))
		}
	}()
	return path, conns
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// AtRisk and AtRiskC follow lock_at_risk and lock_safe; a group stays at
// risk until its last key is safe.
func TestAtRiskThenSafe(t *testing.T) {
	path, conns := fakeDaemon(t)
	// OnEvent runs after the hold saw the event.
	seen := make(chan leased.Event, 8)
	ld, err := leased.Dial(bg(), leased.Options{Address: path, PoolSize: 1,
		OnEvent: func(ev leased.Event) { seen <- ev }})
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Close()
	h, err := ld.LockKeys(bg(), []string{"a", "b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	peer := <-conns
	say := func(ev, key string) {
		peer.Write([]byte(`{"event":"` + ev + `","key":"` + key +
			`","token":"t1","lease_left_ms":1850,"lease_ms":30000}` + "\n"))
		select {
		case <-seen:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s %s not read", ev, key)
		}
	}
	first := h.AtRiskC()
	if h.AtRisk() || closed(first) {
		t.Fatal("at risk before any event")
	}
	say("lock_at_risk", "a")
	if !closed(first) || !h.AtRisk() {
		t.Fatal("AtRiskC not closed on lock_at_risk")
	}
	say("lock_at_risk", "b")
	say("lock_safe", "a")
	if !h.AtRisk() {
		t.Fatal("safe while key b is still at risk")
	}
	say("lock_safe", "b")
	if h.AtRisk() {
		t.Fatal("still at risk after lock_safe of every key")
	}
	next := h.AtRiskC()
	if closed(next) {
		t.Fatal("the channel of the next episode is already closed")
	}
	say("lock_at_risk", "b")
	if !closed(next) {
		t.Fatal("AtRiskC not closed on the second lock_at_risk")
	}
	if closed(h.Done()) {
		t.Fatal("Done closed without lock_lost")
	}
}

// An unlock sent again with the same request id is answered from the
// daemon's memory: of a lock held twice, one hold is left, not none.
func TestUnlockRequestID(t *testing.T) {
	ld := dial(t)
	key := k("rid")
	o := &leased.LockOptions{Owner: "rid"}
	h1, err := ld.Lock(bg(), key, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ld.Lock(bg(), key, o); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		u, err := ld.Unlock(bg(), key, &leased.UnlockOptions{Owner: "rid",
			RequestID: "go-1"})
		if err != nil || u.Released || u.Count != 1 {
			t.Fatalf("unlock %d with go-1: %+v %v", i+1, u, err)
		}
	}
	info, err := ld.Do(bg(), map[string]any{"op": "lock.info", "key": key,
		"token": h1.Token})
	if err != nil || info["count"] != float64(1) {
		t.Fatalf("lock.info after a repeated unlock: %v %v", info, err)
	}
	if x, _ := ld.TryLock(bg(), key, nil); x != nil {
		t.Fatal("another owner got a lock still held once")
	}
	_, err = ld.Unlock(bg(), key, &leased.UnlockOptions{Owner: "rid",
		RequestID: strings.Repeat("r", 65)})
	if leased.Code(err) != "bad_request" {
		t.Fatalf("a request id of 65 characters: %v", err)
	}
	if _, err := ld.Unlock(bg(), key, nil); !errors.Is(err, leased.ErrInvalid) {
		t.Fatalf("unlock naming no holder: %v", err)
	}
	u, err := ld.Unlock(bg(), key, &leased.UnlockOptions{Token: h1.Token,
		RequestID: "go-2"})
	if err != nil || !u.Released {
		t.Fatalf("unlock with a new id: %+v %v", u, err)
	}
	if _, err := ld.Unlock(bg(), key, &leased.UnlockOptions{Owner: "rid",
		RequestID: "go-3"}); !errors.Is(err, leased.ErrNotHeld) {
		t.Fatalf("unlock of a free lock: %v", err)
	}
}

func TestRateAcquire(t *testing.T) {
	ld := dial(t)
	key := k("rate")
	slow := &leased.RateOptions{Burst: 2}
	for i := 0; i < 2; i++ {
		r, err := ld.RateAcquire(bg(), key, 1, time.Minute, slow)
		if err != nil || !r.Acquired {
			t.Fatalf("grant %d of a burst of 2: %+v %v", i+1, r, err)
		}
	}
	r, err := ld.RateAcquire(bg(), key, 1, time.Minute, slow)
	if err != nil || r.Acquired || r.RetryAfter <= 0 {
		t.Fatalf("past the burst: %+v %v", r, err)
	}
	_, err = ld.RateAcquire(bg(), key, 1, time.Minute,
		&leased.RateOptions{Burst: 2, Permits: 3})
	if leased.Code(err) != "bad_request" {
		t.Fatalf("permits above burst: %v", err)
	}
	// 20 a second, one at a time: the second waits about 50 ms for its
	// permit and gets it.
	fast := k("rate:fast")
	if r, err := ld.RateAcquire(bg(), fast, 20, time.Second,
		&leased.RateOptions{Burst: 1}); err != nil || !r.Acquired {
		t.Fatalf("first of a fast limiter: %+v %v", r, err)
	}
	r, err = ld.RateAcquire(bg(), fast, 20, time.Second,
		&leased.RateOptions{Burst: 1, Wait: 10 * time.Second})
	if err != nil || !r.Acquired {
		t.Fatalf("a wait that covers the interval: %+v %v", r, err)
	}
}

// A rate.acquire answered redis_unavailable with outcome unknown says
// so (it may have granted).
func TestRateOutcomeUnknown(t *testing.T) {
	path, _ := fakeDaemon(t)
	ld, err := leased.Dial(bg(), leased.Options{Address: path, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Close()
	_, err = ld.RateAcquire(bg(), "r", 1, time.Second, nil)
	if leased.Code(err) != "redis_unavailable" || !leased.OutcomeUnknown(err) {
		t.Fatalf("outcome unknown: %v", err)
	}
	if leased.OutcomeUnknown(leased.ErrIO) {
		t.Fatal("an io error said outcome unknown")
	}
}

func TestWarm(t *testing.T) {
	ld := dial(t)
	a, none, bad := k("warm:a"), k("warm:none"), k("warm:bad")
	w, err := ld.Warm(bg(), []leased.WarmEntry{
		{Key: a, Value: user{ID: 7, Name: "Ada"}},
		{Key: none, NotFound: true, TTL: 30 * time.Second},
		{Key: "", Value: "empty key"},
		{Key: bad, Value: "v", TTL: time.Minute},
	}, time.Minute)
	if err != nil || w.Stored != 3 || len(w.Errors) != 4 {
		t.Fatalf("warm: %+v %v", w, err)
	}
	if w.Errors[0] != nil || w.Errors[1] != nil || w.Errors[3] != nil ||
		leased.Code(w.Errors[2]) != "bad_request" {
		t.Fatalf("per-entry errors: %v", w.Errors)
	}
	fail := func(context.Context) (user, error) {
		t.Error("loaded a warmed key")
		return user{}, nil
	}
	if u, err := leased.Cached(bg(), ld, a, fail, nil); err != nil ||
		u.Name != "Ada" || u.ID != 7 {
		t.Fatalf("cached after warm: %+v %v", u, err)
	}
	if _, err := leased.Cached(bg(), ld, none, fail, nil); !errors.Is(err, leased.ErrNotFound) {
		t.Fatalf("a warmed not found: %v", err)
	}
	if _, err := ld.Warm(bg(), nil, 0); !errors.Is(err, leased.ErrInvalid) {
		t.Fatalf("warm of nothing: %v", err)
	}
	many := make([]leased.WarmEntry, 1001)
	for i := range many {
		many[i] = leased.WarmEntry{Key: k("warm:m" + strconv.Itoa(i)), Value: i}
	}
	if _, err := ld.Warm(bg(), many, 0); leased.Code(err) != "bad_request" {
		t.Fatalf("1001 entries: %v", err)
	}
}

func TestBloom(t *testing.T) {
	ld := dial(t)
	f := k("bloom")
	b, err := ld.BloomCreate(bg(), f, 1000, 0.01)
	if err != nil || !b.Created || b.Bits <= 0 || b.Hashes <= 0 || b.Bytes <= 0 {
		t.Fatalf("create: %+v %v", b, err)
	}
	if b, err := ld.BloomCreate(bg(), f, 1000, 0.01); err != nil || b.Created {
		t.Fatalf("create again alike: %+v %v", b, err)
	}
	if _, err := ld.BloomCreate(bg(), f, 2000, 0.01); leased.Code(err) != "bad_request" {
		t.Fatalf("create again with another capacity: %v", err)
	}
	in, out := k("bloom:in"), k("bloom:out")
	added, err := ld.BloomAdd(bg(), f, in)
	if err != nil || len(added) != 1 || !added[0] {
		t.Fatalf("add: %v %v", added, err)
	}
	if added, err := ld.BloomAdd(bg(), f, in); err != nil || added[0] {
		t.Fatalf("add again: %v %v", added, err)
	}
	maybe, err := ld.BloomCheck(bg(), f, in, out)
	if err != nil || len(maybe) != 2 || !maybe[0] || maybe[1] {
		t.Fatalf("check: %v %v", maybe, err)
	}
	if _, err := ld.BloomCheck(bg(), k("bloom:none"), in); leased.Code(err) != "bad_request" {
		t.Fatalf("check of a filter that does not exist: %v", err)
	}
	if _, err := ld.BloomAdd(bg(), f); !errors.Is(err, leased.ErrInvalid) {
		t.Fatalf("add of no key: %v", err)
	}
	var loads int32
	loader := func(context.Context) (string, error) {
		atomic.AddInt32(&loads, 1)
		return "v", nil
	}
	o := &leased.CacheOptions{Bloom: f}
	if _, err := leased.Cached(bg(), ld, out, loader, o); !errors.Is(err, leased.ErrNotFound) {
		t.Fatalf("a key the filter rules out: %v", err)
	}
	if v, err := leased.Cached(bg(), ld, in, loader, o); err != nil || v != "v" {
		t.Fatalf("a key the filter may hold: %q %v", v, err)
	}
	if n := atomic.LoadInt32(&loads); n != 1 {
		t.Fatalf("%d loads, want 1 (for the key that may exist)", n)
	}
}

// A compare-and-set that wins, one that loses with the current version,
// and a fill over version 0.
func TestVersionedWrites(t *testing.T) {
	ld := dial(t)
	a, f := k("ver:a"), k("ver:f")
	miss, err := leased.Read[user](bg(), ld, a, nil)
	if err != nil || miss.Hit || miss.Version != 0 {
		t.Fatalf("read of a miss: %+v %v", miss, err)
	}
	w1, err := ld.Write(bg(), a, user{ID: 1}, &leased.WriteOptions{IfVersion: leased.Version(0)})
	if err != nil || !w1.Stored || w1.Version <= 0 {
		t.Fatalf("write over none: %+v %v", w1, err)
	}
	got, err := leased.Read[user](bg(), ld, a, nil)
	if err != nil || !got.Hit || got.Value.ID != 1 || got.Version != w1.Version {
		t.Fatalf("read: %+v %v", got, err)
	}
	w2, err := ld.Write(bg(), a, user{ID: 2}, &leased.WriteOptions{IfVersion: leased.Version(got.Version)})
	if err != nil || !w2.Stored || w2.Version <= w1.Version {
		t.Fatalf("compare-and-set: %+v %v", w2, err)
	}
	late, err := ld.Write(bg(), a, user{ID: 99}, &leased.WriteOptions{IfVersion: leased.Version(got.Version)})
	if err != nil || late.Stored || late.Version != w2.Version {
		t.Fatalf("a write over a version that moved on: %+v %v", late, err)
	}
	if now, _ := leased.Read[user](bg(), ld, a, nil); now.Value.ID != 2 {
		t.Fatalf("the losing write was stored: %+v", now)
	}
	r, err := leased.Read[string](bg(), ld, f, &leased.ReadOptions{Lease: true})
	if err != nil || r.Hit || r.Lease == "" {
		t.Fatalf("read with a lease: %+v %v", r, err)
	}
	if w, err := ld.Fill(bg(), f, r.Lease, "x", &leased.WriteOptions{IfVersion: leased.Version(7)}); err != nil || w.Stored || w.Version != 0 {
		t.Fatalf("fill over version 7 of none: %+v %v", w, err)
	}
	fw, err := ld.Fill(bg(), f, r.Lease, nil, &leased.WriteOptions{IfVersion: leased.Version(0)})
	if err != nil || !fw.Stored {
		t.Fatalf("fill over none: %+v %v", fw, err)
	}
	nf, err := leased.Read[string](bg(), ld, f, nil)
	if err != nil || !nf.Hit || !nf.NotFound || nf.Version != fw.Version {
		t.Fatalf("read of a filled not found: %+v %v", nf, err)
	}
	if _, err := ld.Write(bg(), a, "x", &leased.WriteOptions{IfVersion: leased.Version(-1)}); leased.Code(err) != "bad_request" {
		t.Fatalf("if_version -1: %v", err)
	}
}
