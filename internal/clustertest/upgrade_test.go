package clustertest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRollingUpgrade runs two processes on the same identities, as during
// a rolling upgrade: a new one that sends the keys of a flush together
// (one script call for all on a standalone server, one per slot on a
// cluster) and an old one that sends one key per call (WithOneKeyPerCall,
// as every release before did on a cluster and as a proxy needs). Each
// has its own client (its own connections) and limiter, and 4 goroutines
// that decide every identity twice, half in batches (flushes of many
// keys) and half one by one; 16 requests per identity in all, at a limit
// of 3 per hour. Together they admit exactly 3 per identity, on a
// standalone server and on a three-master cluster; the new process sent
// calls of several identities and the old one none.
func TestRollingUpgrade(t *testing.T) {
	ids := inSlots(spread, 20)
	type client interface {
		redis.Scripter
		AddHook(redis.Hook)
	}
	var (
		s *redistest.Server
		c *redistest.Cluster
	)
	servers := []struct {
		name   string
		client func() client
	}{
		{name: "standalone", client: func() client {
			if s == nil {
				s = redistest.Start(t)
			}
			return s.Client(t)
		}},
		{name: "cluster", client: func() client {
			if c == nil {
				c = redistest.StartCluster(t)
			}
			return c.Client(t)
		}},
	}
	for _, srv := range servers {
		for _, f := range slotFamilies {
			t.Run(srv.name+"/"+f.name, func(t *testing.T) {
				prefix := redistest.Prefix(fmt.Sprintf("upgrade:%s:%s:", srv.name, f.name))
				type process struct {
					name     string
					l        batchLimiter
					rec      *redistest.Scripts
					admitted map[string]int
				}
				procs := make([]*process, 2)
				for i, name := range []string{"new", "old"} {
					cl := srv.client()
					procs[i] = &process{name: name, l: f.build(t, cl, prefix, name == "old"), rec: redistest.RecordScripts(cl), admitted: map[string]int{}}
				}
				var mu sync.Mutex
				var wg sync.WaitGroup
				for _, p := range procs {
					for g := range 4 {
						wg.Go(func() {
							ctx := context.Background()
							admit := func(id string, d throttle.Decision) {
								if d.Allowed {
									mu.Lock()
									p.admitted[id]++
									mu.Unlock()
								}
							}
							for round := range 2 {
								if (g+round)%2 == 0 {
									reqs := make([]throttle.Request, len(ids))
									for i, id := range ids {
										reqs[i] = throttle.Request{Key: id, N: 1}
									}
									ds, err := p.l.AllowBatch(ctx, reqs)
									if err != nil {
										t.Errorf("%s: batch: %v", p.name, err)
										return
									}
									for i, d := range ds {
										admit(ids[i], d)
									}
									continue
								}
								for _, id := range ids {
									d, err := p.l.AllowN(ctx, id, 1)
									if err != nil {
										t.Errorf("%s: id %q: %v", p.name, id, err)
										return
									}
									admit(id, d)
								}
							}
						})
					}
				}
				wg.Wait()
				for _, id := range ids {
					if n := procs[0].admitted[id] + procs[1].admitted[id]; n != limit {
						t.Errorf("id %q: %d admitted (new %d, old %d) of 16, want %d", id, n, procs[0].admitted[id], procs[1].admitted[id], limit)
					}
				}
				most := func(p *process) int {
					m := 0
					for _, call := range p.rec.Ran() {
						m = max(m, len(tags(call.Keys)))
					}
					return m
				}
				if m := most(procs[0]); m < 2 {
					t.Errorf("new: at most %d identities per script call, want several", m)
				}
				if m := most(procs[1]); m != 1 {
					t.Errorf("old: at most %d identities per script call, want 1", m)
				}
				t.Logf("script calls: new %d, old %d", len(procs[0].rec.Ran()), len(procs[1].rec.Ran()))
			})
		}
	}
}
