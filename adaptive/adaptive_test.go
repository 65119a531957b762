package adaptive_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/adaptive"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// accept records n accepted calls of key.
func accept(t *testing.T, l *adaptive.Limit, key string, n int) {
	t.Helper()
	for range n {
		if err := l.Accepted(context.Background(), key); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOneDecreasePerEvent: two processes share one limit. The first 429
// sets it to the calls the partner accepted in the last window less 5 %,
// for both; a second 429 of the same event (within a window) changes
// nothing, and the one after a window decreases again, never below the
// floor; replan runs once per decrease, in the process that made it.
func TestOneDecreasePerEvent(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	prefix := redistest.Prefix("adaptive")
	ceiling := throttle.Rate{Count: 100, Per: 300 * time.Millisecond}
	replans := 0
	a, err := adaptive.NewRedis(client, ceiling, 5, adaptive.WithPrefix(prefix), adaptive.WithRefresh(10*time.Millisecond),
		adaptive.WithReplan(func(context.Context, string) { replans++ }))
	if err != nil {
		t.Fatal(err)
	}
	b, err := adaptive.NewRedis(client, ceiling, 5, adaptive.WithPrefix(prefix), adaptive.WithRefresh(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Limit("p"); got != 100 {
		t.Fatalf("a new key's limit %d, want the ceiling 100", got)
	}
	accept(t, a, "p", 12)
	accept(t, b, "p", 8)
	got, err := a.Rejected(ctx, "p")
	if err != nil || got != 19 {
		t.Fatalf("first 429: limit %d, %v; want 19 (20 accepted in the window, less 5 %%)", got, err)
	}
	if got, err := b.Rejected(ctx, "p"); err != nil || got != 19 {
		t.Fatalf("second 429 of the event, other process: limit %d, %v; want 19 (no second decrease)", got, err)
	}
	if got, err := b.Read(ctx, "p"); err != nil || got != 19 {
		t.Fatalf("other process reads %d, %v; want 19", got, err)
	}
	time.Sleep(350 * time.Millisecond) // the accepted calls leave the window
	if got, err := a.Rejected(ctx, "p"); err != nil || got != 5 {
		t.Fatalf("429 of a new event with nothing accepted: limit %d, %v; want the floor 5", got, err)
	}
	if replans != 2 {
		t.Errorf("replan ran %d times, want 2 (one per decrease)", replans)
	}
}

// TestDecreaseRoundsToNearest: the margin is rounded to the nearest
// call, so that a small quota is not cut by a whole call: 10 accepted
// give 10 (9.5), not 9, which would run the partner at 90 %; 11 give 10
// (10.45), 7 give 7 (6.65).
func TestDecreaseRoundsToNearest(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	ceiling := throttle.Rate{Count: 100, Per: time.Minute}
	for accepted, want := range map[int]int{10: 10, 11: 10, 7: 7, 25: 24, 40: 38} {
		l, err := adaptive.NewRedis(client, ceiling, 1, adaptive.WithPrefix(redistest.Prefix("adaptive")))
		if err != nil {
			t.Fatal(err)
		}
		accept(t, l, "p", accepted)
		if got, err := l.Rejected(ctx, "p"); err != nil || got != want {
			t.Errorf("%d accepted in the window, then a 429: limit %d, %v; want %d", accepted, got, err, want)
		}
	}
}

// TestNoReliefSteps: a 429 that the estimate does not relieve (10
// accepted at a limit of 10) is a lone one, a call a little early: the
// limit stays, though it comes right after a decrease (a probe's 429 and
// the call of its pace still on its way). A second lone one within 10
// windows goes a call below, or 5 % when that is less: 9.5, which is 10
// calls per 1.053 windows (no window holds more than 10); 99 for 100
// (106 counted at 100: more than the limit, from calls on their way).
func TestNoReliefSteps(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	per := 100 * time.Millisecond
	for _, c := range []struct {
		accepted, first, again int
		second                 float64
		quota                  throttle.Rate
	}{
		{10, 10, 10, 9.5, throttle.Rate{Count: 10, Per: time.Duration(float64(per) * 10 / 9.5)}},
		{105, 100, 106, 99, throttle.Rate{Count: 99, Per: per}},
	} {
		replans := 0
		l, err := adaptive.NewRedis(client, throttle.Rate{Count: 200, Per: per}, 1, adaptive.WithPrefix(redistest.Prefix("adaptive")),
			adaptive.WithReplan(func(context.Context, string) { replans++ }))
		if err != nil {
			t.Fatal(err)
		}
		accept(t, l, "p", c.accepted)
		if got, err := l.Rejected(ctx, "p"); err != nil || got != c.first {
			t.Fatalf("first event: limit %d, %v; want %d", got, err, c.first)
		}
		time.Sleep(per + 20*time.Millisecond) // a new event, within 10 windows of the decrease
		accept(t, l, "p", c.again)
		if got, err := l.Rejected(ctx, "p"); err != nil || got != c.first {
			t.Fatalf("a lone 429 at %d with %d accepted, a window after a decrease: limit %d, %v; want %d kept", c.first, c.again, got, err, c.first)
		}
		time.Sleep(per + 20*time.Millisecond) // a second lone event
		accept(t, l, "p", c.again)
		if _, err := l.Rejected(ctx, "p"); err != nil || l.Calls("p") != c.second {
			t.Fatalf("a second lone 429 at %d: limit %v, %v; want %v", c.first, l.Calls("p"), err, c.second)
		}
		if q := l.Quota("p"); q.Rate != c.quota {
			t.Errorf("limit %v: quota %v, want %v", c.second, q.Rate, c.quota)
		}
		if replans != 2 {
			t.Errorf("replan ran %d times, want 2 (the lone 429 changed nothing to plan again)", replans)
		}
	}
}

// TestGrowsBackAndSurvivesLoss: after two windows without a decrease the
// limit grows by 2 % of the estimate per window back to the estimate,
// then beyond it by 0.02 % of it times the square of the windows; when
// the state is lost (FLUSHALL), a process that knew it writes it back:
// the limit resumes from the estimate, not the ceiling.
func TestGrowsBackAndSurvivesLoss(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	ceiling := throttle.Rate{Count: 200, Per: 100 * time.Millisecond}
	l, err := adaptive.NewRedis(client, ceiling, 1, adaptive.WithRefresh(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	accept(t, l, "p", 100)
	first, err := l.Rejected(ctx, "p")
	if err != nil || first != 95 {
		t.Fatalf("first 429: %d, %v; want 95", first, err)
	}
	time.Sleep(150 * time.Millisecond) // within the hold
	if got := l.Limit("p"); got != first {
		t.Fatalf("within the hold: %d, want %d", got, first)
	}
	// About 5 windows past the hold: +2 per window to the estimate, then
	// barely more. On the way, a fraction of a call stretches the window
	// of its whole calls rounded up, never beyond the estimate.
	fractions := 0
	for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		// The limit grows 0.02 calls a ms: the quota's pace lies between
		// the limits read just before and just after it (on a loaded
		// machine, ms apart).
		before := l.Calls("p")
		q := l.Quota("p").Rate
		after := l.Calls("p")
		pace := float64(q.Count) * float64(ceiling.Per) / float64(q.Per)
		if q.Count > 100 || (pace < math.Min(before, 100)-0.05 || pace > math.Min(after, 100)+0.05) && q.Per != ceiling.Per {
			t.Fatalf("limit %v to %v growing to the estimate 100: quota %v (%v calls per window)", before, after, q, pace)
		}
		if q.Per > ceiling.Per {
			fractions++
		}
	}
	if fractions == 0 {
		t.Error("growing from 95 to 100, the limit never had a fraction of a call")
	}
	if got := l.Limit("p"); got < 99 || got > 101 {
		t.Fatalf("after ~5 windows of growth: %d, want about the estimate 100 (+2 per window to it, then 0.02 %% of it per window squared)", got)
	}
	time.Sleep(1500 * time.Millisecond) // about 17 windows past the estimate: 100 × 0.0002 × 17² ≈ 6 more
	grown := l.Limit("p")
	if grown < 103 || grown > 120 {
		t.Fatalf("17 windows past the estimate: %d, want about 106: the probe beyond it grows with the square of the time", grown)
	}
	if q := l.Quota("p"); q.Rate != (throttle.Rate{Count: grown, Per: ceiling.Per}) {
		t.Errorf("probing at %d: quota %v, want whole calls per window", grown, q.Rate)
	}
	srv.FlushAll(t)
	if got, err := l.Read(ctx, "p"); err != nil || got > grown+2 || got < first {
		t.Fatalf("after FLUSHALL: %d, %v; want the last state back (about %d), never the ceiling", got, err, grown)
	}
	other, err := adaptive.NewRedis(client, ceiling, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.Read(ctx, "p"); err != nil || got >= ceiling.Count {
		t.Fatalf("another process after the write-back: %d, %v; want the restored limit", got, err)
	}
}

// TestNewRedisErrors: bad settings are refused, naming the field.
func TestNewRedisErrors(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	r := throttle.Rate{Count: 10, Per: time.Second}
	for name, f := range map[string]func() error{
		"client":         func() error { _, err := adaptive.NewRedis(nil, r, 1); return err },
		"floor":          func() error { _, err := adaptive.NewRedis(client, r, 11); return err },
		"Rate.Count":     func() error { _, err := adaptive.NewRedis(client, throttle.Rate{Per: time.Second}, 1); return err },
		"WithRefresh":    func() error { _, err := adaptive.NewRedis(client, r, 1, adaptive.WithRefresh(0)); return err },
		"WithPacedStart": func() error { _, err := adaptive.NewRedis(client, r, 1, adaptive.WithPacedStart(0)); return err },
	} {
		err := f()
		var oe *throttle.OptionError
		if !errors.As(err, &oe) || !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("%s: %v, want an OptionError", name, err)
		}
	}
}

// TestLossThenRejected: a 429 right after Redis lost the state (and the
// accepted calls) does not drop the limit to the floor: the process that
// knew the state writes it back, and this 429 decreases nothing.
func TestLossThenRejected(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	client := srv.Client(t)
	ceiling := throttle.Rate{Count: 200, Per: 300 * time.Millisecond}
	a, err := adaptive.NewRedis(client, ceiling, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := adaptive.NewRedis(client, ceiling, 1)
	if err != nil {
		t.Fatal(err)
	}
	accept(t, a, "p", 100)
	if got, err := a.Rejected(ctx, "p"); err != nil || got != 95 {
		t.Fatalf("first 429: %d, %v; want 95", got, err)
	}
	srv.FlushAll(t)
	if got, err := a.Rejected(ctx, "p"); err != nil || got != 95 {
		t.Fatalf("429 after FLUSHALL: %d, %v; want 95 (written back), not the floor", got, err)
	}
	if got, err := b.Read(ctx, "p"); err != nil || got != 95 {
		t.Fatalf("the other process reads %d, %v; want 95", got, err)
	}
}

// TestFirstWindowPaced: with WithPacedStart, a key's first window before
// any decrease is paced in parts no smaller than the largest cost (here
// tenths: Count/10 per Per/10, no burst of the whole ceiling), Limit
// still says the ceiling, a 429 in it decreases from the ceiling (not
// from the part), and after the first window a key without a decrease
// has the whole ceiling per Per. Larger costs mean fewer parts; without
// the option nothing is paced.
func TestFirstWindowPaced(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	ceiling := throttle.Rate{Count: 100, Per: 200 * time.Millisecond}
	l, err := adaptive.NewRedis(client, ceiling, 1, adaptive.WithPrefix(redistest.Prefix("adaptive")), adaptive.WithPacedStart(3))
	if err != nil {
		t.Fatal(err)
	}
	paced := throttle.Quota{Rate: throttle.Rate{Count: 10, Per: 20 * time.Millisecond}}
	for cost, want := range map[int]throttle.Rate{20: {Count: 20, Per: 40 * time.Millisecond}, 60: ceiling} {
		other, err := adaptive.NewRedis(client, ceiling, 1, adaptive.WithPrefix(redistest.Prefix("adaptive")), adaptive.WithPacedStart(cost))
		if err != nil {
			t.Fatal(err)
		}
		if q := other.Quota("p"); q.Rate != want {
			t.Errorf("WithPacedStart(%d): %+v, want %v (parts of at least the cost)", cost, q, want)
		}
	}
	plain, err := adaptive.NewRedis(client, ceiling, 1, adaptive.WithPrefix(redistest.Prefix("adaptive")))
	if err != nil {
		t.Fatal(err)
	}
	if q := plain.Quota("p"); q.Rate != ceiling {
		t.Errorf("without WithPacedStart: %+v, want the ceiling", q)
	}
	if q := l.Quota("p"); q != paced {
		t.Fatalf("first window: %+v, want %+v", q, paced)
	}
	if got := l.Limit("p"); got != 100 {
		t.Fatalf("first window: Limit %d, want the ceiling 100", got)
	}
	accept(t, l, "p", 30)
	if got, err := l.Rejected(ctx, "p"); err != nil || got != 29 {
		t.Fatalf("429 in the first window: %d, %v; want 29 (30 accepted less 5 %%, 28.5 rounded), not capped at the paced 10", got, err)
	}
	if q := l.Quota("q"); q != paced {
		t.Fatalf("another key's first window: %+v, want %+v", q, paced)
	}
	time.Sleep(ceiling.Per + 20*time.Millisecond)
	if q := l.Quota("q"); q.Rate != ceiling {
		t.Fatalf("after the first window: %+v, want the ceiling %v", q, ceiling)
	}
	if q := l.Quota("p"); q.Rate.Count != 29 || q.Rate.Per != ceiling.Per {
		t.Fatalf("the decreased key: %+v, want 29 per %v", q, ceiling.Per)
	}
}

// TestRejectedAfterCountsSinceRoom: a 429 whose Retry-After is 700 ms of
// a 1 s window says the partner took its quota in the last 300 ms: the
// estimate counts the 10 calls accepted there, not the 15 accepted half
// a second before (a quota just cut). Rejected, and a Retry-After of the
// whole window, count all 25.
func TestRejectedAfterCountsSinceRoom(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	ceiling := throttle.Rate{Count: 100, Per: time.Second}
	var ls [3]*adaptive.Limit
	for i := range ls {
		l, err := adaptive.NewRedis(client, ceiling, 1, adaptive.WithPrefix(redistest.Prefix("adaptive")))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
		accept(t, l, "p", 15)
	}
	time.Sleep(500 * time.Millisecond)
	for _, l := range ls {
		accept(t, l, "p", 10)
	}
	if got, err := ls[0].RejectedAfter(ctx, "p", 700*time.Millisecond); err != nil || got != 10 {
		t.Errorf("RejectedAfter 700ms: limit %d, %v; want 10 (the 10 of the last 300 ms, less 5 %% rounded)", got, err)
	}
	if got, err := ls[1].Rejected(ctx, "p"); err != nil || got != 24 {
		t.Errorf("Rejected: limit %d, %v; want 24 (all 25 of the window, less 5 %% rounded)", got, err)
	}
	if got, err := ls[2].RejectedAfter(ctx, "p", time.Second); err != nil || got != 24 {
		t.Errorf("RejectedAfter of the whole window: limit %d, %v; want 24 (it tells nothing: all 25 count)", got, err)
	}
}

// TestProbeKeepsEstimate: a 429 while the limit probes beyond its last
// estimate (100) keeps that estimate though fewer calls are counted (98:
// the last accepted ones may not be recorded yet), so the limit goes back
// to 95, not to 93; 50 counted at the estimate is a cut quota, and
// stands.
func TestProbeKeepsEstimate(t *testing.T) {
	ctx := context.Background()
	client := redistest.Shared(t).Client(t)
	l, err := adaptive.NewRedis(client, throttle.Rate{Count: 200, Per: 100 * time.Millisecond}, 1,
		adaptive.WithPrefix(redistest.Prefix("adaptive")), adaptive.WithRefresh(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	accept(t, l, "p", 100)
	if got, err := l.Rejected(ctx, "p"); err != nil || got != 95 {
		t.Fatalf("first 429: %d, %v; want 95", got, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Limit("p") <= 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the limit never probed beyond the estimate: %d", l.Limit("p"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	accept(t, l, "p", 98)
	if got, err := l.Rejected(ctx, "p"); err != nil || got != 95 {
		t.Fatalf("429 of a probe with 98 counted: %d, %v; want 95 (the estimate 100 kept, less 5 %%)", got, err)
	}
	for l.Limit("p") < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the limit never grew back to the estimate: %d", l.Limit("p"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	accept(t, l, "p", 50)
	if got, err := l.Rejected(ctx, "p"); err != nil || got != 48 {
		t.Fatalf("429 at the estimate with 50 counted (a cut quota): %d, %v; want 48 (50 less 5 %%, rounded)", got, err)
	}
}
