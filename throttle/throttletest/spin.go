package throttletest

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Spin starts n CPU-bound goroutines, as other work on the machine would
// be, and returns the function that stops them and waits for them.
func Spin(n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				for i := range 100_000 {
					x += i
				}
				runtime.Gosched()
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

// BurstResult is what the calls of one RunBurst came to: Admitted calls
// got d.Allowed, Failed ones an error, and the rest were rejected (the
// three add up to the goroutines).
type BurstResult struct {
	Admitted, Failed int
	FirstErr         error         // the first failure, nil without one
	Slowest          time.Duration // the longest call, from its AllowN to its return
}

// RunBurst makes goroutines calls of l.AllowN(key, 1) at once, beside two
// CPU-bound goroutines (Spin), and returns what they came to.
func RunBurst(l throttle.Limiter, key string, goroutines int) BurstResult {
	stop := Spin(2)
	defer stop()
	ctx := context.Background()
	var mu sync.Mutex
	var res BurstResult
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			began := time.Now()
			d, err := l.AllowN(ctx, key, 1)
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			res.Slowest = max(res.Slowest, took)
			switch {
			case err != nil:
				res.Failed++
				if res.FirstErr == nil {
					res.FirstErr = err
				}
			case d.Allowed:
				res.Admitted++
			}
		}()
	}
	close(start)
	wg.Wait()
	return res
}

// Burst is RunBurst that fails t on any error, and returns how many calls
// were admitted.
func Burst(t testing.TB, l throttle.Limiter, key string, goroutines int) int {
	t.Helper()
	res := RunBurst(l, key, goroutines)
	if res.Failed > 0 {
		t.Fatalf("%d of %d calls failed, first: %v", res.Failed, goroutines, res.FirstErr)
	}
	t.Logf("%d calls, the slowest took %v", goroutines, res.Slowest)
	return res.Admitted
}
