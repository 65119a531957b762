package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
)

func TestCluster(t *testing.T) {
	start := time.Now()
	c := StartCluster(t)
	t.Logf("cluster up in %v", time.Since(start))
	if got := len(c.Addrs()); got != 3 {
		t.Fatalf("Addrs() has %d nodes, want 3", got)
	}
	cc := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Slot and MasterFor agree with the server and with go-redis.
	keys := []string{"", "a", "{", "}", "{}", "a{}b", "{a}", "x{a}y", "x{a}{b}", "{{a}}", "a}{b}", "\xff\x00", "Zürich", "東京:1", strings.Repeat("k", 300)}
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("key:{%d}", i))
	}
	perNode := make([]int, 3)
	for _, k := range keys {
		want, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := rediskey.Slot(k); int64(got) != want {
			t.Fatalf("rediskey.Slot(%q) = %d, want %d", k, got, want)
		}
		i := c.MasterFor(k)
		if k != "" { // go-redis sends "" to a random slot
			m, err := cc.MasterForKey(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if addr := m.Options().Addr; addr != c.Addrs()[i] {
				t.Fatalf("MasterFor(%q) = %d (%s), go-redis says %s", k, i, c.Addrs()[i], addr)
			}
		}
		perNode[i]++
		if err := cc.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatalf("SET %q: %v", k, err)
		}
	}
	for i, n := range perNode {
		if n == 0 {
			t.Fatalf("no key on node %d (%v)", i, perNode)
		}
	}

	// A dead master fails its own keys, fast, and no others.
	c.Node(1).Stop()
	for _, k := range keys[1:] {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		t0 := time.Now()
		err := cc.Get(cctx, k).Err()
		ccancel()
		if c.MasterFor(k) == 1 {
			if err == nil {
				t.Fatalf("GET %q on the stopped node succeeded", k)
			}
			if d := time.Since(t0); d > 500*time.Millisecond {
				t.Fatalf("GET %q on the stopped node took %v: %v", k, d, err)
			}
		} else if err != nil {
			t.Fatalf("GET %q on a live node: %v", k, err)
		}
	}
	t.Logf("dead-node checks done at %v", time.Since(start))
	if err := c.Node(1).Restart(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if c.MasterFor(k) != 1 {
			continue
		}
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if err = cc.Set(ctx, k, "v", time.Minute).Err(); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("SET %q after Restart: %v", k, err)
		}
	}
	t.Logf("restarted node serves again at %v", time.Since(start))
}

func TestClusterMissingCLISkips(t *testing.T) {
	skipped := false
	t.Run("no redis-cli", func(t *testing.T) {
		t.Setenv("REDIS_SERVER", lookBinary(t))
		t.Setenv("PATH", t.TempDir())
		t.Setenv("REDIS_CLI", "")
		t.Setenv("CI", "")
		defer func() { skipped = t.Skipped() }()
		StartCluster(t)
	})
	if !skipped {
		t.Fatal("StartCluster without redis-cli did not skip")
	}
}
