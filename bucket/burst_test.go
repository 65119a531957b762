package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/hog"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestBurstDialsNothing is window's: a burst of 500 calls on one key, on
// a fresh client that has made one call, opens no connection (NewRedis
// opened the two that coalesced calls use at once) and admits exactly the
// burst. Without them, beside two CPU-bound processes, 8 of 25 bursts had
// errors (BenchmarkBurstBesideHogs).
func TestBurstDialsNothing(t *testing.T) {
	rc := redistest.Shared(t).Client(t)
	const burst = 100
	l, err := NewRedis(rc, throttle.Rate{Count: 1, Per: time.Hour}, burst, WithPrefix(freshPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	before := rc.PoolStats().Misses
	if admitted := throttletest.Burst(t, l, "hot", 500); admitted != burst {
		t.Fatalf("%d admitted of 500 with a burst of %d and no refill to speak of, want exactly %d", admitted, burst, burst)
	}
	if dialed := rc.PoolStats().Misses - before; dialed != 0 {
		t.Errorf("the burst opened %d connections, want 0 (NewRedis opens them)", dialed)
	}
}

// BenchmarkBurstBesideHogs is window's: 500 calls at once on one key
// beside two CPU-bound processes, on a fresh client each burst; it
// reports the calls that failed per burst (the floor: 0).
func BenchmarkBurstBesideHogs(b *testing.B) {
	srv := redistest.Shared(b)
	hog.Start(b, 2)
	failed := 0
	for b.Loop() {
		l, err := NewRedis(srv.Client(b), throttle.Rate{Count: 1, Per: time.Hour}, 100, WithPrefix(freshPrefix()))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = l.Allow(context.Background(), "first")
		failed += throttletest.RunBurst(l, "hot", 500).Failed
	}
	b.ReportMetric(float64(failed)/float64(b.N), "failed/burst")
}
