package throttletest

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

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

// Burst makes goroutines calls of l.AllowN(key, 1) at once, beside two
// CPU-bound goroutines (Spin), and returns how many were admitted. Any
// error fails t.
func Burst(t testing.TB, l throttle.Limiter, key string, goroutines int) int {
	t.Helper()
	stop := Spin(2)
	defer stop()
	ctx := context.Background()
	var admitted, failed atomic.Int64
	var firstErr atomic.Value
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := l.AllowN(ctx, key, 1)
			switch {
			case err != nil:
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			case d.Allowed:
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d calls failed, first: %v", failed.Load(), goroutines, firstErr.Load())
	}
	return int(admitted.Load())
}
