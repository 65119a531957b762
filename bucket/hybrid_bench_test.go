package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// BenchmarkHybridSteady measures a Hybrid at steady state on one key, at
// the rate of BenchmarkLocal: the stock is leased ahead in the background
// and nearly every decision is local. Compare with BenchmarkLocal in the
// same run:
//
//	go test -run '^$' -bench 'BenchmarkLocal$|BenchmarkHybridSteady' -benchmem -count 5 ./bucket
//
// It reports the share of decisions that needed a Redis round trip.
func BenchmarkHybridSteady(b *testing.B) {
	c := redistest.Shared(b).Client(b)
	// A large burst so that leases (a quarter of it at most) cover the
	// round trip of the background refresh at this speed. The benchmark
	// goroutines keep both cores busy, starving redis-server at times, so
	// the timeout is long: this measures the local path, not failures.
	h, err := NewHybrid(c, throttle.PerSecond(benchRate), 10_000_000,
		WithPrefix(freshPrefix()), WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Close(context.Background()) })
	ctx := context.Background()
	for range 1000 { // warm up the rate estimate and the stock
		if _, err := h.AllowN(ctx, "key", 1); err != nil {
			b.Fatal(err)
		}
	}
	report := func(b *testing.B, before HybridStats) {
		st := h.Stats()
		if n := (st.Local - before.Local) + (st.Redis - before.Redis); n > 0 {
			b.ReportMetric(float64(st.Redis-before.Redis)/float64(n), "redis/op")
		}
	}
	b.Run("seq", func(b *testing.B) {
		b.ReportAllocs()
		before := h.Stats()
		for b.Loop() {
			if _, err := h.AllowN(ctx, "key", 1); err != nil {
				b.Fatal(err)
			}
		}
		report(b, before)
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		before := h.Stats()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := h.AllowN(ctx, "key", 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
		report(b, before)
	})
}
