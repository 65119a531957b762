package bucket

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// burstLimiter is the limiter of the burst checks: a burst of 100, no
// refill to speak of.
func burstLimiter(c redis.Scripter, opts ...Option) (throttle.Limiter, error) {
	return NewRedis(c, throttle.Rate{Count: 1, Per: time.Hour}, 100, append(opts, WithPrefix(freshPrefix()))...)
}

// TestBurstDialsNothing is window's: a burst of 500 calls on one key, on
// a fresh client that has made one call, opens no connection and admits
// exactly the burst. Without the connections NewRedis opens, 8 of 25
// bursts had errors beside two CPU-bound processes
// (BenchmarkBurstBesideHogs).
func TestBurstDialsNothing(t *testing.T) {
	// The tests' generous timeout: whether the default suffices under
	// load is a matter of speed, measured by BenchmarkBurstBesideHogs.
	redistest.Shared(t).CheckBurstDialsNothing(t, func(c redis.Scripter) (throttle.Limiter, error) {
		return burstLimiter(c, WithTimeout(redistest.CallTimeout))
	}, 100)
}

func BenchmarkBurstBesideHogs(b *testing.B) {
	redistest.Shared(b).BenchmarkBurstBesideHogs(b, func(c redis.Scripter) (throttle.Limiter, error) { return burstLimiter(c) })
}
