package window_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/benchtest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// BenchmarkMemory decides for an existing key (and for 10,000 keys) with a
// limit high enough that every call is admitted and a window short enough
// that each log stays at its steady-state size.
func BenchmarkMemory(b *testing.B) {
	m, err := window.NewMemory(throttle.Rate{Count: 1 << 30, Per: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	b.Run("one-key", func(b *testing.B) {
		benchtest.SeqAndParallel(b, 0, func(int) error {
			_, err := m.AllowN(ctx, "k", 1)
			return err
		})
	})
	b.Run("10k-keys", func(b *testing.B) {
		// A longer window, so that no key goes idle between two visits.
		m, err := window.NewMemory(throttle.Rate{Count: 1 << 30, Per: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			_, _ = m.AllowN(ctx, k, 1)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := m.AllowN(ctx, keys[i%len(keys)], 1); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkMemoryID is BenchmarkMemory's one-key case with reservations on:
// AllowID with a new id per call and a horizon of a minute.
func BenchmarkMemoryID(b *testing.B) {
	m, err := window.NewMemory(throttle.Rate{Count: 1 << 30, Per: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ids := make([]string, 1<<20)
	for i := range ids {
		ids[i] = "stream:" + strconv.Itoa(i)
	}
	b.Run("one-key", func(b *testing.B) {
		benchtest.SeqAndParallel(b, 0, func(i int) error {
			_, err := m.AllowID(ctx, "k", 1, ids[i%len(ids)], time.Minute)
			return err
		})
	})
}
