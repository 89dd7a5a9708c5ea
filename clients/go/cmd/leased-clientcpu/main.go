// Command leased-clientcpu measures the Go client's own CPU per
// uncontended lock+unlock pair, for bench/peers/clientcpu.sh: WORKERS
// goroutines share one Client of POOL connections, each locking and
// unlocking a key of its own, and one JSON line reports the process'
// CPU time per pair.
//
//	leased-clientcpu --sock=PATH [--workers=50] [--pairs=100000] [--pool=4] [--label=now]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"leased.dev/leased"
)

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	sock := flag.String("sock", os.Getenv("LEASED_SOCKET"), "leased's socket")
	workers := flag.Int("workers", 50, "goroutines")
	pairs := flag.Int("pairs", 100000, "lock+unlock pairs in all")
	pool := flag.Int("pool", 4, "connections of the client")
	label := flag.String("label", "now", "label of the row")
	flag.String("redis", "", "unused (the other clients' flag)")
	flag.Parse()
	ctx := context.Background()
	ld, err := leased.Dial(ctx, leased.Options{Address: *sock, PoolSize: *pool})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer ld.Close()
	if err := run(ctx, ld, *workers, min(*pairs, 1000), "warm"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c0, t0 := cpu(), time.Now()
	if err := run(ctx, ld, *workers, *pairs, "m"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c, t := cpu()-c0, time.Since(t0)
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"lang": "go", "label": *label, "workers": *workers, "pairs": *pairs,
		"conns":           fmt.Sprintf("pool %d", *pool),
		"cpu_us_per_pair": float64(c.Microseconds()) / float64(*pairs),
		"pairs_per_s":     float64(*pairs) / t.Seconds()})
}

// run makes n pairs over the workers, each on a key of its own.
func run(ctx context.Context, ld *leased.Client, workers, n int, tag string) error {
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		share := n / workers
		if w < n%workers {
			share++
		}
		key := fmt.Sprintf("clientcpu:go:%s:%d:%d", tag, os.Getpid(), w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < share; i++ {
				h, err := ld.Lock(ctx, key, nil)
				if err == nil {
					err = h.Unlock(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}
