package concurrency

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/benchtest"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// The Redis benchmarks share one redis-server. BenchmarkAcquireRelease
// (one Acquire and one Release per op) runs beside BenchmarkRedisPing and
// BenchmarkWindowDecision (one sliding-window decision of package window)
// so that the ratio Acquire+Release ÷ window decision comes from one run.
// All are on one key; parallel runs use 8 goroutines per GOMAXPROCS. The
// limits are large enough that every call is admitted.

const (
	benchParallelism = 8
	benchLimit       = 1 << 20
	benchLease       = time.Minute
)

// benchIDs returns a function giving ids unique within the benchmark
// process.
func benchIDs() func() string {
	var seq atomic.Uint64
	return func() string { return strconv.FormatUint(seq.Add(1), 36) }
}

func BenchmarkRedisPing(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	benchtest.SeqAndParallel(b, benchParallelism, func(int) error { return client.Ping(ctx).Err() })
}

func BenchmarkAcquireRelease(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	l, err := NewRedis(client, benchLimit, WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout))
	if err != nil {
		b.Fatal(err)
	}
	next := benchIDs()
	benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
		id := next()
		if _, err := l.Acquire(ctx, "one", id, benchLease); err != nil {
			return err
		}
		return l.Release(ctx, "one", id)
	})
}

func BenchmarkWindowDecision(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	l, err := window.NewRedis(client, throttle.Rate{Count: 1 << 30, Per: time.Second},
		window.WithPrefix(redistest.Prefix("window")), window.WithTimeout(redistest.CallTimeout))
	if err != nil {
		b.Fatal(err)
	}
	benchtest.SeqAndParallel(b, benchParallelism, func(int) error {
		_, err := l.AllowN(ctx, "one", 1)
		return err
	})
}

// benchMemIDs are ids taken round-robin by the Memory benchmarks (no
// allocation per op).
var benchMemIDs = func() []string {
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = "job-" + strconv.Itoa(i)
	}
	return ids
}()

func BenchmarkMemoryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("one-key", func(b *testing.B) {
		m, err := NewMemory(benchLimit)
		if err != nil {
			b.Fatal(err)
		}
		benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
			id := benchMemIDs[i%len(benchMemIDs)]
			if _, err := m.Acquire(ctx, "one", id, benchLease); err != nil {
				return err
			}
			return m.Release(ctx, "one", id)
		})
	})
	b.Run("many-keys", func(b *testing.B) {
		m, err := NewMemory(benchLimit)
		if err != nil {
			b.Fatal(err)
		}
		benchtest.SeqAndParallel(b, benchParallelism, func(i int) error {
			key, id := benchtest.Keys[i%len(benchtest.Keys)], benchMemIDs[i%len(benchMemIDs)]
			if _, err := m.Acquire(ctx, key, id, benchLease); err != nil {
				return err
			}
			return m.Release(ctx, key, id)
		})
	})
}

// BenchmarkMemoryAcquireHeld measures Acquire on a key whose limit of 64
// slots is full, half by the caller (renewed) and half by others
// (rejected): the cost of the O(limit) scan.
func BenchmarkMemoryAcquireHeld(b *testing.B) {
	ctx := context.Background()
	const limit = 64
	m, err := NewMemory(limit)
	if err != nil {
		b.Fatal(err)
	}
	for _, id := range benchMemIDs[:limit] {
		if _, err := m.Acquire(ctx, "full", id, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := m.Acquire(ctx, "full", benchMemIDs[i%(2*limit)], time.Hour); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
