package window

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/hog"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestBurstDialsNothing: a limiter on a fresh client that has made one
// call (a service that has just started) takes a burst of 500 calls on
// one key without opening a connection: NewRedis opened the two that
// coalesced calls use at once. Without them the burst's second call in
// flight dialed inside its 50 ms timeout, and on a starved CPU the dial
// and go-redis's handshake outlasted it (BenchmarkBurstBesideHogs: 5 of
// 40 bursts had errors beside two CPU-bound processes, now none).
func TestBurstDialsNothing(t *testing.T) {
	rc := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 100, Per: time.Minute}
	l, err := NewRedis(rc, r, WithPrefix(freshPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	before := rc.PoolStats().Misses
	if admitted := throttletest.Burst(t, l, "hot", 500); admitted != r.Count {
		t.Fatalf("%d admitted of 500 at a limit of %v, want exactly %d", admitted, r, r.Count)
	}
	if dialed := rc.PoolStats().Misses - before; dialed != 0 {
		t.Errorf("the burst opened %d connections, want 0 (NewRedis opens them)", dialed)
	}
}

// BenchmarkBurstBesideHogs runs 500 calls at once on one key, beside two
// CPU-bound processes, at the default timeout, each burst on a fresh
// client that has made one call; it reports the calls that failed per
// burst (the floor: 0).
func BenchmarkBurstBesideHogs(b *testing.B) {
	srv := redistest.Shared(b)
	hog.Start(b, 2)
	failed := 0
	for b.Loop() {
		l, err := NewRedis(srv.Client(b), throttle.Rate{Count: 100, Per: time.Minute}, WithPrefix(freshPrefix()))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = l.Allow(context.Background(), "first")
		failed += throttletest.RunBurst(l, "hot", 500).Failed
	}
	b.ReportMetric(float64(failed)/float64(b.N), "failed/burst")
}
