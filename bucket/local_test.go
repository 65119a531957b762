package bucket

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/queuethrottle/queuethrottle/internal/janitor"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name  string
		rate  throttle.Rate
		burst int
		opts  []Option
		field string
	}{
		{"zero count", throttle.Rate{Count: 0, Per: time.Second}, 1, nil, "Rate.Count"},
		{"negative count", throttle.Rate{Count: -1, Per: time.Second}, 1, nil, "Rate.Count"},
		{"zero per", throttle.Rate{Count: 1}, 1, nil, "Rate.Per"},
		{"negative per", throttle.Rate{Count: 1, Per: -time.Second}, 1, nil, "Rate.Per"},
		{"zero burst", throttle.PerSecond(1), 0, nil, "burst"},
		{"negative burst", throttle.PerSecond(1), -5, nil, "burst"},
		{"burst x per beyond 2^53 µs", throttle.PerHour(1), 1 << 32, nil, "burst"},
		{"prefix with {", throttle.PerSecond(1), 1, []Option{WithPrefix("a{")}, "WithPrefix"},
		{"prefix with }", throttle.PerSecond(1), 1, []Option{WithPrefix("}")}, "WithPrefix"},
		{"zero timeout", throttle.PerSecond(1), 1, []Option{WithTimeout(0)}, "WithTimeout"},
		{"zero instances", throttle.PerSecond(1), 1, []Option{WithLocalShare(0, 0.5)}, "WithLocalShare.instances"},
		{"zero safety", throttle.PerSecond(1), 1, []Option{WithLocalShare(2, 0)}, "WithLocalShare.safety"},
		{"safety above 1", throttle.PerSecond(1), 1, []Option{WithLocalShare(2, 1.5)}, "WithLocalShare.safety"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				var oe *throttle.OptionError
				if !errors.Is(err, throttle.ErrInvalidOption) || !errors.As(err, &oe) || oe.Field != tt.field {
					t.Fatalf("%s: error = %v, want an *throttle.OptionError for field %q", what, err, tt.field)
				}
			}
			_, err := NewLocal(tt.rate, tt.burst, tt.opts...)
			check("NewLocal", err)
			_, err = NewRedis(fakeScripter{}, tt.rate, tt.burst, tt.opts...)
			check("NewRedis", err)
		})
	}
	_, err := NewRedis(nil, throttle.PerSecond(1), 1)
	var oe *throttle.OptionError
	if !errors.As(err, &oe) || oe.Field != "client" {
		t.Fatalf("NewRedis(nil client) error = %v, want an *throttle.OptionError for field client", err)
	}
}

func TestOptionsDefaults(t *testing.T) {
	cfg, err := newConfig([]Option{nil, WithClock(nil), WithLocalShare(3, 0.8)})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.clock != nil || cfg.prefix != "throttle:bucket:" || cfg.timeout != 50*time.Millisecond {
		t.Fatalf("defaults: clock %v, prefix %q, timeout %v", cfg.clock, cfg.prefix, cfg.timeout)
	}
	if ls := cfg.localShare; !ls.set || ls.instances != 3 || ls.safety != 0.8 {
		t.Fatalf("localShare = %+v", ls)
	}
}

func TestLocalAccessors(t *testing.T) {
	l, err := NewLocal(throttle.PerSecond(5), 7)
	if err != nil {
		t.Fatal(err)
	}
	if l.Rate() != throttle.PerSecond(5) || l.Burst() != 7 || l.Algorithm() != "token_bucket" {
		t.Fatalf("Rate %v, Burst %d, Algorithm %q", l.Rate(), l.Burst(), l.Algorithm())
	}
	d, err := l.Allow(context.Background(), "k")
	if err != nil || !d.Allowed || d.Source != throttle.SourceLocal || d.Remaining != 6 {
		t.Fatalf("Allow = %+v, %v", d, err)
	}
}

// TestLocalZeroAllocs checks that deciding for a key the bucket holds
// allocates nothing, admitted or rejected, on the last key used or not.
func TestLocalZeroAllocs(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.PerSecond(1000), 10, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		if _, err := l.AllowN(ctx, k, 1); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		clock.Advance(100 * time.Microsecond)
		i++
		_, _ = l.AllowN(ctx, keys[i%len(keys)], 1+i%3) // admitted and rejected
		_, _ = l.AllowN(ctx, keys[i%len(keys)], 1)     // the last key again
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decision on known keys, want 0", allocs/2)
	}
}

// TestLocalChurnKeepsLimits: a million distinct keys (a client minting
// keys) beside one key at 10/min, burst 10: the limited key is admitted
// exactly as without the churn (its 10, then nothing until it refills),
// the keys beyond the cap are refused with ErrTooManyKeys, not admitted,
// and the Local holds no more than DefaultMaxKeys.
func TestLocalChurnKeepsLimits(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.PerMinute(10), 10, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	buf := []byte("key-")
	limited, refused := 0, 0
	for i := range 1_000_000 {
		if i%20_000 == 0 { // 50 rounds over 2.5 s
			clock.Advance(50 * time.Millisecond)
			if d, err := l.AllowN(ctx, "limited", 1); err != nil {
				t.Fatal(err)
			} else if d.Allowed {
				limited++
			}
		}
		key := string(strconv.AppendInt(buf[:4], int64(i), 10))
		d, err := l.AllowN(ctx, key, 1)
		switch {
		case errors.Is(err, throttle.ErrTooManyKeys):
			refused++
		case err != nil || !d.Allowed:
			t.Fatalf("key %d: %+v, %v; want admitted (a new key starts full) or refused", i, d, err)
		}
	}
	if limited != 10 {
		t.Errorf("the limited key was admitted %d times in 2.5 s beside the churn, want its burst of 10", limited)
	}
	if n := l.Len(); n > DefaultMaxKeys {
		t.Errorf("Len = %d after a million keys, want <= %d", n, DefaultMaxKeys)
	}
	if refused < 1_000_000-DefaultMaxKeys || l.Refused() != int64(refused) {
		t.Errorf("%d refused (Refused %d), want at least the %d beyond the cap", refused, l.Refused(), 1_000_000-DefaultMaxKeys)
	}
}

// TestLocalJanitor: keys full again are forgotten by the janitor without
// any new decision, and a Local nobody holds is collected (the janitor
// does not keep it alive) with no goroutine left behind.
func TestLocalJanitor(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer janitor.SetPeriod(20 * time.Millisecond)()
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.PerSecond(10), 10, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 10_000 {
		if _, err := l.AllowN(ctx, "k"+strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(99 * time.Millisecond)
	time.Sleep(100 * time.Millisecond) // a few sweeps: all still refilling
	if n := l.Len(); n != 10_000 {
		t.Fatalf("Len = %d before the keys are full again, want 10000", n)
	}
	clock.Advance(time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for l.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("Len = %d once every key is full again, want 0 (the janitor forgets them)", n)
	}
	w := weak.Make(l)
	l = nil
	for range 100 {
		runtime.GC()
		if w.Value() == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w.Value() != nil {
		t.Fatal("a Local nobody holds is kept alive")
	}
	goleak.VerifyNone(t, ignore)
}

// TestLocalIdleEviction checks that keys are forgotten once full again:
// with a token per millisecond and burst 1, only the keys used in the last
// millisecond are not full, and the bucket holds little more than those.
func TestLocalIdleEviction(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.Rate{Count: 1, Per: time.Millisecond}, 1, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const keys = 200_000
	maxLen := 0
	for i := 0; i < keys; i++ {
		clock.Advance(10 * time.Microsecond) // 100 keys per millisecond
		if _, err := l.AllowN(ctx, "idle-"+strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			maxLen = max(maxLen, l.Len())
		}
	}
	// 100 keys are not full at any time; each shard also keeps up to a
	// few full ones until new keys arrive there.
	if maxLen > 1000 {
		t.Fatalf("held up to %d keys, want <= 1000 (about 100 are not full at any time)", maxLen)
	}
	// A forgotten key reads full, as it would have been.
	clock.Advance(time.Millisecond)
	if d, _ := l.AllowN(ctx, "idle-0", 1); !d.Allowed {
		t.Fatalf("a key idle for longer than time-to-full: %+v, want admitted", d)
	}
}

// TestLocalConcurrent has 8 goroutines race for one key at one instant:
// exactly burst are admitted.
func TestLocalConcurrent(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	const burst = 100
	l, err := NewLocal(throttle.PerSecond(10), burst, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				// Other keys too, so that shards and the LRU change under us.
				if _, err := l.AllowN(context.Background(), "other-"+strconv.Itoa(g*1000+i), 1); err != nil {
					t.Error(err)
					return
				}
				d, err := l.AllowN(context.Background(), "shared", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != burst {
		t.Fatalf("%d admitted at one instant, want burst %d", got, burst)
	}
}

// fakeScripter satisfies redis.Scripter for constructor tests; calling it
// panics. Tests of Redis paths use a real redis-server.
type fakeScripter struct{ redis.Scripter }

// TestLocalNeverForgetsALiveKey: with room for one key, a second key is
// refused while the first still refills (its state intact), and admitted
// once the first is full again and can be forgotten.
func TestLocalNeverForgetsALiveKey(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.PerSecond(1), 3, WithClock(clock), WithMaxKeys(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allow := func(key string, remaining int) {
		t.Helper()
		d, err := l.AllowN(ctx, key, 1)
		if err != nil || !d.Allowed || d.Remaining != remaining {
			t.Fatalf("key %q: %+v, %v; want admitted with Remaining %d", key, d, err, remaining)
		}
	}
	allow("a", 2)
	allow("a", 1)
	if _, err := l.AllowN(ctx, "b", 1); !errors.Is(err, throttle.ErrTooManyKeys) {
		t.Fatalf("a 2nd key while the only one refills: %v, want ErrTooManyKeys", err)
	}
	allow("a", 0) // not reset by the refused key
	clock.Advance(3 * time.Second)
	allow("b", 2) // a is full again: forgotten for b
	if n := l.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
}

// TestLocalConcurrentEviction races decisions on more keys than the cache
// holds (run it with -race): buckets are evicted while other goroutines
// hold them, and must be looked up again, never updated after eviction.
func TestLocalConcurrentEviction(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, err := NewLocal(throttle.Rate{Count: 1, Per: 100 * time.Microsecond}, 2, WithClock(clock), WithMaxKeys(8))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				if g == 0 && i%10 == 0 {
					clock.Advance(10 * time.Microsecond)
				}
				key := "k" + strconv.Itoa((g*7+i)%20)
				d, err := l.AllowN(context.Background(), key, 1+i%2)
				if errors.Is(err, throttle.ErrTooManyKeys) {
					continue // 20 keys, room for 8: refused while all refill
				}
				if err != nil {
					t.Error(err)
					return
				}
				if d.Remaining < 0 || d.Remaining > 2 {
					t.Errorf("key %s: %+v", key, d)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := l.Len(); n > 8 {
		t.Fatalf("Len = %d, want <= 8", n)
	}
}
