package bucket

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// newTestRedis returns a Redis bucket on the shared server with a fresh
// prefix and redistest.CallTimeout (opts may override both), and the client it
// uses.
func newTestRedis(t *testing.T, r throttle.Rate, burst int, opts ...Option) (*Redis, *redis.Client) {
	t.Helper()
	client := redistest.Shared(t).Client(t)
	l, err := NewRedis(client, r, burst, append([]Option{WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l, client
}

// patient returns l's twin on client with the tests' generous timeout: the
// same keys and scripts. A test whose limiter has a short timeout warms
// with it (connection open, scripts loaded), which a loaded machine may
// not do within the short one.
func patient(t *testing.T, client redis.Scripter, l *Redis) *Redis {
	t.Helper()
	twin, err := NewRedis(client, l.rate, l.Burst(), WithPrefix(l.prefix), WithTimeout(redistest.CallTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return twin
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRedisAccessors(t *testing.T) {
	l, _ := newTestRedis(t, throttle.PerSecond(5), 7)
	if l.Rate() != throttle.PerSecond(5) || l.Burst() != 7 || l.Algorithm() != "token_bucket" {
		t.Fatalf("Rate %v, Burst %d, Algorithm %q", l.Rate(), l.Burst(), l.Algorithm())
	}
	d, err := l.Allow(ctxT(t), "k")
	if err != nil || !d.Allowed || d.Source != throttle.SourceRedis || d.Remaining != 6 {
		t.Fatalf("Allow = %+v, %v", d, err)
	}
}

// storedBucket reads the bucket stored at key (the byte 1, then credit,
// ts and per as little-endian doubles: see convert.lua); ok is false when
// the key is missing.
func storedBucket(t testing.TB, client *redis.Client, key string) (credit, ts, per int64, ok bool) {
	t.Helper()
	v, err := client.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, 0, 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 25 || v[0] != 1 {
		t.Fatalf("bucket at %q = %q: not 25 bytes starting with 1", key, v)
	}
	field := func(i int) int64 {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[1+8*i:])))
		if f != math.Trunc(f) {
			t.Fatalf("bucket at %q: field %d = %v, not an integer", key, i, f)
		}
		return int64(f)
	}
	return field(0), field(1), field(2), true
}

// packedBucket is a bucket's string as convert.lua stores it.
func packedBucket(credit, ts, per float64) string {
	b := []byte{1}
	for _, f := range []float64{credit, ts, per} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
	}
	return string(b)
}

// TestRedisKeyLayout checks the bucket under its escaped, hash-tagged key.
func TestRedisKeyLayout(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, client := newTestRedis(t, throttle.PerSecond(10), 3, WithClock(clock))
	ctx := ctxT(t)
	long := strings.Repeat("x", 10<<10)
	sum := sha256.Sum256([]byte(long))
	for id, tagged := range map[string]string{
		"":         "{%E}",
		"a{b}:c":   "{a%7Bb%7D:c}",
		"%7B":      "{%257B}",
		"\x00\xff": "{\x00\xff}",
		long:       "{%H" + hex.EncodeToString(sum[:]) + "}",
	} {
		if _, err := l.AllowN(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
		key := l.prefix + tagged
		if credit, ts, per, ok := storedBucket(t, client, key); !ok || credit != 2_000_000 || ts != throttletest.T0.UnixMicro() || per != 1_000_000 {
			t.Fatalf("key %.40q: bucket at %q = %d %d %d (stored %v); want 2000000 %d 1000000", id, key, credit, ts, per, ok, throttletest.T0.UnixMicro())
		}
		// The hash tag is everything between the first '{' and the next '}'.
		tag := key[strings.IndexByte(key, '{')+1:]
		tag = tag[:strings.IndexByte(tag, '}')]
		if tag == "" || !strings.HasSuffix(key, "{"+tag+"}") {
			t.Fatalf("key %q: hash tag %q does not span the identity", key, tag)
		}
	}
}

// TestRedisReadsEarlierLayouts: a bucket stored as a hash {tokens, ts,
// per} or as the text "credit ts per", as earlier versions wrote it,
// keeps its tokens (an upgrade loses nothing) and becomes the binary
// string at the next write; a key of another type, or a hash or string
// that is not a bucket, is an error, never a full bucket (nor
// overwritten).
func TestRedisReadsEarlierLayouts(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, client := newTestRedis(t, throttle.PerSecond(1), 5, WithClock(clock))
	ctx := ctxT(t)
	t0 := throttletest.T0.UnixMicro()
	key := rediskey.Key(l.prefix, "old")
	// 1 token of 5 left, counted in µs per token (per = 10^6).
	if err := client.HSet(ctx, key, "tokens", 1_000_000, "ts", t0, "per", 1_000_000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.giveBack(ctx, "old", l.lims.def, 1); err != nil { // 2 left, written as a string
		t.Fatal(err)
	}
	if credit, ts, per, ok := storedBucket(t, client, key); !ok || credit != 2_000_000 || ts != t0 || per != 1_000_000 {
		t.Fatalf("after giveBack on a hash: credit %d ts %d per %d (stored %v); want 2000000 %d 1000000", credit, ts, per, ok, t0)
	}
	for i, want := range []bool{true, true, false} {
		if d, err := l.AllowN(ctx, "old", 1); err != nil || d.Allowed != want {
			t.Fatalf("AllowN #%d = %+v, %v; want allowed %v (2 tokens were left)", i+1, d, err, want)
		}
	}

	// The text layout: 3 tokens of 5 left.
	textKey := rediskey.Key(l.prefix, "text-layout")
	if err := client.Set(ctx, textKey, fmt.Sprintf("3000000 %d 1000000", t0), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := l.AllowN(ctx, "text-layout", 1); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("AllowN on a text bucket with 3 tokens = %+v, %v; want admitted, 2 left", d, err)
	}
	if credit, ts, per, ok := storedBucket(t, client, textKey); !ok || credit != 2_000_000 || ts != t0 || per != 1_000_000 {
		t.Fatalf("after AllowN on a text bucket: credit %d ts %d per %d (stored %v); want 2000000 %d 1000000", credit, ts, per, ok, t0)
	}

	if err := client.HSet(ctx, rediskey.Key(l.prefix, "old2"), "tokens", 0, "ts", t0, "per", 1_000_000).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := l.AllowN(ctx, "old2", 1); err != nil || d.Allowed {
		t.Fatalf("AllowN on an empty hash bucket = %+v, %v; want rejected", d, err)
	}
	// Without per (the oldest layout): counted in the current period.
	if err := client.HSet(ctx, rediskey.Key(l.prefix, "old3"), "tokens", 1_000_000, "ts", t0).Err(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if d, err := l.AllowN(ctx, "old3", 1); err != nil || d.Allowed != want {
			t.Fatalf("AllowN #%d on a hash without per = %+v, %v; want allowed %v (1 token left)", i+1, d, err, want)
		}
	}

	if err := client.RPush(ctx, rediskey.Key(l.prefix, "list"), "x").Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{"list"}
	for i, fields := range [][]any{{"tokens", "abc", "ts", "x"}, {"name", "alice"}, {"tokens", 1, "ts", t0, "per", 0},
		{"tokens", 2_500_000.5, "ts", t0, "per", 1_000_000}, {"tokens", "inf", "ts", t0}, {"tokens", 1e300, "ts", t0},
		{"tokens", 1, "ts", -1}, {"tokens", 1, "ts", t0, "per", "inf"}, {"tokens", "nan", "ts", t0}} {
		k := fmt.Sprint("hash", i)
		if err := client.HSet(ctx, rediskey.Key(l.prefix, k), fields...).Err(); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	for i, v := range []string{"not a bucket", "1 2", "1.5 2 3", "1 2 0", "-99999999999999999 2 3",
		packedBucket(1, float64(t0), 0), packedBucket(math.NaN(), float64(t0), 1), packedBucket(1.5, float64(t0), 1),
		packedBucket(1, -1, 1), packedBucket(1, float64(t0), math.Inf(1)), packedBucket(1e17, float64(t0), 1),
		"\x02" + packedBucket(1, float64(t0), 1)[1:]} {
		k := fmt.Sprint("text", i)
		if err := client.Set(ctx, rediskey.Key(l.prefix, k), v, 0).Err(); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	for _, k := range keys {
		if d, err := l.AllowN(ctx, k, 1); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("AllowN on a %s key = %+v, %v; want a WRONGTYPE error", k, d, err)
		}
		if typ := client.Type(ctx, rediskey.Key(l.prefix, k)).Val(); typ == "string" && !strings.HasPrefix(k, "text") {
			t.Fatalf("key %s was overwritten with a string", k)
		}
	}
}

// TestRedisTTL checks that a key expires when its bucket would be full
// again, rounded up to the millisecond, never a fixed hour.
func TestRedisTTL(t *testing.T) {
	tests := []struct {
		name  string
		rate  throttle.Rate
		burst int
		n     int
		want  time.Duration
	}{
		{"3 of 5 at 10/1s", throttle.PerSecond(10), 5, 3, 300 * time.Millisecond},
		{"1 of 1 at 5/2s", throttle.Rate{Count: 5, Per: 2 * time.Second}, 1, 1, 400 * time.Millisecond},
		{"1 of 1 at 3/1s", throttle.PerSecond(3), 1, 1, 334 * time.Millisecond},
		{"2 of 2 at 1/1h", throttle.PerHour(1), 2, 2, 2 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mode := range []string{"client clock", "server TIME"} {
				var opts []Option
				if mode == "client clock" {
					opts = append(opts, WithClock(throttletest.NewClock(throttletest.T0)))
				}
				l, client := newTestRedis(t, tt.rate, tt.burst, opts...)
				ctx := ctxT(t)
				d, err := l.AllowN(ctx, "ttl", tt.n)
				if err != nil || !d.Allowed || d.ResetAfter != tt.want {
					t.Fatalf("%s: AllowN = %+v, %v; want admitted with ResetAfter %v", mode, d, err, tt.want)
				}
				ttl, err := client.PTTL(ctx, rediskey.Key(l.prefix, "ttl")).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl > tt.want || ttl < tt.want-50*time.Millisecond {
					t.Fatalf("%s: PTTL = %v, want %v (time to full) or a little less", mode, ttl, tt.want)
				}
			}
		})
	}
}

// TestRedisRejectionWritesNothing compares the bucket and its expiry before
// and after rejections.
func TestRedisRejectionWritesNothing(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	l, client := newTestRedis(t, throttle.PerSecond(1), 2, WithClock(clock))
	ctx := ctxT(t)
	key := rediskey.Key(l.prefix, "k")
	if d, err := l.AllowN(ctx, "k", 2); err != nil || !d.Allowed {
		t.Fatalf("AllowN(2) = %+v, %v", d, err)
	}
	before, err := client.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	ttlBefore := client.PTTL(ctx, key).Val()
	for _, at := range []time.Duration{0, 300 * time.Millisecond, 999 * time.Millisecond} {
		clock.Set(throttletest.T0.Add(at))
		if d, err := l.AllowN(ctx, "k", 1); err != nil || d.Allowed {
			t.Fatalf("at %v: AllowN = %+v, %v; want rejected", at, d, err)
		}
		if _, err := l.lease(ctx, "k", l.lims.def, 1, 2); err != nil {
			t.Fatal(err)
		}
	}
	after, err := client.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("rejections changed the bucket: before %q, after %q", before, after)
	}
	if ttl := client.PTTL(ctx, key).Val(); ttl > ttlBefore {
		t.Fatalf("rejections moved the expiry: PTTL %v before, %v after", ttlBefore, ttl)
	}
}

// TestRedisNoScript flushes the script cache: the next call reloads it.
func TestRedisNoScript(t *testing.T) {
	l, client := newTestRedis(t, throttle.PerSecond(10), 5)
	ctx := ctxT(t)
	if _, err := l.AllowN(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := l.AllowN(ctx, "k", 1)
	if err != nil || !d.Allowed {
		t.Fatalf("after SCRIPT FLUSH: %+v, %v", d, err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.giveBack(ctx, "k", l.lims.def, 1); err != nil {
		t.Fatalf("giveBack after SCRIPT FLUSH: %v", err)
	}
}

// TestRedisBadCostNoCall checks that bad costs fail before any Redis call:
// the client here points at nothing.
func TestRedisBadCostNoCall(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewRedis(client, throttle.PerSecond(1), 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -1, 4} {
		if _, err := l.AllowN(context.Background(), "k", n); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Fatalf("AllowN(n=%d) = %v, want ErrInvalidCost", n, err)
		}
	}
	for _, mm := range [][2]int{{0, 1}, {4, 4}, {2, 1}} {
		if _, err := l.lease(context.Background(), "k", l.lims.def, mm[0], mm[1]); !errors.Is(err, throttle.ErrInvalidCost) {
			t.Fatalf("lease(%d, %d) = %v, want ErrInvalidCost", mm[0], mm[1], err)
		}
	}
	if _, err := l.AllowN(context.Background(), "k", 1); err == nil || !strings.HasPrefix(err.Error(), "bucket: redis: ") {
		t.Fatalf("AllowN on an unreachable Redis: %v, want a \"bucket: redis: \" error", err)
	}
}

func TestRedisLease(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	// 10/1s: a token every 100ms.
	l, client := newTestRedis(t, throttle.PerSecond(10), 10, WithClock(clock))
	ctx := ctxT(t)
	lease := func(key string, min, max int, want grant) {
		t.Helper()
		got, err := l.lease(ctx, key, l.lims.def, min, max)
		if err != nil {
			t.Fatal(err)
		}
		if got.lim = nil; got != want {
			t.Fatalf("lease(%q, %d, %d) at %v = %+v, want %+v", key, min, max, clock.Now().Sub(throttletest.T0), got, want)
		}
	}
	ms := time.Millisecond
	lease("a", 3, 8, grant{granted: 8, remaining: 2, resetAfter: 800 * ms})
	lease("a", 3, 8, grant{granted: 0, remaining: 2, retryAfter: 100 * ms, resetAfter: 800 * ms})
	lease("a", 1, 8, grant{granted: 2, remaining: 0, resetAfter: time.Second})
	clock.Advance(50 * ms)
	lease("a", 1, 8, grant{granted: 0, remaining: 0.5, retryAfter: 50 * ms, resetAfter: 950 * ms})
	lease("a", 1, 100, grant{granted: 0, remaining: 0.5, retryAfter: 50 * ms, resetAfter: 950 * ms}) // max beyond burst
	clock.Advance(200 * ms)
	lease("a", 1, 100, grant{granted: 2, remaining: 0.5, resetAfter: 950 * ms})

	// giveBack does not move the refill timeline: tokens stored at the
	// last admission (250ms) grow by n, and refill still counts from there.
	clock.Advance(30 * ms) // 280ms: 0.8 tokens
	if err := l.giveBack(ctx, "a", l.lims.def, 3); err != nil {
		t.Fatal(err)
	}
	lease("a", 1, 10, grant{granted: 3, remaining: 0.8, resetAfter: 920 * ms})
	ttl := client.PTTL(ctx, rediskey.Key(l.prefix, "a")).Val()
	if ttl > 920*ms || ttl < 870*ms {
		t.Fatalf("PTTL after lease = %v, want about 920ms", ttl)
	}
	if err := l.giveBack(ctx, "a", l.lims.def, 2); err != nil {
		t.Fatal(err)
	}
	// The bucket is full 200 ms sooner, but its key lives as long as it
	// did: a process that took tokens knows it exists until then, and
	// would take a key gone sooner for one Redis lost.
	if got := client.PTTL(ctx, rediskey.Key(l.prefix, "a")).Val(); got > ttl || got < ttl-50*ms {
		t.Fatalf("PTTL after giving 2 back = %v, want the %v it had (never sooner)", got, ttl)
	}
	lease("a", 1, 10, grant{granted: 2, remaining: 0.8, resetAfter: 920 * ms}) // the 2 given back

	// Giving back more than is missing caps at burst: the key reads full,
	// and is kept full until its old expiry.
	if err := l.giveBack(ctx, "a", l.lims.def, 100); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(ctx, rediskey.Key(l.prefix, "a")).Val(); n != 1 {
		t.Fatal("a full bucket's key was deleted before its expiry")
	}
	lease("a", 10, 10, grant{granted: 10, remaining: 0, resetAfter: time.Second})

	// A missing key is full and stays missing.
	if err := l.giveBack(ctx, "missing", l.lims.def, 3); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(ctx, rediskey.Key(l.prefix, "missing")).Val(); n != 0 {
		t.Fatal("giveBack created a key")
	}
	if err := l.giveBack(ctx, "missing", l.lims.def, 0); err != nil {
		t.Fatal(err)
	}
}

// TestRedisGiveBackServerTime runs lease and giveBack on the server's
// TIME.
func TestRedisGiveBackServerTime(t *testing.T) {
	l, client := newTestRedis(t, throttle.PerHour(10), 10) // no refill to speak of
	ctx := ctxT(t)
	g, err := l.lease(ctx, "k", l.lims.def, 5, 10)
	if err != nil || g.granted != 10 {
		t.Fatalf("lease = %+v, %v", g, err)
	}
	if err := l.giveBack(ctx, "k", l.lims.def, 4); err != nil {
		t.Fatal(err)
	}
	if ttl := client.PTTL(ctx, rediskey.Key(l.prefix, "k")).Val(); ttl < 59*time.Minute {
		t.Fatalf("PTTL = %v, want the hour it had: giving back never shortens a key's life", ttl)
	}
	d, err := l.AllowN(ctx, "k", 4)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("AllowN(4) after giving 4 back = %+v, %v", d, err)
	}
}

// TestRedisConcurrent has two clients with 8 goroutines each hammer one
// key for 2s at 100/1s, burst 10: in any span, certainly-contained
// admissions never exceed burst + refill.
func TestRedisConcurrent(t *testing.T) {
	srv := redistest.Shared(t)
	r := throttle.PerSecond(100)
	const burst = 10
	prefix := freshPrefix()
	var (
		mu  sync.Mutex
		adm []throttletest.TimedAdmission
		wg  sync.WaitGroup
	)
	total := 0
	stop := time.Now().Add(2 * time.Second)
	for c := 0; c < 2; c++ {
		l, err := NewRedis(srv.Client(t), r, burst, WithPrefix(prefix), WithTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []throttletest.TimedAdmission
				calls := 0
				for time.Now().Before(stop) {
					sent := time.Now()
					d, err := l.AllowN(context.Background(), "shared", 1)
					if err != nil {
						t.Error(err)
						return
					}
					calls++
					if d.Allowed {
						mine = append(mine, throttletest.TimedAdmission{Sent: sent, Returned: time.Now()})
					}
				}
				mu.Lock()
				adm = append(adm, mine...)
				total += calls
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	for _, span := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second} {
		throttletest.CheckBucketAdmissions(t, adm, r, burst, span, time.Millisecond)
	}
	// At most the burst and the refill between the first decision and the
	// last, which lie within the first call's send and the last one's
	// return (past the 2 s by a call's time, more on a loaded machine);
	// about 10 + 200 unless something stalls.
	first, last := adm[0].Sent, adm[0].Returned
	for _, a := range adm {
		if a.Sent.Before(first) {
			first = a.Sent
		}
		if a.Returned.After(last) {
			last = a.Returned
		}
	}
	most := burst + int(int64(last.Sub(first))*int64(r.Count)/int64(r.Per)) + 1
	if len(adm) < 150 || len(adm) > most {
		t.Fatalf("%d admissions in %v at %v burst %d, want at most %d and about 210", len(adm), last.Sub(first), r, burst, most)
	}
	t.Logf("%d admissions of %d decisions", len(adm), total)
}

// TestRedisTimeout pauses a private server: AllowN must give up within the
// timeout (+20ms), with an error.
func TestRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	const timeout = 50 * time.Millisecond
	// Room for a loaded machine, far below the 3 s of go-redis's read
	// timeout that a call without the limiter's timeout would wait.
	const slack = timeout + time.Second
	l, err := NewRedis(client, throttle.PerSecond(10), 5, WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	twin := patient(t, client, l)
	if _, err := twin.AllowN(context.Background(), "warm", 1); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Resume() })
	for i := 0; i < 3; i++ {
		start := time.Now()
		_, err := l.AllowN(context.Background(), "k", 1)
		took := time.Since(start)
		if err == nil || !strings.HasPrefix(err.Error(), "bucket: redis: ") {
			t.Fatalf("AllowN on a paused server: %v, want a \"bucket: redis: \" error", err)
		}
		if took > slack {
			t.Fatalf("AllowN on a paused server took %v, want <= %v", took, slack)
		}
		start = time.Now()
		if err := l.giveBack(context.Background(), "k", l.lims.def, 1); err == nil {
			t.Fatal("giveBack on a paused server: no error")
		}
		if took := time.Since(start); took > slack {
			t.Fatalf("giveBack on a paused server took %v, want <= %v", took, slack)
		}
	}
	// A caller's earlier deadline wins over the twin's 2 s.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := twin.AllowN(ctx, "k", 1); err == nil {
		t.Fatal("no error")
	}
	if took := time.Since(start); took > slack {
		t.Fatalf("AllowN with a 10ms context took %v", took)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The timed-out connections are gone; a loaded machine may need more
	// than one 50 ms try to dial again.
	var d throttle.Decision
	for try := 0; try < 20; try++ {
		if d, err = l.AllowN(context.Background(), "k", 1); err == nil {
			break
		}
	}
	if err != nil || !d.Allowed {
		t.Fatalf("after Resume: %+v, %v", d, err)
	}
}

// TestRedisDebtBeyondQuota: a bucket deep in debt under a small burst,
// decided under a quota with a larger burst at the same period (whose
// deepest debt is smaller), is read at that quota's deepest debt: a
// rejection, not a reply the client refuses.
func TestRedisDebtBeyondQuota(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	var burst atomic.Int64
	burst.Store(5)
	quotas := func(string) throttle.Quota {
		return throttle.Quota{Rate: throttle.PerSecond(1), Burst: int(burst.Load())}
	}
	l, client := newTestRedis(t, throttle.PerSecond(1), 5, WithClock(clock), WithQuotas(quotas))
	ctx := ctxT(t)
	t0 := float64(throttletest.T0.UnixMicro())
	// The deepest debt burst 5 allows: -(2^53 - 5 tokens).
	if err := client.Set(ctx, rediskey.Key(l.prefix, "deep"), packedBucket(-(1<<53)+5_000_000, t0, 1_000_000), 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []int64{5, 10} {
		burst.Store(b)
		d, err := l.AllowN(ctx, "deep", 1)
		if err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("AllowN under burst %d on the deepest debt = %+v, %v; want a rejection", b, d, err)
		}
		if _, err := l.Peek(ctx, "deep", 1); err != nil {
			t.Fatalf("Peek under burst %d on the deepest debt: %v", b, err)
		}
	}
}
