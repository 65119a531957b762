package bucket

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// offsetClock is the system clock shifted by d: a process whose clock is
// off.
type offsetClock time.Duration

func (c offsetClock) Now() time.Time { return throttle.SystemClock.Now().Add(time.Duration(c)) }

// TestServerClockHoldsAcrossSkewedClients runs two Redis buckets on one
// key whose local clocks are 10 s apart, both WithServerClock (the scripts
// never call TIME): in every interval [t, t+d) no more than burst + Count
// × d/Per admissions happen for certain (the whole request-reply interval
// inside it).
func TestServerClockHoldsAcrossSkewedClients(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	prefix := freshPrefix()
	r := throttle.Rate{Count: 10, Per: 300 * time.Millisecond}
	const burst = 10
	var ls []*Redis
	for _, skew := range []time.Duration{0, -10 * time.Second} {
		l, err := NewRedis(c, r, burst, WithPrefix(prefix), WithTimeout(time.Second), withServerClockOver(offsetClock(skew)))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	type adm struct{ sent, replied time.Time }
	var mu sync.Mutex
	var as []adm
	var failed error
	var wg sync.WaitGroup
	stop := time.Now().Add(1200 * time.Millisecond)
	for _, l := range ls {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					sent := time.Now()
					d, err := l.Allow(context.Background(), "k")
					replied := time.Now()
					mu.Lock()
					if err != nil {
						failed = errors.Join(failed, err)
					} else if d.Allowed {
						as = append(as, adm{sent, replied})
					}
					mu.Unlock()
					if err != nil {
						return
					}
					if !d.Allowed {
						time.Sleep(min(d.RetryAfter, 5*time.Millisecond))
					}
				}
			}()
		}
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	sort.Slice(as, func(i, j int) bool { return as[i].sent.Before(as[j].sent) })
	// Each limiter's estimate of the server's clock is off by up to its
	// Bound, so the refill the two see between two admissions can be that
	// much longer than the true time between them.
	slack := ls[0].server.Bound() + ls[1].server.Bound()
	if slack > r.Per/2 {
		t.Fatalf("error bounds %v and %v: too coarse to judge a refill of %v", ls[0].server.Bound(), ls[1].server.Bound(), r.Per)
	}
	worst := 0.0
	for i := range as {
		for j := i; j < len(as); j++ {
			// Admissions i..j certainly lie in [sent_i, replied of the
			// last of them]; count those whose intervals do.
			end := as[j].replied
			n := 0
			for k := i; k <= j; k++ {
				if !as[k].replied.After(end) {
					n++
				}
			}
			bound := burst + float64(r.Count)*float64(end.Sub(as[i].sent)+slack)/float64(r.Per)
			worst = max(worst, float64(n)-bound)
			if float64(n) > bound+1e-9 {
				t.Fatalf("%d admissions certainly within %v, bound %.2f", n, end.Sub(as[i].sent), bound)
			}
		}
	}
	off := ls[1].server.Offset() - ls[0].server.Offset()
	t.Logf("%d admissions in 1.2s (at most %.0f); worst count minus bound %.2f; offsets differ by %v, error bounds %v in all", len(as), burst+float64(r.Count)*1.2/0.3, worst, off, slack)
	if d := (off - 10*time.Second).Abs(); d > slack+time.Millisecond {
		t.Fatalf("the estimates differ by %v, want 10s within both error bounds (%v)", off, slack)
	}
	if len(as) < 2*burst {
		t.Fatalf("only %d admissions: the buckets starve", len(as))
	}
}
