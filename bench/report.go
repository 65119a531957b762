package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

type environment struct {
	date               time.Time
	cpus               int
	cpuModel           string
	goVersion          string
	redisVersion       string
	modules            []string
	library            string
	loadStart, loadEnd string
	duration           time.Duration
	rounds             int
	benchtime          time.Duration
}

func describeEnv() environment {
	e := environment{
		date:      time.Now().UTC(),
		cpus:      runtime.NumCPU(),
		cpuModel:  cpuModel(),
		goVersion: runtime.Version(),
		loadStart: loadAvg(),
		library:   libraryRevision(),
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			switch m.Path {
			case "github.com/go-redis/redis_rate/v10", "github.com/ulule/limiter/v3",
				"github.com/throttled/throttled/v2", "golang.org/x/time",
				"github.com/redis/go-redis/v9", "github.com/queuethrottle/queuethrottle":
				v := m.Version
				if m.Replace != nil {
					v += " => " + m.Replace.Path
				}
				e.modules = append(e.modules, m.Path+" "+v)
			}
		}
	}
	return e
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// libraryRevision names the library commit the run was built from, and
// whether the working tree had changes outside bench/.
func libraryRevision() string {
	rev, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	s := "commit " + strings.TrimSpace(string(rev))
	st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--", ".", ":(exclude)bench").Output()
	if err == nil && len(strings.TrimSpace(string(st))) > 0 {
		s += " plus uncommitted changes"
	}
	return s
}

func redisVersion(c *redis.Client) string {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}

// stats summarises per-round values: median and range.
type stats struct{ med, lo, hi float64 }

func summarize(v []float64) stats {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return stats{med, s[0], s[n-1]}
}

func (s stats) String() string {
	return fmt.Sprintf("%s [%s–%s]", fmtRatio(s.med), fmtRatio(s.lo), fmtRatio(s.hi))
}

func fmtRatio(r float64) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	case r >= 0.1:
		return fmt.Sprintf("%.2f", r)
	default:
		return fmt.Sprintf("%.3f", r)
	}
}

func index(k contender) int {
	return slices.IndexFunc(throughputContenders, func(c contender) bool { return c.name == k.name })
}

// ratios returns, for every round, ns/op of a divided by ns/op of b in
// the same round and case.
func ratios(res [][]sample, a, b contender) []float64 {
	return ratiosOf(res, a, b, func(s sample) float64 { return s.nsOp })
}

// ratiosOf is ratios of what f reads from each sample.
func ratiosOf(res [][]sample, a, b contender, f func(sample) float64) []float64 {
	ra, rb := res[index(a)], res[index(b)]
	out := make([]float64, len(ra))
	for i := range ra {
		out[i] = f(ra[i]) / f(rb[i])
	}
	return out
}

func column(res []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(res))
	for i, s := range res {
		out[i] = f(s)
	}
	return out
}

type headline struct {
	what   string
	a, b   contender
	target float64 // 0: none
	note   string
	// hotKey, when > 0, is the target of the parallel one-key case
	// instead of target (where coalescing pays most).
	hotKey float64
}

// targetIn returns h's target in case bc (0: none).
func (h headline) targetIn(bc benchCase) float64 {
	if h.hotKey > 0 && bc.parallel && len(bc.keys) == 1 {
		return h.hotKey
	}
	return h.target
}

var headlines = []headline{
	{"window.Redis ÷ PING", cWindow, cPing, 0, "DESIGN.md: ~1.2 sequential, 1.6–2.2 parallel", 0},
	{"window.Redis ÷ pipeline window", cWindow, cPipeline, 1.0, "issue 11: no slower than the design it replaces", 0},
	{"window.Redis ÷ redis_rate", cWindow, cRedisRate, 0.8, "issue 11: ≤ 0.8 parallel; ≤ 0.5 parallel on one hot key", 0.5},
	{"window.Redis on AutoPipeliner ÷ window.Redis", cWindowAuto, cWindow, 0, "go-redis's pipelining on top of our coalescing", 0},
	{"bucket.Redis ÷ redis_rate", cBucket, cRedisRate, 0.8, "issue 11: ≤ 0.8 parallel", 0},
	{"bucket.Local ÷ x/time/rate", cLocal, cXRate, 1.0, "no slower", 0},
	{"bucket.Hybrid ÷ bucket.Local", cHybrid, cLocal, 2.0, "within 2×", 0},
	{"pipeline window ÷ PING", cPipeline, cPing, 0, "issue 5, parallel: 1.40–1.45", 0},
	{"redis_rate ÷ PING", cRedisRate, cPing, 0, "issue 5, parallel: 1.25–1.38", 0},
	{"ulule ÷ PING", cUlule, cPing, 0, "issue 5, parallel: 1.08–1.14", 0},
	{"throttled ÷ PING", cThrottled, cPing, 0, "issue 5, parallel: 2.2–6.7", 0},
}

// cpuHeadlines are the ratios of Redis CPU per decision that issue 28
// sets targets for, on many keys in parallel.
var cpuHeadlines = []headline{
	{"window.Redis ÷ redis_rate", cWindow, cRedisRate, 0.6, "issue 28", 0},
	{"bucket.Redis ÷ redis_rate", cBucket, cRedisRate, 0.5, "issue 28", 0},
}

func report(env environment, cases []benchCase, res [][][]sample, acc []accuracyResult) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }

	p("# Side-by-side benchmark results\n\n")
	p("Written by `go run .` in `bench/` (see [README.md](README.md)) on %s; the whole run took %v.\n",
		env.date.Format("2006-01-02 15:04 MST"), env.duration.Round(time.Second))
	p("Every speed figure is a ratio to a reference measured in the same round; absolute\n")
	p("times are for context only. Ratios are the median over %d rounds, with the range\n", env.rounds)
	p("(lowest–highest round) in brackets.\n\n")

	p("## Machine and versions\n\n")
	p("- CPU: %s, %d logical CPUs (`nproc`); client and redis-server share them, and other work ran on the machine during the run (load average %s at the start, %s at the end)\n",
		env.cpuModel, env.cpus, env.loadStart, env.loadEnd)
	p("- Go: %s, GOMAXPROCS %d\n", env.goVersion, runtime.GOMAXPROCS(0))
	p("- redis-server: %s (started by the run on a loopback port, no persistence)\n", env.redisVersion)
	p("- library: %s\n", env.library)
	for _, m := range env.modules {
		p("- `%s`\n", m)
	}
	p("\n")

	p("## Who coalesces\n\n")
	p("Whether concurrent decisions of one process share Redis calls (group commit).\n\n")
	p("| contender | coalesces |\n|---|---|\n")
	for _, k := range throughputContenders {
		if k.redis {
			p("| %s | %s |\n", k.name, k.coalesces)
		}
	}
	p("\n")

	p("## Settings\n\n")
	p("- Each measurement is one `testing.Benchmark` with `ReportAllocs` and a target of %v, on a fresh limiter over an emptied Redis (`FLUSHALL`), after a warm-up that touches every key.\n", env.benchtime)
	p("- Order: within a round, every contender runs once per case; the order rotates from round to round.\n")
	p("- Sequential cases: the ns/op of every contender whose each decision is a Redis round trip (%s) is timed call by call, with the calls interleaved: each step calls every one of them once, in an order that rotates from step to step, until each has had about %v of calls, on fresh limiters over an emptied Redis. A loopback round trip here varies several-fold from one moment to the next, and separate benchmarks meet different moments; interleaved, they meet the same ones. B/op and allocs/op, and the ns/op of the others, come from the separate benchmarks.\n", roundTripNames(), env.benchtime)
	p("- Parallel cases: `RunParallel` with `SetParallelism(%d)`: %d goroutines on GOMAXPROCS %d. Many keys: %d keys, each goroutine walking them from its own offset.\n",
		benchParallelism, benchParallelism*runtime.GOMAXPROCS(0), runtime.GOMAXPROCS(0), manyKeys)
	p("- All Redis-backed contenders share one go-redis client (`ContextTimeoutEnabled: true`, which the Hybrid requires; default pool of 10×GOMAXPROCS).\n")
	p("- Limits admit every call (the expensive path of every algorithm; the *admitted* column shows it). Windows (ours, the pipeline, ulule): 10^9 per 1 s. Token buckets and GCRA (ours, redis_rate, throttled, x/time/rate, the mutex bucket): a burst of 10^7, never spent in one measurement, refilled at 1 per minute, so that no bucket is full again between two visits (with a fast refill each of the 10,000 keys would be full again before its next visit, and bucket.Local forgets full buckets: that would measure re-creating state, not deciding). bucket.Redis runs with `WithTimeout(5s)` and the Hybrid with `WithTimeout(1s)`: the per-call deadline is still set, but a call stalled on this loaded machine does not become an error.\n")
	p("- Floors: *Redis PING* is one round trip, the least any Redis-backed limiter can cost. The *mutex bucket* is the plainest keyed token bucket (one `sync.Mutex` over a `map[string]*state`), the local floor. x/time/rate is keyed with a `sync.Map` of `*rate.Limiter`.\n")
	p("- The pipeline window is the design our script replaces: MULTI of ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE with client-side millisecond timestamps, and a ZREM on rejection.\n")
	p("- ulule uses its go-redis v9 store (`drivers/store/redis`), throttled its go-redis v9 store (`store/goredisstore.v9`) with `GCRARateLimiterCtx`.\n\n")

	p("## Headline ratios\n\n")
	p("Per round, the first contender's ns/op divided by the second's in the same case; median [range].\n\n")
	p("| ratio | target |")
	for _, bc := range cases {
		p(" %s |", bc.name)
	}
	p("\n|---|---|")
	for range cases {
		p("---|")
	}
	p("\n")
	for _, h := range headlines {
		target := h.note
		if h.target > 0 {
			target = fmt.Sprintf("≤ %.2f (%s)", h.target, h.note)
		}
		if h.hotKey > 0 {
			target = fmt.Sprintf("≤ %.2f, ≤ %.2f parallel on one key (%s)", h.target, h.hotKey, h.note)
		}
		p("| %s | %s |", h.what, target)
		for ci, bc := range cases {
			s := summarize(ratios(res[ci], h.a, h.b))
			mark := ""
			if t := h.targetIn(bc); t > 0 {
				if s.med <= t {
					mark = " ✓"
				} else {
					mark = " ✗"
				}
			}
			p(" %s%s |", s, mark)
		}
		p("\n")
	}
	p("\n✓ / ✗: the median meets / misses the DESIGN.md target in that case.\n\n")
	p("Redis CPU per decision (parallel cases; the Redis CPU column below): per round, the first contender's divided by the second's in the same case; median [range].\n\n")
	p("| ratio | target |")
	var parallel []int // the cases with Redis CPU
	for ci, bc := range cases {
		if bc.parallel {
			parallel = append(parallel, ci)
			p(" %s |", bc.name)
		}
	}
	p("\n|---|---|%s\n", strings.Repeat("---|", len(parallel)))
	for _, h := range cpuHeadlines {
		p("| %s | ≤ %.2f on %d keys (%s) |", h.what, h.target, manyKeys, h.note)
		for _, ci := range parallel {
			s := summarize(ratiosOf(res[ci], h.a, h.b, func(s sample) float64 { return s.redisCPU }))
			mark := ""
			if len(cases[ci].keys) > 1 {
				if s.med <= h.target {
					mark = " ✓"
				} else {
					mark = " ✗"
				}
			}
			p(" %s%s |", s, mark)
		}
		p("\n")
	}
	p("\n")
	p("The sequential ratios of contenders timed interleaved, from their separate benchmarks instead (the method of earlier runs), for comparison:\n\n")
	var sequential []int // the cases timed interleaved
	p("| ratio |")
	for ci, bc := range cases {
		if !bc.parallel {
			sequential = append(sequential, ci)
			p(" %s |", bc.name)
		}
	}
	p("\n|---|%s\n", strings.Repeat("---|", len(sequential)))
	for _, h := range headlines {
		if !h.a.roundTrip || !h.b.roundTrip {
			continue
		}
		p("| %s |", h.what)
		for _, ci := range sequential {
			p(" %s |", summarize(ratiosOf(res[ci], h.a, h.b, func(s sample) float64 { return s.separateNsOp })))
		}
		p("\n")
	}
	p("\n")

	p("## Throughput\n\n")
	p("× PING: ns/op ÷ PING's ns/op in the same round and case (Redis-backed contenders only). × mutex: ns/op ÷ the mutex bucket's. ns/op, B/op and allocs/op: medians over the rounds. Redis CPU (parallel cases): the CPU time redis-server spent per decision (user and system, from `INFO cpu`, over every call of the benchmark), median [range] over the rounds: what a decision costs the shared Redis (ns/op is wall time, which includes Redis's share). One call at a time, Redis's CPU per call is mostly the wake-up and system calls around each round trip, and varied 2× from run to run, so the sequential tables leave it out. admitted: share of the measured calls admitted.\n\n")
	for ci, bc := range cases {
		p("### %s\n\n", capitalize(bc.name))
		p("| limiter | algorithm | × PING | × mutex | ns/op | Redis CPU µs/op | B/op | allocs/op | admitted | errors |\n")
		p("|---|---|---|---|---:|---:|---:|---:|---:|---:|\n")
		for ki, k := range throughputContenders {
			rs := res[ci][ki]
			xping := "—"
			if k.redis {
				xping = summarize(ratios(res[ci], k, cPing)).String()
			}
			xmutex := summarize(ratios(res[ci], k, cMutex)).String()
			var calls, denied, errs int64
			for _, s := range rs {
				calls += s.calls
				denied += s.denied
				errs += s.errs
			}
			adm := "—"
			if calls > 0 {
				adm = fmt.Sprintf("%.1f%%", 100*float64(calls-denied-errs)/float64(calls))
			}
			cpu := "—"
			if k.redis && bc.parallel {
				cpu = summarize(column(rs, func(s sample) float64 { return s.redisCPU })).String()
			}
			p("| %s | %s | %s | %s | %.0f | %s | %.0f | %.0f | %s | %d |\n", k.name, k.kind, xping, xmutex,
				summarize(column(rs, func(s sample) float64 { return s.nsOp })).med, cpu,
				summarize(column(rs, func(s sample) float64 { return s.bytesOp })).med,
				summarize(column(rs, func(s sample) float64 { return s.allocsOp })).med,
				adm, errs)
		}
		for ki, k := range throughputContenders {
			var shares []float64
			for _, s := range res[ci][ki] {
				if s.redisShare >= 0 {
					shares = append(shares, 100*s.redisShare)
				}
			}
			if len(shares) > 0 {
				st := summarize(shares)
				p("\n%s: %.1f%% of the decisions needed a Redis call (median; %.1f–%.1f%%).\n", k.name, st.med, st.lo, st.hi)
			}
		}
		p("\n")
	}

	if len(acc) > 0 {
		writeAccuracy(p, acc)
	}

	p("\n## Notes\n\n")
	p("- throttled's go-redis store reads with GET and writes with a compare-and-swap script (sent with EVAL, not EVALSHA); on one key under parallel load the swaps conflict, and after 10 failed attempts `RateLimitCtx` returns an error. Those calls count in its ns/op and in the *errors* column.\n")
	p("- bucket.Hybrid leases tokens in proportion to each key's observed demand (about 150 ms of it). On one hot key nearly every decision is local; over 10,000 keys each key sees so few calls that its leases are tiny, and many decisions make a Redis call: all of them in the sequential case, where each key is seen about once per 10,000 calls (the share is printed under each table). The DESIGN.md target \"within 2× of the local bucket\" is about the first situation.\n")
	p("- The pipeline window stamps each admission on the client, before the round trip, in whole milliseconds. A call that waits in the client pool or the network is stamped earlier than admissions Redis has already counted, and a millisecond score lets a member leave the window up to 1 ms early. Under concurrent load it therefore over-admits, as the accuracy run shows. window.Redis stamps with the server's TIME, in microseconds, inside the script.\n")
	p("- The mutex bucket is one mutex over one map: the least work per decision, so the floor in the sequential cases. In the parallel cases its single lock is contended by %d goroutines, and limiters with a lock per key or per shard (x/time/rate in a sync.Map, bucket.Local) can beat it there; compare them with each other directly.\n", benchParallelism*runtime.GOMAXPROCS(0))
	p("- redis-server and the client share 2 cores with other work, so the parallel cases are bounded by redis-server's CPU. A script that costs Redis more CPU than a PING shows up as a higher × PING there.\n")
	return w.String()
}

func writeAccuracy(p func(string, ...any), acc []accuracyResult) {
	l := accuracyLimits
	p("## Accuracy\n\n")
	p("Each Redis-backed limiter at %d per second (windows: %d per any %v; token buckets and GCRA: %d per second with a burst of %d; ulule: %d per fixed %v window), ", int(perSecond(l.rate)), l.window, l.per, int(perSecond(l.rate)), l.burst, l.window, l.per)
	p("from %d go-redis clients, each with its own limiter instance (two processes sharing one Redis), %d goroutines each calling one key as fast as they can for %v.\n\n",
		accClients, accGoroutines, accDuration)
	p("- *max in 1 s, conservative*: the most admissions certainly inside one 1 s window: a set counts only if the last one returned less than 1 s after the first one was sent, so the true admission instants fit in less than 1 s however they fell in their send-to-return intervals. Above the bound means the limiter certainly broke its contract.\n")
	p("- *naive*: the most admissions whose calls returned within 1 s of each other (by return time), for comparison; it can exceed the truth by the round-trip jitter.\n")
	p("- *stated bound*: the most admissions in any 1 s that the limiter's own contract allows.\n\n")
	p("| limiter | algorithm | admitted in %v | max in 1 s, conservative | naive | stated bound in any 1 s | over its bound | errors |\n", accDuration)
	p("|---|---|---:|---:|---:|---|---|---:|\n")
	for _, r := range acc {
		p("| %s | %s | %d | %d | %d | %d (%s) | %s | %d |\n", r.name, r.kind, r.total, r.maxCons, r.maxNaive, r.bound, r.boundText, verdict(r, r.maxCons), r.errs)
	}
	p("\n### Boundary probe\n\n")
	p("On a fresh key: one call, then all %d goroutines call as fast as they can from %v to %v after it was sent. *in the burst*: admitted during the burst. *in the first second*: admitted certainly within 1 s of the first admission, the first included (returned before the first call was sent + 1 s). *max in 1 s*: the most certainly inside one 1 s window over the whole probe (conservative, as above).\n\n",
		accClients*accGoroutines, probeStart, probeEnd)
	p("| limiter | algorithm | in the burst | in the first second | max in 1 s | stated bound in any 1 s | over its bound | errors |\n")
	p("|---|---|---:|---:|---:|---:|---|---:|\n")
	for _, r := range acc {
		p("| %s | %s | %d | %d | %d | %d | %s | %d |\n", r.name, r.kind, r.probeBurst, r.probeFirstSecond, r.probeMaxCons, r.bound, verdict(r, r.probeMaxCons), r.probeErrs)
	}
	p("\n")
	var over []string
	for _, r := range acc {
		if r.overRun || r.overProbe {
			over = append(over, r.name)
		}
	}
	if len(over) == 0 {
		p("No limiter exceeded its own stated bound in this run.\n")
	} else {
		p("Over their own stated bound in this run: %s.\n", strings.Join(over, ", "))
	}
	p("ulule/limiter is a fixed window: admitting up to twice its limit in one second across a window boundary is its design, which its bound above allows; against a limit of %d in any 1 s it is over whenever its max exceeds %d.\n", l.window, l.window)
}

// verdict says whether max broke r's stated bound; for a fixed window that
// stayed within it, it also says when max exceeded the per-window limit,
// which the design allows across a boundary.
func verdict(r accuracyResult, max int) string {
	if max > r.bound {
		return fmt.Sprintf("**yes, by %d**", max-r.bound)
	}
	if r.kind == kindFixed && max > accuracyLimits.window {
		return fmt.Sprintf("no; %d over its per-window limit across a boundary, by design", max-accuracyLimits.window)
	}
	return "no"
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// roundTripNames lists the contenders timed interleaved in the sequential
// cases.
func roundTripNames() string {
	var names []string
	for _, k := range throughputContenders {
		if k.roundTrip {
			names = append(names, k.name)
		}
	}
	return strings.Join(names, ", ")
}
