package throttle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// allFamily builds the two parts of the All tables: a per-tenant sliding
// window and a global token bucket, on one clock.
type allFamily struct {
	name   string
	source throttle.Source // of every decision of the tables
	window func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter
	bucket func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter
}

func memoryWindow(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter {
	l, err := window.NewMemory(r, window.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func localBucket(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter {
	l, err := bucket.NewLocal(r, burst, bucket.WithClock(c))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// redisWindow and redisBucket use the client's clock when c is not nil,
// the Redis server's TIME otherwise.
func redisWindow(client redis.Scripter) func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter {
	return func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter {
		opts := []window.Option{window.WithPrefix(redistest.Prefix("all")), window.WithTimeout(redistest.CallTimeout)}
		if c != nil {
			opts = append(opts, window.WithClock(c))
		}
		l, err := window.NewRedis(client, r, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

func redisBucket(client redis.Scripter) func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter {
	return func(t *testing.T, r throttle.Rate, burst int, c throttle.Clock) throttle.Limiter {
		opts := []bucket.Option{bucket.WithPrefix(redistest.Prefix("all")), bucket.WithTimeout(redistest.CallTimeout)}
		if c != nil {
			opts = append(opts, bucket.WithClock(c))
		}
		l, err := bucket.NewRedis(client, r, burst, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

func allFamilies(t *testing.T) []allFamily {
	client := redistest.Shared(t).Client(t)
	return []allFamily{
		{name: "Memory+Local", source: throttle.SourceLocal, window: memoryWindow, bucket: localBucket},
		{name: "Redis+Redis", source: throttle.SourceRedis, window: redisWindow(client), bucket: redisBucket(client)},
		{name: "Redis+Local", source: throttle.SourceRedis, window: redisWindow(client), bucket: localBucket},
	}
}

func global(string) string { return "global" }

// allStep is one decision of the All table: at T0+at, AllowN(key, n).
type allStep struct {
	at         time.Duration
	key        string
	n          int // 0 means 1
	allowed    bool
	retryAfter time.Duration
	limit      int
	remaining  int
}

// TestAllTable runs the stacked-limit rules on a global bucket (5/s, burst
// 5, asked first) and a per-tenant window (3/s), at fixed instants, for
// every family: a rejection charges no part, RetryAfter is the largest of
// the rejecting parts', Limit and Remaining are the tightest part's.
func TestAllTable(t *testing.T) {
	const ms = time.Millisecond
	steps := []allStep{
		{at: 0, key: "a", allowed: true, limit: 3, remaining: 2},
		{at: 0, key: "a", allowed: true, limit: 3, remaining: 1},
		{at: 0, key: "a", allowed: true, limit: 3, remaining: 0},
		// The tenant rejects; the global token it took is given back...
		{at: 0, key: "a", retryAfter: time.Second, limit: 3, remaining: 0},
		// ... so b finds 2 of the 5 left, not 1.
		{at: 0, key: "b", allowed: true, limit: 5, remaining: 1},
		{at: 0, key: "b", allowed: true, limit: 5, remaining: 0},
		// The global bucket rejects (one token per 200 ms); b's window
		// has room.
		{at: 0, key: "b", retryAfter: 200 * ms, limit: 5, remaining: 0},
		// Both reject: the largest RetryAfter, of the tenant's window.
		{at: 0, key: "a", retryAfter: time.Second, limit: 3, remaining: 0},
		// Both at 0 Remaining: the first part is the tightest.
		{at: 200 * ms, key: "b", allowed: true, limit: 5, remaining: 0},
		{at: 200 * ms, key: "c", retryAfter: 200 * ms, limit: 5, remaining: 0},
		// a's units of T0 have left; the bucket holds 4.
		{at: time.Second, key: "a", allowed: true, limit: 3, remaining: 2},
		{at: time.Second, key: "c", n: 3, allowed: true, limit: 5, remaining: 0},
		{at: time.Second, key: "c", n: 2, retryAfter: time.Second, limit: 3, remaining: 0},
		// Costs above 1: the bucket holds 2 of 3, a's window 1 of 3 units.
		{at: 1400 * ms, key: "a", n: 3, retryAfter: 600 * ms, limit: 3, remaining: 2},
		{at: 1400 * ms, key: "a", n: 2, allowed: true, limit: 5, remaining: 0},
		// The bucket takes 2, a's window rejects: both go back...
		{at: 1800 * ms, key: "a", n: 2, retryAfter: 600 * ms, limit: 3, remaining: 0},
		// ... so b still finds them.
		{at: 1800 * ms, key: "b", n: 2, allowed: true, limit: 5, remaining: 0},
		{at: 1800 * ms, key: "b", retryAfter: 200 * ms, limit: 5, remaining: 0},
	}
	ctx := context.Background()
	for _, f := range allFamilies(t) {
		t.Run(f.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			lim, err := throttle.All(
				throttle.Part{Limiter: f.bucket(t, throttle.Rate{Count: 5, Per: time.Second}, 5, clock), Key: global},
				throttle.Part{Limiter: f.window(t, throttle.Rate{Count: 3, Per: time.Second}, clock)},
			)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range steps {
				clock.Set(throttletest.T0.Add(s.at))
				n := max(s.n, 1)
				d, err := lim.AllowN(ctx, s.key, n)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if d.Allowed != s.allowed || d.RetryAfter != s.retryAfter || d.Limit != s.limit || d.Remaining != s.remaining || d.Source != f.source || d.Reserved {
					t.Fatalf("step %d (at %v, %q, n %d): got %+v\nwant Allowed %v RetryAfter %v Limit %d Remaining %d Source %v",
						i, s.at, s.key, n, d, s.allowed, s.retryAfter, s.limit, s.remaining, f.source)
				}
			}
		})
	}
}

// peeker is the Peek of window.Memory, window.Redis and All's Limiter.
type peeker interface {
	Peek(ctx context.Context, key string, n int) (throttle.Decision, error)
}

func TestAllOptions(t *testing.T) {
	mem := memoryWindow(t, throttle.Rate{Count: 1, Per: time.Second}, throttletest.NewClock(throttletest.T0))
	plain := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{Allowed: true}, nil
	})
	tests := []struct {
		name  string
		parts []throttle.Part
		field string
	}{
		{name: "no parts", field: "parts"},
		{name: "nil limiter", parts: []throttle.Part{{Limiter: mem}, {}}, field: "parts[1].Limiter"},
		{name: "two that cannot give back", parts: []throttle.Part{{Limiter: plain}, {Limiter: mem}, {Limiter: plain}}, field: "parts[2].Limiter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := throttle.All(tt.parts...)
			var oe *throttle.OptionError
			if !errors.Is(err, throttle.ErrInvalidOption) || !errors.As(err, &oe) || oe.Field != tt.field {
				t.Fatalf("All: %v; want an OptionError for %s", err, tt.field)
			}
		})
	}
	if _, err := throttle.All(throttle.Part{Limiter: plain}, throttle.Part{Limiter: mem}); err != nil {
		t.Fatalf("one part that cannot give back: %v", err)
	}
}

// TestAllPlainPartAskedLast: a part that cannot give back is asked after
// every other, so that its admission never needs giving back; when it
// rejects, the others' charges go back.
func TestAllPlainPartAskedLast(t *testing.T) {
	ctx := context.Background()
	mem := memoryWindow(t, throttle.Rate{Count: 2, Per: time.Second}, throttletest.NewClock(throttletest.T0)).(peeker)
	var seen []int
	plain := throttle.LimiterFunc(func(ctx context.Context, key string, n int) (throttle.Decision, error) {
		d, err := mem.Peek(ctx, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, d.Remaining) // 0: the window has charged this request already
		return throttle.Decision{RetryAfter: 5 * time.Second, Limit: 7}, nil
	})
	lim, err := throttle.All(throttle.Part{Limiter: plain}, throttle.Part{Limiter: mem.(throttle.Limiter)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := lim.AllowN(ctx, "k", 1)
	if err != nil || d.Allowed || d.RetryAfter != 5*time.Second || d.Limit != 7 {
		t.Fatalf("AllowN = %+v, %v; want the plain part's rejection", d, err)
	}
	if len(seen) != 1 || seen[0] != 0 {
		t.Fatalf("the window's Remaining when the plain part was asked: %v; want [0] (asked after the window)", seen)
	}
	if p, err := mem.Peek(ctx, "k", 1); err != nil || p.Remaining != 1 {
		t.Fatalf("window after the rejection: %+v, %v; want Remaining 1 (its charge given back)", p, err)
	}
	if _, ok := lim.(peeker); ok {
		t.Fatal("All with a part that has no Peek has a Peek")
	}
}

// TestAllPartError: when a part fails, the others' charges go back and the
// error names the part and wraps its error.
func TestAllPartError(t *testing.T) {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	glob := localBucket(t, throttle.Rate{Count: 5, Per: time.Second}, 5, clock)
	tenant := memoryWindow(t, throttle.Rate{Count: 3, Per: time.Second}, clock)
	boom := errors.New("boom")
	failing := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, boom
	})
	lim, err := throttle.All(throttle.Part{Limiter: glob, Key: global}, throttle.Part{Limiter: tenant}, throttle.Part{Limiter: failing})
	if err != nil {
		t.Fatal(err)
	}
	// The store of the last part fails.
	if _, err := lim.AllowN(ctx, "a", 2); !errors.Is(err, boom) || !strings.Contains(err.Error(), "parts[2]") {
		t.Fatalf("AllowN: %v; want boom, naming parts[2]", err)
	}
	// A cost the tenant's window can never admit, after the bucket took it.
	lim, err = throttle.All(throttle.Part{Limiter: glob, Key: global}, throttle.Part{Limiter: tenant})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN(ctx, "a", 4); !errors.Is(err, throttle.ErrInvalidCost) || !strings.Contains(err.Error(), "parts[1]") {
		t.Fatalf("AllowN(4): %v; want ErrInvalidCost, naming parts[1]", err)
	}
	// Nothing stayed charged: the bucket holds 5, the window 3.
	if d, err := glob.AllowN(ctx, "global", 5); err != nil || !d.Allowed {
		t.Fatalf("global bucket after the failures: %+v, %v; want 5 tokens", d, err)
	}
	if d, err := tenant.AllowN(ctx, "a", 3); err != nil || !d.Allowed {
		t.Fatalf("tenant window after the failures: %+v, %v; want 3 units", d, err)
	}
}

// TestAllPeek: All's Limiter has Peek when every part has one; it says
// what AllowN says and charges nothing.
func TestAllPeek(t *testing.T) {
	ctx := context.Background()
	clock := throttletest.NewClock(throttletest.T0)
	lim, err := throttle.All(
		throttle.Part{Limiter: memoryWindow(t, throttle.Rate{Count: 4, Per: time.Second}, clock), Key: global},
		throttle.Part{Limiter: memoryWindow(t, throttle.Rate{Count: 2, Per: time.Second}, clock)},
	)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := lim.(peeker)
	if !ok {
		t.Fatal("All of windows has no Peek")
	}
	for i := range 4 {
		clock.Set(throttletest.T0.Add(time.Duration(i) * 100 * time.Millisecond))
		p1, err1 := p.Peek(ctx, "a", 1)
		p2, err2 := p.Peek(ctx, "a", 1)
		d, err := lim.AllowN(ctx, "a", 1)
		if err1 != nil || err2 != nil || err != nil || p1 != p2 || p1 != d {
			t.Fatalf("step %d: Peek %+v, %v; Peek %+v, %v; AllowN %+v, %v", i, p1, err1, p2, err2, d, err)
		}
	}
}
