// Package benchtest runs one operation as the pair of benchmarks every
// limiter comparison in this module uses: sequential and parallel.
package benchtest

import (
	"sync/atomic"
	"testing"
)

// SeqAndParallel benchmarks op in two sub-benchmarks with allocations
// reported: "seq" calls it from one goroutine, "parallel" from parallelism
// goroutines per GOMAXPROCS (0 means 1) with b.RunParallel. op receives a
// call number that is distinct within a goroutine and spread apart between
// goroutines, for picking keys; an error fails the benchmark.
func SeqAndParallel(b *testing.B, parallelism int, op func(i int) error) {
	b.Helper()
	b.Run("seq", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := op(i); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		if parallelism > 0 {
			b.SetParallelism(parallelism)
		}
		var goroutines atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(goroutines.Add(1)) * 7919
			for pb.Next() {
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}
