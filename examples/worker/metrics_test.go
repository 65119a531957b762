package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRunMetrics starts a short run with -metrics on a free port and GETs
// the metrics while it runs: the decisions counter is there with its
// outcome and source labels, admitted and reserved, and the latency
// histogram.
func TestRunMetrics(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 30, "10/1s", 20) // the burst takes 2 s
	cfg.Rate = "20/1s"
	cfg.Timeout = 20 * time.Second
	cfg.Metrics = freeAddr(t)
	scrapeDuringRun(t, cfg,
		`(?m)^throttle_decisions_total\{[^}]*throttle_key="burst"[^}]*throttle_outcome="admitted"[^}]*throttle_source="local"[^}]*\} [1-9]`,
		`(?m)^throttle_decisions_total\{[^}]*throttle_key="burst"[^}]*throttle_outcome="reserved"[^}]*throttle_source="local"[^}]*\} [1-9]`,
		`(?m)^throttle_decision_duration_seconds_bucket\{[^}]*throttle_key="burst"`,
		`(?m)^throttle_dispositions_total\{[^}]*throttle_disposition="wait"[^}]*throttle_key="burst"[^}]*\} [1-9]`,
	)
}

// TestRunMetricsHybrid: with -limiter hybrid, -metrics also serves the
// Hybrid's own metrics (bucket.HybridDecisionsMetric and the latency of
// its Redis calls) beside the Gate's.
func TestRunMetricsHybrid(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 30, "10/1s", 20)
	cfg.Rate = "20/1s"
	cfg.Limiter = familyHybrid
	cfg.RedisURL = "redis://" + redistest.Start(t).Addr() + "/0"
	cfg.Timeout = 30 * time.Second
	cfg.Metrics = freeAddr(t)
	scrapeDuringRun(t, cfg,
		`(?m)^throttle_decisions_total\{[^}]*throttle_outcome="admitted"[^}]*\} [1-9]`,
		`(?m)^throttle_hybrid_decisions_total\{[^}]*otel_scope_name="github.com/queuethrottle/queuethrottle/bucket"[^}]*throttle_outcome="admitted"[^}]*throttle_source="(local|redis)"[^}]*\} [1-9]`,
		`(?m)^throttle_hybrid_redis_duration_seconds_bucket\{[^}]*throttle_hybrid_op="lease"`,
	)
}

// scrapeDuringRun runs the worker with cfg (cfg.Metrics set) and GETs its
// metrics until every pattern matches, failing if the run ends first, if
// a pattern never matches within 10 s, if the run fails, or if the metrics
// are still served after it.
func scrapeDuringRun(t *testing.T, cfg config, patterns ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var out syncWriter
	out.w = &bytes.Buffer{}
	go func() {
		_, err := work(ctx, cfg, &out)
		done <- err
	}()

	var want []*regexp.Regexp
	for _, p := range patterns {
		want = append(want, regexp.MustCompile(p))
	}
	var body []byte
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		body = get(t, "http://"+cfg.Metrics+"/metrics")
		ok := body != nil
		for _, re := range want {
			ok = ok && re.Match(body)
		}
		if ok {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the run ended (%v) before the metrics showed:\n%s", err, body)
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, re := range want {
		if !re.Match(body) {
			t.Errorf("no line matching %s in:\n%s", re, body)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if get(t, "http://"+cfg.Metrics+"/metrics") != nil {
		t.Error("the metrics are still served after the run")
	}
}

// TestRunMetricsLinger: with -linger the metrics, per tenant, are still
// served after the summary, until the linger ends; without -metrics,
// -linger is refused.
func TestRunMetricsLinger(t *testing.T) {
	cfg := defaultConfig()
	cfg.JobsPath = writeJobs(t, 5, "10/1s", 2)
	cfg.Timeout = 20 * time.Second
	cfg.Metrics = freeAddr(t)
	cfg.Linger = 3 * time.Second
	done := make(chan error, 1)
	var out syncWriter
	var buf bytes.Buffer
	out.w = &buf
	go func() {
		_, err := work(context.Background(), cfg, &out)
		done <- err
	}()
	lingering := func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		return bytes.Contains(buf.Bytes(), []byte("(-linger)"))
	}
	for deadline := time.Now().Add(15 * time.Second); !lingering(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the run never said it lingers")
		}
	}
	body := get(t, "http://"+cfg.Metrics+"/metrics")
	if !regexp.MustCompile(`(?m)^throttle_decisions_total\{[^}]*throttle_key="light"[^}]*\} [1-9]`).Match(body) {
		t.Errorf("after the summary, no decisions of tenant light in:\n%s", body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if get(t, "http://"+cfg.Metrics+"/metrics") != nil {
		t.Error("the metrics are still served after the linger")
	}
	cfg.Metrics = ""
	if _, err := work(context.Background(), cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "-linger") {
		t.Errorf("-linger without -metrics: %v, want an error naming -linger", err)
	}
}

// get returns the body of a 200 response to url, or nil.
func get(t *testing.T, url string) []byte {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	return b
}

func TestProcessMetricsAddr(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"localhost:9464", "localhost:9466"},
		{"127.0.0.1:0", "127.0.0.1:0"},
		{":9000", ":9002"},
	} {
		got, err := processMetricsAddr(tt.in, 2)
		if err != nil || got != tt.want {
			t.Errorf("processMetricsAddr(%q, 2) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := processMetricsAddr("nocolon", 1); err == nil {
		t.Error("no error for an address without a port")
	}
}
