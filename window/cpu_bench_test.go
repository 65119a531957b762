package window

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

//go:embed testdata/window_f017374.lua
var windowF017374Lua string

// BenchmarkRedisCPU weighs what a decision costs the Redis server (issue
// 28): the CPU time redis-server spends per AllowN (user and system, from
// INFO cpu) and the part of it inside the script calls (INFO
// commandstats), for window.Redis, for the same Go code sending the
// script of commit f017374 (testdata/window_f017374.lua), and for the
// script before reservations (testdata/window_before_reservations.lua),
// one call per decision, as BenchmarkRedisWindowBefore sends it. Each
// iteration is a round in which every contender decides the same number
// of times in each case, in an order that rotates from round to round;
// each run on an emptied Redis (FLUSHALL: run no test beside it) with a
// fresh limiter, after a touch of every key. The metrics are medians over
// the rounds, and the ratios ("cpu-vs-..." and "script-vs-...") medians
// of the ratios of one round. Run it with
// -benchtime Nx for N rounds:
//
//	go test -run '^$' -bench RedisCPU -benchtime 5x ./window
//
// Cases: "keys-10k", 16 goroutines over 10,000 keys, each walking them
// from its own offset; "hot-key", 16 goroutines on one key; "seq", one
// call at a time on another key. Limits admit every call.
func BenchmarkRedisCPU(b *testing.B) {
	server := redistest.Shared(b)
	client, admin := server.Client(b), server.Client(b)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	type decideFunc = func(ctx context.Context, key string) error
	// A contender makes a fresh limiter for every run.
	type contender struct {
		name  string
		fresh func() decideFunc
	}
	windowOf := func(script *redisscript.Script) func() decideFunc {
		return func() decideFunc {
			l, err := NewRedis(client, benchRate, WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			if script != nil {
				l.calls.Script, l.wholeArgs = script, true
			}
			return func(ctx context.Context, key string) error {
				_, err := l.Allow(ctx, key)
				return err
			}
		}
	}
	before := redisscript.New(windowBeforeReservationsLua)
	win, limit := strconv.FormatInt(benchRate.PerMicros(), 10), strconv.Itoa(benchRate.Count)
	expiry := strconv.FormatInt(benchRate.Per.Milliseconds(), 10)
	timeout := deadline.NewShared(time.Second)
	contenders := []contender{
		{"window", windowOf(nil)},
		{"f017374", windowOf(redisscript.New(windowF017374Lua))},
		{"before", func() decideFunc {
			var member memberSource
			if err := member.init(); err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context, key string) error {
				ctx, _ = timeout.Bound(ctx)
				args := append(before.Start(make([]any, 0, 9)), "1", "{"+key+"}", win, limit, expiry, "1", member.next())
				return before.Run(ctx, client, redis.NewIntSliceCmd(ctx, args...))
			}
		}},
	}
	cases := []struct {
		name       string
		goroutines int
		keys       []string
		decisions  int
	}{
		{"keys-10k", 16, keys, 30_000},
		{"hot-key", 16, []string{"hot"}, 30_000},
		{"seq", 1, []string{"seq"}, 3_000},
	}
	ctx := context.Background()
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			runs := make([][]cpuCost, len(contenders))
			for round := range b.N {
				for i := range contenders {
					k := (i + round) % len(contenders)
					// A run of its own: no key of another expires during
					// it, and every key is touched once before.
					server.FlushAll(b)
					decide := contenders[k].fresh()
					if _, err := cpuRun(ctx, admin, decide, c.goroutines, c.keys, len(c.keys)); err != nil {
						b.Fatal(err)
					}
					cost, err := cpuRun(ctx, admin, decide, c.goroutines, c.keys, c.decisions)
					if err != nil {
						b.Fatal(err)
					}
					runs[k] = append(runs[k], cost)
				}
			}
			for k, rs := range runs {
				name := contenders[k].name
				b.ReportMetric(median(rs, func(c cpuCost) float64 { return c.cpu }), "cpu-µs/"+name)
				b.ReportMetric(median(rs, func(c cpuCost) float64 { return c.script }), "script-µs/"+name)
				b.ReportMetric(median(rs, func(c cpuCost) float64 { return c.calls }), "calls/"+name)
				if k == 0 {
					continue
				}
				ratios := make([]cpuCost, len(rs))
				for r := range rs {
					ratios[r] = cpuCost{cpu: runs[0][r].cpu / rs[r].cpu, script: runs[0][r].script / rs[r].script}
				}
				b.ReportMetric(median(ratios, func(c cpuCost) float64 { return c.cpu }), "cpu-vs-"+name)
				b.ReportMetric(median(ratios, func(c cpuCost) float64 { return c.script }), "script-vs-"+name)
			}
		})
	}
}

// cpuCost is what one run cost redis-server per decision: CPU time, µs;
// the time spent in script calls, µs; and script calls.
type cpuCost struct{ cpu, script, calls float64 }

func median(rs []cpuCost, f func(cpuCost) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// cpuRun makes n decisions from goroutines goroutines, each walking keys
// from its own offset, and returns what they cost redis-server.
func cpuRun(ctx context.Context, admin *redis.Client, decide func(context.Context, string) error, goroutines int, keys []string, n int) (cpuCost, error) {
	before, err := serverCosts(ctx, admin)
	if err != nil {
		return cpuCost{}, err
	}
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	for g := range goroutines {
		wg.Go(func() {
			k := g * len(keys) / goroutines
			for next.Add(1) <= int64(n) {
				if err := decide(ctx, keys[k%len(keys)]); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
				k++
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return cpuCost{}, *err
	}
	after, err := serverCosts(ctx, admin)
	if err != nil {
		return cpuCost{}, err
	}
	return cpuCost{
		cpu:    (after.cpu - before.cpu) / float64(n),
		script: (after.script - before.script) / float64(n),
		calls:  (after.calls - before.calls) / float64(n),
	}, nil
}

// serverCosts returns redis-server's CPU time since it started (µs), and
// the time spent in and the number of EVALSHA and EVAL calls.
func serverCosts(ctx context.Context, c *redis.Client) (cpuCost, error) {
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return cpuCost{}, err
	}
	var cost cpuCost
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "used_cpu_user", "used_cpu_sys":
			s, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return cpuCost{}, fmt.Errorf("INFO %s: %w", name, err)
			}
			cost.cpu += s * 1e6
		case "cmdstat_evalsha", "cmdstat_eval":
			for field := range strings.SplitSeq(value, ",") {
				f, v, _ := strings.Cut(field, "=")
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					continue
				}
				switch f {
				case "calls":
					cost.calls += x
				case "usec":
					cost.script += x
				}
			}
		}
	}
	return cost, nil
}
