package window

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// offsetClock is the system clock shifted by d: a process whose clock is
// off.
type offsetClock time.Duration

func (c offsetClock) Now() time.Time { return throttle.SystemClock.Now().Add(time.Duration(c)) }

// admission is the true interval (this test process's clock, shared by
// both limiters) within which an admission happened: from the request to
// the reply.
type admission struct{ sent, replied time.Time }

// certainMax returns the most admissions certainly within one window of
// length w: whose whole intervals lie in some [t, t+w).
func certainMax(as []admission, w time.Duration) int {
	sort.Slice(as, func(i, j int) bool { return as[i].sent.Before(as[j].sent) })
	best := 0
	for i := range as {
		end := as[i].sent.Add(w)
		n := 0
		for j := i; j < len(as) && as[j].sent.Before(end); j++ {
			if as[j].replied.Before(end) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// hammer runs workers goroutines per limiter deciding on key for d and
// returns the admissions.
func hammer(t *testing.T, ls []*Redis, key string, workers int, d time.Duration) []admission {
	t.Helper()
	var mu sync.Mutex
	var as []admission
	var wg sync.WaitGroup
	var failed error
	stop := time.Now().Add(d)
	for _, l := range ls {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					sent := time.Now()
					dec, err := l.Allow(context.Background(), key)
					replied := time.Now()
					mu.Lock()
					if err != nil && failed == nil {
						failed = err
					}
					if err == nil && dec.Allowed {
						as = append(as, admission{sent, replied})
					}
					mu.Unlock()
					if err != nil {
						return
					}
					if !dec.Allowed {
						time.Sleep(min(dec.RetryAfter, 5*time.Millisecond))
					}
				}
			}()
		}
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	return as
}

// TestServerClockHoldsAcrossSkewedClients runs two limiters on one key
// whose local clocks are 10 s apart, both WithServerClock (so the script
// never calls TIME): they decide on the server's clock as estimated, and
// no window of Per holds more than Count admissions for certain.
func TestServerClockHoldsAcrossSkewedClients(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	prefix := freshPrefix()
	for _, tt := range []struct {
		name string
		rate throttle.Rate
	}{
		{"20 per 300ms", throttle.Rate{Count: 20, Per: 300 * time.Millisecond}},
		{"5 per 200ms", throttle.Rate{Count: 5, Per: 200 * time.Millisecond}},
		{"50 per 500ms", throttle.Rate{Count: 50, Per: 500 * time.Millisecond}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var ls []*Redis
			for _, skew := range []time.Duration{0, -10 * time.Second} {
				l, err := NewRedis(c, tt.rate, WithPrefix(prefix), WithTimeout(time.Second), withServerClockOver(offsetClock(skew)))
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, l)
			}
			as := hammer(t, ls, tt.name, 3, 4*tt.rate.Per)
			if ls[0].server == nil {
				t.Logf("without the estimate: %d admissions in %v; most certainly in one window: %d (limit %d)", len(as), 4*tt.rate.Per, certainMax(as, tt.rate.Per), tt.rate.Count)
				return
			}
			// Each limiter's estimate of the server's clock is off by up to
			// its Bound (half a round trip, longer on a loaded machine), so
			// two admissions' recorded instants can be that much closer than
			// the true ones: a window shorter by both bounds, in true time,
			// lies within one of Per on the server's clock. Skewed clocks
			// used as they are would put up to twice Count in it.
			slack := ls[0].server.Bound() + ls[1].server.Bound()
			if slack > tt.rate.Per/2 {
				t.Fatalf("error bounds %v and %v: too coarse to judge a window of %v", ls[0].server.Bound(), ls[1].server.Bound(), tt.rate.Per)
			}
			got := certainMax(as, tt.rate.Per-slack)
			off := ls[1].server.Offset() - ls[0].server.Offset()
			t.Logf("%d admissions in %v; most certainly in one window of %v: %d (limit %d); estimated offsets differ by %v (10s expected), error bounds %v and %v",
				len(as), 4*tt.rate.Per, tt.rate.Per-slack, got, tt.rate.Count, off, ls[0].server.Bound(), ls[1].server.Bound())
			if got > tt.rate.Count {
				t.Fatalf("%d admissions certainly within one window of %v (%v less both error bounds), limit %d", got, tt.rate.Per-slack, tt.rate.Per, tt.rate.Count)
			}
			if len(as) < 2*tt.rate.Count {
				t.Fatalf("only %d admissions in 4 windows: the limiters starve", len(as))
			}
			if d := (off - 10*time.Second).Abs(); d > slack+time.Millisecond {
				t.Fatalf("the estimates differ by %v, want 10s within both error bounds (%v)", off, slack)
			}
		})
	}
}

// TestServerClockOptions checks WithServerClock's refusals.
func TestServerClockOptions(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	_, err := NewRedis(c, throttle.PerSecond(1), WithServerClock(), WithClock(throttle.SystemClock))
	var oe *throttle.OptionError
	if !errors.As(err, &oe) || oe.Field != "WithServerClock" {
		t.Fatalf("WithServerClock with WithClock = %v, want an OptionError", err)
	}
	l, err := NewMemory(throttle.PerSecond(1), WithServerClock())
	if err != nil || l == nil {
		t.Fatalf("NewMemory ignores WithServerClock: %v", err)
	}
}

// TestNoTimeInScripts runs a window on a Redis whose TIME command is
// renamed away, so scripts cannot call it: the default window fails every
// decision with a hint naming WithServerClock, which the Gate logs once at
// level Error.
func TestNoTimeInScripts(t *testing.T) {
	srv := redistest.StartArgs(t, "--rename-command", "TIME", "")
	l, err := NewRedis(srv.Client(t), throttle.PerSecond(10), WithPrefix(freshPrefix()), WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Allow(context.Background(), "k")
	var he *redisopt.HintError
	if !errors.As(err, &he) || !strings.Contains(err.Error(), "window.WithServerClock()") {
		t.Fatalf("Allow on a Redis without TIME = %v, want a hint naming window.WithServerClock()", err)
	}
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	g, err := throttle.NewGate(l, throttle.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		d, err := g.Admit(context.Background(), "k", 1)
		if err != nil || d.Source != throttle.SourceDegraded || d.Err == nil {
			t.Fatalf("Admit = %+v, %v; want a degraded decision with Err", d, err)
		}
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "level=ERROR"); n != 1 || !strings.Contains(out, "hint=") {
		t.Fatalf("want one Error line with a hint, got %d:\n%s", n, out)
	}
	t.Logf("%s", out[:strings.Index(out, "\n")])
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
