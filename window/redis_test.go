package window

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func newTestRedis(t *testing.T, c redis.Scripter, r throttle.Rate, opts ...Option) *Redis {
	t.Helper()
	l, err := NewRedis(c, r, append([]Option{WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// patient returns l's twin on client with the tests' generous timeout: the
// same keys and scripts. A test whose limiter has a short timeout warms
// with it (connection open, script loaded), which a loaded machine may not
// do within the short one.
func patient(t *testing.T, client redis.Scripter, l *Redis) *Redis {
	t.Helper()
	return newTestRedis(t, client, l.rate, WithPrefix(l.prefix))
}

// newClockedRedis returns newTestRedis(t, c, r, opts...) on a fake clock
// at T0, and the clock.
func newClockedRedis(t *testing.T, c redis.Scripter, r throttle.Rate, opts ...Option) (*Redis, *throttletest.Clock) {
	t.Helper()
	clock := throttletest.NewClock(throttletest.T0)
	return newTestRedis(t, c, r, append(opts, WithClock(clock))...), clock
}

// newTwins returns a Memory and a Redis of r with opts on one fake clock,
// at T0: the same limiter twice, for tests that compare their decisions.
func newTwins(t *testing.T, c redis.Scripter, r throttle.Rate, opts ...Option) (*Memory, *Redis, *throttletest.Clock) {
	t.Helper()
	red, clock := newClockedRedis(t, c, r, opts...)
	mem, err := NewMemory(r, append(opts, WithClock(clock))...)
	if err != nil {
		t.Fatal(err)
	}
	return mem, red, clock
}

func TestNewRedisBadInput(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	tests := []struct {
		name   string
		client redis.Scripter
		rate   throttle.Rate
		opts   []Option
		field  string
	}{
		{"nil client", nil, throttle.PerSecond(1), nil, "client"},
		{"nil *redis.Client", (*redis.Client)(nil), throttle.PerSecond(1), nil, "client"},
		{"zero rate", client, throttle.Rate{}, nil, "Rate.Count"},
		{"zero Per", client, throttle.Rate{Count: 1}, nil, "Rate.Per"},
		{"negative Count", client, throttle.Rate{Count: -1, Per: time.Second}, nil, "Rate.Count"},
		{"brace in prefix", client, throttle.PerSecond(1), []Option{WithPrefix("a{b")}, "WithPrefix"},
		{"Count above 2^53", client, throttle.Rate{Count: 1<<53 + 1, Per: time.Second}, nil, "Rate.Count"},
		{"Client without ContextTimeoutEnabled", redistest.NoContextClient(t), throttle.PerSecond(1), nil, "client"},
		{"ClusterClient without ContextTimeoutEnabled", redistest.NoContextCluster(t), throttle.PerSecond(1), nil, "client"},
		{"Ring without ContextTimeoutEnabled", redistest.NoContextRing(t), throttle.PerSecond(1), nil, "client"},
		{"Read/WriteTimeout above WithTimeout", redistest.ShortTimeoutsClient(t), throttle.PerSecond(1), []Option{WithTimeout(10 * time.Millisecond)}, "client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewRedis(tt.client, tt.rate, tt.opts...)
			if l != nil || !errors.Is(err, throttle.ErrInvalidOption) {
				t.Fatalf("NewRedis = %v, %v; want nil and an error wrapping ErrInvalidOption", l, err)
			}
			var oe *throttle.OptionError
			if !errors.As(err, &oe) || oe.Field != tt.field {
				t.Fatalf("error %v does not name field %q", err, tt.field)
			}
		})
	}
	t.Run("Count of 2^53", func(t *testing.T) {
		if _, err := NewRedis(client, throttle.Rate{Count: 1 << 53, Per: time.Second}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Read/WriteTimeout within WithTimeout", func(t *testing.T) {
		if _, err := NewRedis(redistest.ShortTimeoutsClient(t), throttle.PerSecond(1), WithTimeout(20*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("nil options are ignored", func(t *testing.T) {
		l, err := NewRedis(client, throttle.PerSecond(1), nil, WithClock(nil))
		if err != nil || l.clock != nil || l.prefix != defaultPrefix {
			t.Fatalf("NewRedis with nil options = %+v, %v", l, err)
		}
	})
}

// TestRedisBadCostNoCall checks that a bad cost is refused before any
// Redis call: the client points at a closed port.
// TestRedisLargestCount: the largest Count decides exactly, since every
// value of the scripts' replies stays exact in a Lua number (a double).
func TestRedisLargestCount(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	l, err := NewRedis(client, throttle.Rate{Count: 1 << 53, Per: time.Second}, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := l.AllowN(ctx, "k", 1)
	if err != nil || !d.Allowed || d.Remaining != 1<<53-1 {
		t.Fatalf("AllowN = %+v, %v; want allowed, remaining 2^53-1", d, err)
	}
	d, err = l.AllowID(ctx, "k", 1, "id", time.Second)
	if err != nil || !d.Allowed || d.Remaining != 1<<53-2 {
		t.Fatalf("AllowID = %+v, %v; want allowed, remaining 2^53-2", d, err)
	}
	ds, ok, err := l.AllowJoint(ctx, []throttle.Limiter{l}, []string{"j"}, 1)
	if err != nil || !ok || !ds[0].Allowed || ds[0].Remaining != 1<<53-1 {
		t.Fatalf("AllowJoint = %+v, %v, %v; want allowed, remaining 2^53-1", ds, ok, err)
	}
}

func TestRedisBadCostNoCall(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewRedis(client, throttle.Rate{Count: MaxCost + 1, Per: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -3, MaxCost + 1, MaxCost + 2} {
		if _, err := l.AllowN(context.Background(), "k", n); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Fatalf("AllowN(n=%d) = %v, want ErrInvalidCost", n, err)
		}
	}
	// A store failure is wrapped and is not a usage error.
	_, err = l.Allow(context.Background(), "k")
	if err == nil || throttle.IsUsageError(err) || !strings.HasPrefix(err.Error(), "window: redis: ") {
		t.Fatalf("Allow against a closed port = %v, want a wrapped redis error", err)
	}
}

func TestRedisDecisionFields(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	l := newTestRedis(t, client, throttle.PerMinute(10))
	if l.Rate() != throttle.PerMinute(10) || l.Algorithm() != "sliding_window_log" {
		t.Fatalf("Rate, Algorithm = %v, %q", l.Rate(), l.Algorithm())
	}
	d, err := l.Allow(context.Background(), "fields")
	if err != nil {
		t.Fatal(err)
	}
	want := throttle.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Minute, Source: throttle.SourceRedis}
	if d != want {
		t.Fatalf("Allow = %+v, want %+v", d, want)
	}
}

func TestRedisNoScript(t *testing.T) {
	srv := redistest.Shared(t)
	client := srv.Client(t)
	ctx := context.Background()
	l := newTestRedis(t, client, throttle.PerSecond(5))
	for i := 0; i < 3; i++ {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := l.Allow(ctx, "noscript")
		if err != nil || !d.Allowed || d.Remaining != 4-i {
			t.Fatalf("Allow after SCRIPT FLUSH = %+v, %v", d, err)
		}
	}
	ok, err := client.ScriptExists(ctx, windowScript.Hash()).Result()
	if err != nil || !ok[0] {
		t.Fatalf("script not reloaded: %v, %v", ok, err)
	}
}

// TestRedisRejectionWritesNothing compares the key's DUMP and TTL around a
// rejection.
func TestRedisRejectionWritesNothing(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	for _, clocked := range []bool{false, true} {
		var opts []Option
		if clocked {
			opts = append(opts, WithClock(throttle.SystemClock))
		}
		l := newTestRedis(t, client, throttle.Rate{Count: 3, Per: time.Minute}, opts...)
		key := l.key("full")
		if d, err := l.AllowN(ctx, "full", 3); err != nil || !d.Allowed {
			t.Fatalf("AllowN(3) = %+v, %v", d, err)
		}
		before := unitsOf(ctx, client, key)
		ttlBefore := client.PTTL(ctx, key).Val()
		time.Sleep(5 * time.Millisecond)
		for _, n := range []int{1, 2, 3} {
			if d, err := l.AllowN(ctx, "full", n); err != nil || d.Allowed {
				t.Fatalf("AllowN(%d) on a full window = %+v, %v", n, d, err)
			}
		}
		if after := unitsOf(ctx, client, key); !slices.Equal(after, before) {
			t.Fatalf("clock %v: rejection changed the units from %v to %v", clocked, before, after)
		}
		if ttlAfter := client.PTTL(ctx, key).Val(); ttlAfter >= ttlBefore {
			t.Fatalf("clock %v: PTTL %v after rejections, %v before: a rejection renewed the expiry", clocked, ttlAfter, ttlBefore)
		}
		if n := len(unitsOf(ctx, client, key)); n != 3 {
			t.Fatalf("%d units, want 3", n)
		}
	}
}

// TestRedisRejectionOnlyDropsStaleMembers: a rejection adds nothing and
// keeps the expiry; it may drop members that have left the window, as the
// algorithm does before it counts.
func TestRedisRejectionOnlyDropsStaleMembers(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	l, clock := newClockedRedis(t, client, throttle.Rate{Count: 2, Per: time.Second})
	key := l.key("stale")
	step := func(at time.Duration, n int, allowed bool) {
		t.Helper()
		clock.Set(throttletest.T0.Add(at))
		d, err := l.AllowN(ctx, "stale", n)
		if err != nil || d.Allowed != allowed {
			t.Fatalf("at %v, n %d: %+v, %v; want Allowed %v", at, n, d, err, allowed)
		}
	}
	step(0, 1, true)
	step(900*time.Millisecond, 1, true)
	live := unitsOf(ctx, client, key)[1]
	ttl := client.PTTL(ctx, key).Val()
	step(1050*time.Millisecond, 2, false) // the member at 0 is stale
	if got := unitsOf(ctx, client, key); len(got) != 1 || got[0] != live {
		t.Fatalf("after the rejection the set holds %v, want only the live member %v", got, live)
	}
	if after := client.PTTL(ctx, key).Val(); after > ttl {
		t.Fatalf("PTTL %v after the rejection, %v before: a rejection renewed the expiry", after, ttl)
	}
	step(1050*time.Millisecond, 1, true)
	if n := len(unitsOf(ctx, client, key)); n != 2 {
		t.Fatalf("%d units after the admission, want 2", n)
	}
}

func TestRedisTTL(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	for _, opts := range [][]Option{nil, {WithClock(throttle.SystemClock)}} {
		r := throttle.Rate{Count: 2, Per: 5*time.Second + 500*time.Microsecond}
		l := newTestRedis(t, client, r, opts...)
		if _, err := l.Allow(ctx, "ttl"); err != nil {
			t.Fatal(err)
		}
		// With the server's clock, up to half a window more (the expiry
		// marker's rounding: see plain.lua).
		ttl := client.PTTL(ctx, l.key("ttl")).Val()
		least, most := throttle.CeilMillisecond(r.Per)-time.Second, throttle.CeilMillisecond(r.Per)
		if opts == nil {
			most += throttle.CeilMillisecond(r.Per/2) + time.Millisecond
		}
		if ttl <= least || ttl > most {
			t.Fatalf("PTTL = %v, want in (%v, %v]", ttl, least, most)
		}
	}
	// A short window's key expires on its own.
	l := newTestRedis(t, client, throttle.Rate{Count: 1, Per: 20 * time.Millisecond})
	if _, err := l.Allow(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := client.Exists(ctx, l.key("gone")).Val(); n != 0 {
		t.Fatal("key of a 20ms window still exists after 100ms")
	}
}

func TestRedisKeyEscaping(t *testing.T) {
	l := &Redis{prefix: defaultPrefix}
	seen := map[string]string{}
	for _, k := range throttletest.OddKeys() {
		rk := l.key(k)
		if prev, dup := seen[rk]; dup {
			t.Fatalf("keys %.40q and %.40q map to the same Redis key %.60q", prev, k, rk)
		}
		seen[rk] = k
		tag, ok := strings.CutPrefix(rk, defaultPrefix+"{")
		if !ok || !strings.HasSuffix(tag, "}") {
			t.Fatalf("key %.40q -> %.60q: no hash tag", k, rk)
		}
		tag = strings.TrimSuffix(tag, "}")
		if tag == "" || strings.ContainsAny(tag, "{}") {
			t.Fatalf("key %.40q -> tag %.60q: empty or contains a brace", k, tag)
		}
		if len(rk) > len(defaultPrefix)+3*rediskey.MaxRaw+2 {
			t.Fatalf("key of %d bytes -> Redis key of %d bytes", len(k), len(rk))
		}
	}
	for k, want := range map[string]string{
		"":      "throttle:window:{%E}",
		"a":     "throttle:window:{a}",
		"a}b{c": "throttle:window:{a%7Db%7Bc}",
		"%":     "throttle:window:{%25}",
		":":     "throttle:window:{:}",
	} {
		if got := l.key(k); got != want {
			t.Errorf("key(%q) = %q, want %q", k, got, want)
		}
	}
}

// TestRedisMembersOfEarlierVersions: during a rolling upgrade a key holds
// the members of processes of the earlier version ("<16 hex>:<counter>",
// written here as their script wrote them) beside this version's: both
// count alike, so the two versions together admit at most the limit, and
// a reservation made among them is kept and claimed.
func TestRedisMembersOfEarlierVersions(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	r := throttle.Rate{Count: 10, Per: time.Minute}
	l := newTestRedis(t, client, r)
	now, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 { // an earlier process's admissions
		client.ZAdd(ctx, l.key("k"), redis.Z{Score: float64(now.UnixMicro() - int64(i)), Member: fmt.Sprintf("88657fa7829418a3:%s", strconv.FormatInt(int64(i+1), 36))})
	}
	admitted := 0
	for range 10 {
		if d, err := l.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			admitted++
		}
	}
	if admitted != 6 {
		t.Errorf("%d admitted beside 4 units of an earlier version at a limit of 10, want 6", admitted)
	}
	d, err := l.AllowID(ctx, "k", 1, "job-1", time.Hour)
	if err != nil || d.Allowed || !d.Reserved {
		t.Fatalf("AllowID in a full window: %+v, %v; want a reservation", d, err)
	}
	if p, err := l.Peek(ctx, "k", 1); err != nil || p.Remaining != 0 {
		t.Errorf("Peek: %+v, %v; want 0 remaining (the reservation counts)", p, err)
	}
}

func TestRedisMembersUnique(t *testing.T) {
	var a, b memberSource
	if err := a.init(); err != nil {
		t.Fatal(err)
	}
	if err := b.init(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		for _, m := range []string{a.next(), b.next()} {
			if seen[m] {
				t.Fatalf("member %q made twice", m)
			}
			seen[m] = true
			// 8 bytes, apart from AllowID's "A"/"R" units and from the
			// hex members of earlier versions.
			if len(m) != memberLen || m[0] < 0x80 {
				t.Fatalf("member %q: want %d bytes, the first at least 0x80", m, memberLen)
			}
		}
	}
	// n > 1 stores distinct members too.
	client := redistest.Shared(t).Client(t)
	l := newTestRedis(t, client, throttle.PerSecond(1200))
	if d, err := l.AllowN(context.Background(), "many", 1100); err != nil || !d.Allowed || d.Remaining != 100 {
		t.Fatalf("AllowN(1100) = %+v, %v", d, err)
	}
	if n := len(unitsOf(context.Background(), client, l.key("many"))); n != 1100 {
		t.Fatalf("%d units after AllowN(1100)", n)
	}
}

// TestRedisConcurrent runs two clients x 8 goroutines for 3 s at 100/1s on
// one key with the Redis server's TIME, and checks from the outside that no
// window of 1 s held more than 100 admissions.
func TestRedisConcurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("3s load test")
	}
	srv := redistest.Shared(t)
	r := throttle.PerSecond(100)
	prefix := freshPrefix()
	ctx := context.Background()
	var (
		mu     sync.Mutex
		adm    []throttletest.TimedAdmission
		errs   []error
		wg     sync.WaitGroup
		stopAt = time.Now().Add(3 * time.Second)
	)
	for c := 0; c < 2; c++ {
		l, err := NewRedis(srv.Client(t), r, WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stopAt) {
					sent := time.Now()
					d, err := l.Allow(ctx, "shared")
					returned := time.Now()
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else if d.Allowed {
						adm = append(adm, throttletest.TimedAdmission{Sent: sent, Returned: returned})
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	// Soundness: the script's instant for each admission lies in [Sent,
	// Returned] (Redis runs on this machine, its TIME advancing with our
	// clock). The script guarantees that admission i+100 is at least 1 s
	// after admission i, in whole microseconds of TIME. A violation is
	// therefore proven only by 101 admissions whose intervals fit in a span
	// shorter than 1 s minus 1 ms of slack for the microsecond truncation
	// and clock reading; CheckTimedAdmissions looks for exactly that.
	throttletest.CheckTimedAdmissions(t, adm, r, time.Millisecond)
	// About 300 are possible (100 at 0 s, 1 s and 2 s); fewer than 250
	// means the limiter stalls or over-rejects.
	if len(adm) < 250 {
		t.Fatalf("%d admissions in 3s at %v, want >= 250", len(adm), r)
	}
	t.Logf("%d admissions in 3s", len(adm))
}

// TestRedisTimeout pauses a private server: with the default WithTimeout of
// 50 ms (and a client with ContextTimeoutEnabled) a decision gives up in
// about that time, not the client's 3 s ReadTimeout.
func TestRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	l, err := NewRedis(client, throttle.PerSecond(10), WithPrefix(freshPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := patient(t, client, l).Allow(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	start := time.Now()
	_, err = l.Allow(context.Background(), "k")
	took := time.Since(start)
	if err == nil || throttle.IsUsageError(err) {
		t.Fatalf("Allow against a paused Redis = %v, want a timeout error", err)
	}
	// 50 ms plus generous room for a loaded machine, far below 5 s.
	if took > time.Second {
		t.Fatalf("Allow against a paused Redis took %v with a 50ms timeout", took)
	}
}

// TestRedisStoreFailure checks that a stopped or hung Redis is an error
// (bounded by ctx) and that the limiter recovers after a restart, whose
// empty script cache it reloads: a key it had admitted on is seen lost and
// recovers for a window, a new key is decided as new.
func TestRedisStoreFailure(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	l := newTestRedis(t, client, throttle.Rate{Count: 10, Per: 30 * time.Second})
	key := "k"
	allow := func(timeout time.Duration) (throttle.Decision, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return l.Allow(ctx, key)
	}
	if d, err := allow(5 * time.Second); err != nil || !d.Allowed {
		t.Fatalf("Allow = %+v, %v", d, err)
	}

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := allow(100 * time.Millisecond)
	// go-redis reports the deadline as a socket timeout.
	if err == nil || throttle.IsUsageError(err) || !strings.HasPrefix(err.Error(), "window: redis: ") {
		t.Fatalf("Allow against a paused Redis = %v, want a wrapped timeout", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Allow against a paused Redis took %v despite a 100ms deadline", took)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	if _, err := allow(time.Second); err == nil || !strings.HasPrefix(err.Error(), "window: redis: ") {
		t.Fatalf("Allow against a stopped Redis = %v, want a wrapped error", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The restarted server is empty: no window, no cached script.
	var d throttle.Decision
	for i := 0; i < 50; i++ { // the pool may still hold dead connections
		if d, err = allow(5 * time.Second); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || d.Allowed || d.RetryAfter < 29*time.Second {
		t.Fatalf("Allow after Restart = %+v, %v; want a rejection for about the 30 s window: the set was lost", d, err)
	}
	key = "new"
	if d, err = allow(5 * time.Second); err != nil || !d.Allowed || d.Remaining != 9 {
		t.Fatalf("Allow of a new key after Restart = %+v, %v; want admitted with Remaining 9", d, err)
	}
}

// TestRedisReservationTTL: a key with reservations lives until its
// furthest reservation has left its window, plus the grace a late claim
// may still use (10 s for AllowID), and no longer: an admission made
// after a reservation does not shorten it, and once everything has passed
// the key is gone.
func TestRedisReservationTTL(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	r := throttle.Rate{Count: 1, Per: time.Second}
	l := newTestRedis(t, client, r)
	for _, id := range []string{"a", "b", "c"} { // a admitted; b at 1 s; c at 2 s
		if _, err := l.AllowID(ctx, "ttl", 1, id, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Furthest unit at 2 s: 2 s + 1 s window + 10 s grace.
	want := 13 * time.Second
	ttl := client.PTTL(ctx, l.key("ttl")).Val()
	if ttl <= want-time.Second || ttl > want+time.Millisecond {
		t.Fatalf("PTTL = %v, want about %v", ttl, want)
	}
	if _, err := l.AllowN(ctx, "ttl", 1); err != nil { // rejected: writes nothing
		t.Fatal(err)
	}
	if after := client.PTTL(ctx, l.key("ttl")).Val(); after > ttl || after < ttl-time.Second {
		t.Fatalf("PTTL %v after a rejection, %v before", after, ttl)
	}
	// A short window with a short horizon is gone after its reservations
	// and their grace (the horizon, 30 ms).
	s := newTestRedis(t, client, throttle.Rate{Count: 1, Per: 20 * time.Millisecond})
	for _, id := range []string{"a", "b"} {
		if _, err := s.AllowID(ctx, "gone", 1, id, 30*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if ttl := client.PTTL(ctx, s.key("gone")).Val(); ttl > 10*time.Second+50*time.Millisecond {
		t.Fatalf("PTTL = %v, want at most 10.05 s (the reservation's 20 ms + window + the longest grace)", ttl)
	}
}

// TestRedisAllowIDKeepsOnlyItsWindow: admitted units of AllowID leave the
// set with their window, as AllowN's do, while no reservation was made in
// the last window and the late-claim grace (10 s); only then do they stay
// the grace longer, for a late claim of a reservation among them.
func TestRedisAllowIDKeepsOnlyItsWindow(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	l, clock := newClockedRedis(t, client, throttle.Rate{Count: 2, Per: time.Second})
	key := l.key("k")
	allowID := func(at time.Duration, id string, allowed, reserved bool) {
		t.Helper()
		clock.Set(throttletest.T0.Add(at))
		d, err := l.AllowID(ctx, "k", 1, id, time.Minute)
		if err != nil || d.Allowed != allowed || d.Reserved != reserved {
			t.Fatalf("at %v, id %s: %+v, %v; want Allowed %v, Reserved %v", at, id, d, err, allowed, reserved)
		}
	}
	card := func(want int64, why string) {
		t.Helper()
		if n := client.ZCard(ctx, key).Val(); n != want {
			t.Fatalf("ZCARD = %d, want %d: %s", n, want, why)
		}
	}
	allowID(0, "a", true, false)
	allowID(100*time.Millisecond, "b", true, false)
	allowID(1500*time.Millisecond, "c", true, false)
	card(1, "a and b left their window, and no reservation was ever made")
	allowID(1600*time.Millisecond, "d", true, false)
	allowID(1700*time.Millisecond, "e", false, true) // reserved for 2.5 s
	allowID(3600*time.Millisecond, "f", true, false)
	card(4, "c, d and e (unclaimed) left their window within the grace of e's reservation")
	allowID(3700*time.Millisecond, "e", true, false) // a late claim, on its reservation
	allowID(12*time.Second, "g", true, false)
	card(5, "c, d, f and e (claimed) are within the grace of e's reservation, at 2.5 s")
	allowID(13600*time.Millisecond, "h", true, false)
	card(1, "e's reservation is more than the window and 10 s old")
}

// TestLargeCostsAreWrittenInChunks admits and reserves costs above the
// 500 members one ZADD takes (units.lua's addUnits; 5,000 in one would
// overflow unpack), through the fast path, an AllowID admission and a
// reservation: every unit is stored.
func TestLargeCostsAreWrittenInChunks(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	l := newTestRedis(t, client, throttle.Rate{Count: 12000, Per: time.Minute})
	ctx := context.Background()
	steps := []struct {
		id                string
		allowed, reserved bool
	}{{"", true, false}, {"big", true, false}, {"bigger", false, true}}
	for _, s := range steps {
		var d throttle.Decision
		var err error
		if s.id == "" {
			d, err = l.AllowN(ctx, "k", 5000)
		} else {
			d, err = l.AllowID(ctx, "k", 5000, s.id, time.Hour)
		}
		if err != nil || d.Allowed != s.allowed || d.Reserved != s.reserved {
			t.Fatalf("id %q: %+v, %v; want allowed %v, reserved %v", s.id, d, err, s.allowed, s.reserved)
		}
	}
	if n := client.ZCard(ctx, l.key("k")).Val(); n != 3*5000 {
		t.Fatalf("%d units stored, want %d", n, 3*5000)
	}
}

// TestRedisScheduleLostNeverOverLimit: the fast path of a lone AllowID
// takes a key without a schedule (KEYS[2]) to hold no reservation. With
// the schedule deleted behind its back (evicted, say) while reservations
// are in the set, decisions may waste a reserved unit or admit an id
// before its slot, but never admit over the limit: the fast path admits
// only while every unit in the set, reservations included, fits.
func TestRedisScheduleLostNeverOverLimit(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	r := throttle.Rate{Count: 3, Per: time.Second}
	l, clock := newClockedRedis(t, client, r)
	rng := rand.New(rand.NewPCG(3, 5))
	charged := map[string]time.Duration{} // id -> its last charged admission
	var adm []throttletest.Admitted
	due := map[string]time.Duration{} // rejected id -> when it comes back
	lost := 0
	at := time.Duration(0)
	for step := range 600 {
		at += time.Duration(rng.IntN(600)) * time.Millisecond // about the limit, so that windows fill up and drain
		clock.Set(throttletest.T0.Add(at))
		if rng.IntN(10) == 0 {
			lost += int(client.Del(ctx, l.key("k")+hintSuffix).Val())
		}
		// A rejected id comes back when its retry-after is up (claiming
		// its reservation), a new id arrives otherwise, and now and then
		// an admitted one is delivered again.
		id := fmt.Sprint("job-", step)
		for other, when := range due {
			if when <= at && (id == fmt.Sprint("job-", step) || when < due[id]) {
				id = other
			}
		}
		if _, back := due[id]; !back && step > 10 && rng.IntN(5) == 0 {
			id = fmt.Sprint("job-", step-1-rng.IntN(10))
		}
		d, err := l.AllowID(ctx, "k", 1, id, 3*time.Second)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if delete(due, id); !d.Allowed {
			due[id] = at + d.RetryAfter
		}
		// An id admitted within the last window is admitted again free;
		// any other admission is charged.
		if last, seen := charged[id]; d.Allowed && (!seen || at-last >= r.Per) {
			charged[id] = at
			adm = append(adm, throttletest.Admitted{At: at, N: 1})
		}
	}
	if lost < 20 {
		t.Fatalf("the schedule was deleted %d times, want 20 or more: the test does not exercise its loss", lost)
	}
	throttletest.CheckWindow(t, adm, r)
}

// unitsOf returns the units in key's sorted set, oldest first: every
// member but the expiry marker of plain.lua (scored below 0).
func unitsOf(ctx context.Context, client *redis.Client, key string) []redis.Z {
	return client.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: "0", Max: "+inf"}).Val()
}
