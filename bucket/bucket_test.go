package bucket

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestDiv(t *testing.T) {
	check := func(a, b int64) {
		t.Helper()
		inv := 1 / float64(b)
		if got, want := floorDiv(a, b, inv), a/b; got != want {
			t.Fatalf("floorDiv(%d, %d) = %d, want %d", a, b, got, want)
		}
		want := a / b
		if a%b != 0 {
			want++
		}
		if got := ceilDiv(a, b, inv); got != want {
			t.Fatalf("ceilDiv(%d, %d) = %d, want %d", a, b, got, want)
		}
	}
	edges := []int64{0, 1, 2, 3, 7, 999_999, 1_000_000, 1_000_001, 1 << 26, 1<<53 - 1, 1 << 53, 3_333_333, 2_001_000}
	for _, a := range edges {
		for _, b := range edges[1:] {
			check(a, b)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 1_000_000; i++ {
		b := r.Int64N(1<<r.IntN(54)) + 1
		q := r.Int64N(1<<53/b + 1)
		a := min(q*b+r.Int64N(b)-r.Int64N(2), 1<<53)
		check(max(a, 0), b)
	}
}

func TestTypedNilClient(t *testing.T) {
	var c *redis.Client
	if _, err := NewRedis(c, throttle.PerSecond(1), 1); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("NewRedis((*redis.Client)(nil)) error = %v, want ErrInvalidOption", err)
	}
	if _, err := NewHybrid(c, throttle.PerSecond(1), 1); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("NewHybrid((*redis.Client)(nil)) error = %v, want ErrInvalidOption", err)
	}
}

// TestNewRedisClientTimeouts checks the rule NewRedis shares with NewHybrid
// (and window and concurrency): a go-redis client without
// ContextTimeoutEnabled is refused unless its read and write timeouts are
// within WithTimeout.
func TestNewRedisClientTimeouts(t *testing.T) {
	mk := func(c interface {
		redis.Scripter
		Close() error
	}) redis.Scripter {
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	short := 20 * time.Millisecond
	tests := []struct {
		name string
		c    redis.Scripter
		opts []Option
		ok   bool
	}{
		{"Client with ContextTimeoutEnabled", mk(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})), nil, true},
		{"Client without", mk(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})), nil, false},
		{"ClusterClient without", mk(redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})), nil, false},
		{"Ring without", mk(redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})), nil, false},
		{"short timeouts within WithTimeout", mk(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: short, WriteTimeout: short})), []Option{WithTimeout(short)}, true},
		{"short timeouts above WithTimeout", mk(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: short, WriteTimeout: short})), []Option{WithTimeout(short / 2)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewRedis(tt.c, throttle.PerSecond(10), 10, tt.opts...)
			if tt.ok {
				if err != nil {
					t.Fatalf("NewRedis = %v", err)
				}
				return
			}
			var oe *throttle.OptionError
			if !errors.As(err, &oe) || oe.Field != "client" || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
				t.Fatalf("NewRedis = %v, want an OptionError for client naming ContextTimeoutEnabled", err)
			}
		})
	}
}
