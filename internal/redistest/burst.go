package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/hog"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// burstCalls is the size of the bursts below: 500 calls at once on one key.
const burstCalls = 500

// CheckBurstDialsNothing builds a limiter with build (at a timeout that
// holds under a loaded test run, such as CallTimeout) on a fresh client of
// s, makes one call (a service that has just started), then a burst of
// 500 calls at once on one key: none may fail, want must be admitted, and
// the burst must open no connection (the constructor opens those that
// coalesced calls use at once; a connection opened inside a call spends
// the call's timeout on TCP and the handshake).
func (s *Server) CheckBurstDialsNothing(t *testing.T, build func(redis.Scripter) (throttle.Limiter, error), want int) {
	t.Helper()
	rc := s.Client(t)
	l, err := build(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowN(context.Background(), "first", 1); err != nil {
		t.Fatal(err)
	}
	before := rc.PoolStats().Misses
	if admitted := throttletest.Burst(t, l, "hot", burstCalls); admitted != want {
		t.Fatalf("%d admitted of %d, want exactly %d", admitted, burstCalls, want)
	}
	if dialed := rc.PoolStats().Misses - before; dialed != 0 {
		t.Errorf("the burst opened %d connections, want 0 (the constructor opens them)", dialed)
	}
}

// BenchmarkBurstBesideHogs runs, per iteration, a burst of 500 calls at
// once on one key beside two CPU-bound processes (hog.Start), on a
// limiter built by build on a fresh client of s that has made one call,
// and reports the calls that failed per burst (the floor: 0, at the
// default timeout).
func (s *Server) BenchmarkBurstBesideHogs(b *testing.B, build func(redis.Scripter) (throttle.Limiter, error)) {
	hog.Start(b, 2)
	failed := 0
	for b.Loop() {
		l, err := build(s.Client(b))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = l.AllowN(context.Background(), "first", 1)
		failed += throttletest.RunBurst(l, "hot", burstCalls).Failed
	}
	b.ReportMetric(float64(failed)/float64(b.N), "failed/burst")
}
