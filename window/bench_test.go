package window

import (
	"context"
	_ "embed"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/benchtest"
	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// The Redis benchmarks share one redis-server and compare a sliding-window
// decision with a bare round trip (PING) and with the pipeline design it
// replaces. Parallel runs use 8 goroutines per GOMAXPROCS. The limit is
// large enough that almost every call is admitted (the expensive path).

const benchParallelism = 8

var benchRate = throttle.Rate{Count: 1 << 30, Per: time.Second}

func BenchmarkRedisPing(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	benchtest.SeqAndParallel(b, benchParallelism, func(int) error { return client.Ping(ctx).Err() })
}

func BenchmarkRedisWindow(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	l, err := NewRedis(client, benchRate, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("one-key", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
			_, err := l.Allow(ctx, "one")
			return err
		})
	})
	b.Run("many-keys", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
			_, err := l.Allow(ctx, benchtest.Keys[i%len(benchtest.Keys)])
			return err
		})
	})
	// AllowBatch over the same keys: compare ns/decision with
	// many-keys/parallel.
	for _, size := range []int{16, 64} {
		b.Run("batch-"+strconv.Itoa(size), func(b *testing.B) {
			benchtest.Batches(b, benchtest.Keys, size, func(reqs []throttle.Request) error {
				_, err := l.AllowBatch(ctx, reqs)
				return err
			})
		})
	}
}

// BenchmarkLossCheck weighs the lost-set check (see heldUnits): the same
// decisions with it and without; compare the two in one run.
func BenchmarkLossCheck(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	for _, check := range []bool{true, false} {
		name := "check"
		if !check {
			name = "off"
		}
		l, err := NewRedis(client, benchRate, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
		if err != nil {
			b.Fatal(err)
		}
		l.held.Off = !check
		b.Run(name+"/one-key", func(b *testing.B) {
			benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
				_, err := l.Allow(ctx, "one")
				return err
			})
		})
		b.Run(name+"/many-keys", func(b *testing.B) {
			benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
				_, err := l.Allow(ctx, benchtest.Keys[i%len(benchtest.Keys)])
				return err
			})
		})
	}
}

// pipelineWindow is the design the script replaces: MULTI of
// ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE with millisecond scores from the
// client clock, and a ZREM of the new member when the count was full.
type pipelineWindow struct {
	client *redis.Client
	rate   throttle.Rate
	prefix string
	member memberSource
}

func (p *pipelineWindow) allow(ctx context.Context, key string) (bool, error) {
	k := p.prefix + key
	now := time.Now().UnixMilli()
	member := p.member.next()
	var card *redis.IntCmd
	_, err := p.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRemRangeByScore(ctx, k, "-inf", strconv.FormatInt(now-p.rate.Per.Milliseconds(), 10))
		card = pipe.ZCard(ctx, k)
		pipe.ZAdd(ctx, k, redis.Z{Score: float64(now), Member: member})
		pipe.PExpire(ctx, k, p.rate.Per)
		return nil
	})
	if err != nil {
		return false, err
	}
	if card.Val() >= int64(p.rate.Count) {
		return false, p.client.ZRem(ctx, k, member).Err()
	}
	return true, nil
}

func BenchmarkPipelineWindow(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	p := &pipelineWindow{client: client, rate: benchRate, prefix: freshPrefix()}
	if err := p.member.init(); err != nil {
		b.Fatal(err)
	}
	b.Run("one-key", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
			_, err := p.allow(ctx, "one")
			return err
		})
	})
	b.Run("many-keys", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
			_, err := p.allow(ctx, benchtest.Keys[i%len(benchtest.Keys)])
			return err
		})
	})
}

// sequentialRivals returns a client of the shared redis-server, and
// window.Redis and the pipeline window on it, with fresh prefixes.
func sequentialRivals(b *testing.B) (*redis.Client, *Redis, *pipelineWindow) {
	client := redistest.Shared(b).Client(b)
	l, err := NewRedis(client, benchRate, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
	if err != nil {
		b.Fatal(err)
	}
	p := &pipelineWindow{client: client, rate: benchRate, prefix: freshPrefix()}
	if err := p.member.init(); err != nil {
		b.Fatal(err)
	}
	return client, l, p
}

// BenchmarkRedisSequential compares one decision at a time of
// window.Redis with the pipeline window's and a PING, on one key,
// interleaved (see benchtest.Interleaved): the "window/pipeline" metric is
// the sequential ratio of issue 11.
func BenchmarkRedisSequential(b *testing.B) {
	client, l, p := sequentialRivals(b)
	ctx := context.Background()
	benchtest.Interleaved(b, []benchtest.Op{
		{Name: "window", Do: func() error { _, err := l.Allow(ctx, "one"); return err }},
		{Name: "pipeline", Do: func() error { _, err := p.allow(ctx, "one"); return err }},
		{Name: "ping", Do: func() error { return client.Ping(ctx).Err() }},
	})
}

// leastExactLua is the least an exact sliding-window-log decision on the
// server's clock can ask of Redis: the count, and the unit added only if
// it fits (no pause, no reservations, no batch).
const leastExactLua = `local t = redis.call("TIME")
local now = t[1] * 1000000 + t[2]
local window, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", string.format("%d", now - window))
if redis.call("ZCARD", KEYS[1]) >= limit then
	return {0}
end
redis.call("ZADD", KEYS[1], string.format("%d", now), ARGV[3])
redis.call("PEXPIRE", KEYS[1], ARGV[4])
return {1}`

// BenchmarkScriptFloor asks whether any exact script can decide one call
// at a time as fast as the pipeline window (the sequential target of
// issue 11), interleaved as BenchmarkRedisSequential: it reports each
// op's time over the pipeline's ("<op>/pipeline"); its ns/op is one step,
// a call of every op. noop-script is a script that only returns, sent
// with window.Redis's keys and arguments: what EVALSHA costs before any
// work. least-script is leastExactLua.
func BenchmarkScriptFloor(b *testing.B) {
	client, l, p := sequentialRivals(b)
	ctx := context.Background()
	var m memberSource
	if err := m.init(); err != nil {
		b.Fatal(err)
	}
	noop, least := redisscript.New("return {1, 0, 0}"), redisscript.New(leastExactLua)
	r, err := l.request("one", 1, "", argAllowN)
	if err != nil {
		b.Fatal(err)
	}
	win, limit := strconv.FormatInt(benchRate.PerMicros(), 10), strconv.Itoa(benchRate.Count)
	expiry := strconv.FormatInt(benchRate.Per.Milliseconds(), 10)
	leastKey := freshPrefix() + "{one}"
	run := func(s *redisscript.Script, args ...any) error {
		return s.Run(ctx, client, redis.NewIntSliceCmd(ctx, append(s.Start(nil), args...)...))
	}
	ops := []benchtest.Op{
		{Name: "pipeline", Do: func() error { _, err := p.allow(ctx, "one"); return err }},
		{Name: "window", Do: func() error { _, err := l.Allow(ctx, "one"); return err }},
		{Name: "noop-script", Do: func() error {
			return run(noop, "3", r.key, r.hint, r.pause, argTime, argExact, "", r.argWin, r.argLimit, argOne, argOne, m.next(), argAllowN)
		}},
		{Name: "least-script", Do: func() error { return run(least, "1", leastKey, win, limit, m.next(), expiry) }},
		{Name: "ping", Do: func() error { return client.Ping(ctx).Err() }},
	}
	spent, _ := benchtest.TimeOps(b, ops)
	for i, op := range ops[1:] {
		b.ReportMetric(float64(spent[i+1])/float64(spent[0]), op.Name+"/pipeline")
	}
}

// BenchmarkRedisWindowID is BenchmarkRedisWindow with reservations on:
// AllowID with a new id per call and a horizon of a minute (an admission
// also looks the id up).
func BenchmarkRedisWindowID(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	l, err := NewRedis(client, benchRate, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64 // every id new, as every message of a stream
	b.Run("one-key", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
			_, err := l.AllowID(ctx, "one", 1, strconv.FormatInt(seq.Add(1), 10), time.Minute)
			return err
		})
	})
	b.Run("many-keys", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
			_, err := l.AllowID(ctx, benchtest.Keys[i%len(benchtest.Keys)], 1, strconv.FormatInt(seq.Add(1), 10), time.Minute)
			return err
		})
	})
}

//go:embed testdata/window_before_reservations.lua
var windowBeforeReservationsLua string

// BenchmarkRedisWindowBefore is the AllowN of the script before
// reservations and ids (commit 863e1b6), sent the way window.Redis sends
// its own: the baseline for the cost of a decision with reservations on
// (BenchmarkRedisWindowID, same run).
func BenchmarkRedisWindowBefore(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	script := redisscript.New(windowBeforeReservationsLua)
	prefix := freshPrefix()
	var m memberSource
	if err := m.init(); err != nil {
		b.Fatal(err)
	}
	win, limit := strconv.FormatInt(benchRate.PerMicros(), 10), strconv.Itoa(benchRate.Count)
	expiry := strconv.FormatInt(benchRate.Per.Milliseconds(), 10)
	timeout := deadline.NewShared(redistest.CallTimeout)
	allow := func(key string) error {
		ctx, _ := timeout.Bound(ctx)
		args := append(script.Start(make([]any, 0, 9)), "1", key, win, limit, expiry, "1", m.next())
		return script.Run(ctx, client, redis.NewIntSliceCmd(ctx, args...))
	}
	one := prefix + "{one}"
	b.Run("one-key", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(int) error { return allow(one) })
	})
	b.Run("many-keys", func(b *testing.B) {
		benchtest.SeqAndParallel(b, benchParallelism, func(i int) error { return allow(prefix + "{" + benchtest.Keys[i%len(benchtest.Keys)] + "}") })
	})
}

// BenchmarkCoalescedLoad is TestCoalescedLoad at the default timeout (50
// ms): 500 goroutines on a fresh key at once, beside two CPU-bound
// goroutines, a burst per iteration. It reports the calls that failed
// (the target is 0) and those admitted (exactly Count, 100, without
// failures) per burst, and the slowest call.
func BenchmarkCoalescedLoad(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	r := throttle.Rate{Count: 100, Per: time.Minute}
	l, err := NewRedis(client, r, WithPrefix(freshPrefix()))
	if err != nil {
		b.Fatal(err)
	}
	benchtest.Bursts(b, l, func(i int) string { return "hot-" + strconv.Itoa(i) })
}
