package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/benchtest"
)

// benchParallelism is the goroutines per GOMAXPROCS of every parallel case
// (as in the library's Redis benchmarks): enough concurrent calls to keep
// redis-server busy.
const benchParallelism = 8

// manyKeys is the key count of the "10k keys" cases.
const manyKeys = 10_000

type benchCase struct {
	name     string
	parallel bool
	keys     []string
}

func benchCases() []benchCase {
	many := make([]string, manyKeys)
	for i := range many {
		many[i] = "user-" + strconv.Itoa(i)
	}
	one := []string{"one"}
	return []benchCase{
		{"sequential, one key", false, one},
		{"sequential, 10k keys", false, many},
		{"parallel, one key", true, one},
		{"parallel, 10k keys", true, many},
	}
}

// sample is one measurement of one contender in one case and round.
type sample struct {
	nsOp, bytesOp, allocsOp float64
	// separateNsOp is testing.Benchmark's ns/op where nsOp was then timed
	// interleaved (see retimeSequential); 0 otherwise.
	separateNsOp        float64
	n                   int
	calls, denied, errs int64
	redisShare          float64 // share of decisions that needed a Redis call; -1: not known
	// redisCPU is the CPU time redis-server spent per decision, µs (user
	// and system, from INFO cpu, over every call of the benchmark); -1
	// for contenders without Redis.
	redisCPU float64
}

// measure runs one contender in one case with testing.Benchmark on a fresh
// limiter over an emptied Redis, after a warm-up that touches every key.
func measure(c *redis.Client, k contender, bc benchCase) (sample, error) {
	ctx := context.Background()
	if err := c.FlushAll(ctx).Err(); err != nil {
		return sample{}, err
	}
	inst, err := k.make(c, throughputLimits)
	if err != nil {
		return sample{}, fmt.Errorf("%s: %w", k.name, err)
	}
	defer inst.release()
	allow := inst.allow
	warm(allow, bc.keys)
	var redis0, all0 int64
	if inst.redisCalls != nil {
		redis0, all0 = inst.redisCalls()
	}

	var calls, denied, errs atomic.Int64
	var firstErr atomic.Value
	call := func(key string) {
		ok, err := allow(ctx, key)
		switch {
		case err != nil:
			if errs.Add(1) == 1 {
				firstErr.Store(err.Error())
			}
		case !ok:
			denied.Add(1)
		}
	}
	var cpu0 time.Duration
	if k.redis {
		if cpu0, err = serverCPU(c); err != nil {
			return sample{}, err
		}
	}
	keys := bc.keys
	res := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		if !bc.parallel {
			i := 0
			for b.Loop() {
				call(keys[i%len(keys)])
				i++
			}
			calls.Add(int64(b.N))
			return
		}
		var g atomic.Int64
		b.SetParallelism(benchParallelism)
		b.RunParallel(func(pb *testing.PB) {
			i := int(g.Add(1)) * 97
			n := int64(0)
			for pb.Next() {
				call(keys[i%len(keys)])
				i++
				n++
			}
			calls.Add(n)
		})
	})
	if e, ok := firstErr.Load().(string); ok {
		fmt.Fprintf(os.Stderr, "  %s / %s: %d errors, first: %s\n", k.name, bc.name, errs.Load(), e)
	}
	if res.N == 0 {
		return sample{}, fmt.Errorf("%s / %s: benchmark failed", k.name, bc.name)
	}
	redisCPU := -1.0
	if k.redis {
		cpu1, err := serverCPU(c)
		if err != nil {
			return sample{}, err
		}
		redisCPU = (cpu1 - cpu0).Seconds() * 1e6 / float64(calls.Load())
	}
	var redisShare float64 = -1
	if inst.redisCalls != nil {
		redis1, all1 := inst.redisCalls()
		if all1 > all0 {
			redisShare = float64(redis1-redis0) / float64(all1-all0)
		}
	}
	return sample{
		redisShare: redisShare,
		redisCPU:   redisCPU,
		nsOp:       float64(res.T.Nanoseconds()) / float64(res.N),
		bytesOp:    float64(res.AllocedBytesPerOp()),
		allocsOp:   float64(res.AllocsPerOp()),
		n:          res.N,
		calls:      calls.Load(),
		denied:     denied.Load(),
		errs:       errs.Load(),
	}, nil
}

// warm calls allow on every key (1,000 times on a single key) from 16
// goroutines, so that each measurement starts from existing state.
func warm(allow allowFunc, keys []string) {
	n := len(keys)
	if n == 1 {
		n = 1000
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				_, _ = allow(context.Background(), keys[i%len(keys)])
			}
		})
	}
	wg.Wait()
}

// timeInterleaved returns the ns per call of each of ks in the sequential
// case bc, timed call by call with the calls interleaved
// (benchtest.TimeInterleaved) until each has had about benchtime of calls
// (and at least 200), on fresh limiters over an emptied Redis, each on its
// own keys, warmed as in measure.
func timeInterleaved(c *redis.Client, ks []contender, bc benchCase, benchtime time.Duration) ([]float64, error) {
	ctx := context.Background()
	if err := c.FlushAll(ctx).Err(); err != nil {
		return nil, err
	}
	ops := make([]func() error, len(ks))
	key := bc.keys[0]
	for i, k := range ks {
		inst, err := k.make(c, throughputLimits)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.name, err)
		}
		defer inst.release()
		warm(inst.allow, bc.keys)
		ops[i] = func() error {
			_, err := inst.allow(ctx, key)
			return err
		}
	}
	budget := benchtime * time.Duration(len(ks))
	start := time.Now()
	spent, steps, err := benchtest.TimeInterleaved(ops, func(step int) bool {
		key = bc.keys[step%len(bc.keys)]
		return step < 200 || time.Since(start) < budget
	})
	if err != nil {
		return nil, fmt.Errorf("%s / %s: %w", ks[err.Op].name, bc.name, err.Err)
	}
	ns := make([]float64, len(ks))
	for i := range ks {
		ns[i] = float64(spent[i].Nanoseconds()) / float64(steps)
	}
	return ns, nil
}

// retimeSequential replaces, in the round just measured of the sequential
// case bc, the ns/op of every round-trip contender with its interleaved
// timing (timeInterleaved), and keeps testing.Benchmark's as separateNsOp.
// res is the case's samples, [contender][round].
func retimeSequential(c *redis.Client, res [][]sample, bc benchCase, benchtime time.Duration) error {
	var ks []contender
	var at []int
	for ki, k := range throughputContenders {
		if k.roundTrip {
			ks, at = append(ks, k), append(at, ki)
		}
	}
	ns, err := timeInterleaved(c, ks, bc, benchtime)
	if err != nil {
		return err
	}
	for i, ki := range at {
		s := &res[ki][len(res[ki])-1]
		s.separateNsOp, s.nsOp = s.nsOp, ns[i]
	}
	return nil
}

// serverCPU returns the CPU time redis-server has used since it started
// (used_cpu_user plus used_cpu_sys of INFO cpu).
func serverCPU(c *redis.Client) (time.Duration, error) {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu: %s: %w", name, err)
			}
			sum += x
		}
	}
	return time.Duration(sum * float64(time.Second)), nil
}
