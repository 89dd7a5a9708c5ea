package leased

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// reply is one line from the daemon: a response (with id) or an event.
type reply struct {
	ID       json.RawMessage  `json:"id"`
	Event    string           `json:"event"`
	OK       bool             `json:"ok"`
	Error    *wireError       `json:"error"`
	Acquired bool             `json:"acquired"`
	Token    string           `json:"token"`
	Count    int              `json:"count"`
	Fence    int64            `json:"fence"`
	Fences   map[string]int64 `json:"fences"`
	LeaseMS  int64            `json:"lease_ms"`
	TTLMS    int64            `json:"ttl_ms"`
	Hit      bool             `json:"hit"`
	Value    json.RawMessage  `json:"value"`
	Lease    json.RawMessage  `json:"lease"`
	RetryMS  int64            `json:"retry_after_ms"`
	// Released is a bool for unlock, a count for sem.release; Stored a
	// bool for cache.fill, a count for cache.mset. Raw, since a field of
	// the wrong type would make the whole line unreadable.
	Released  json.RawMessage `json:"released"`
	Stored    json.RawMessage `json:"stored"`
	Features  []string        `json:"features"`
	Layout    int             `json:"layout"`
	Session   string          `json:"session"`
	Protocol  int             `json:"protocol"`
	Key       string          `json:"key"`
	Reason    string          `json:"reason"`
	Permits   int             `json:"permits"`
	Available int             `json:"available"`
	// Version is a number on a cache hit or write, the daemon's version
	// string in hello's reply: raw, as Released and Stored.
	Version json.RawMessage `json:"version"`
	raw     []byte
}

type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Key     string `json:"key"`
	Outcome string `json:"outcome"`
}

func (w *wireError) toError() *Error {
	return &Error{Code: w.Code, Message: w.Message, Reason: w.Reason,
		Key: w.Key, Outcome: w.Outcome}
}

// pend is a request waiting for its reply. onReply, when set, runs in
// the reader with c.mu held, before any later line is read, so a hold
// is tracked before a lock_lost for it can arrive.
type pend struct {
	ch      chan *reply
	onReply func(*conn, *reply)
}

// conn is one session: requests are pipelined and matched by id, a
// reader goroutine routes replies and events.
type conn struct {
	nc       net.Conn
	target   string
	onEvent  func(Event)
	wmu      sync.Mutex // guards the write queue below
	wbuf     []byte
	spare    []byte
	flushing bool
	// hasDeadline: a write deadline is set on nc.
	hasDeadline bool
	mu          sync.Mutex
	nextID      int64
	pending     map[int64]*pend
	holds       map[string][]*Held
	features    map[string]bool
	session     string
	dead        chan struct{}
	inflight    int32
	near        nearState
}

// Event is an unsolicited line from the daemon (lock_lost, sem_lost,
// lock_at_risk, lock_safe, shutdown, ...).
type Event struct {
	Name   string
	Key    string
	Token  string
	Reason string
	Raw    json.RawMessage
}

// errNotSent marks a request that never reached the daemon, so it may
// go out again on a new connection.
type errNotSent struct{ err error }

func (e errNotSent) Error() string { return e.err.Error() }
func (e errNotSent) Unwrap() error { return e.err }

func dialConn(ctx context.Context, o *Options) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, o.Network, o.Address)
	if err != nil {
		return nil, connectErr(o, err)
	}
	c := &conn{
		nc:       nc,
		target:   o.Address,
		onEvent:  o.OnEvent,
		pending:  make(map[int64]*pend),
		holds:    make(map[string][]*Held),
		features: make(map[string]bool),
		dead:     make(chan struct{}),
	}
	go c.read()
	if err := c.hello(ctx, o); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *conn) hello(ctx context.Context, o *Options) error {
	req := map[string]any{"op": "hello", "client": o.Client}
	if o.Auth != "" {
		req["auth"] = o.Auth
	}
	r, err := c.call(ctx, req, nil)
	if err != nil {
		return err
	}
	for _, f := range r.Features {
		c.features[f] = true
	}
	c.session = r.Session
	return nil
}

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

func (c *conn) close() { _ = c.nc.Close() }

func (c *conn) read() {
	var src io.Reader = c.nc
	if uc, ok := c.nc.(*net.UnixConn); ok {
		src = &fdReader{uc: uc, c: c, oob: make([]byte, syscall.CmsgSpace(4*4))}
	}
	br := bufio.NewReaderSize(src, 64*1024)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			c.end()
			return
		}
		r := &reply{}
		if json.Unmarshal(line, r) != nil {
			continue
		}
		r.raw = line
		if r.Event != "" {
			c.event(r)
			continue
		}
		c.route(r)
	}
}

func (c *conn) route(r *reply) {
	id, err := strconv.ParseInt(string(r.ID), 10, 64)
	if err != nil {
		return
	}
	c.mu.Lock()
	p := c.pending[id]
	delete(c.pending, id)
	if p != nil && p.onReply != nil {
		p.onReply(c, r)
	}
	c.mu.Unlock()
	if p != nil {
		p.ch <- r
	}
}

// riskEvents put a key of a hold at risk (true) or take it out (false).
var riskEvents = map[string]bool{"lock_at_risk": true, "sem_at_risk": true,
	"lock_safe": false, "sem_safe": false}

func (c *conn) event(r *reply) {
	if r.Event == "lock_lost" || r.Event == "sem_lost" {
		c.mu.Lock()
		hs := c.holds[r.Token]
		delete(c.holds, r.Token)
		c.mu.Unlock()
		for _, h := range hs {
			h.lose(r.Reason)
		}
	}
	if atRisk, ok := riskEvents[r.Event]; ok {
		c.mu.Lock()
		hs := append([]*Held(nil), c.holds[r.Token]...)
		c.mu.Unlock()
		for _, h := range hs {
			h.setRisk(r.Key, atRisk)
		}
	}
	if c.onEvent != nil {
		c.onEvent(Event{Name: r.Event, Key: r.Key, Token: r.Token,
			Reason: r.Reason, Raw: r.raw})
	}
}

// end runs once the connection is gone: every call waiting on it fails
// and every hold of its session is lost with it.
func (c *conn) end() {
	c.close()
	c.mu.Lock()
	pends := c.pending
	c.pending = make(map[int64]*pend)
	holds := c.holds
	c.holds = make(map[string][]*Held)
	close(c.dead)
	closeFds(c.near.fds)
	c.near.fds = nil
	c.mu.Unlock()
	if s := c.near.seg.Swap(nil); s != nil {
		s.retire()
	}
	for _, p := range pends {
		p.ch <- nil
	}
	for _, hs := range holds {
		for _, h := range hs {
			h.lose("connection_closed")
		}
	}
}

func (c *conn) ioErr(err error) error {
	return &Error{Code: "io", Message: "the connection to leased at " +
		c.target + " failed; its session and the session's locks are gone",
		Err: err}
}

// send writes one request and returns its id and the pending entry.
func (c *conn) send(ctx context.Context, req map[string]any,
	onReply func(*conn, *reply)) (int64, *pend, error) {
	p := &pend{ch: make(chan *reply, 1), onReply: onReply}
	c.mu.Lock()
	if c.isDead() {
		c.mu.Unlock()
		return 0, nil, errNotSent{c.ioErr(net.ErrClosed)}
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = p
	c.mu.Unlock()
	req["id"] = id
	if err := c.write(ctx, req); err != nil {
		c.forget(id)
		return 0, nil, err
	}
	return id, p, nil
}

// write queues one request line. Goroutines that send at the same time
// share syscalls: the first to find nobody writing writes everything
// queued, until the queue is empty, and the others only queue.
func (c *conn) write(ctx context.Context, req map[string]any) error {
	c.wmu.Lock()
	buf, err := appendRequest(c.wbuf, req)
	if err != nil {
		c.wmu.Unlock()
		return &Error{Code: "invalid", Message: err.Error(), Err: err}
	}
	c.wbuf = buf
	if c.flushing {
		c.wmu.Unlock()
		return nil
	}
	c.flushing = true
	for len(c.wbuf) > 0 {
		out := c.wbuf
		c.wbuf = c.spare[:0]
		c.deadline(ctx)
		c.wmu.Unlock()
		_, err = c.nc.Write(out)
		c.wmu.Lock()
		c.spare = out[:0]
		if err != nil {
			c.wbuf = nil
			break
		}
	}
	c.flushing = false
	c.wmu.Unlock()
	if err != nil {
		// The other requests of the batch fail when the reader sees
		// the connection end. This one may go out on a new one, unless
		// the deadline cut the write short: part of it may have gone.
		c.close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return c.ioErr(err)
		}
		return errNotSent{c.ioErr(err)}
	}
	return nil
}

// deadline bounds a write by the writer's ctx (c.wmu held).
func (c *conn) deadline(ctx context.Context) {
	dl, ok := ctx.Deadline()
	if ok || c.hasDeadline {
		_ = c.nc.SetWriteDeadline(dl)
		c.hasDeadline = ok
	}
}

func (c *conn) forget(id int64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// call sends req and waits for its reply. When ctx ends first, a wait
// the daemon can cancel is cancelled, and a grant or fill lease that
// still comes is given back by abandon.
func (c *conn) call(ctx context.Context, req map[string]any,
	onReply func(*conn, *reply)) (*reply, error) {
	atomic.AddInt32(&c.inflight, 1)
	defer atomic.AddInt32(&c.inflight, -1)
	id, p, err := c.send(ctx, req, onReply)
	if err != nil {
		return nil, err
	}
	select {
	case r := <-p.ch:
		return c.result(r)
	case <-ctx.Done():
		go c.abandon(id, req, p)
		return nil, ctxErr(ctx, "leased "+req["op"].(string))
	}
}

func (c *conn) result(r *reply) (*reply, error) {
	if r == nil {
		return nil, c.ioErr(errors.New("connection closed"))
	}
	if !r.OK {
		e := &Error{Code: "internal", Message: "reply without ok"}
		if r.Error != nil {
			e = r.Error.toError()
		}
		return r, e
	}
	return r, nil
}

func (c *conn) abandon(id int64, req map[string]any, p *pend) {
	op := req["op"]
	if (op == "lock" || op == "sem.acquire" || op == "cache.get" ||
		op == "rate.acquire") &&
		c.features["cancel"] {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = c.call(ctx, map[string]any{"op": "cancel", "target": id}, nil)
		cancel()
	}
	r := <-p.ch
	if r == nil || !r.OK {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch {
	case op == "cache.get" && !r.Hit && isString(r.Lease):
		_, _ = c.call(ctx, map[string]any{"op": "cache.release",
			"key": req["key"], "lease": rawString(r.Lease)}, nil)
	case r.Acquired:
		c.giveBack(ctx, req, r)
	}
}

// giveBack releases a grant that came after its caller stopped waiting.
func (c *conn) giveBack(ctx context.Context, req map[string]any, r *reply) {
	c.mu.Lock()
	hs := c.holds[r.Token]
	c.mu.Unlock()
	for _, h := range hs {
		if h.grant == r {
			_ = h.Unlock(ctx)
			return
		}
	}
}

// rawInt is the integer RAW holds, or 0 (absent, or not a number).
func rawInt(raw json.RawMessage) int64 {
	n, _ := strconv.ParseInt(string(raw), 10, 64)
	return n
}

func isString(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '"' }

func rawString(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}
