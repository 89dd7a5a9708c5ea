package leased

// The shared near cache reader against segments written here byte by
// byte (a writer following lib/leased/near_layout.h), hostile segments,
// a writer racing the reader, and a connection's near.map and near.hits
// against a peer that speaks the protocol. None needs a daemon.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

const (
	testPage  = 4096
	testStale = 5 * time.Second
)

// nearWriter writes layout 1 as the header says: buckets of four ways
// under a seqlock, records in a ring (bump allocation), a header with
// epoch, heartbeat and state.
type nearWriter struct {
	f         *os.File
	mem       []byte
	nb        uint64
	bucketsOf uint64
	ringOff   uint64
	ringBytes uint64
	cursor    uint64
}

func newNearWriter(t testing.TB, size, nb uint64) *nearWriter {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size),
		syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	w := &nearWriter{f: f, mem: mem, nb: nb, bucketsOf: testPage}
	w.ringOff = (testPage + nb*nearBucketBytes + testPage - 1) / testPage * testPage
	w.ringBytes = size - w.ringOff
	le := binary.LittleEndian
	copy(mem, "LDNEAR01")
	le.PutUint32(mem[8:], 1)
	le.PutUint32(mem[12:], testPage)
	le.PutUint64(mem[16:], size)
	le.PutUint32(mem[24:], uint32(nb))
	le.PutUint32(mem[28:], 4)
	le.PutUint64(mem[32:], w.bucketsOf)
	le.PutUint64(mem[40:], w.ringOff)
	le.PutUint64(mem[48:], w.ringBytes)
	// Long enough that no test depends on the machine's speed; the
	// tests of staleness set the heartbeat back past it.
	le.PutUint64(mem[56:], uint64(testStale))
	w.beat(monoNow())
	w.store32(80, nearLive)
	t.Cleanup(func() {
		_ = syscall.Munmap(mem)
		f.Close()
	})
	return w
}

func (w *nearWriter) store32(off uint64, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&w.mem[off])), v)
}

func (w *nearWriter) store64(off uint64, v uint64) {
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&w.mem[off])), v)
}

func (w *nearWriter) load32(off uint64) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&w.mem[off])))
}

func (w *nearWriter) beat(now int64) { w.store64(72, uint64(now)) }

// wayOf is key's way (its own, else a free one) and its bucket.
func (w *nearWriter) wayOf(key string) (uint64, uint64) {
	h := crc32.ChecksumIEEE([]byte(key))
	boff := w.bucketsOf + (uint64(h)&(w.nb-1))*nearBucketBytes
	free := uint64(0)
	for i := uint64(0); i < 4; i++ {
		wo := boff + 8 + i*nearWayBytes
		if w.load32(wo) == h && w.load32(wo+4) == uint32(len(key)) {
			return boff, wo
		}
		if w.load32(wo+4) == 0 && free == 0 {
			free = wo
		}
	}
	return boff, free
}

// put stores key = value at ring offset off (-1: the next free bytes).
func (w *nearWriter) put(key, value string, ttl time.Duration, null bool,
	off int64) (uint64, uint64) {
	need := (uint64(nearRecBytes+len(key)+len(value)) + 7) &^ 7
	if off < 0 {
		if w.cursor+need > w.ringBytes {
			w.cursor = 0
		}
		off = int64(w.cursor)
		w.cursor += need
	}
	boff, wo := w.wayOf(key)
	seq := w.load32(boff)
	w.store32(boff, seq+1)
	le := binary.LittleEndian
	rec := w.ringOff + uint64(off)
	le.PutUint32(w.mem[rec:], uint32(len(key)))
	le.PutUint32(w.mem[rec+4:], uint32(len(value)))
	copy(w.mem[rec+16:], key)
	copy(w.mem[rec+16+uint64(len(key)):], value)
	flags := uint32(0)
	if null {
		flags = nearNullFlag
	}
	le.PutUint32(w.mem[wo:], crc32.ChecksumIEEE([]byte(key)))
	le.PutUint32(w.mem[wo+4:], uint32(len(key)))
	le.PutUint32(w.mem[wo+8:], uint32(len(value)))
	le.PutUint32(w.mem[wo+12:], flags)
	le.PutUint64(w.mem[wo+16:], uint64(off))
	le.PutUint64(w.mem[wo+24:], uint64(monoNow()+int64(ttl)))
	w.store32(boff, seq+2)
	return boff, wo
}

func (w *nearWriter) del(key string) {
	boff, wo := w.wayOf(key)
	seq := w.load32(boff)
	w.store32(boff, seq+1)
	copy(w.mem[wo:wo+nearWayBytes], make([]byte, nearWayBytes))
	w.store32(boff, seq+2)
}

func (w *nearWriter) reader(t *testing.T) *nearSeg {
	t.Helper()
	s, err := mapNear(int(w.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(s.mem) })
	return s
}

func expect(t *testing.T, s *nearSeg, key, want string, wantRes int) {
	t.Helper()
	v, res := s.get(key, monoNow())
	if res != wantRes || v != want {
		t.Fatalf("get %q: %q %d, want %q %d", key, v, res, want, wantRes)
	}
}

func TestNearReads(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	s := w.reader(t)
	w.put("user:7", `"Ada"`, time.Minute, false, -1)
	w.put("gone", "", time.Minute, true, -1)
	expect(t, s, "user:7", `"Ada"`, nearHit)
	expect(t, s, "gone", "", nearNull)
	expect(t, s, "user:8", "", nearMiss)
	w.put("user:7", "longer value", time.Minute, false, -1)
	expect(t, s, "user:7", "longer value", nearHit)
	w.del("user:7")
	expect(t, s, "user:7", "", nearMiss)

	w.put("short", "v", -time.Nanosecond, false, -1)
	expect(t, s, "short", "", nearMiss) // expired
	_, wo := w.put("forever", "v", time.Minute, false, -1)
	binary.LittleEndian.PutUint64(w.mem[wo+24:], ^uint64(0)) // no expiry
	expect(t, s, "forever", "v", nearHit)

	w.put("k", "v", time.Minute, false, -1)
	w.beat(monoNow() - int64(testStale+time.Millisecond))
	expect(t, s, "k", "", nearMiss) // stale
	w.beat(monoNow() + int64(testStale+time.Second))
	expect(t, s, "k", "", nearMiss) // from the future
	w.beat(monoNow())
	expect(t, s, "k", "v", nearHit)
	w.store32(80, 0)
	expect(t, s, "k", "", nearClosed)
}

func TestNearSeqStuckOdd(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	s := w.reader(t)
	boff, _ := w.put("k", "v", time.Minute, false, -1)
	w.store32(boff, w.load32(boff)+1)
	start := time.Now()
	expect(t, s, "k", "", nearMiss)
	if d := time.Since(start); d > 5*time.Second { // a few tries, no waiting
		t.Fatalf("a stuck bucket held the reader %v", d)
	}
}

func TestNearBadWays(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	s := w.reader(t)
	le := binary.LittleEndian
	cases := []struct {
		name string
		at   uint64
		put  func(b []byte)
	}{
		{"offset at the ring's end", 16, func(b []byte) { le.PutUint64(b, w.ringBytes) }},
		{"offset huge", 16, func(b []byte) { le.PutUint64(b, ^uint64(7)) }},
		{"offset misaligned", 16, func(b []byte) { le.PutUint64(b, 4) }},
		{"vlen huge", 8, func(b []byte) { le.PutUint32(b, ^uint32(0)) }},
		{"vlen not the record's", 8, func(b []byte) { le.PutUint32(b, 3) }},
		{"hash of another key", 0, func(b []byte) { le.PutUint32(b, crc32.ChecksumIEEE([]byte("x"))) }},
	}
	for _, c := range cases {
		boff, wo := w.put("k", "value", time.Minute, false, 0)
		expect(t, s, "k", "value", nearHit)
		seq := w.load32(boff)
		c.put(w.mem[wo+c.at:])
		w.store32(boff, seq+2)
		if v, res := s.get("k", monoNow()); res != nearMiss {
			t.Fatalf("%s: %q %d", c.name, v, res)
		}
		copy(w.mem[wo:wo+nearWayBytes], make([]byte, nearWayBytes))
	}
}

func TestNearHostileSegments(t *testing.T) {
	rnd := rand.New(rand.NewSource(33))
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = "key-" + itoa(uint64(i))
	}
	probe := func(mem []byte) {
		s, err := checkNear(mem)
		if err != nil {
			return
		}
		for _, k := range keys {
			s.get(k, monoNow()) // must not panic, whatever it says
		}
	}
	// Random bytes.
	for i := 0; i < 300; i++ {
		mem := make([]byte, []int{0, 100, 256, 4096, 65536}[i%5])
		rnd.Read(mem)
		probe(mem)
	}
	// A good header over noise, with ways that name the probed keys
	// (so the record checks run), heartbeat fresh.
	for i := 0; i < 50; i++ {
		w := newNearWriter(t, 1<<16, 16)
		rnd.Read(w.mem[testPage:])
		le := binary.LittleEndian
		for _, k := range keys[:16] {
			boff, wo := w.wayOf(k)
			if wo == 0 {
				wo = boff + 8
			}
			le.PutUint32(w.mem[wo:], crc32.ChecksumIEEE([]byte(k)))
			le.PutUint32(w.mem[wo+4:], uint32(len(k)))
			le.PutUint64(w.mem[wo+24:], uint64(monoNow()+int64(time.Minute)))
			if rnd.Intn(2) == 0 {
				le.PutUint32(w.mem[boff:], 0)
			}
		}
		w.beat(monoNow())
		probe(w.mem)
	}
	// Headers that name space past the mapping are refused.
	w := newNearWriter(t, 1<<16, 16)
	good := append([]byte(nil), w.mem[:256]...)
	le := binary.LittleEndian
	bad := map[string]func(h []byte){
		"total past the end":     func(h []byte) { le.PutUint64(h[16:], 1<<20) },
		"buckets past the end":   func(h []byte) { le.PutUint64(h[32:], 1<<16-100) },
		"ring past the end":      func(h []byte) { le.PutUint64(h[48:], 1<<17) },
		"ring offset huge":       func(h []byte) { le.PutUint64(h[40:], ^uint64(7)) },
		"buckets not power of 2": func(h []byte) { le.PutUint32(h[24:], 48) },
		"buckets huge":           func(h []byte) { le.PutUint32(h[24:], 1<<31) },
		"header_bytes huge":      func(h []byte) { le.PutUint32(h[12:], 1<<30) },
		"layout 2":               func(h []byte) { le.PutUint32(h[8:], 2) },
		"no staleness bound":     func(h []byte) { le.PutUint64(h[56:], 0) },
	}
	for name, f := range bad {
		mem := make([]byte, 1<<16)
		copy(mem, good)
		f(mem)
		if _, err := checkNear(mem); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Truncated: the file is shorter than the segment it describes.
	if _, err := checkNear(append([]byte(nil), w.mem[:8192]...)); err == nil {
		t.Error("a truncated segment was accepted")
	}
}

// A writer rewrites one key in the same ring bytes as fast as it can,
// each value one byte repeated; the reader must only see whole values.
func TestNearRaceNeverTorn(t *testing.T) {
	w := newNearWriter(t, 1<<16, 4)
	s := w.reader(t)
	w.put("k", strings.Repeat("a", 50), time.Minute, false, 0)
	stop := make(chan struct{})
	var writes int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			c := "abcdefgh"[n%8 : n%8+1]
			w.put("k", strings.Repeat(c, 50+n%700), time.Minute, false, 0)
			w.beat(monoNow())
			atomic.AddInt64(&writes, 1)
		}
	}()
	hits, torn := 0, 0
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		v, res := s.get("k", monoNow())
		if res != nearHit {
			continue
		}
		hits++
		if len(v) < 50 || strings.Count(v, v[:1]) != len(v) {
			torn++
		}
	}
	close(stop)
	wg.Wait()
	if torn != 0 {
		t.Fatalf("%d torn values of %d hits", torn, hits)
	}
	if hits < 1000 || atomic.LoadInt64(&writes) < 1000 {
		t.Fatalf("too little happened: %d hits, %d writes", hits, writes)
	}
}

// nearPeer speaks enough of the protocol: hello with shared_near,
// near.map (the descriptor with the reply's first byte), cache.get (a hit
// of "socket"), near.hits (summed).
type nearPeer struct {
	mu      sync.Mutex
	ops     []string
	hits    float64
	falls   float64
	feature bool
}

func (p *nearPeer) count(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, o := range p.ops {
		if o == op {
			n++
		}
	}
	return n
}

func startNearPeer(t *testing.T, w *nearWriter, feature bool) (string, *nearPeer) {
	path := filepath.Join(t.TempDir(), "near.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &nearPeer{feature: feature}
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go p.serve(c, w)
		}
	}()
	return path, p
}

func (p *nearPeer) serve(c *net.UnixConn, w *nearWriter) {
	dec := json.NewDecoder(c)
	for {
		var req map[string]any
		if dec.Decode(&req) != nil {
			return
		}
		op, _ := req["op"].(string)
		p.mu.Lock()
		p.ops = append(p.ops, op)
		if op == "near.hits" {
			p.hits += req["hits"].(float64)
			p.falls += req["fallbacks"].(float64)
		}
		p.mu.Unlock()
		rep := map[string]any{"id": req["id"], "ok": true}
		var oob []byte
		switch op {
		case "hello":
			rep["session"] = "s1"
			if p.feature {
				rep["features"] = []string{"shared_near"}
			}
		case "near.map":
			rep["bytes"] = len(w.mem)
			rep["layout"] = 1
			fd, err := syscall.Open("/proc/self/fd/"+itoa(uint64(w.f.Fd())),
				syscall.O_RDONLY, 0)
			if err != nil {
				return
			}
			defer syscall.Close(fd)
			oob = syscall.UnixRights(fd)
		case "cache.get":
			rep["hit"] = true
			rep["value"] = `"socket"`
		}
		b, _ := json.Marshal(rep)
		b = append(b, '\n')
		if oob != nil {
			if _, _, err := c.WriteMsgUnix(b[:1], oob, nil); err != nil {
				return
			}
			b = b[1:]
		}
		if _, err := c.Write(b); err != nil {
			return
		}
	}
}

func TestNearThroughTheClient(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	path, p := startNearPeer(t, w, true)
	w.put("user:7", `"Ada"`, time.Minute, false, -1)
	w.put("user:404", "", time.Minute, true, -1)
	ctx := context.Background()
	cl, err := Dial(ctx, Options{Address: path, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	never := func(context.Context) (string, error) {
		return "", errors.New("the loader ran")
	}
	for i := 0; i < 2500; i++ {
		v, err := Cached(ctx, cl, "user:7", never, nil)
		if err != nil || v != "Ada" {
			t.Fatalf("hit %d: %q %v", i, v, err)
		}
	}
	if _, err := Cached(ctx, cl, "user:404", never, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cached null: %v", err)
	}
	if v, err := Cached(ctx, cl, "user:8", never, nil); err != nil || v != "socket" {
		t.Fatalf("miss: %q %v", v, err)
	}
	if n := p.count("cache.get"); n != 1 {
		t.Fatalf("%d cache.get for one miss", n)
	}
	if n := p.count("near.map"); n != 1 {
		t.Fatalf("near.map asked %d times", n)
	}
	cl.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		h, f := p.hits, p.falls
		p.mu.Unlock()
		if h == 2501 && f == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("near.hits reported %v hits, %v fallbacks", h, f)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNearSegmentThatIsNoSegment(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	w.put("k", `"v"`, time.Minute, false, -1)
	copy(w.mem, "NOTNEAR!")
	path, p := startNearPeer(t, w, true)
	ctx := context.Background()
	cl, err := Dial(ctx, Options{Address: path, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 3; i++ {
		v, err := Cached(ctx, cl, "k", func(context.Context) (string, error) {
			return "", errors.New("the loader ran")
		}, nil)
		if err != nil || v != "socket" {
			t.Fatalf("%q %v", v, err)
		}
	}
	if n := p.count("near.map"); n != 1 {
		t.Fatalf("near.map asked %d times", n)
	}
}

func TestNearWithoutTheFeature(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	path, p := startNearPeer(t, w, false)
	w.put("k", `"v"`, time.Minute, false, -1)
	ctx := context.Background()
	cl, err := Dial(ctx, Options{Address: path, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 2; i++ {
		v, err := Cached(ctx, cl, "k", func(context.Context) (string, error) {
			return "", errors.New("the loader ran")
		}, nil)
		if err != nil || v != "socket" {
			t.Fatalf("%q %v", v, err)
		}
	}
	if p.count("near.map") != 0 {
		t.Fatal("near.map without the feature")
	}
}

func BenchmarkNearGet(b *testing.B) {
	w := newNearWriter(b, 1<<20, 64)
	s, _ := mapNear(int(w.f.Fd()))
	w.put("user:7", `"Ada"`, time.Minute, false, -1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, res := s.get("user:7", monoNow()); res != nearHit {
			b.Fatal(res)
		}
	}
}

// Against the daemon of LEASED_SOCKET, when it offers shared_near
// (check_client_go turns it on): a hit is the daemon's answer, and after
// a cache.set is answered the old value is never read, through the
// segment or the socket.
func TestNearRealDaemon(t *testing.T) {
	sock := os.Getenv("LEASED_SOCKET")
	if sock == "" {
		t.Skip("LEASED_SOCKET is not set")
	}
	ctx := context.Background()
	cl, err := Dial(ctx, Options{Address: sock, PoolSize: 1, Serializer: Strings})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := cl.conn(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !c.features["shared_near"] {
		t.Skip("the daemon offers no shared_near")
	}
	w, err := Dial(ctx, Options{Address: sock, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	key := "go-near:" + itoa(uint64(time.Now().UnixNano()))
	set := func(v string) {
		if _, err := w.Do(ctx, map[string]any{"op": "cache.set", "key": key,
			"value": v}); err != nil {
			t.Fatal(err)
		}
	}
	never := func(context.Context) (string, error) {
		return "", errors.New("the loader ran")
	}
	get := func() string {
		v, err := Cached(ctx, cl, key, never, nil)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	inSegment := func(want string) bool {
		s := c.near.seg.Load()
		if s == nil {
			return false
		}
		v, res := s.get(key, monoNow())
		return res == nearHit && v == want
	}
	set("v0")
	deadline := time.Now().Add(10 * time.Second)
	for !(get() == "v0" && inSegment("v0")) {
		if time.Now().After(deadline) {
			t.Fatal("the key never reached the segment")
		}
		time.Sleep(5 * time.Millisecond)
	}
	served := 0
	for i := 1; i < 300; i++ {
		want := "v" + itoa(uint64(i))
		set(want)
		for j := 0; j < 3; j++ {
			if inSegment(want) {
				served++
			}
			if got := get(); got != want {
				t.Fatalf("after the set of %s, read %s", want, got)
			}
		}
	}
	if served == 0 {
		t.Fatal("the segment served none of the reads")
	}
}

// A segment the daemon closed (a reload) sends reads to the socket, and
// is asked for again once a second has passed.
func TestNearClosedIsMappedAgain(t *testing.T) {
	w := newNearWriter(t, 1<<20, 64)
	w.put("k", `"v"`, time.Minute, false, -1)
	path, p := startNearPeer(t, w, true)
	ctx := context.Background()
	cl, err := Dial(ctx, Options{Address: path, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	get := func() string {
		v, err := Cached(ctx, cl, "k", func(context.Context) (string, error) {
			return "", errors.New("the loader ran")
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	start := time.Now() // the first near.map is asked after this
	if v := get(); v != "v" {
		t.Fatalf("first read %q", v)
	}
	w.store32(80, 0)
	if v := get(); v != "socket" {
		t.Fatalf("read of a closed segment %q", v)
	}
	w.store32(80, nearLive)
	for get() != "v" {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the segment was not mapped again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if el := time.Since(start); el < nearRetry-10*time.Millisecond {
		t.Fatalf("mapped again after %v", el)
	}
	if n := p.count("near.map"); n != 2 {
		t.Fatalf("near.map asked %d times", n)
	}
}

// A daemon of the test's own (LEASED_BIN on LEASED_TEST_REDIS, as
// check_client_go sets them), stopped with SIGSTOP: no hit is served by a
// lookup that starts later than shared_stale_ms (+5 ms for the stop to
// land) after the stop, however slowly this loop turns, and the segment
// answers again after SIGCONT.
func TestNearStoppedDaemon(t *testing.T) {
	bin, redis := os.Getenv("LEASED_BIN"), os.Getenv("LEASED_TEST_REDIS")
	if bin == "" || redis == "" {
		t.Skip("LEASED_BIN or LEASED_TEST_REDIS is not set")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	conf := filepath.Join(dir, "c.yml")
	yml := "listen:\n  unix: \"" + sock + "\"\nmetrics:\n  listen: \"\"\n" +
		"redis:\n  address: \"" + redis + "\"\njournal:\n  path: \"" +
		filepath.Join(dir, "j") + "\"\nlog:\n  level: warn\n" +
		"cache:\n  near: { enabled: true, shared_stale_ms: 50 }\n"
	if err := os.WriteFile(conf, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	d := exec.Command(bin, "-f", "-c", conf)
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = d.Process.Signal(syscall.SIGCONT)
		_ = d.Process.Signal(syscall.SIGTERM)
		_ = d.Wait()
	}()
	ctx := context.Background()
	var cl *Client
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		if cl, err = Dial(ctx, Options{Address: sock, PoolSize: 1,
			Serializer: Strings}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer cl.Close()
	if _, err := cl.Do(ctx, map[string]any{"op": "cache.set", "key": "k",
		"value": "v"}); err != nil {
		t.Fatal(err)
	}
	c, _ := cl.conn(ctx, 0)
	var s *nearSeg
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, _ = Cached(ctx, cl, "k", func(context.Context) (string, error) {
			return "", errors.New("the loader ran")
		}, nil)
		if s = c.near.seg.Load(); s != nil {
			if _, res := s.get("k", monoNow()); res == nearHit {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the key never reached the segment")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := d.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := monoNow()
	lastHit := int64(0)
	for {
		at := monoNow()
		if _, res := s.get("k", at); res != nearHit {
			break
		}
		lastHit = at
		if at-stopped > int64(10*time.Second) {
			t.Fatal("the segment still answered 10 s after SIGSTOP")
		}
	}
	if late := time.Duration(lastHit - stopped); lastHit != 0 &&
		late > 55*time.Millisecond {
		t.Fatalf("a hit %v after SIGSTOP (shared_stale_ms 50)", late)
	}
	_ = d.Process.Signal(syscall.SIGCONT)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, res := s.get("k", monoNow()); res == nearHit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the segment did not answer again after SIGCONT")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
