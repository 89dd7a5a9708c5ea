// Command leased-conformance runs the scenarios of the conformance suite
// (clients/conformance/README.md) with the Go client:
//
//	leased-conformance FILE...         run the scenarios, print ok / not ok
//	leased-conformance --steps JSON    helper mode: run the steps, exit 0 or 1
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"leased.dev/leased"
)

type step map[string]any

type bgOp struct {
	start  time.Time
	cancel context.CancelFunc
	done   chan map[string]any
	result map[string]any
}

type run struct {
	clients map[string]*leased.Client
	helds   map[string]*leased.Held
	saved   map[string]map[string]any
	bg      map[string]*bgOp
	helper  bool
}

func newRun(helper bool) *run {
	return &run{clients: map[string]*leased.Client{},
		helds: map[string]*leased.Held{}, saved: map[string]map[string]any{},
		bg: map[string]*bgOp{}, helper: helper}
}

func (r *run) closeAll() {
	for _, b := range r.bg {
		b.cancel()
	}
	for _, c := range r.clients {
		c.Close()
	}
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "--steps" {
		os.Exit(helperMain(os.Args[2]))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: leased-conformance FILE... | --steps JSON")
		os.Exit(2)
	}
	passed, failed := 0, 0
	for _, f := range os.Args[1:] {
		name, err := scenario(f)
		if err != nil {
			fmt.Printf("not ok %s: %v\n", name, err)
			failed++
		} else {
			fmt.Printf("ok %s\n", name)
			passed++
		}
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}

func helperMain(js string) int {
	var steps []step
	if err := json.Unmarshal([]byte(js), &steps); err != nil {
		fmt.Fprintln(os.Stderr, "bad --steps:", err)
		return 1
	}
	r := newRun(true)
	defer r.closeAll()
	if err := r.steps(steps); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func scenario(file string) (string, error) {
	name := strings.TrimSuffix(filepath.Base(file), ".json")
	data, err := os.ReadFile(file)
	if err != nil {
		return name, err
	}
	var sc struct {
		Name  string `json:"name"`
		Steps []step `json:"steps"`
	}
	if err := json.Unmarshal(data, &sc); err != nil {
		return name, err
	}
	if sc.Name != "" {
		name = sc.Name
	}
	if _, err := control(step{"do": "env", "action": "begin", "scenario": name}); err != nil {
		return name, fmt.Errorf("begin: %v", err)
	}
	r := newRun(false)
	defer r.closeAll()
	return name, r.steps(sc.Steps)
}

func (r *run) steps(steps []step) error {
	for i, s := range steps {
		if err := r.one(s); err != nil {
			return fmt.Errorf("step %d (%v): %v", i+1, s["do"], err)
		}
	}
	return nil
}

// one carries out a step, checks its expect and saves it under its as.
func (r *run) one(s step) error {
	start := time.Now()
	res, err := r.do(s)
	if err != nil {
		return err
	}
	if res == nil {
		return nil // a background step: saved by await
	}
	if _, ok := res["elapsed_ms"]; !ok {
		res["elapsed_ms"] = time.Since(start).Milliseconds()
	}
	res = normalize(res)
	if exp, ok := s["expect"].(map[string]any); ok {
		if err := r.check(exp, res); err != nil {
			return err
		}
	} else if code, bad := res["error"]; bad {
		return fmt.Errorf("error %v", code)
	}
	if as, ok := s["as"].(string); ok {
		r.saved[as] = res
	}
	return nil
}

func normalize(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

func (r *run) do(s step) (map[string]any, error) {
	switch s["do"] {
	case "env":
		return control(s)
	case "open":
		return r.open(s), nil
	case "close":
		c, err := r.client(s)
		if err != nil {
			return nil, err
		}
		c.Close()
		return map[string]any{}, nil
	case "lock", "sem":
		return r.lockStep(s)
	case "unlock":
		h, err := r.held(s)
		if err != nil {
			return nil, err
		}
		return errResult(h.Unlock(context.Background()), map[string]any{}), nil
	case "wait_lost":
		return r.waitLost(s)
	case "wait_at_risk", "wait_safe":
		return r.waitRisk(s, str(s, "do") == "wait_at_risk")
	case "await":
		return r.await(s)
	case "cancel":
		b := r.bg[str(s, "op")]
		if b == nil {
			return nil, fmt.Errorf("no background step %q", str(s, "op"))
		}
		b.cancel()
		return map[string]any{}, nil
	case "cached", "invalidate", "update":
		return r.cacheStep(s)
	case "rate", "warm", "unlock_id":
		return r.wave3Step(s)
	case "reconnect":
		// The client opens a new session by itself at its next call.
		_, err := r.client(s)
		return map[string]any{}, err
	case "count":
		return count(str(s, "file")), nil
	case "pause":
		if !r.helper {
			return nil, errors.New("pause is for helpers only")
		}
		time.Sleep(60 * time.Second)
		return map[string]any{}, nil
	}
	return nil, fmt.Errorf("unknown step %v", s["do"])
}

func (r *run) open(s step) map[string]any {
	o := leased.Options{Client: "conformance-go"}
	switch str(s, "target") {
	case "tcp":
		o.Network, o.Address = "tcp", os.Getenv("LEASED_TCP")
		if b, _ := s["auth"].(bool); b {
			o.Auth = os.Getenv("LEASED_AUTH_TOKEN")
		}
	case "dead":
		o.Address = os.Getenv("LEASED_DEAD_SOCKET")
	default:
		o.Address = os.Getenv("LEASED_SOCKET")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := leased.Dial(ctx, o)
	if err != nil {
		return errResult(err, nil)
	}
	r.clients[str(s, "as")] = c
	return map[string]any{}
}

func (r *run) client(s step) (*leased.Client, error) {
	c := r.clients[str(s, "client")]
	if c == nil {
		return nil, fmt.Errorf("no client %q", str(s, "client"))
	}
	return c, nil
}

func (r *run) held(s step) (*leased.Held, error) {
	h := r.helds[str(s, "held")]
	if h == nil {
		return nil, fmt.Errorf("no held handle %q", str(s, "held"))
	}
	return h, nil
}

func (r *run) lockStep(s step) (map[string]any, error) {
	c, err := r.client(s)
	if err != nil {
		return nil, err
	}
	as := str(s, "as")
	ctx, cancel := context.WithCancel(context.Background())
	call := func() map[string]any {
		h, err := take(ctx, c, s)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				// A cancelled wait acquired nothing.
				return map[string]any{"acquired": false}
			}
			return errResult(err, nil)
		}
		if h == nil {
			return map[string]any{"acquired": false}
		}
		if as != "" {
			r.helds[as] = h
		}
		res := map[string]any{"acquired": true, "token": h.Token}
		if s["do"] == "lock" {
			res["count"] = h.Count
			if h.Keys == nil {
				res["fence"] = h.Fence
			}
		}
		return res
	}
	if b, _ := s["background"].(bool); !b {
		defer cancel()
		return call(), nil
	}
	op := &bgOp{start: time.Now(), cancel: cancel, done: make(chan map[string]any, 1)}
	r.bg[as] = op
	go func() { op.done <- call() }()
	return nil, nil
}

func take(ctx context.Context, c *leased.Client, s step) (*leased.Held, error) {
	wait := dur(s, "wait_ms")
	if ms, ok := s["wait_ms"].(float64); ok && ms < 0 {
		wait = leased.WaitForever
	}
	if s["do"] == "sem" {
		permits, _ := s["permits"].(float64)
		limit, _ := s["limit"].(float64)
		return c.TrySemaphore(ctx, str(s, "key"), int(limit),
			&leased.SemOptions{Permits: int(permits), Wait: wait, TTL: dur(s, "ttl_ms")})
	}
	o := &leased.LockOptions{Owner: str(s, "owner"), Wait: wait, TTL: dur(s, "ttl_ms")}
	if keys := strs(s["keys"]); keys != nil {
		return c.TryLockKeys(ctx, keys, o)
	}
	switch str(s, "mode") {
	case "read":
		return c.RWLock(str(s, "key")).TryRLock(ctx, o)
	case "write":
		return c.RWLock(str(s, "key")).TryLock(ctx, o)
	}
	return c.TryLock(ctx, str(s, "key"), o)
}

func (r *run) waitLost(s step) (map[string]any, error) {
	h, err := r.held(s)
	if err != nil {
		return nil, err
	}
	select {
	case <-h.Done():
		return map[string]any{"reason": h.Reason()}, nil
	case <-time.After(dur(s, "within_ms")):
		return nil, fmt.Errorf("no lost signal within %v", dur(s, "within_ms"))
	}
}

// waitRisk waits on AtRiskC for at risk; safe has no channel of its own,
// so it is polled.
func (r *run) waitRisk(s step, atRisk bool) (map[string]any, error) {
	h, err := r.held(s)
	if err != nil {
		return nil, err
	}
	deadline := time.After(dur(s, "within_ms"))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for h.AtRisk() != atRisk {
		select {
		case <-h.Done():
			return nil, fmt.Errorf("lost (%s) while waiting", h.Reason())
		case <-deadline:
			return nil, fmt.Errorf("at risk %v, not %v, after %v", !atRisk,
				atRisk, dur(s, "within_ms"))
		case <-h.AtRiskC():
		case <-tick.C:
		}
	}
	return map[string]any{}, nil
}

func (r *run) await(s step) (map[string]any, error) {
	name := str(s, "op")
	b := r.bg[name]
	if b == nil {
		return nil, fmt.Errorf("no background step %q", name)
	}
	if b.result == nil {
		select {
		case b.result = <-b.done:
			b.result["elapsed_ms"] = time.Since(b.start).Milliseconds()
		case <-time.After(60 * time.Second):
			return nil, errors.New("the background step did not end in 60 s")
		}
	}
	res := map[string]any{}
	for k, v := range b.result {
		res[k] = v
	}
	r.saved[name] = normalize(res)
	return res, nil
}

func (r *run) cacheStep(s step) (map[string]any, error) {
	c, err := r.client(s)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	keys := strs(s["keys"])
	if k, ok := s["keys"].(string); ok {
		keys = []string{k}
	}
	switch s["do"] {
	case "invalidate":
		return errResult(c.Invalidate(ctx, keys...), map[string]any{}), nil
	case "update":
		w, _ := s["writer"].(map[string]any)
		writer := func(context.Context) error {
			return appendLine(str(w, "count_file"))
		}
		return errResult(c.Update(ctx, writer, keys...), map[string]any{}), nil
	}
	l, _ := s["loader"].(map[string]any)
	v, err := leased.Cached(ctx, c, str(s, "key"), func(context.Context) (string, error) {
		return load(l)
	}, nil)
	if err != nil {
		return errResult(err, nil), nil
	}
	return map[string]any{"value": v}, nil
}

// wave3Step: rate (RateAcquire), warm (Warm: stored, failed and the
// first entry error's code) and unlock_id (Unlock with a request id).
func (r *run) wave3Step(s step) (map[string]any, error) {
	c, err := r.client(s)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	switch s["do"] {
	case "rate":
		n := func(k string) int { f, _ := s[k].(float64); return int(f) }
		g, err := c.RateAcquire(ctx, str(s, "key"), n("rate"),
			dur(s, "per_ms"), &leased.RateOptions{Burst: n("burst"),
				Permits: n("permits"), Wait: dur(s, "wait_ms")})
		if err != nil {
			return errResult(err, nil), nil
		}
		return map[string]any{"acquired": g.Acquired,
			"retry_after_ms": g.RetryAfter.Milliseconds()}, nil
	case "warm":
		var es []leased.WarmEntry
		list, _ := s["entries"].([]any)
		for _, x := range list {
			e, _ := x.(map[string]any)
			es = append(es, leased.WarmEntry{Key: str(e, "key"),
				Value: str(e, "value"), TTL: dur(e, "ttl_ms")})
		}
		w, err := c.Warm(ctx, es, 0)
		if err != nil {
			return errResult(err, nil), nil
		}
		res := map[string]any{"stored": w.Stored}
		failed := 0
		for _, e := range w.Errors {
			if e == nil {
				continue
			}
			if failed == 0 {
				res["first_error"] = leased.Code(e)
			}
			failed++
		}
		res["failed"] = failed
		return res, nil
	}
	u, err := c.Unlock(ctx, str(s, "key"), &leased.UnlockOptions{
		Owner: str(s, "owner"), RequestID: str(s, "request_id")})
	if err != nil {
		return errResult(err, nil), nil
	}
	return map[string]any{"released": u.Released, "count": u.Count}, nil
}

func load(l map[string]any) (string, error) {
	if f := str(l, "count_file"); f != "" {
		if err := appendLine(f); err != nil {
			return "", err
		}
	}
	if m := str(l, "mark"); m != "" {
		if _, err := control(step{"do": "env", "action": "mark", "name": m}); err != nil {
			return "", err
		}
	}
	time.Sleep(dur(l, "delay_ms"))
	return str(l, "value"), nil
}

func appendLine(file string) error {
	if file == "" {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(os.Getenv("LEASED_CONF_TMP"), file),
		os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(fmt.Sprintf("%d\n", os.Getpid()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func count(file string) map[string]any {
	data, err := os.ReadFile(filepath.Join(os.Getenv("LEASED_CONF_TMP"), file))
	if err != nil {
		return map[string]any{"lines": 0}
	}
	return map[string]any{"lines": strings.Count(string(data), "\n")}
}

// control sends one request on the harness' control channel.
func control(s step) (map[string]any, error) {
	nc, err := net.Dial("unix", os.Getenv("LEASED_CONTROL"))
	if err != nil {
		return nil, fmt.Errorf("control channel: %v", err)
	}
	defer nc.Close()
	line, _ := json.Marshal(s)
	if _, err := nc.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("control channel: %v", err)
	}
	reply, err := bufio.NewReader(nc).ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("control channel: %v", err)
	}
	var res map[string]any
	if err := json.Unmarshal(reply, &res); err != nil {
		return nil, fmt.Errorf("control channel: %v", err)
	}
	if ok, _ := res["ok"].(bool); !ok {
		return nil, fmt.Errorf("%v %v", s["action"], res["error"])
	}
	return res, nil
}

func errResult(err error, ok map[string]any) map[string]any {
	if err == nil {
		return ok
	}
	code := leased.Code(err)
	if code == "" {
		code = err.Error()
	}
	if code == "not_acquired" || code == "no_permit" {
		return map[string]any{"acquired": false}
	}
	fmt.Fprintln(os.Stderr, "leased-conformance:", err)
	return map[string]any{"error": code}
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func dur(m map[string]any, k string) time.Duration {
	n, _ := m[k].(float64)
	return time.Duration(n * float64(time.Millisecond))
}

func strs(v any) []string {
	a, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(a))
	for _, x := range a {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}
