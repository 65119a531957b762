package bucket

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// The shape of BenchmarkScriptCPU: the bench module's parallel case on
// 10,000 keys coalesces about 7 keys per flush.
const (
	cpuBenchKeys    = 10_000
	cpuBenchPerCall = 7 // buckets per script call
	cpuBenchPipe    = 8 // script calls per round trip
	cpuBenchTrips   = 8 // round trips per measurement (between two INFOs)
)

// BenchmarkScriptCPU weighs what Redis spends per decision on the script
// of commit f017374 and on the current one, taking 1 token from 7 buckets
// per call over 10,000 keys (every take admitted and written, as in the
// bench module), 8 calls pipelined per round trip so that Redis's own
// work dominates. Each iteration runs 8 round trips of each script, in
// alternating order, so both see the same load. It reports, per script,
// redis-µs/decision (INFO cpu: the server's user and system time) and
// script-µs/decision (INFO commandstats: the time in EVALSHA), and
// current/f017374, the ratio of their redis-µs.
func BenchmarkScriptCPU(b *testing.B) {
	l := newBenchRedis(b)
	client := l.client.(*redis.Client)
	ctx := context.Background()
	oldSHA, err := client.ScriptLoad(ctx, oldTakeLua).Result()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := client.ScriptLoad(ctx, bucketHeadLua+convertLua+bucketLua).Result(); err != nil { // takeScript's
		b.Fatal(err)
	}
	// As the bench module's: 1 token per minute, a burst of 10^7.
	lim, err := newKeyLimits(throttle.PerMinute(1), 10_000_000)
	if err != nil {
		b.Fatal(err)
	}
	type side struct {
		name      string
		keys      []string
		next      int
		cpu, usec float64 // µs, summed over the run
		decisions float64
	}
	sides := []*side{{name: "f017374"}, {name: "current"}}
	// trip sends one round trip of s's script, cpuBenchPipe calls.
	trip := func(s *side) {
		p := client.Pipeline()
		cmds := make([]*redis.IntSliceCmd, cpuBenchPipe)
		for c := range cmds {
			groups := make([][]*takeCall, cpuBenchPerCall)
			reqs := make([][]takeReq, cpuBenchPerCall)
			for i := range groups {
				r := l.takeReq(s.keys[s.next%len(s.keys)], lim, 1, 1)
				s.next++
				groups[i], reqs[i] = []*takeCall{{Req: r}}, []takeReq{r}
			}
			if s.name == "f017374" {
				cmds[c] = oldCommand(ctx, l, oldSHA, "", reqs)
			} else {
				cmds[c] = l.command(ctx, groups)
			}
			_ = p.Process(ctx, cmds[c])
		}
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		for _, cmd := range cmds {
			if v := cmd.Val(); len(v) != 2*cpuBenchPerCall+1 || v[0] != 1 {
				b.Fatalf("%s: reply %v, want 1 token granted to each", s.name, v)
			}
		}
	}
	for _, s := range sides {
		s.keys = make([]string, cpuBenchKeys)
		for i := range s.keys {
			s.keys[i] = s.name + "-" + strconv.Itoa(i)
		}
		for range cpuBenchKeys/(cpuBenchPerCall*cpuBenchPipe) + 1 { // every key written once
			trip(s)
		}
	}
	i := 0
	for b.Loop() {
		for j := range sides {
			s := sides[(i+j)%2]
			cpu0, usec0 := serverUsage(b, client)
			for range cpuBenchTrips {
				trip(s)
			}
			cpu1, usec1 := serverUsage(b, client)
			s.cpu += cpu1 - cpu0
			s.usec += usec1 - usec0
			s.decisions += cpuBenchTrips * cpuBenchPipe * cpuBenchPerCall
		}
		i++
	}
	for _, s := range sides {
		b.ReportMetric(s.cpu/s.decisions, s.name+"-redis-µs/decision")
		b.ReportMetric(s.usec/s.decisions, s.name+"-script-µs/decision")
	}
	b.ReportMetric(sides[1].cpu/sides[1].decisions/(sides[0].cpu/sides[0].decisions), "current/f017374")
}

// serverUsage returns the CPU time redis-server has used (used_cpu_user
// plus used_cpu_sys of INFO cpu) and the time it spent in EVALSHA (usec
// of cmdstat_evalsha), both in µs.
func serverUsage(b *testing.B, c *redis.Client) (cpu, evalsha float64) {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu", "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case name == "used_cpu_user" || name == "used_cpu_sys":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu: %s: %v", line, err)
			}
			cpu += f * 1e6
		case name == "cmdstat_evalsha":
			for _, field := range strings.Split(v, ",") {
				if us, ok := strings.CutPrefix(field, "usec="); ok {
					f, err := strconv.ParseFloat(us, 64)
					if err != nil {
						b.Fatalf("INFO commandstats: %s: %v", line, err)
					}
					evalsha = f
				}
			}
		}
	}
	return cpu, evalsha
}
