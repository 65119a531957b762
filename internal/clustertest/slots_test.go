package clustertest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// inSlots returns perSlot identities in each of slots (as Redis keys of
// any prefix: the hash tag is the escaped identity), slot after slot
// interleaved.
func inSlots(slots []int, perSlot int) []string {
	found := map[int][]string{}
	for _, s := range slots {
		found[s] = nil
	}
	for i, full := 0, 0; full < len(slots); i++ {
		id := fmt.Sprint("s", i)
		s := rediskey.Slot(rediskey.Key("", id))
		if got, ok := found[s]; ok && len(got) < perSlot {
			found[s] = append(got, id)
			if len(found[s]) == perSlot {
				full++
			}
		}
	}
	var ids []string
	for i := range perSlot {
		for _, s := range slots {
			ids = append(ids, found[s][i])
		}
	}
	return ids
}

// spread is three slots, one on each master of redistest's cluster (which
// splits the slots evenly, in order).
var spread = []int{100, 6000, 12000}

// batchLimiter is what a test of script calls needs of a limiter.
type batchLimiter interface {
	throttle.Limiter
	throttle.BatchLimiter
}

// slotFamily is a Redis limiter family with a batch, built with or
// without one key per call.
type slotFamily struct {
	name   string
	perKey int // KEYS per identity in a call
	build  func(t *testing.T, c redis.Scripter, prefix string, oneKey bool) batchLimiter
}

var slotFamilies = []slotFamily{
	{name: "window", perKey: 3, build: func(t *testing.T, c redis.Scripter, prefix string, oneKey bool) batchLimiter {
		opts := []window.Option{window.WithPrefix(prefix), window.WithTimeout(time.Second)}
		if oneKey {
			opts = append(opts, window.WithOneKeyPerCall())
		}
		l, err := window.NewRedis(c, throttle.Rate{Count: limit, Per: time.Hour}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}},
	{name: "bucket", perKey: 2, build: func(t *testing.T, c redis.Scripter, prefix string, oneKey bool) batchLimiter {
		opts := []bucket.Option{bucket.WithPrefix(prefix), bucket.WithTimeout(time.Second)}
		if oneKey {
			opts = append(opts, bucket.WithOneKeyPerCall())
		}
		l, err := bucket.NewRedis(c, throttle.Rate{Count: 1, Per: time.Hour}, limit, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}},
}

// tags returns the distinct hash tags of keys: the identities a script
// call carries.
func tags(keys []string) map[string]bool {
	seen := map[string]bool{}
	for _, k := range keys {
		if i := strings.IndexByte(k, '{'); i >= 0 {
			if j := strings.IndexByte(k[i:], '}'); j > 0 {
				seen[k[i:i+j+1]] = true
			}
		}
	}
	return seen
}

// checkSlotCalls checks the script calls that ran: want of them, each of
// keys of one slot, perKey keys per identity, every identity of ids in
// exactly one.
func checkSlotCalls(t *testing.T, calls []redistest.ScriptCall, ids []string, perKey, want int) {
	t.Helper()
	if len(calls) != want {
		t.Fatalf("%d script calls ran for %d identities, want %d", len(calls), len(ids), want)
	}
	seen := map[string]int{}
	for _, c := range calls {
		slot := rediskey.Slot(c.Keys[0])
		for _, k := range c.Keys {
			if rediskey.Slot(k) != slot {
				t.Fatalf("a call of keys in slots %d and %d: %q", slot, rediskey.Slot(k), c.Keys)
			}
		}
		tg := tags(c.Keys)
		if len(c.Keys) != perKey*len(tg) {
			t.Fatalf("a call of %d keys for %d identities, want %d each: %q", len(c.Keys), len(tg), perKey, c.Keys)
		}
		for k := range tg {
			seen[k]++
		}
	}
	for _, id := range ids {
		if k := rediskey.Key("", id); seen[k] != 1 {
			t.Fatalf("identity %q in %d calls, want 1", id, seen[k])
		}
	}
}

// TestClusterSlotCalls decides batches over 60 identities in 3 hash
// slots, one on each master, each identity twice per batch (so 120
// requests, one flush): through a *redis.ClusterClient a batch is 3
// script calls, one per slot; with WithOneKeyPerCall 60, one per
// identity; through a *redis.Client connected to one master, for 60
// identities in 3 of its slots, the first batch is refused once
// (CROSSSLOT: keys of several slots) and then every batch is 3 calls.
// Each identity is limited exactly: its first 3 requests admitted, the
// 4th rejected. Then 16 goroutines decide each identity 5 times more
// (coalesced flushes, of keys of several slots): every request rejected.
func TestClusterSlotCalls(t *testing.T) {
	c := redistest.StartCluster(t)
	var own []int // 3 slots of node 0
	for s := 0; len(own) < 3; s += 1000 {
		if ownerOf(c, s) == 0 {
			own = append(own, s)
		}
	}
	type client interface {
		redis.Scripter
		AddHook(redis.Hook)
	}
	cases := []struct {
		name    string
		client  func() client
		slots   []int
		oneKey  bool
		refused int // calls refused by the first batch
		calls   int // calls that ran per batch
	}{
		{name: "cluster", client: func() client { return c.Client(t) }, slots: spread, calls: 3},
		{name: "cluster, WithOneKeyPerCall", client: func() client { return c.Client(t) }, slots: spread, oneKey: true, calls: 60},
		{name: "node", client: func() client { return c.Node(0).Client(t) }, slots: own, refused: 1, calls: 3},
		{name: "node, WithOneKeyPerCall", client: func() client { return c.Node(0).Client(t) }, slots: own, oneKey: true, calls: 60},
	}
	for _, f := range slotFamilies {
		for i, tc := range cases {
			t.Run(f.name+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				ids := inSlots(tc.slots, 21)
				ids, warm := ids[:60], ids[60:]
				cl := tc.client()
				l := f.build(t, cl, fmt.Sprintf("slots:%s:%d:", f.name, i), tc.oneKey)
				// One decision in each slot loads the script on its
				// master: the calls counted meet no NOSCRIPT.
				for _, id := range warm {
					if _, err := l.AllowN(ctx, id, 1); err != nil {
						t.Fatal(err)
					}
				}
				rec := redistest.RecordScripts(cl)
				var reqs []throttle.Request
				for range 2 {
					for _, id := range ids {
						reqs = append(reqs, throttle.Request{Key: id, N: 1})
					}
				}
				for batch := range 2 {
					rec.Reset()
					ds, err := l.AllowBatch(ctx, reqs)
					if err != nil {
						t.Fatalf("batch %d: %v", batch+1, err)
					}
					for j, d := range ds {
						// Batch 1: requests 1 and 2 of each identity;
						// batch 2: 3 (admitted) and 4 (rejected).
						if want := batch == 0 || j < len(ids); d.Allowed != want || d.Source != throttle.SourceRedis {
							t.Fatalf("batch %d, request %d (%q): %+v, want allowed %v", batch+1, j, reqs[j].Key, d, want)
						}
					}
					refused := 0
					for _, call := range rec.Calls() {
						if call.Err != nil {
							if !redis.HasErrorPrefix(call.Err, "CROSSSLOT") {
								t.Fatalf("batch %d: a script call failed: %v", batch+1, call.Err)
							}
							refused++
						}
					}
					if want := map[int]int{0: tc.refused}[batch]; refused != want {
						t.Fatalf("batch %d: %d calls refused, want %d", batch+1, refused, want)
					}
					checkSlotCalls(t, rec.Ran(), ids, f.perKey, tc.calls)
				}
				rec.Reset()
				each(ids, func(id string) {
					for k := range calls {
						d, err := l.AllowN(ctx, id, 1)
						if err != nil || d.Allowed {
							t.Errorf("id %q, call %d after the batches: %+v, %v; want rejected", id, k+1, d, err)
							return
						}
					}
				})
				t.Logf("%d decisions in 16 goroutines: %d script calls", len(ids)*calls, len(rec.Ran()))
			})
		}
	}
}

// ownerOf returns the index of the node that serves slot s.
func ownerOf(c *redistest.Cluster, s int) int {
	for i := 0; ; i++ {
		if k := rediskey.Key("", fmt.Sprint("o", i)); rediskey.Slot(k) == s {
			return c.MasterFor(k)
		}
	}
}
