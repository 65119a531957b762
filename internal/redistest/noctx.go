package redistest

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// NoContextClient, NoContextCluster and NoContextRing return clients
// created without ContextTimeoutEnabled (never dialled), which the Redis
// limiters must refuse; ShortTimeoutsClient one without it but with 20 ms
// read and write timeouts. Each is closed when the test ends.
func NoContextClient(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NoContextCluster: see NoContextClient.
func NoContextCluster(t testing.TB) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NoContextRing: see NoContextClient.
func NoContextRing(t testing.TB) *redis.Ring {
	c := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ShortTimeoutsClient: see NoContextClient.
func ShortTimeoutsClient(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: 20 * time.Millisecond, WriteTimeout: 20 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
