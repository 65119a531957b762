package window

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// burstLimiter is the limiter of the burst checks: 100 a minute.
func burstLimiter(c redis.Scripter, opts ...Option) (throttle.Limiter, error) {
	return NewRedis(c, throttle.Rate{Count: 100, Per: time.Minute}, append(opts, WithPrefix(freshPrefix()))...)
}

// TestBurstDialsNothing: a burst of 500 calls on one key, on a fresh
// client that has made one call, opens no connection: NewRedis opened the
// two that coalesced calls use at once. Without them the burst's second
// call in flight dialed inside its 50 ms timeout, and on a starved CPU
// the dial and go-redis's handshake outlasted it (BenchmarkBurstBesideHogs:
// 5 of 40 bursts had errors beside two CPU-bound processes, now none).
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
