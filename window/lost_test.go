package window

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRedisLostSetNeverOverAdmits: 3 processes x 8 goroutines on one key
// at 100/1s; Redis is killed and restarted empty 150 ms later, and then
// flushed (FLUSHALL) while running. The first script call to find the key
// gone while it should hold units pauses it for a window, for every
// process, so that no 1 s window ever holds more than 100 admissions
// (without the check: about 200 after each loss).
func TestRedisLostSetNeverOverAdmits(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var deciders []func() (throttle.Decision, error)
	for range 3 {
		l := newLostTestRedis(t, newLostTestClient(t, srv), prefix, throttle.PerSecond(100))
		deciders = append(deciders, func() (throttle.Decision, error) { return l.Allow(context.Background(), "k") })
	}
	checkLossNeverOverAdmits(t, srv, deciders)
}

// TestRedisLostJointNeverOverAdmits is TestRedisLostSetNeverOverAdmits for
// stacked windows decided in one script (AllowJoint): 100/1s per key under
// a roomy 1000/1s for all.
func TestRedisLostJointNeverOverAdmits(t *testing.T) {
	srv := redistest.Start(t)
	prefix := freshPrefix()
	var deciders []func() (throttle.Decision, error)
	for range 3 {
		c := newLostTestClient(t, srv)
		key := newLostTestRedis(t, c, prefix+"key:", throttle.PerSecond(100))
		all := newLostTestRedis(t, c, prefix+"all:", throttle.PerSecond(1000))
		parts := []throttle.Limiter{key, all}
		deciders = append(deciders, func() (throttle.Decision, error) {
			ds, ok, err := key.AllowJoint(context.Background(), parts, []string{"k", "all"}, 1)
			if err != nil || !ok {
				return throttle.Decision{}, fmt.Errorf("AllowJoint: %v, joint %v", err, ok)
			}
			return throttle.Decision{Allowed: ds[0].Allowed && ds[1].Allowed}, nil
		})
	}
	checkLossNeverOverAdmits(t, srv, deciders)
}

// newLostTestClient returns a client of its own to srv, as a process of
// its own would have.
func newLostTestClient(t *testing.T, srv *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newLostTestRedis(t *testing.T, c *redis.Client, prefix string, r throttle.Rate) *Redis {
	t.Helper()
	l, err := NewRedis(c, r, WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// checkLossNeverOverAdmits runs 8 goroutines on each decider (a process)
// while srv is killed, restarted empty and flushed, and fails if any 1 s
// window (less the callers' slop) saw more than 100 admissions.
func checkLossNeverOverAdmits(t *testing.T, srv *redistest.Server, deciders []func() (throttle.Decision, error)) {
	t.Helper()
	var mu sync.Mutex
	var admitted []time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, decide := range deciders {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, err := decide()
					if err != nil {
						time.Sleep(5 * time.Millisecond) // Redis is down
						continue
					}
					if d.Allowed {
						mu.Lock()
						admitted = append(admitted, time.Now())
						mu.Unlock()
					}
				}
			}()
		}
	}
	time.Sleep(1200 * time.Millisecond)
	srv.Stop()
	time.Sleep(150 * time.Millisecond)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	srv.FlushAll(t)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	// Callers see an admission a round trip after Redis made it: allow
	// them 100 ms of that in the 1 s.
	const slop = 100 * time.Millisecond
	most := 0
	for i := range admitted {
		j, _ := slices.BinarySearchFunc(admitted[i:], admitted[i].Add(time.Second-slop), func(a, b time.Time) int { return a.Compare(b) })
		most = max(most, j)
	}
	t.Logf("%d admitted in 4.35 s; at most %d within any %v", len(admitted), most, time.Second-slop)
	if most > 100 {
		t.Fatalf("%d admitted within %v, want at most the limit of 100: a lost set was not seen", most, time.Second-slop)
	}
	if len(admitted) < 200 {
		t.Fatalf("only %d admitted in 4.35 s: recovery should cost about a window per loss, not the run", len(admitted))
	}
}

// TestRedisLostScheduleOnePause: a FLUSHALL that takes a key's reservations
// with its units pauses the key for one window, not until the last of
// the lost reservations: an admission proves that its own unit exists for
// a window, and reservations are a schedule, not admissions that may
// count unseen. (Before, a claim's reply, whose reset counts the
// reservations ahead, made every decision until the last of them find
// the key lost again: a partner key stood still for 6 s after a flush.)
func TestRedisLostScheduleOnePause(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	per := 400 * time.Millisecond // b's unit still counts at the flush's first decision, even on a loaded machine
	l := newLostTestRedis(t, newLostTestClient(t, srv), freshPrefix(), throttle.Rate{Count: 1, Per: per})
	allowID := func(id string) throttle.Decision {
		t.Helper()
		d, err := l.AllowID(ctx, "k", 1, id, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := allowID("a"); !d.Allowed {
		t.Fatalf("first: %+v, want admitted", d)
	}
	var slotB time.Duration
	for i, id := range []string{"b", "c", "d", "e", "f"} {
		d := allowID(id)
		if d.Allowed || !d.Reserved {
			t.Fatalf("%s: %+v, want a reservation", id, d)
		}
		if i == 0 {
			slotB = d.RetryAfter
		}
	}
	time.Sleep(slotB + 5*time.Millisecond)
	if d := allowID("b"); !d.Allowed {
		t.Fatalf("b at its slot: %+v, want admitted", d)
	}
	srv.FlushAll(t)
	d, err := l.Allow(ctx, "k")
	if err != nil || d.Allowed {
		t.Fatalf("right after the flush: %+v, %v; want rejected (lost: paused for a window)", d, err)
	}
	time.Sleep(per + 20*time.Millisecond)
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("a window after the flush: %+v, %v; want admitted (b's unit has left; the reservations lost were no admissions)", d, err)
	}
}

// TestRedisShrunkWindowNotLost: a quota's window that shrinks below the
// age of the key's last admission is not a lost set. The process still
// holds that unit's old bound (now + the old window), the unit is out of
// the new window, and the set still exists: the decision is admitted, not
// paused as after a loss.
func TestRedisShrunkWindowNotLost(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	l, shrink := newShrinkingRedis(t, client, throttle.Rate{Count: 1000, Per: 500 * time.Millisecond}, throttle.Rate{Count: 1000, Per: 100 * time.Millisecond})
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	time.Sleep(150 * time.Millisecond)
	shrink()
	if d, err := l.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow after the window shrank under the last admission's age: %+v, %v; want admitted, not paused as lost", d, err)
	}
}

// TestRedisShrunkWindowKeepsExpiry: a process deciding under a shorter
// window than another's (a quota that shrank) finds no unit in its window
// and writes the set anew, lone, batched or of several units: the key's
// expiry stays as late as it was, so the process that admitted under the
// long window, whose window shrinks next, does not find its set gone and
// take it for lost (found by a helper: B's write lowered the expiry from
// 1.9 s to 0.3 s, and A's next decision paused the key for every process).
func TestRedisShrunkWindowKeepsExpiry(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	long, short := throttle.Rate{Count: 100, Per: time.Second}, throttle.Rate{Count: 100, Per: 100 * time.Millisecond}
	for _, form := range []string{"lone", "batch", "cost 2"} {
		t.Run(form, func(t *testing.T) {
			a, shrink := newShrinkingRedis(t, client, long, short)
			b := newTestRedis(t, client, short, WithPrefix(a.prefix))
			if d, err := a.Allow(ctx, "k"); err != nil || !d.Allowed {
				t.Fatalf("A: %+v, %v", d, err)
			}
			expires := client.PExpireTime(ctx, a.key("k")).Val()
			time.Sleep(150 * time.Millisecond) // A's unit leaves B's window
			var err error
			switch form {
			case "lone":
				_, err = b.Allow(ctx, "k")
			case "batch":
				_, err = b.AllowBatch(ctx, []throttle.Request{{Key: "k", N: 1}, {Key: "other", N: 1}})
			default:
				_, err = b.AllowN(ctx, "k", 2)
			}
			if err != nil {
				t.Fatal(err)
			}
			if after := client.PExpireTime(ctx, a.key("k")).Val(); after < expires {
				t.Fatalf("B's decision moved the key's expiry from %v to %v, sooner", expires, after)
			}
			shrink()
			time.Sleep(300 * time.Millisecond) // after B's expiry, before A's
			if d, err := a.Allow(ctx, "k"); err != nil || !d.Allowed {
				t.Fatalf("A after the shrink: %+v, %v; want admitted, not paused as a lost set", d, err)
			}
		})
	}
}
