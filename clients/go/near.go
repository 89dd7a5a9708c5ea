package leased

// The shared near cache: leased may publish its near cache in a
// read-only shared memory segment (hello's feature shared_near;
// leased-protocol(7), "Shared near cache"; the layout is
// lib/leased/near_layout.h). A connection on the Unix socket maps it at
// its first Cached and looks keys up there before asking the daemon.
// Nothing in the segment is trusted: every rule of the layout is checked
// on every read, and anything out of place sends the read to the socket.

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const (
	nearHdrBytes    = 256
	nearBucketBytes = 168
	nearWayBytes    = 40
	nearRecBytes    = 16
	nearLive        = 1
	nearNullFlag    = 1
	// A bucket that stays odd, or keeps moving, this many times sends
	// the read to the socket: the daemon is writing it.
	nearTries = 8
	// near.hits goes out after this many lookups, or this long.
	nearReportEvery = 1000
	nearReportNs    = int64(time.Second)
	// near.map is asked again (a closed segment, a refusal) at most
	// this often.
	nearRetry = time.Second
)

// What a lookup found.
const (
	nearMiss   = iota // ask the daemon
	nearHit           // the value
	nearNull          // a cached "not found"
	nearClosed        // the segment was replaced: map it again
)

// monoBase and monoAt0 turn the runtime's monotonic clock (CLOCK_MONOTONIC,
// read through the vDSO by time.Since) into CLOCK_MONOTONIC nanoseconds,
// the clock of the segment's heartbeat and deadlines: one system call at
// start, none per lookup.
var (
	monoOnce sync.Once
	monoBase time.Time
	monoAt0  int64
)

func monoNow() int64 {
	monoOnce.Do(func() {
		var ts syscall.Timespec
		monoBase = time.Now()
		_, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, // CLOCK_MONOTONIC
			uintptr(unsafe.Pointer(&ts)), 0)
		if e == 0 {
			monoAt0 = ts.Nano()
		}
	})
	if monoAt0 == 0 {
		return 0
	}
	return monoAt0 + int64(time.Since(monoBase))
}

// nearSeg is one mapped segment. readers counts lookups in progress and
// dead stops new ones, so that a replaced segment is unmapped only when
// no goroutine reads it.
type nearSeg struct {
	mem        []byte
	mask       uint64
	bucketsOff uint64
	ringOff    uint64
	ringBytes  uint64
	staleNs    uint64
	readers    int32
	dead       int32
}

// mapNear maps the segment of fd (the caller closes fd).
func mapNear(fd int) (*nearSeg, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size < nearHdrBytes || st.Size > 1<<40 {
		return nil, errors.New("a shared near segment of a size out of range")
	}
	mem, err := syscall.Mmap(fd, 0, int(st.Size), syscall.PROT_READ,
		syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	s, err := checkNear(mem)
	if err != nil {
		_ = syscall.Munmap(mem)
		return nil, err
	}
	return s, nil
}

// checkNear checks the header's geometry against the mapping (fixed for
// the segment's life); every lookup checks the rest.
func checkNear(mem []byte) (*nearSeg, error) {
	le := binary.LittleEndian
	size := uint64(len(mem))
	if size < nearHdrBytes || string(mem[0:8]) != "LDNEAR01" ||
		le.Uint32(mem[8:]) != 1 || le.Uint32(mem[28:]) != 4 {
		return nil, errors.New("not a layout 1 shared near segment")
	}
	headerBytes := uint64(le.Uint32(mem[12:]))
	total := le.Uint64(mem[16:])
	nb := uint64(le.Uint32(mem[24:]))
	s := &nearSeg{mem: mem, bucketsOff: le.Uint64(mem[32:]),
		ringOff: le.Uint64(mem[40:]), ringBytes: le.Uint64(mem[48:]),
		staleNs: le.Uint64(mem[56:]), mask: nb - 1}
	switch {
	case total > size || headerBytes < nearHdrBytes || headerBytes > size:
		return nil, errors.New("the segment's header names space past its end")
	case nb == 0 || nb&(nb-1) != 0:
		return nil, errors.New("the bucket count is no power of two")
	case s.bucketsOff%8 != 0 || s.bucketsOff < nearHdrBytes ||
		s.bucketsOff > size || nb > (size-s.bucketsOff)/nearBucketBytes:
		return nil, errors.New("the buckets lie outside the segment")
	case s.ringOff%8 != 0 || s.ringOff < nearHdrBytes || s.ringOff > size ||
		s.ringBytes > size-s.ringOff:
		return nil, errors.New("the ring lies outside the segment")
	case s.staleNs == 0 || s.staleNs > 1<<62:
		return nil, errors.New("the segment's staleness bound is out of range")
	}
	return s, nil
}

func (s *nearSeg) u32(off uint64) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[off])))
}

func (s *nearSeg) u64(off uint64) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&s.mem[off])))
}

// get looks key up. Every load of the segment is atomic (ordered), so the
// seq read after the copy is read after it on any CPU.
func (s *nearSeg) get(key string, now int64) (string, int) {
	atomic.AddInt32(&s.readers, 1)
	defer atomic.AddInt32(&s.readers, -1)
	if atomic.LoadInt32(&s.dead) != 0 {
		return "", nearClosed
	}
	epoch := s.u64(64)
	beat := int64(s.u64(72))
	if s.u32(80) != nearLive {
		return "", nearClosed
	}
	// A beat from the future is as wrong as an old one.
	if age := now - beat; age > int64(s.staleNs) || -age > int64(s.staleNs) {
		return "", nearMiss
	}
	h := crc32.ChecksumIEEE(strBytes(key))
	klen := uint64(len(key))
	boff := s.bucketsOff + (uint64(h)&s.mask)*nearBucketBytes
	for try := 0; try < nearTries; try++ {
		seq := s.u32(boff)
		if seq&1 != 0 {
			continue
		}
		v, res, torn := s.ways(boff, h, key, klen, now)
		if s.u32(boff) != seq {
			continue // the daemon wrote the bucket meanwhile
		}
		if torn || res == nearMiss || s.u64(64) != epoch {
			return "", nearMiss
		}
		return v, res
	}
	return "", nearMiss
}

// ways looks for key among the four ways of the bucket at boff. torn is
// set when a way's fields do not hold together (an expired deadline
// too): the caller tells a race from a real no by the seq.
func (s *nearSeg) ways(boff uint64, h uint32, key string, klen uint64,
	now int64) (v string, res int, torn bool) {
	for i := uint64(0); i < 4; i++ {
		w := boff + 8 + i*nearWayBytes
		if s.u32(w) != h || uint64(s.u32(w+4)) != klen {
			continue
		}
		vlen := uint64(s.u32(w + 8))
		flags := s.u32(w + 12)
		off := s.u64(w + 16)
		// Unsigned: an entry without an expiry says 2^64 - 1.
		deadline := s.u64(w + 24)
		// Sizes stay far below 2^64 here: klen and vlen are 32-bit.
		span := (nearRecBytes + klen + vlen + 7) &^ 7
		if deadline <= uint64(now) || off%8 != 0 || off > s.ringBytes ||
			span > s.ringBytes-off {
			return "", nearMiss, true
		}
		var small [256]byte // most records: no allocation but the value's
		rec := small[:]
		if span <= uint64(len(small)) {
			rec = small[:span]
		} else {
			rec = make([]byte, span)
		}
		s.copyOut(rec, s.ringOff+off)
		le := binary.LittleEndian
		if uint64(le.Uint32(rec)) != klen || uint64(le.Uint32(rec[4:])) != vlen ||
			string(rec[nearRecBytes:nearRecBytes+klen]) != key {
			continue // another key of this hash, or torn
		}
		if flags&nearNullFlag != 0 {
			return "", nearNull, false
		}
		return string(rec[nearRecBytes+klen : nearRecBytes+klen+vlen]), nearHit, false
	}
	return "", nearMiss, false
}

// strBytes is s's bytes without a copy, for reading only: a string
// header followed by a capacity is a slice header.
func strBytes(s string) []byte {
	return *(*[]byte)(unsafe.Pointer(&struct {
		string
		int
	}{s, len(s)}))
}

// copyOut fills dst (a multiple of 8 bytes) from the 8-aligned off with
// atomic loads, so that no load of the copy moves past the seq check.
func (s *nearSeg) copyOut(dst []byte, off uint64) {
	for i := 0; i < len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], s.u64(off+uint64(i)))
	}
}

// retire unmaps a replaced segment once no lookup is reading it.
func (s *nearSeg) retire() {
	atomic.StoreInt32(&s.dead, 1)
	go func() {
		for atomic.LoadInt32(&s.readers) != 0 {
			time.Sleep(time.Millisecond)
		}
		_ = syscall.Munmap(s.mem)
	}()
}

// nearState is a connection's side of the shared near cache.
type nearState struct {
	mu      sync.Mutex // one near.map at a time
	seg     atomic.Pointer[nearSeg]
	off     int32 // 1: this session has no segment (TCP, no feature)
	retryAt int64 // monoNow before which near.map is not asked again
	hits    uint64
	falls   uint64
	last    int64 // monoNow of the last near.hits
	fds     []int // descriptors received and not yet taken (under c.mu)
}

// nearGet is key's value text from the segment: ok false when the
// daemon must answer; null true for a cached "not found".
func (c *conn) nearGet(ctx context.Context, key string) (v string, null bool, ok bool) {
	n := &c.near
	if atomic.LoadInt32(&n.off) != 0 {
		return "", false, false
	}
	s := n.seg.Load()
	if s == nil {
		if s = c.nearMap(ctx); s == nil {
			return "", false, false
		}
	}
	now := monoNow()
	v, res := s.get(key, now)
	switch res {
	case nearHit, nearNull:
		atomic.AddUint64(&n.hits, 1)
	case nearClosed:
		if n.seg.CompareAndSwap(s, nil) {
			s.retire()
		}
		fallthrough
	default:
		atomic.AddUint64(&n.falls, 1)
	}
	last := atomic.LoadInt64(&n.last)
	if atomic.LoadUint64(&n.hits)+atomic.LoadUint64(&n.falls) >= nearReportEvery ||
		now-last >= nearReportNs {
		if atomic.CompareAndSwapInt64(&n.last, last, now) {
			c.nearReport()
		}
	}
	switch res {
	case nearHit:
		return v, false, true
	case nearNull:
		return "", true, true
	}
	return "", false, false
}

// nearReport sends near.hits: what the segment served and what went to
// the socket since the last report. Nobody waits for its answer.
func (c *conn) nearReport() {
	h := atomic.SwapUint64(&c.near.hits, 0)
	f := atomic.SwapUint64(&c.near.falls, 0)
	if h == 0 && f == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	if _, _, err := c.send(ctx, map[string]any{"op": "near.hits",
		"hits": h, "fallbacks": f}, nil); err != nil {
		// Not counted this time; the daemon's metric is a sum.
		return
	}
}

// nearMap asks for this session's segment (near.map); nil when there is
// none, then the daemon answers every read. While one goroutine asks, the
// others read through the socket rather than wait for it.
func (c *conn) nearMap(ctx context.Context) *nearSeg {
	n := &c.near
	if !n.mu.TryLock() {
		return nil
	}
	defer n.mu.Unlock()
	if s := n.seg.Load(); s != nil {
		return s
	}
	if monoNow() < atomic.LoadInt64(&n.retryAt) {
		return nil
	}
	atomic.StoreInt64(&n.retryAt, monoNow()+int64(nearRetry))
	if _, unix := c.nc.(*net.UnixConn); !unix || !c.features["shared_near"] {
		atomic.StoreInt32(&n.off, 1)
		return nil
	}
	// The descriptor comes with the reply's first byte, so the reader
	// has it queued when the reply is routed; the segment is mapped
	// there, whenever the reply comes.
	_, _ = c.call(ctx, map[string]any{"op": "near.map"},
		func(c *conn, r *reply) {
			fds := c.near.fds
			c.near.fds = nil
			defer closeFds(fds)
			if !r.OK || r.Layout != 1 || len(fds) == 0 {
				return
			}
			if s, err := mapNear(fds[0]); err == nil {
				c.near.seg.Store(s)
				atomic.StoreInt64(&c.near.last, monoNow())
			}
		})
	return n.seg.Load()
}

func closeFds(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// fdReader reads a Unix connection with room for descriptors (a plain
// read would lose them), which it queues for near.map's reply.
type fdReader struct {
	uc  *net.UnixConn
	c   *conn
	oob []byte
}

func (f *fdReader) Read(p []byte) (int, error) {
	n, oobn, _, _, err := f.uc.ReadMsgUnix(p, f.oob)
	if n < 0 {
		n = 0 // a failed read may say -1; io.Reader wants 0
	}
	if oobn > 0 {
		var fds []int
		if msgs, perr := syscall.ParseSocketControlMessage(f.oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if got, rerr := syscall.ParseUnixRights(&m); rerr == nil {
					fds = append(fds, got...)
				}
			}
		}
		f.c.mu.Lock()
		f.c.near.fds = append(f.c.near.fds, fds...)
		f.c.mu.Unlock()
	}
	return n, err
}
