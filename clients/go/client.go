// Package leased is a client for the leased sidecar daemon: distributed
// locks and cache-aside over Redis, spoken as newline-delimited JSON
// over a Unix socket (protocol version 1, leased-protocol(7)).
//
// A Client is safe for use by many goroutines. It keeps a small pool of
// connections (sessions); a request that names a key always goes to the
// connection that key hashes to, so a lock, its reentries and its unlock
// meet the session that holds it. Requests are pipelined on each
// connection and matched to their replies by id.
package leased

import (
	"context"
	"encoding/json"
	"errors"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
)

// ProtocolVersion is the version of the leased protocol this client
// speaks.
const ProtocolVersion = 1

// DefaultSocket is where leased listens unless LEASED_SOCKET says
// otherwise.
const DefaultSocket = "/run/leased/leased.sock"

// Options configure a Client. The zero value connects to LEASED_SOCKET
// (or DefaultSocket) with 4 connections.
type Options struct {
	// Network is "unix" (default) or "tcp".
	Network string
	// Address is the socket path, or host:port for TCP.
	Address string
	// Client names this program in hello (default: its file name).
	Client string
	// Auth is the token a TCP listener requires.
	Auth string
	// PoolSize is how many connections (sessions) the client keeps.
	PoolSize int
	// Serializer turns cached values into strings; JSON by default.
	Serializer Serializer
	// OnEvent, when set, sees every event (it runs in a connection's
	// reader: return quickly).
	OnEvent func(Event)
}

// Client is a pooled, goroutine-safe leased client.
type Client struct {
	opts   Options
	slots  []slot
	owners uint64
	closed int32
}

type slot struct {
	mu sync.Mutex
	c  *conn
}

// Dial connects to leased. The first connection is opened at once, so
// a daemon that cannot be reached is reported here (code connect); the
// others open at their first use.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	if opts.Network == "" {
		opts.Network = "unix"
	}
	if opts.Address == "" {
		opts.Address = os.Getenv("LEASED_SOCKET")
	}
	if opts.Address == "" {
		opts.Address = DefaultSocket
	}
	if opts.Client == "" {
		opts.Client = filepath.Base(os.Args[0])
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 4
	}
	if opts.Serializer == nil {
		opts.Serializer = JSON
	}
	cl := &Client{opts: opts, slots: make([]slot, opts.PoolSize)}
	if _, err := cl.conn(ctx, 0); err != nil {
		return nil, err
	}
	return cl, nil
}

// Close ends every session of the client; their locks are released by
// the daemon.
func (cl *Client) Close() error {
	atomic.StoreInt32(&cl.closed, 1)
	for i := range cl.slots {
		s := &cl.slots[i]
		s.mu.Lock()
		if s.c != nil {
			// What the shared near cache served since the last report.
			s.c.nearReport()
			s.c.close()
			s.c = nil
		}
		s.mu.Unlock()
	}
	return nil
}

// conn gives the live connection of slot i, opening a new session when
// the last one ended (a daemon restart, say).
func (cl *Client) conn(ctx context.Context, i int) (*conn, error) {
	if atomic.LoadInt32(&cl.closed) != 0 {
		return nil, newErr("io", "the client is closed")
	}
	s := &cl.slots[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil && !s.c.isDead() {
		return s.c, nil
	}
	c, err := dialConn(ctx, &cl.opts)
	if err != nil {
		return nil, err
	}
	s.c = c
	return c, nil
}

// slotOf routes a key (a group: its smallest key) to its connection.
func (cl *Client) slotOf(keys []string) int {
	if len(keys) == 0 {
		return cl.leastBusy()
	}
	k := keys[0]
	for _, x := range keys[1:] {
		if x < k {
			k = x
		}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(k))
	return int(h.Sum32() % uint32(len(cl.slots)))
}

func (cl *Client) leastBusy() int {
	best, load := 0, int32(-1)
	for i := range cl.slots {
		s := &cl.slots[i]
		s.mu.Lock()
		c := s.c
		s.mu.Unlock()
		n := int32(0)
		if c != nil {
			n = atomic.LoadInt32(&c.inflight)
		}
		if load < 0 || n < load {
			best, load = i, n
		}
	}
	return best
}

// call sends req on the connection of keys. A request that could not
// be written because the daemon had closed an idle connection goes out
// once more on a new one.
func (cl *Client) call(ctx context.Context, keys []string,
	req map[string]any, onReply func(*conn, *reply)) (*reply, *conn, error) {
	i := cl.slotOf(keys)
	for attempt := 0; ; attempt++ {
		c, err := cl.conn(ctx, i)
		if err != nil {
			return nil, nil, err
		}
		r, err := c.call(ctx, req, onReply)
		var ns errNotSent
		if errors.As(err, &ns) && attempt == 0 {
			continue
		}
		if errors.As(err, &ns) {
			err = ns.err
		}
		return r, c, err
	}
}

// Do sends one request as it is (any op of the protocol: stats,
// lock.info, cache.set, ...) and returns the reply object. An error
// reply is an *Error.
func (cl *Client) Do(ctx context.Context, req map[string]any) (map[string]any, error) {
	var keys []string
	if k, ok := req["key"].(string); ok {
		keys = []string{k}
	}
	r, _, err := cl.call(ctx, keys, req, nil)
	if r == nil {
		return nil, err
	}
	var m map[string]any
	if jerr := json.Unmarshal(r.raw, &m); jerr != nil {
		return nil, newErr("io", "unreadable reply: %v", jerr)
	}
	delete(m, "id")
	return m, err
}

// Features lists the optional parts the daemon announced in hello
// (cancel, rwlock, semaphore, multilock, ...).
func (cl *Client) Features(ctx context.Context) ([]string, error) {
	c, err := cl.conn(ctx, 0)
	if err != nil {
		return nil, err
	}
	var fs []string
	for f := range c.features {
		fs = append(fs, f)
	}
	return fs, nil
}

func connectErr(o *Options, err error) error {
	what := "check that leased runs and listens there"
	if o.Network == "unix" {
		what += " (or set LEASED_SOCKET to its socket)"
	}
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		what = "permission denied: this user must be in the socket's " +
			"group (see leased.yml(5), listen.unix_group)"
	}
	return &Error{Code: "connect", Message: "cannot connect to leased at " +
		o.Address + ": " + err.Error() + "; " + what, Err: err}
}

func (cl *Client) newOwner() string {
	return "go-" + itoa(atomic.AddUint64(&cl.owners, 1))
}
