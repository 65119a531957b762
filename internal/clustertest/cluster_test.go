package clustertest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// Every family limits an identity to 3 admissions in a minute: a window
// of 3 per minute, or a bucket of burst 3 refilling 1 per minute.
const (
	limit = 3
	calls = 5 // per identity
)

var perMinute = throttle.Rate{Count: 1, Per: time.Minute}

// family is one Redis-backed limiter family. newLimiter builds one on c
// with keys under prefix and a per-call timeout of timeout (where the
// family has one); opts are extra bucket options (WithLocalShare).
type family struct {
	name       string
	limit      int  // Decision.Limit: the window's Count, the bucket's refill Count
	hybrid     bool // decisions may be local, so only bounds are exact
	newLimiter func(t *testing.T, c redis.Scripter, prefix string, timeout time.Duration, opts ...bucket.Option) throttle.Limiter
}

var families = []family{
	{name: "window", limit: limit, newLimiter: func(t *testing.T, c redis.Scripter, prefix string, timeout time.Duration, _ ...bucket.Option) throttle.Limiter {
		l, err := window.NewRedis(c, throttle.Rate{Count: limit, Per: time.Minute}, window.WithPrefix(prefix), window.WithTimeout(timeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}},
	{name: "bucket", limit: perMinute.Count, newLimiter: func(t *testing.T, c redis.Scripter, prefix string, timeout time.Duration, _ ...bucket.Option) throttle.Limiter {
		l, err := bucket.NewRedis(c, perMinute, limit, bucket.WithPrefix(prefix), bucket.WithTimeout(timeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}},
	{name: "hybrid", limit: perMinute.Count, hybrid: true, newLimiter: func(t *testing.T, c redis.Scripter, prefix string, timeout time.Duration, opts ...bucket.Option) throttle.Limiter {
		opts = append([]bucket.Option{bucket.WithPrefix(prefix), bucket.WithTimeout(timeout)}, opts...)
		h, err := bucket.NewHybrid(c, perMinute, limit, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close(context.Background()) })
		return h
	}},
}

// identities returns n identities: throttletest.OddKeys (empty, braces,
// colons, escapes, binary, long) and generated ones with braces, colons
// and non-ASCII text.
func identities(n int) []string {
	ids := throttletest.OddKeys()
	patterns := []string{"tenant:%d", "{tenant}:%d", "a}{%d", "{%d}", "Zürich/%d", "東京:{%d}", "\xff\x00%d", "%%7B%d%%7D", "job:%d:}"}
	for i := 0; len(ids) < n; i++ {
		ids = append(ids, fmt.Sprintf(patterns[i%len(patterns)], i))
	}
	return ids[:n]
}

// byMaster groups ids by the master that holds their keys, checking that
// every master holds some.
func byMaster(t *testing.T, c *redistest.Cluster, ids []string) [][]string {
	t.Helper()
	groups := make([][]string, len(c.Addrs()))
	slots := map[int]bool{}
	for _, id := range ids {
		key := rediskey.Key("", id) // the tag, and so the slot, ignore the prefix
		slots[rediskey.Slot(key)] = true
		i := c.MasterFor(key)
		groups[i] = append(groups[i], id)
	}
	if len(slots) < len(ids)/2 {
		t.Fatalf("%d identities in only %d slots", len(ids), len(slots))
	}
	for i, g := range groups {
		if len(g) == 0 {
			t.Fatalf("no identity on master %d of %d", i, len(groups))
		}
	}
	t.Logf("%d identities in %d slots, per master %d/%d/%d", len(ids), len(slots), len(groups[0]), len(groups[1]), len(groups[2]))
	return groups
}

// each runs f for every id, 16 at a time.
func each(ids []string, f func(id string)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(id)
		}()
	}
	wg.Wait()
}

// checkExact makes calls decisions for id and checks them as on a single
// server: the first limit admitted by Redis with Remaining limit-1 .. 0,
// the rest rejected with a RetryAfter of about a minute (the Hybrid:
// between 1 and limit admitted, decided locally or by Redis).
func checkExact(t *testing.T, f family, decide func(ctx context.Context, id string) (throttle.Decision, error), id string) {
	t.Helper()
	admitted := 0
	for i := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := decide(ctx, id)
		cancel()
		if err != nil {
			t.Errorf("%s: id %.40q, call %d: %v", f.name, id, i+1, err)
			return
		}
		if d.Allowed {
			admitted++
		}
		switch {
		case d.Source == throttle.SourceDegraded || d.Source == throttle.SourceUnknown:
			t.Errorf("%s: id %.40q, call %d: Source %v on a live master", f.name, id, i+1, d.Source)
			return
		case d.Limit != f.limit:
			t.Errorf("%s: id %.40q, call %d: Limit %d, want %d", f.name, id, i+1, d.Limit, f.limit)
			return
		case !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > time.Minute):
			t.Errorf("%s: id %.40q, call %d: rejected with RetryAfter %v, want (0, 1m]", f.name, id, i+1, d.RetryAfter)
			return
		case f.hybrid:
			continue
		case d.Source != throttle.SourceRedis:
			t.Errorf("%s: id %.40q, call %d: Source %v, want redis", f.name, id, i+1, d.Source)
			return
		case d.Allowed != (i < limit) || d.Remaining != max(limit-1-i, 0):
			t.Errorf("%s: id %.40q, call %d: %+v, want the first %d of %d admitted, Remaining %d", f.name, id, i+1, d, limit, calls, max(limit-1-i, 0))
			return
		case !d.Allowed && d.RetryAfter < 50*time.Second:
			t.Errorf("%s: id %.40q, call %d: RetryAfter %v, want about 1m", f.name, id, i+1, d.RetryAfter)
			return
		}
	}
	if admitted < 1 || admitted > limit {
		t.Errorf("%s: id %.40q: %d of %d admitted, want 1..%d", f.name, id, admitted, calls, limit)
	}
}

// TestClusterLimits runs 1,000 identities of every spelling through every
// family on a three-master cluster: no errors (so no CROSSSLOT), and
// each identity limited as on a single server.
func TestClusterLimits(t *testing.T) {
	c := redistest.StartCluster(t)
	ids := identities(1000)
	byMaster(t, c, ids)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			l := f.newLimiter(t, c.Client(t), "limits:"+f.name+":", time.Second)
			each(ids, func(id string) {
				checkExact(t, f, func(ctx context.Context, id string) (throttle.Decision, error) { return l.AllowN(ctx, id, 1) }, id)
			})
		})
	}
}

// TestClusterMasterDown stops one master: through a throttle.Gate, its
// identities get the failure policy (Source degraded) and the other
// masters' identities are limited exactly as before.
func TestClusterMasterDown(t *testing.T) {
	const dead = 1
	c := redistest.StartCluster(t)
	groups := byMaster(t, c, identities(300))
	var live []string
	for i, g := range groups {
		if i != dead {
			live = append(live, g...)
		}
	}
	cases := []struct {
		family int
		policy throttle.FailurePolicy
		opts   []bucket.Option
		// want is the Decisions for an identity on the dead master.
		admitted int // how many of calls are admitted (degraded)
	}{
		{family: 0, policy: throttle.FailClosed, admitted: 0},
		{family: 0, policy: throttle.FailOpen, admitted: calls},
		{family: 1, policy: throttle.FailClosed, admitted: 0},
		{family: 1, policy: throttle.FailOpen, admitted: calls},
		{family: 2, policy: throttle.FailClosed, admitted: 0},
		{family: 2, policy: throttle.FailOpen, admitted: calls},
		// A local share of Count (1 per minute) × 1 / 1 instance, with a
		// FailClosed Gate that never applies: the Hybrid decides in
		// degraded mode itself.
		{family: 2, policy: throttle.FailClosed, opts: []bucket.Option{bucket.WithLocalShare(1, 1)}, admitted: 1},
	}
	cc := c.Client(t)
	type gate struct {
		f        family
		g        *throttle.Gate
		admitted int
	}
	gates := make([]gate, len(cases))
	for i, tc := range cases {
		f := families[tc.family]
		l := f.newLimiter(t, cc, fmt.Sprintf("down:%d:", i), 500*time.Millisecond, tc.opts...)
		g, err := throttle.NewGate(l, throttle.WithFailurePolicy(tc.policy), throttle.WithDegradedRetryAfter(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		gates[i] = gate{f: f, g: g, admitted: tc.admitted}
	}

	c.Node(dead).Stop()
	start := time.Now()
	for i, tc := range cases {
		gt := gates[i]
		name := fmt.Sprintf("%s/%v", gt.f.name, tc.policy)
		if tc.opts != nil {
			name = gt.f.name + "/local share"
		}
		t.Run(name, func(t *testing.T) {
			admit := func(ctx context.Context, id string) (throttle.Decision, error) { return gt.g.Admit(ctx, id, 1) }
			each(groups[dead], func(id string) {
				admitted := 0
				for j := range calls {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					d, err := admit(ctx, id)
					cancel()
					if err != nil {
						t.Errorf("id %.40q, call %d on the dead master: %v", id, j+1, err)
						return
					}
					if d.Source != throttle.SourceDegraded {
						t.Errorf("id %.40q, call %d on the dead master: Source %v, want degraded", id, j+1, d.Source)
						return
					}
					if d.Allowed {
						admitted++
					} else if d.RetryAfter <= 0 {
						t.Errorf("id %.40q, call %d on the dead master: rejected with RetryAfter %v", id, j+1, d.RetryAfter)
					}
				}
				if admitted != gt.admitted {
					t.Errorf("id %.40q on the dead master: %d of %d admitted, want %d", id, admitted, calls, gt.admitted)
				}
			})
			each(live, func(id string) { checkExact(t, gt.f, admit, id) })
		})
	}
	t.Logf("decisions with a dead master took %v", time.Since(start))
}

// TestCrossSlotFallback decides through a plain *redis.Client connected
// to one master of the cluster, for identities that master holds, 16 at
// a time: the limiters' coalesced calls carry keys of several slots,
// which a cluster node refuses (CROSSSLOT) before running anything, as a
// proxy in front of a cluster does. No decision may fail, and each
// identity is limited exactly.
func TestCrossSlotFallback(t *testing.T) {
	c := redistest.StartCluster(t)
	own := byMaster(t, c, identities(300))[0]
	client := c.Node(0).Client(t)
	for _, f := range families {
		if f.hybrid {
			continue // its Redis calls are bucket.Redis's
		}
		t.Run(f.name, func(t *testing.T) {
			l := f.newLimiter(t, client, "crossslot:"+f.name+":", time.Second)
			each(own, func(id string) {
				checkExact(t, f, func(ctx context.Context, id string) (throttle.Decision, error) { return l.AllowN(ctx, id, 1) }, id)
			})
		})
	}
}
