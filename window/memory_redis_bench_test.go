package window

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// BenchmarkRedisBytesPerUnit fills 1,000 keys to a limit of 100 with
// AllowN (one unit a call) and reports what Redis holds for them, by
// MEMORY USAGE of every key the limiter wrote, per admitted unit
// ("bytes/unit"; the floor of issue 28: at most 24). The time per op is
// not the figure.
func BenchmarkRedisBytesPerUnit(b *testing.B) {
	const keys, limit = 1000, 100
	srv := redistest.Shared(b)
	client := srv.Client(b)
	ctx := context.Background()
	var perUnit float64
	for b.Loop() {
		prefix := freshPrefix()
		l, err := NewRedis(client, throttle.Rate{Count: limit, Per: time.Hour}, WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([]throttle.Request, 0, keys)
		for k := range keys {
			reqs = append(reqs, throttle.Request{Key: "tenant-" + strconv.Itoa(k), N: 1})
		}
		for range limit {
			ds, err := l.AllowBatch(ctx, reqs)
			if err != nil {
				b.Fatal(err)
			}
			for _, d := range ds {
				if d.Err != nil || !d.Allowed {
					b.Fatalf("not admitted: %+v", d)
				}
			}
		}
		var bytes int64
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			n, err := client.MemoryUsage(ctx, iter.Val()).Result()
			if err != nil {
				b.Fatal(err)
			}
			bytes += n
		}
		if err := iter.Err(); err != nil {
			b.Fatal(err)
		}
		perUnit = float64(bytes) / (keys * limit)
	}
	b.ReportMetric(perUnit, "bytes/unit")
}
