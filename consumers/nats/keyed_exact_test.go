package natsthrottle

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// mixedCosts are the costs of testdata/costs.jsonl, in arrival order.
var mixedCosts = []int{5, 3, 3, 5, 4, 1, 5, 2, 2, 3, 4, 1, 4, 2, 4, 4, 2, 5, 4, 3, 5, 3, 2, 4, 4, 1,
	4, 1, 5, 1, 2, 3, 3, 5, 2, 2, 3, 5, 1, 5, 2, 2, 5, 1, 3, 4, 2, 2, 2, 3, 5}

// exactSchedule is the exact first-come-first-served schedule of costs
// arriving together at t=0 under a sliding window of r: each decided in
// arrival order at 0 on a window.Memory at fixed instants, reserving its
// own slot (a small one may so take a gap before a larger one), and
// starting there. It returns each one's start from 0.
func exactSchedule(t *testing.T, r throttle.Rate, costs []int) []time.Duration {
	t.Helper()
	var now time.Time
	lim, err := window.NewMemory(r, window.WithClock(throttle.ClockFunc(func() time.Time { return now })))
	if err != nil {
		t.Fatal(err)
	}
	starts := make([]time.Duration, len(costs))
	type event struct {
		at time.Duration
		i  int
	}
	var events []event
	for i := range costs {
		events = append(events, event{0, i})
	}
	for len(events) > 0 {
		sort.SliceStable(events, func(a, b int) bool { return events[a].at < events[b].at })
		e := events[0]
		events = events[1:]
		now = time.Unix(0, 0).Add(e.at)
		d, err := lim.AllowID(context.Background(), "k", costs[e.i], strconv.Itoa(e.i), math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			starts[e.i] = e.at
			continue
		}
		events = append(events, event{e.at + d.RetryAfter, e.i})
	}
	return starts
}

// TestConsumeByKeyExactSchedule: the mixed costs of testdata/costs.jsonl
// (51 messages, costs 1-5) on one key at 5 units per 100 ms start on the
// exact schedule (exactSchedule: a small message takes the gap before a
// larger one's slot), each no later than its exact start by more than
// 20 ms and 5 % (a claim lands up to a millisecond after its slot, the
// retry-after being whole milliseconds, and the next window starts from
// there: about 1 % over the run). Deciding only the next two messages
// ahead of their start, a small message was decided too late for its gap
// (#5, cost 1, exact at 100 ms, started at 430 ms; the last start 24 %
// late), and messages decided out of the order they were pulled in took
// each other's slots. The limit holds at every admission, and each
// message is delivered and handled once.
func TestConsumeByKeyExactSchedule(t *testing.T) {
	e := newEnv(t)
	r := throttle.Rate{Count: 5, Per: 100 * time.Millisecond}
	lim := newInstantsLimiter(t, r)
	g, err := throttle.NewGate(lim, throttle.WithReservations(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := newStarts(0)
	naked := e.watch(t, nakAdvisory)
	cost := func(m jetstream.Msg) (int, error) { return strconv.Atoi(string(m.Data())) }
	h := newHandler(t, s.handle, g, WithConcurrency(4), WithConsumerConfig(keyedCfg), WithCostFunc(cost))
	seqs := make([]uint64, len(mixedCosts))
	for i, c := range mixedCosts {
		seqs[i] = e.publish(t, "jobs.costs", fmt.Sprint(c), nil)
	}
	kc := consumeByKey(t, e, h)
	waitFor(t, 20*time.Second, "every message handled", func() bool { return s.handled() == len(mixedCosts) })
	exact := exactSchedule(t, r, mixedCosts)
	// The schedule's t=0 is the first start (message 0 starts on arrival).
	t0 := s.startedAt(seqs[0])
	var late []string
	var last, lastExact time.Duration
	for i, seq := range seqs {
		got := s.startedAt(seq).Sub(t0)
		last, lastExact = max(last, got), max(lastExact, exact[i])
		if got > exact[i]+exact[i]/20+20*time.Millisecond {
			late = append(late, fmt.Sprintf("#%d (cost %d) at %v, exact %v", i, mixedCosts[i], got.Round(time.Millisecond), exact[i]))
		}
	}
	if len(late) > 0 {
		t.Errorf("%d of %d messages started late for the exact schedule: %v", len(late), len(mixedCosts), late)
	}
	{
		var gs, es []time.Duration
		for i, seq := range seqs {
			gs = append(gs, s.startedAt(seq).Sub(t0))
			es = append(es, exact[i])
		}
		slices.Sort(gs)
		slices.Sort(es)
		for i := range gs {
			if gs[i] > es[i]+es[i]/20+20*time.Millisecond {
				t.Errorf("sorted start %d at %v, exact %v", i, gs[i], es[i])
			}
		}
	}
	t.Logf("last start %v, exact %v (%.3f)", last.Round(time.Millisecond), lastExact, float64(last)/float64(lastExact))
	if most := lim.mostUnits(r.Per); most > r.Count {
		t.Errorf("%d units admitted in one %v window, want <= %d", most, r.Per, r.Count)
	}
	if n := len(naked.all()); n != 0 {
		t.Errorf("%d NAKs, want 0", n)
	}
	if n, err := kc.Deliveries(testCtx(t)); err != nil || n != len(mixedCosts) {
		t.Errorf("Deliveries = %d, %v; want %d (one each)", n, err, len(mixedCosts))
	}
	for seq, n := range s.runs {
		if n != 1 {
			t.Errorf("stream seq %d handled %d times", seq, n)
		}
	}
}

// TestConsumeByKeyFloodBounded: a flood of one key of mixed costs is
// never pulled into process without bound, within its rate (admitted at
// once, waiting for 4 handlers of 5 ms) or beyond it (each reserving its
// own slot, up to a horizon that would hold them all): at every instant
// the messages pulled and not started stay within the key's messages
// ahead and those reserved (maxKeyAhead + maxKeyReserved). Nothing is
// NAKed.
func TestConsumeByKeyFloodBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate throttle.Rate
		work time.Duration
	}{
		{"within its rate", throttle.PerSecond(100_000), 5 * time.Millisecond},
		{"beyond its rate", throttle.Rate{Count: 50, Per: 100 * time.Millisecond}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			const total = 600
			lim, err := window.NewMemory(tc.rate)
			if err != nil {
				t.Fatal(err)
			}
			g, err := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			s := newStarts(tc.work)
			naked := e.watch(t, nakAdvisory)
			// Costs 1 and 2: a key of mixed costs, whose reservations do
			// not count among its messages ahead.
			cost := func(m jetstream.Msg) (int, error) {
				i, err := strconv.Atoi(string(m.Data()))
				return 1 + i%2, err
			}
			h := newHandler(t, s.handle, g, WithConcurrency(4), WithConsumerConfig(keyedCfg), WithCostFunc(cost))
			for i := range total {
				e.publish(t, "jobs.flood", fmt.Sprint(i), nil)
			}
			kc := consumeByKey(t, e, h)
			most := int64(0)
			for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
				most = max(most, kc.Pulled()-int64(s.handled()))
			}
			if bound := int64(maxKeyAhead + maxKeyReserved); most > bound {
				t.Errorf("up to %d messages pulled and not started, want at most %d", most, bound)
			}
			if s.handled() == 0 {
				t.Error("nothing handled")
			}
			if n := len(naked.all()); n != 0 {
				t.Errorf("%d NAKs, want 0", n)
			}
			t.Logf("at most %d pulled and not started; %d handled", most, s.handled())
		})
	}
}
