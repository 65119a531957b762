package redistest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Load is what Hammer saw of a limiter.
type Load struct {
	Calls, Admitted, Failed int64
	// Settled counts the admissions after the settle time Hammer was
	// given (past the first connections' handshakes, say).
	Settled int64
	Longest time.Duration // the longest AllowN
}

// Hammer calls l.AllowN(key, 1) from goroutines goroutines for d, each
// again at once after an admission, after min(RetryAfter, 100 ms) after
// a rejection and after 10 ms after an error (as a consumer's retry),
// and returns what the calls saw.
func Hammer(l throttle.Limiter, key string, goroutines int, d, settle time.Duration) Load {
	var calls, admitted, failed, settled, longest atomic.Int64
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for time.Now().Before(stop) {
				t0 := time.Now()
				dec, err := l.AllowN(context.Background(), key, 1)
				took := int64(time.Since(t0))
				for old := longest.Load(); took > old && !longest.CompareAndSwap(old, took); old = longest.Load() {
				}
				calls.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
					time.Sleep(10 * time.Millisecond)
				case dec.Allowed:
					admitted.Add(1)
					if time.Since(start) >= settle {
						settled.Add(1)
					}
				default:
					time.Sleep(min(dec.RetryAfter, 100*time.Millisecond))
				}
			}
		})
	}
	wg.Wait()
	return Load{Calls: calls.Load(), Admitted: admitted.Load(), Failed: failed.Load(), Settled: settled.Load(), Longest: time.Duration(longest.Load())}
}
