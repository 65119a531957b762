package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestParseRates(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]string // tenant -> quota
		err  string
	}{
		{name: "lines", in: "# tenant quota\n\ninitech 10/1s\n  globex   50/1s burst 100  \n", want: map[string]string{"initech": "10/1s", "globex": "50/1s burst 100"}},
		{name: "no quota", in: "initech\n", err: "line 1: initech: "},
		{name: "bad burst", in: "a 1/s\nb 10/1s burst -2\n", err: "line 2: b: throttle: invalid option Quota.Burst"},
		{name: "twice", in: "a 1/s\na 2/s\n", err: "line 2: tenant a twice"},
		{name: "bad tenant", in: "a.b 1/s\n", err: "line 1: tenant \"a.b\""},
		{name: "tabs and a byte order mark", in: "\uFEFFa\t5/1s\tburst 3\n", want: map[string]string{"a": "5/1s burst 3"}},
		{name: "period below a millisecond", in: "a 1/500us\n", err: "line 1: a: rate 1/500µs: the worker needs a period of at least 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRates(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for tenant, s := range tt.want {
				if got[tenant].String() != s {
					t.Errorf("%s: %v, want %s", tenant, got[tenant], s)
				}
			}
		})
	}
}

func writeRates(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rates.txt")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunRates: a -rates line with a burst sets the tenant's bucket, over
// the jobs file's rate line, and the summary judges it by that burst.
func TestRunRates(t *testing.T) {
	cfg := defaultConfig()
	cfg.Reservations = 0
	cfg.JobsPath = writeJobs(t, 25, "1/1s", 6)
	cfg.RatesPath = writeRates(t, "burst 5/200ms burst 8\n")
	cfg.Rate = "3/200ms"
	cfg.Limiter = familyBucket
	cfg.Timeout = 20 * time.Second
	rep, out := mustWork(t, cfg)
	s := out.String()
	for _, want := range []string{"(burst 5/200ms burst 8)", "(bound 13 = burst 8 + refill 5)", "(bound 6 = burst 3 + refill 3)"} {
		if !strings.Contains(s, want) {
			t.Errorf("the output does not say %q", want)
		}
	}
	checkConsumer(t, rep, map[string]int{"burst": 25, "light": 6})
	if got := byTenant(rep)["burst"].MaxInWindow; got <= 5 || got > 13 {
		t.Errorf("burst: max in window %d, want 6..13 (a burst of 8)", got)
	}
	if !rep.OK() {
		t.Error("report not OK")
	}
}

// TestRunRatesRedisHash: with -redis the quotas are written to a Redis
// hash at start, and an HSET during the run changes a tenant's limit: 25
// jobs at 1/1s would need 25 s; raised to 50/1s a moment after the start,
// they are done in a few.
func TestRunRatesRedisHash(t *testing.T) {
	srv := redistest.Start(t)
	cfg := defaultConfig()
	cfg.Reservations = 0 // bounce: a reservation would keep the old pace
	cfg.JobsPath = writeJobs(t, 25, "5/1s", 6)
	cfg.RatesPath = writeRates(t, "burst 1/1s\n")
	cfg.Rate = "3/200ms"
	cfg.RedisURL = "redis://" + srv.Addr() + "/0"
	cfg.Timeout = 15 * time.Second
	admin := srv.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed := make(chan string, 1)
	go func() {
		defer close(changed)
		for ctx.Err() == nil {
			keys, _ := admin.Keys(ctx, "queuethrottle:example:*:quotas").Result()
			if len(keys) == 1 && admin.HGet(ctx, keys[0], "burst").Val() == "1/1s" {
				time.Sleep(300 * time.Millisecond)
				admin.HSet(ctx, keys[0], "burst", "50/1s")
				changed <- keys[0]
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	rep, out := mustWork(t, cfg)
	key := <-changed
	if key == "" {
		t.Fatal("no quotas hash appeared")
	}
	if got := admin.HGetAll(context.Background(), key).Val(); got["light"] != "3/200ms" || got["burst"] != "50/1s" {
		t.Errorf("hash %s = %v", key, got)
	}
	if !strings.Contains(out.String(), "; quotas in Redis hash "+key) {
		t.Error("the header does not name the hash")
	}
	jobs := map[string]int{"burst": 25, "light": 6}
	checkConsumer(t, rep, jobs)
	if rep.Asynq != nil {
		checkConsumer(t, *rep.Asynq, jobs)
	}
	if rep.Elapsed > 10*time.Second {
		t.Errorf("%v: the raised quota was not used", rep.Elapsed)
	}
	if r := byTenant(rep)["burst"].Rate; r != throttle.PerSecond(50) {
		t.Errorf("the report judges burst by %v, want its quota at the end, 50/1s", r)
	}
}

// TestLoadQuotasRefusesShortPeriods: -rate, like the jobs file's and the
// -rates file's lines, needs a period of at least a millisecond.
func TestLoadQuotasRefusesShortPeriods(t *testing.T) {
	cfg := defaultConfig()
	cfg.Rate = "1/1ns"
	_, err := loadQuotas(cfg, jobsFile{})
	if err == nil || !strings.Contains(err.Error(), "-rate: rate 1/1ns: the worker needs a period of at least 1ms") {
		t.Fatalf("err = %v, want -rate refused", err)
	}
	cfg.Rate = "1/1ms"
	if _, err := loadQuotas(cfg, jobsFile{}); err != nil {
		t.Fatalf("1/1ms: %v", err)
	}
}
