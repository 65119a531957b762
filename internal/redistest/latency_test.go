package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestLatencyProxy(t *testing.T) {
	s := Shared(t)
	p := NewLatencyProxy(t, s, 40*time.Millisecond)
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 80*time.Millisecond {
		t.Fatalf("a round trip through the proxy took %v, want >= 80ms", rtt)
	}
}
