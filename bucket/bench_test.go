package bucket

import (
	"context"
	"strconv"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/queuethrottle/queuethrottle/internal/benchtest"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// The local benchmarks compare Local with golang.org/x/time/rate on one
// key, at a rate high enough that both admit nearly every call: both read
// the system clock and take a lock per decision.
const benchRate = 1_000_000_000 // per second

func BenchmarkLocal(b *testing.B) {
	l, err := NewLocal(throttle.PerSecond(benchRate), 1000)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	benchtest.SeqAndParallel(b, 0, func(int) error {
		_, err := l.AllowN(ctx, "key", 1)
		return err
	})
}

// BenchmarkLocalQuotas is BenchmarkLocal for a key with a quota of its
// own (WithQuotas over a map): the cost of the QuotaFunc and the cached
// quota lookup.
func BenchmarkLocalQuotas(b *testing.B) {
	quotas := map[string]throttle.Quota{"key": {Rate: throttle.PerSecond(benchRate / 2), Burst: 1000}}
	l, err := NewLocal(throttle.PerSecond(benchRate), 1000, WithQuotas(func(k string) throttle.Quota { return quotas[k] }))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	benchtest.SeqAndParallel(b, 0, func(int) error {
		_, err := l.AllowN(ctx, "key", 1)
		return err
	})
}

// benchIDs are the ids of the AllowID benchmarks, made ahead so that
// formatting them is not measured: a new id per call, as every message
// brings its own (at benchRate with a burst of 1000, an id is remembered
// for 1 µs, so the ids of a key stay few).
var benchIDs = func() []string {
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "msg-" + strconv.Itoa(i)
	}
	return ids
}()

// BenchmarkLocalAllowID is BenchmarkLocal with an id per call: compare
// the two in one run.
func BenchmarkLocalAllowID(b *testing.B) {
	l, err := NewLocal(throttle.PerSecond(benchRate), 1000)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	benchtest.SeqAndParallel(b, 0, func(i int) error {
		_, err := l.AllowID(ctx, "key", 1, benchIDs[i&(len(benchIDs)-1)], time.Second)
		return err
	})
}

func BenchmarkXTimeRate(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(benchRate), 1000)
	benchtest.SeqAndParallel(b, 0, func(int) error {
		l.AllowN(time.Now(), 1)
		return nil
	})
}

// benchParallelism is the goroutines per GOMAXPROCS of the parallel Redis
// benchmarks: enough concurrent calls to keep the server busy.
const benchParallelism = 8

// newBenchRedis returns a Redis bucket on the shared server, with a
// generous timeout: a benchmark measures speed, and a loaded machine can
// stall one call beyond the default 50 ms.
func newBenchRedis(b *testing.B) *Redis {
	l, err := NewRedis(redistest.Shared(b).Client(b), throttle.PerSecond(benchRate), 1000, WithPrefix(freshPrefix()), WithTimeout(5*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// The Redis benchmarks compare one bucket decision (one EVALSHA) with a
// PING on the same server and client.
func BenchmarkRedisBucket(b *testing.B) {
	l := newBenchRedis(b)
	ctx := context.Background()
	benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
		_, err := l.AllowN(ctx, "key", 1)
		return err
	})
}

// BenchmarkLossCheck weighs the lost-bucket check (see "Lost buckets"):
// the same decisions with it and without; compare the two in one run.
func BenchmarkLossCheck(b *testing.B) {
	ctx := context.Background()
	for _, check := range []bool{true, false} {
		name := "check"
		if !check {
			name = "off"
		}
		l := newBenchRedis(b)
		l.held.Off = !check
		b.Run(name+"/one-key", func(b *testing.B) {
			benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
				_, err := l.AllowN(ctx, "key", 1)
				return err
			})
		})
		b.Run(name+"/many-keys", func(b *testing.B) {
			benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
				_, err := l.AllowN(ctx, benchtest.Keys[i%len(benchtest.Keys)], 1)
				return err
			})
		})
	}
}

// BenchmarkRedisBucketBatch decides AllowBatch's batches over 1,024 keys:
// compare its ns/decision with BenchmarkRedisBucketKeys/parallel.
func BenchmarkRedisBucketBatch(b *testing.B) {
	l := newBenchRedis(b)
	ctx := context.Background()
	for _, size := range []int{16, 64} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			benchtest.Batches(b, benchtest.Keys, size, func(reqs []throttle.Request) error {
				_, err := l.AllowBatch(ctx, reqs)
				return err
			})
		})
	}
}

// BenchmarkRedisBucketKeys is BenchmarkRedisBucket over 1,024 keys.
func BenchmarkRedisBucketKeys(b *testing.B) {
	l := newBenchRedis(b)
	ctx := context.Background()
	benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
		_, err := l.AllowN(ctx, benchtest.Keys[i%len(benchtest.Keys)], 1)
		return err
	})
}

// BenchmarkRedisAllowID is BenchmarkRedisBucket with an id per call (one
// EVALSHA of bucket_id.lua): compare the two in one run.
func BenchmarkRedisAllowID(b *testing.B) {
	l := newBenchRedis(b)
	ctx := context.Background()
	benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
		_, err := l.AllowID(ctx, "key", 1, benchIDs[i&(len(benchIDs)-1)], time.Second)
		return err
	})
}

func BenchmarkRedisPing(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	benchtest.SeqAndParallel(b, benchParallelism, func(int) error { return client.Ping(ctx).Err() })
}

// BenchmarkCoalescedLoad is TestCoalescedLoad at the default timeout (50
// ms): 500 goroutines on a fresh key at once, beside two CPU-bound
// goroutines, a burst per iteration. It reports the calls that failed
// (the target is 0) and those admitted (exactly the burst, 100, without
// failures) per burst, and the slowest call.
func BenchmarkCoalescedLoad(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	l, err := NewRedis(client, throttle.Rate{Count: 1, Per: time.Hour}, 100, WithPrefix(freshPrefix()))
	if err != nil {
		b.Fatal(err)
	}
	benchtest.Bursts(b, l, func(i int) string { return "hot-" + strconv.Itoa(i) })
}
