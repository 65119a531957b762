package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
)

// clusterSize is the number of masters StartCluster starts.
const clusterSize = 3

// Cluster is a Redis Cluster of three masters and no replicas, each a
// [Server] on its own loopback ports. Its methods are safe for concurrent
// use.
type Cluster struct {
	nodes []*Server
	owner [rediskey.Slots]uint8 // slot -> index in nodes, as assigned at start
}

// StartCluster starts a three-master Redis Cluster for t and stops it at
// t's cleanup. It starts three redis-server processes with cluster mode on,
// joins them with "redis-cli --cluster create" (the slots split evenly, no
// replicas) and returns once every node reports cluster_state:ok. It skips
// t (or fails it under CI=true) when redis-server or redis-cli is not
// installed; redis-cli is looked up as $REDIS_CLI, then on $PATH.
//
// The nodes run with cluster-node-timeout 1000 ms and
// cluster-require-full-coverage no: with the default (yes), a cluster
// whose master is down refuses every key, on every node, once the others
// notice (after the node timeout), whereas a test of a dead master wants
// the keys of the other masters to keep working. There are no replicas,
// so nothing fails over: a stopped node's slots stay unserved until it is
// restarted (Node(i).Restart, which brings it back empty, with its cluster
// identity and slots).
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := lookBinary(t)
	cli := lookTool(t, "REDIS_CLI", "redis-cli")
	c := &Cluster{}
	t.Cleanup(c.shutdown)
	for range clusterSize {
		s, err := newServerArgs(bin, clusterArgs)
		if err != nil {
			t.Fatalf("redistest: cluster node: %v", err)
		}
		c.nodes = append(c.nodes, s)
	}
	if err := c.create(cli); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// clusterArgs returns the cluster-mode arguments of a node on port; the
// cluster bus gets a free port of its own (the default, port + 10000, may
// be taken or beyond 65535).
func clusterArgs(port int) ([]string, error) {
	bus, err := freePort()
	if err != nil {
		return nil, err
	}
	if bus == port {
		return nil, fmt.Errorf("bus port %d is the client port", bus)
	}
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-port", strconv.Itoa(bus),
		"--cluster-config-file", "nodes-" + strconv.Itoa(port) + ".conf",
		"--cluster-node-timeout", "1000",
		"--cluster-require-full-coverage", "no",
	}, nil
}

// create joins the nodes into one cluster, waits until every node says
// cluster_state:ok and records which node owns each slot.
func (c *Cluster) create(cli string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w: %s", err, strings.TrimSpace(string(out)))
	}

	clients := make([]*redis.Client, len(c.nodes))
	for i, s := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true})
		defer clients[i].Close()
	}
	for i := 0; i < len(clients); {
		info, err := clients[i].ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			i++
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster node %s not ok within %v: %v %s", c.nodes[i].addr(), startTimeout, err, info)
		case <-time.After(10 * time.Millisecond):
		}
	}

	shards, err := clients[0].ClusterShards(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER SHARDS: %w", err)
	}
	covered := 0
	for _, sh := range shards {
		if len(sh.Nodes) != 1 {
			return fmt.Errorf("CLUSTER SHARDS: a shard of %d nodes, want 1", len(sh.Nodes))
		}
		i := c.index(net.JoinHostPort(sh.Nodes[0].IP, strconv.FormatInt(sh.Nodes[0].Port, 10)))
		if i < 0 {
			return fmt.Errorf("CLUSTER SHARDS names an unknown node %s:%d", sh.Nodes[0].IP, sh.Nodes[0].Port)
		}
		for _, r := range sh.Slots {
			for slot := r.Start; slot <= r.End; slot++ {
				c.owner[slot] = uint8(i)
			}
			covered += int(r.End - r.Start + 1)
		}
	}
	if covered != rediskey.Slots {
		return fmt.Errorf("CLUSTER SLOTS covers %d slots, want %d", covered, rediskey.Slots)
	}
	return nil
}

func (c *Cluster) index(addr string) int {
	for i, s := range c.nodes {
		if s.addr() == addr {
			return i
		}
	}
	return -1
}

// shutdown stops every node and removes their directories.
func (c *Cluster) shutdown() {
	for _, s := range c.nodes {
		s.shutdown()
	}
}

// Addrs returns the nodes' "127.0.0.1:port" addresses, node 0 first.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.addr()
	}
	return addrs
}

// Node returns node i (0, 1 or 2), for instance to Stop it. Restart brings
// it back into the cluster with its slots but no data.
func (c *Cluster) Node(i int) *Server { return c.nodes[i] }

// MasterFor returns the index of the node that serves the Redis key key:
// the owner of its hash slot (rediskey.Slot) when the cluster started.
func (c *Cluster) MasterFor(key string) int { return int(c.owner[rediskey.Slot(key)]) }

// Client returns a new cluster client, closed at t's cleanup, set up so
// that a dead master fails calls fast instead of stalling them: context
// deadlines bound every call (ContextTimeoutEnabled), dials give up after
// 100 ms and a single attempt, reads and writes after 200 ms, and a
// failed call (or a MOVED redirect) is retried at most once, at once.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		ContextTimeoutEnabled: true,
		MaxRedirects:          1,
		MaxRetries:            -1,
		MinRetryBackoff:       -1,
		MaxRetryBackoff:       -1,
		DialTimeout:           100 * time.Millisecond,
		DialerRetries:         1,
		ReadTimeout:           200 * time.Millisecond,
		WriteTimeout:          200 * time.Millisecond,
		PoolTimeout:           200 * time.Millisecond,
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
