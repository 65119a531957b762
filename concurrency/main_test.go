package concurrency

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestMain stops the shared redis-server after the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

// freshPrefix returns a key prefix no other limiter of this or an earlier
// test run uses, so tests can share one Redis.
func freshPrefix() string { return redistest.Prefix("concurrency") }

// limiter is what Redis and Memory have in common.
type limiter interface {
	Acquire(ctx context.Context, key, id string, lease time.Duration) (throttle.Decision, error)
	Renew(ctx context.Context, key, id string, lease time.Duration) error
	Release(ctx context.Context, key, id string) error
}

var (
	_ limiter = (*Redis)(nil)
	_ limiter = (*Memory)(nil)
)

// newLimiterFunc returns a limiter of limit slots per key; c, if not nil,
// is its clock.
type newLimiterFunc func(t *testing.T, limit int, c throttle.Clock) limiter

func newTestRedis(t *testing.T, c redis.Scripter, limit int, opts ...Option) *Redis {
	t.Helper()
	l, err := NewRedis(c, limit, append([]Option{WithPrefix(freshPrefix()), WithTimeout(redistest.CallTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// implementations are the limiters every conformance test runs against.
var implementations = []struct {
	name string
	new  newLimiterFunc
}{
	{"memory", func(t *testing.T, limit int, c throttle.Clock) limiter {
		m, err := NewMemory(limit, WithClock(c))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}},
	{"redis", func(t *testing.T, limit int, c throttle.Clock) limiter {
		return newTestRedis(t, redistest.Shared(t).Client(t), limit, WithClock(c))
	}},
}
