package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestJain(t *testing.T) {
	for _, tt := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{10, 10}, 1},
		{[]float64{10, 0}, 0.5},
		{[]float64{1, 0, 0, 0}, 0.25},
		{[]float64{3, 1}, 0.8},
	} {
		if got := jain(tt.xs); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("jain(%v) = %v, want %v", tt.xs, got, tt.want)
		}
	}
}

func TestMeasureFairness(t *testing.T) {
	origin := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return origin.Add(time.Duration(ms) * time.Millisecond) }
	var jobs []jobTimes
	// gold (weight 3) and tin (weight 1) both backlogged from 0 s to 4 s,
	// starting 30 and 10 a second: fair to their weights.
	for s := range 4 {
		for i := range 30 {
			jobs = append(jobs, jobTimes{"gold", at(0), at(s*1000 + i*30)})
		}
		for i := range 10 {
			jobs = append(jobs, jobTimes{"tin", at(0), at(s*1000 + i*90)})
		}
	}
	// A tenant held by its rate (5/1s, starting 5 a second) is not
	// backlogged on the handlers.
	for s := range 4 {
		for i := range 5 {
			jobs = append(jobs, jobTimes{"slow", at(0), at(s*1000 + i*200)})
		}
	}
	weights := map[string]float64{"gold": 3, "tin": 1, "slow": 1}
	rates := map[string]throttle.Rate{"gold": throttle.PerSecond(150), "tin": throttle.PerSecond(150), "slow": throttle.PerSecond(5)}
	weight := func(t string) float64 { return weights[t] }
	rateOf := func(t string) throttle.Rate { return rates[t] }
	starts := startsPerSecond(jobs, origin)
	if got := fmt.Sprint(starts["gold"]); got != "[30 30 30 30]" {
		t.Errorf("gold's starts per second %s", got)
	}
	f := measureFairness(jobs, origin, starts, weight, rateOf)
	if f.Seconds != 2 || f.Min < 0.999 {
		t.Errorf("fairness %+v, want 2 seconds (1 and 2: backlogged through each) at 1", f)
	}
	// Unweighted, the same starts are unfair: 30 against 10.
	f = measureFairness(jobs, origin, starts, func(string) float64 { return 1 }, rateOf)
	if want := jain([]float64{30, 10}); math.Abs(f.Min-want) > 1e-9 {
		t.Errorf("fairness without weights %+v, want min %v", f, want)
	}
}

// fairTrace writes a trace where 8 handlers of 100 ms are the bottleneck:
// two floods at t=0 (gold weight 3, tin weight 1, at a rate far above what
// the handlers run), beside a calm tenant sending a job every 100 ms.
func fairTrace(t *testing.T) string {
	var b strings.Builder
	b.WriteString(`{"tenant":"gold","rate":"1000/1s","weight":3}` + "\n")
	b.WriteString(`{"tenant":"tin","rate":"1000/1s"}` + "\n")
	for i := range 160 {
		fmt.Fprintf(&b, `{"id":"gold-%d","tenant":"gold","at_ms":0}`+"\n", i)
		fmt.Fprintf(&b, `{"id":"tin-%d","tenant":"tin","at_ms":0}`+"\n", i)
	}
	for i := range 25 {
		fmt.Fprintf(&b, `{"id":"calm-%d","tenant":"calm","at_ms":%d}`+"\n", i, i*100)
	}
	path := filepath.Join(t.TempDir(), "fair.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunFairShares runs fairTrace: with the fair shares (a consumer per
// tenant) the calm tenant starts at once, nothing is NAKed, each job is
// delivered once, the floods' starts go about 3 to 1 and the report says
// so (weight, starts_per_s, fairness); first come, first served
// (-fair=false) the calm tenant waits behind the floods.
func TestRunFairShares(t *testing.T) {
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			cfg := defaultConfig()
			cfg.JobsPath = fairTrace(t)
			cfg.Fair = fair
			cfg.Handlers = 8
			cfg.Work = 100 * time.Millisecond
			cfg.Timeout = 30 * time.Second
			cfg.Report = filepath.Join(t.TempDir(), "report.json")
			if err := run(context.Background(), cfg, &strings.Builder{}); err != nil {
				t.Fatal(err)
			}
			var r jsonReport
			b, err := os.ReadFile(cfg.Report)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			c := r.Consumers[0]
			ts := map[string]jsonTenant{}
			for _, tt := range c.Tenants {
				ts[tt.Tenant] = tt
				sum := 0
				for _, n := range tt.StartsPerS {
					sum += n
				}
				if sum != tt.Handled {
					t.Errorf("%s: starts_per_s %v add up to %d, handled %d", tt.Tenant, tt.StartsPerS, sum, tt.Handled)
				}
			}
			gold, tin, calm := ts["gold"], ts["tin"], ts["calm"]
			if gold.Weight != 3 || tin.Weight != 1 || calm.Weight != 1 {
				t.Errorf("weights gold %v, tin %v, calm %v; want 3, 1, 1", gold.Weight, tin.Weight, calm.Weight)
			}
			if !fair {
				if calm.WaitP50MS < 1000 {
					t.Errorf("first come, first served: calm's p50 wait %v ms, want it behind the floods (over 1 s)", calm.WaitP50MS)
				}
				return
			}
			if calm.WaitP99MS > 300 {
				t.Errorf("calm's p99 wait %v ms beside the floods, want it about at once (under 300 ms)", calm.WaitP99MS)
			}
			if n := gold.Naks + tin.Naks + calm.Naks; n != 0 || c.Deliveries != 345 {
				t.Errorf("%d NAKs, %d deliveries; want 0 and 345 (each job pulled once, when it can start)", n, c.Deliveries)
			}
			// Both floods wait through seconds 1 and 2 at least; gold's
			// starts over them are about 3 times tin's.
			g, tn := 0, 0
			for s := 1; s <= 2; s++ {
				g += gold.StartsPerS[s]
				tn += tin.StartsPerS[s]
			}
			if ratio := float64(g) / float64(tn); ratio < 2.4 || ratio > 3.6 {
				t.Errorf("gold %d, tin %d starts in seconds 1-2: ratio %.2f, want about 3", g, tn, ratio)
			}
			// Under load the publisher may spread the floods so that only
			// one whole second has both backlogged: one is enough to judge.
			if c.Fairness.Seconds < 1 || c.Fairness.JainMin < 0.9 {
				t.Errorf("fairness %+v, want a second or more with Jain's index about 1", c.Fairness)
			}
		})
	}
}

func TestHandlersBounds(t *testing.T) {
	for _, n := range []int{0, -1, maxHandlers + 1} {
		cfg := defaultConfig()
		cfg.JobsPath = "../../testdata/jobs.jsonl"
		cfg.Handlers = n
		_, err := work(context.Background(), cfg, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), "-handlers: must be from 1 to 1024") {
			t.Errorf("-handlers %d: err %v", n, err)
		}
	}
}
