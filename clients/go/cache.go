package leased

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Serializer turns cached values into the strings the daemon stores,
// and back.
type Serializer interface {
	Marshal(v any) (string, error)
	Unmarshal(s string, v any) error
}

type jsonSerializer struct{}

func (jsonSerializer) Marshal(v any) (string, error) {
	if _, ok := v.([]byte); ok {
		return "", errors.New("[]byte is not cached as JSON: " +
			"convert it, or use a Serializer that takes it")
	}
	b, err := json.Marshal(v)
	return string(b), err
}

func (jsonSerializer) Unmarshal(s string, v any) error {
	return json.Unmarshal([]byte(s), v)
}

type stringSerializer struct{}

func (stringSerializer) Marshal(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("a %T is not a string", v)
	}
	return s, nil
}

func (stringSerializer) Unmarshal(s string, v any) error {
	p, ok := v.(*string)
	if !ok {
		return fmt.Errorf("a string cannot be read into a %T", v)
	}
	*p = s
	return nil
}

// JSON stores values as JSON, as cache-manager's stores do (default).
var JSON Serializer = jsonSerializer{}

// Strings stores strings as they are and refuses anything else, for
// keys shared with leasectl get/set or clients that store plain strings.
var Strings Serializer = stringSerializer{}

// CacheOptions of Cached.
type CacheOptions struct {
	// TTL of the filled value; 0: the daemon's cache.ttl_ms.
	TTL time.Duration
	// Wait is how long to wait while another caller loads the key; 0:
	// the daemon's cache.wait_ms (3000). Past it the caller does not
	// load: it gets an error with code timeout.
	Wait time.Duration
	// Bloom names a Bloom filter (hello's feature bloom): a key it rules
	// out is ErrNotFound at once, the loader not called.
	Bloom string
}

// Cached is the cache-aside read path with single flight: a hit is
// returned as it is; on a miss exactly one caller, in any process,
// runs loader and fills the key while the others wait for its value.
// A loader that returns ErrNotFound caches "not found" (and Cached
// returns ErrNotFound to every reader until it expires). When the
// loader fails, panics or its value cannot be stored, the fill lease is
// given back at once so the next reader loads. The value is returned
// as every later reader gets it: read back through the serializer.
func Cached[T any](ctx context.Context, cl *Client, key string,
	loader func(context.Context) (T, error), opts *CacheOptions) (T, error) {
	var zero T
	if err := checkKeys([]string{key}); err != nil {
		return zero, err
	}
	if opts == nil {
		opts = &CacheOptions{}
	}
	// The shared near cache first, on the connection the key's requests
	// go to (its session's segment).
	if c, err := cl.conn(ctx, cl.slotOf([]string{key})); err == nil {
		if v, null, ok := c.nearGet(ctx, key); ok {
			if null {
				return zero, ErrNotFound
			}
			return decodeText[T](cl, key, v)
		}
	}
	req := map[string]any{"op": "cache.get", "key": key}
	if opts.Wait > 0 {
		req["wait_ms"] = ms(opts.Wait)
	}
	if opts.Bloom != "" {
		req["bloom"] = opts.Bloom
	}
	r, c, err := cl.call(ctx, []string{key}, req, nil)
	if err != nil {
		return zero, err
	}
	if r.Hit {
		return decode[T](cl, key, r.Value)
	}
	if !isString(r.Lease) {
		return zero, newErr("timeout", "%q was being loaded elsewhere and "+
			"no value came within the wait", key)
	}
	f := &filler{c: c, key: key, lease: rawString(r.Lease), ttl: opts.TTL}
	return fill(ctx, cl, f, loader)
}

type filler struct {
	c      *conn
	key    string
	lease  string
	ttl    time.Duration
	filled bool
}

// fill runs the loader under the fill lease; the deferred release
// covers every way out that did not store (an error, a panic).
func fill[T any](ctx context.Context, cl *Client, f *filler,
	loader func(context.Context) (T, error)) (T, error) {
	var zero T
	defer f.release()
	v, err := loader(ctx)
	if errors.Is(err, ErrNotFound) {
		if err := f.store(ctx, nil); err != nil {
			return zero, err
		}
		return zero, ErrNotFound
	}
	if err != nil {
		return zero, err
	}
	s, err := cl.opts.Serializer.Marshal(v)
	if err != nil {
		return zero, &Error{Code: "invalid", Message: "the value of " +
			f.key + " cannot be stored: " + err.Error(), Err: err}
	}
	if err := f.store(ctx, &s); err != nil {
		return zero, err
	}
	raw, _ := json.Marshal(s)
	return decode[T](cl, f.key, raw)
}

func (f *filler) store(ctx context.Context, v *string) error {
	req := map[string]any{"op": "cache.fill", "key": f.key, "lease": f.lease,
		"value": v}
	if f.ttl > 0 {
		req["ttl_ms"] = ms(f.ttl)
	}
	_, err := f.c.call(ctx, req, nil)
	if err == nil {
		f.filled = true
	}
	return err
}

func (f *filler) release() {
	if f.filled {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	_, _ = f.c.call(ctx, map[string]any{"op": "cache.release",
		"key": f.key, "lease": f.lease}, nil)
}

func decode[T any](cl *Client, key string, raw json.RawMessage) (T, error) {
	if !isString(raw) {
		var v T
		return v, ErrNotFound
	}
	return decodeText[T](cl, key, rawString(raw))
}

// decodeText reads the cached text s (the value, not JSON-quoted).
func decodeText[T any](cl *Client, key string, s string) (T, error) {
	var v T
	if err := cl.opts.Serializer.Unmarshal(s, &v); err != nil {
		return v, &Error{Code: "bad_value", Message: "the cached value of " +
			key + " cannot be read: " + err.Error(), Err: err}
	}
	return v, nil
}

// Invalidate deletes the cached keys now and once more after the
// daemon's cache.double_delete_ms (the delayed double delete). Call it
// right after the database write committed.
func (cl *Client) Invalidate(ctx context.Context, keys ...string) error {
	if err := checkKeys(keys); err != nil {
		return err
	}
	_, _, err := cl.call(ctx, nil, map[string]any{"op": "cache.invalidate",
		"keys": keys}, nil)
	return err
}

// Update runs the database write, then invalidates keys. The keys are
// checked before the write runs.
func (cl *Client) Update(ctx context.Context, writer func(context.Context) error,
	keys ...string) error {
	if err := checkKeys(keys); err != nil {
		return err
	}
	if err := writer(ctx); err != nil {
		return err
	}
	return cl.Invalidate(ctx, keys...)
}

// WarmEntry is one value Warm stores. Value goes through the
// serializer as Cached stores a loaded value; NotFound stores "not
// found" instead (what a loader's ErrNotFound caches).
type WarmEntry struct {
	Key      string
	Value    any
	NotFound bool
	// TTL of this entry; 0: Warm's ttl, else the daemon's cache.ttl_ms.
	TTL time.Duration
}

// Warmed is the answer of Warm: Stored counts the entries stored, and
// Errors[i] is entry i's own error (nil when it was stored).
type Warmed struct {
	Stored int
	Errors []error
}

// Warm is the bulk warm-up (cache.mset; hello's feature mset): up to
// 1000 entries stored in one request as Cached would have filled them,
// each with its own TTL or ttl (0: the daemon's default). An entry that
// fails alone (bad_request, wrong_type, redis_unavailable) is in
// Errors; the others are stored all the same. A request the daemon
// refuses as a whole (no entries, too many) is the error returned.
func (cl *Client) Warm(ctx context.Context, entries []WarmEntry,
	ttl time.Duration) (*Warmed, error) {
	if len(entries) == 0 {
		return nil, newErr("invalid", "nothing to warm")
	}
	list := make([]map[string]any, len(entries))
	for i, e := range entries {
		m := map[string]any{"key": e.Key, "value": nil}
		if !e.NotFound {
			s, err := cl.opts.Serializer.Marshal(e.Value)
			if err != nil {
				return nil, &Error{Code: "invalid", Message: "the value of " +
					e.Key + " cannot be stored: " + err.Error(), Err: err}
			}
			m["value"] = s
		}
		if e.TTL > 0 {
			m["ttl_ms"] = ms(e.TTL)
		} else if ttl > 0 {
			m["ttl_ms"] = ms(ttl)
		}
		list[i] = m
	}
	r, _, err := cl.call(ctx, nil, map[string]any{"op": "cache.mset",
		"entries": list}, nil)
	if err != nil {
		return nil, err
	}
	var body struct {
		Stored  int `json:"stored"`
		Results []struct {
			OK    bool       `json:"ok"`
			Error *wireError `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal(r.raw, &body); err != nil {
		return nil, newErr("io", "unreadable cache.mset reply: %v", err)
	}
	w := &Warmed{Stored: body.Stored, Errors: make([]error, len(entries))}
	for i, res := range body.Results {
		if i < len(w.Errors) && !res.OK {
			if res.Error != nil {
				w.Errors[i] = res.Error.toError()
			} else {
				w.Errors[i] = newErr("internal", "entry result without ok")
			}
		}
	}
	return w, nil
}

// Bloom is the answer of BloomCreate: Created is false when the filter
// existed with the same parameters; Bits, Hashes and Bytes its size.
type Bloom struct {
	Created bool  `json:"created"`
	Bits    int64 `json:"bits"`
	Hashes  int   `json:"hashes"`
	Bytes   int64 `json:"bytes"`
}

// BloomCreate makes the Bloom filter (hello's feature bloom) for
// capacity keys at errorRate false positives. The same filter with
// other parameters is a bad_request that names the ones it has.
func (cl *Client) BloomCreate(ctx context.Context, filter string,
	capacity int64, errorRate float64) (*Bloom, error) {
	r, _, err := cl.call(ctx, nil, map[string]any{"op": "bloom.create",
		"filter": filter, "capacity": capacity, "error_rate": errorRate}, nil)
	if err != nil {
		return nil, err
	}
	b := &Bloom{}
	if err := json.Unmarshal(r.raw, b); err != nil {
		return nil, newErr("io", "unreadable bloom.create reply: %v", err)
	}
	return b, nil
}

// BloomAdd adds keys (1 to 1000) to filter: true where the key was
// certainly not in it before.
func (cl *Client) BloomAdd(ctx context.Context, filter string, keys ...string) ([]bool, error) {
	return cl.bloomKeys(ctx, "bloom.add", "added", filter, keys)
}

// BloomCheck asks filter about keys: false where the key was certainly
// never added. A filter that does not exist is a bad_request.
func (cl *Client) BloomCheck(ctx context.Context, filter string, keys ...string) ([]bool, error) {
	return cl.bloomKeys(ctx, "bloom.check", "maybe", filter, keys)
}

func (cl *Client) bloomKeys(ctx context.Context, op, field, filter string,
	keys []string) ([]bool, error) {
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	r, _, err := cl.call(ctx, nil, map[string]any{"op": op, "filter": filter,
		"keys": keys}, nil)
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	var out []bool
	if json.Unmarshal(r.raw, &body) != nil ||
		json.Unmarshal(body[field], &out) != nil || len(out) != len(keys) {
		return nil, newErr("io", "unreadable %s reply", op)
	}
	return out, nil
}

// Versioned is what Read found (hello's feature versioned): Hit, and on
// a hit the Value read through the serializer (NotFound for a cached
// "not found") and its Version; on a miss read with a lease, the fill
// Lease.
type Versioned[T any] struct {
	Hit      bool
	NotFound bool
	Value    T
	Version  int64
	Lease    string
}

// ReadOptions of Read.
type ReadOptions struct {
	// Lease asks for the fill lease on a miss (and may wait while
	// another caller loads, as Cached does); false reads without one.
	Lease bool
	// Wait as for CacheOptions.
	Wait time.Duration
}

// Read is a cache.get that returns the value with its version, for a
// later Write or Fill with WriteOptions.IfVersion (a compare-and-set).
func Read[T any](ctx context.Context, cl *Client, key string,
	opts *ReadOptions) (*Versioned[T], error) {
	if err := checkKeys([]string{key}); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &ReadOptions{}
	}
	req := map[string]any{"op": "cache.get", "key": key}
	if !opts.Lease {
		req["lease"] = false
	}
	if opts.Wait > 0 {
		req["wait_ms"] = ms(opts.Wait)
	}
	r, _, err := cl.call(ctx, []string{key}, req, nil)
	if err != nil {
		return nil, err
	}
	v := &Versioned[T]{Hit: r.Hit}
	if !r.Hit {
		if isString(r.Lease) {
			v.Lease = rawString(r.Lease)
		}
		return v, nil
	}
	v.Version = rawInt(r.Version)
	v.Value, err = decode[T](cl, key, r.Value)
	if errors.Is(err, ErrNotFound) {
		v.NotFound, err = true, nil
	}
	return v, err
}

// WriteOptions of Write and Fill.
type WriteOptions struct {
	// TTL of the value; 0: the daemon's cache.ttl_ms.
	TTL time.Duration
	// IfVersion, when set (leased.Version(n)), stores only when the
	// entry's version is n; Version(0): only when there is none.
	IfVersion *int64
}

// Version gives a WriteOptions.IfVersion.
func Version(n int64) *int64 { return &n }

// Written is what Write and Fill did: Stored, and the Version the value
// got, or, when it was not stored, the entry's current version (0:
// none), to read again and retry.
type Written struct {
	Stored  bool
	Version int64
}

// Write is a cache.set of value through the serializer (nil: "not
// found"); with opts.IfVersion a compare-and-set. Any outstanding fill
// lease of the key becomes invalid.
func (cl *Client) Write(ctx context.Context, key string, value any,
	opts *WriteOptions) (*Written, error) {
	return cl.write(ctx, "cache.set", key, "", value, opts)
}

// Fill stores value under lease (from Read with a lease), with
// opts.IfVersion as Write has it.
func (cl *Client) Fill(ctx context.Context, key, lease string, value any,
	opts *WriteOptions) (*Written, error) {
	return cl.write(ctx, "cache.fill", key, lease, value, opts)
}

func (cl *Client) write(ctx context.Context, op, key, lease string,
	value any, opts *WriteOptions) (*Written, error) {
	if err := checkKeys([]string{key}); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &WriteOptions{}
	}
	req := map[string]any{"op": op, "key": key, "value": nil}
	if value != nil {
		s, err := cl.opts.Serializer.Marshal(value)
		if err != nil {
			return nil, &Error{Code: "invalid", Message: "the value of " +
				key + " cannot be stored: " + err.Error(), Err: err}
		}
		req["value"] = s
	}
	if op == "cache.fill" {
		req["lease"] = lease
	}
	if opts.TTL > 0 {
		req["ttl_ms"] = ms(opts.TTL)
	}
	if opts.IfVersion != nil {
		req["if_version"] = *opts.IfVersion
	}
	r, _, err := cl.call(ctx, []string{key}, req, nil)
	if err != nil {
		return nil, err
	}
	return &Written{Stored: string(r.Stored) == "true", Version: rawInt(r.Version)}, nil
}
