// Command leased-nearbench times, on one goroutine, a Cached hit served
// from the shared near cache segment against a GET round trip to Redis
// on a raw RESP connection, alternately (bench/near-py.py runs it):
//
//	leased-nearbench -socket S -redis HOST:PORT -key K -direct-key D
//
// It prints one line per side: name ops/s p50_us (medians of the rounds).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"time"

	"leased.dev/leased"
)

func rate(fn func(), d time.Duration) float64 {
	n := 0
	start := time.Now()
	for {
		for i := 0; i < 256; i++ {
			fn()
		}
		n += 256
		if el := time.Since(start); el >= d {
			return float64(n) / el.Seconds()
		}
	}
}

func p50(fn func(), count int) float64 {
	lat := make([]time.Duration, count)
	for i := range lat {
		t0 := time.Now()
		fn()
		lat[i] = time.Since(t0)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(lat[count/2].Nanoseconds()) / 1000
}

func median(x []float64) float64 {
	sort.Float64s(x)
	return x[len(x)/2]
}

func main() {
	sock := flag.String("socket", "", "leased's Unix socket")
	redis := flag.String("redis", "", "Redis host:port")
	key := flag.String("key", "", "a key the segment holds")
	direct := flag.String("direct-key", "", "a Redis key to GET")
	secs := flag.Float64("seconds", 2, "seconds per side per round")
	rounds := flag.Int("rounds", 5, "rounds")
	flag.Parse()
	ctx := context.Background()
	ld, err := leased.Dial(ctx, leased.Options{Address: *sock, PoolSize: 1,
		Serializer: leased.Strings})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer ld.Close()
	never := func(context.Context) (string, error) {
		return "", errors.New("the loader ran")
	}
	near := func() {
		if _, err := leased.Cached(ctx, ld, *key, never, nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	rc, err := net.Dial("tcp", *redis)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	br := bufio.NewReader(rc)
	cmd := []byte(fmt.Sprintf("*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(*direct), *direct))
	buf := make([]byte, 65536)
	get := func() {
		if _, err := rc.Write(cmd); err != nil {
			os.Exit(1)
		}
		if _, err := br.Read(buf); err != nil {
			os.Exit(1)
		}
	}
	near()
	get()
	d := time.Duration(*secs * float64(time.Second))
	var nOps, nP50, dOps, dP50 []float64
	for r := 0; r < *rounds; r++ {
		nOps = append(nOps, rate(near, d))
		nP50 = append(nP50, p50(near, 20000))
		dOps = append(dOps, rate(get, d))
		dP50 = append(dP50, p50(get, 20000))
	}
	fmt.Printf("near %.0f %.3f\n", median(nOps), median(nP50))
	fmt.Printf("direct %.0f %.3f\n", median(dOps), median(dP50))
}
