// Package benchtest runs one operation as the pair of benchmarks every
// limiter comparison in this module uses (sequential and parallel), and
// bursts of concurrent decisions under CPU load (Bursts), and sequential
// operations against each other, call by call (Interleaved).
package benchtest

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// Keys are the keys of the many-keys benchmarks: "user-0" to "user-1023".
var Keys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "user-" + strconv.Itoa(i)
	}
	return k
}()

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

// BurstSize is the number of goroutines of one burst in Bursts.
const BurstSize = 500

// Bursts runs a burst of BurstSize goroutines deciding on key(i) at once,
// beside two CPU-bound goroutines (throttletest.RunBurst), per iteration
// i, and reports per burst the calls that failed ("failed/burst"), the
// calls admitted ("admitted/burst") and the slowest call in ms
// ("slowest-ms", the worst of the run). A call's error does not stop the
// benchmark: how many fail is what it measures.
func Bursts(b *testing.B, l throttle.Limiter, key func(i int) string) {
	// Warm, as a running service is: connections open, scripts loaded.
	for try := 1; ; try++ {
		_, err := l.AllowN(context.Background(), key(-1), 1)
		if err == nil {
			break
		}
		if try == 3 {
			b.Logf("warm-up failed 3 times, the last: %v", err)
			break
		}
	}
	var failed, admitted int
	var slowest time.Duration
	i := 0
	for b.Loop() {
		res := throttletest.RunBurst(l, key(i), BurstSize)
		failed += res.Failed
		admitted += res.Admitted
		slowest = max(slowest, res.Slowest)
		i++
	}
	b.ReportMetric(float64(failed)/float64(i), "failed/burst")
	b.ReportMetric(float64(admitted)/float64(i), "admitted/burst")
	b.ReportMetric(float64(slowest)/float64(time.Millisecond), "slowest-ms")
}

// Batches benchmarks decide on batches of size requests of cost 1, over
// keys in turn, from GOMAXPROCS goroutines: one op is one batch, and
// "ns/decision" is its time per request, to compare with the parallel
// case of SeqAndParallel (the same decisions, coalesced).
func Batches(b *testing.B, keys []string, size int, decide func([]throttle.Request) error) {
	b.Helper()
	b.ReportAllocs()
	var goroutines atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		k := int(goroutines.Add(1)) * 7919
		reqs := make([]throttle.Request, size)
		for pb.Next() {
			for i := range reqs {
				reqs[i] = throttle.Request{Key: keys[k%len(keys)], N: 1}
				k++
			}
			if err := decide(reqs); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/decision")
}

// Op is one operation of Interleaved.
type Op struct {
	Name string // in the reported units: no spaces
	Do   func() error
}

// Interleaved benchmarks ops sequentially against each other (see
// TimeInterleaved), one step per iteration. It reports each op's time per
// call ("<name>-ns") and the first op's time over each other's
// ("<first>/<name>", summed over the same steps). Meant for ops of a round
// trip or more, where the clock reads around each call weigh nothing. An
// error fails the benchmark.
func Interleaved(b *testing.B, ops []Op) {
	b.Helper()
	spent, steps := TimeOps(b, ops)
	for i, op := range ops {
		b.ReportMetric(float64(spent[i].Nanoseconds())/float64(steps), op.Name+"-ns")
		if i > 0 {
			b.ReportMetric(float64(spent[0])/float64(spent[i]), ops[0].Name+"/"+op.Name)
		}
	}
}

// TimeOps is TimeInterleaved for a benchmark, one step per iteration: it
// returns each op's time in all and the steps run; an error fails b.
func TimeOps(b *testing.B, ops []Op) (spent []time.Duration, steps int) {
	b.Helper()
	do := make([]func() error, len(ops))
	for i, op := range ops {
		do[i] = op.Do
	}
	spent, steps, err := TimeInterleaved(do, func(int) bool { return b.Loop() })
	if err != nil {
		b.Fatalf("%s: %v", ops[err.Op].Name, err.Err)
	}
	return spent, steps
}

// OpError is the error of op number Op of TimeInterleaved.
type OpError struct {
	Op  int
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("op %d: %v", e.Op, e.Err) }
func (e *OpError) Unwrap() error { return e.Err }

// TimeInterleaved calls every op once per step, in an order that rotates
// from step to step, while more(step) is true, and times each call. It
// returns the time each op took in all, and the steps run; it stops at
// the first error. A loopback round trip on a shared machine varies
// several-fold from one moment to the next, and separate benchmarks meet
// different moments; interleaved, every op meets the same ones.
func TimeInterleaved(ops []func() error, more func(step int) bool) (spent []time.Duration, steps int, err *OpError) {
	spent = make([]time.Duration, len(ops))
	for ; more(steps); steps++ {
		for j := range ops {
			i := (j + steps) % len(ops)
			start := time.Now()
			if err := ops[i](); err != nil {
				return spent, steps, &OpError{Op: i, Err: err}
			}
			spent[i] += time.Since(start)
		}
	}
	return spent, steps, nil
}
