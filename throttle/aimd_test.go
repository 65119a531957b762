package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

func TestAIMD(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	a, err := throttle.NewAIMD(throttle.PerSecond(100), 5, 10, clock)
	require.NoError(t, err)
	require.Equal(t, throttle.Quota{}, a.Quota("k"), "at the ceiling: the limiter's own")
	require.Equal(t, 50, a.Decrease("k"))
	require.Equal(t, 50, a.Decrease("k"), "within one Per: the same congestion")
	clock.Advance(time.Second)
	require.Equal(t, 60, a.Limit("k"), "grows by step per Per")
	require.Equal(t, 30, a.Decrease("k"))
	require.Equal(t, throttle.Quota{Rate: throttle.Rate{Count: 30, Per: time.Second}}, a.Quota("k"))
	clock.Advance(7 * time.Second)
	require.Equal(t, throttle.Quota{}, a.Quota("k"), "back at the ceiling")
	require.Equal(t, 100, a.Limit("other"))

	slow, err := throttle.NewAIMD(throttle.PerSecond(100), 5, 1, clock)
	require.NoError(t, err)
	for range 8 {
		slow.Decrease("k")
		clock.Advance(time.Second)
	}
	require.Equal(t, 6, slow.Limit("k"), "never below the floor (5), then one step")

	for _, bad := range []struct {
		floor, step int
		field       string
	}{{0, 1, "floor"}, {101, 1, "floor"}, {1, 0, "step"}} {
		_, err := throttle.NewAIMD(throttle.PerSecond(100), bad.floor, bad.step, nil)
		var oe *throttle.OptionError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, bad.field, oe.Field)
	}
}

// partnerRun is the outcome of a simulated minute against a partner with
// a hidden quota.
type partnerRun struct {
	sent, ok, tooMany int
}

// simulatePartner sends one key's backlog for a minute of a fixed clock,
// as fast as the Gate admits (up to 20 per ms, through a sliding window of
// ceiling), to partner, which answers 429 with its own Retry-After beyond
// its hidden quota. feedback: "none" ignores the 429s; "pause" pauses the
// key for the Retry-After; "aimd" also halves the limit (WithAIMD).
func simulatePartner(t *testing.T, ceiling throttle.Rate, partner throttle.Limiter, clock *throttletest.Clock, feedback string) partnerRun {
	t.Helper()
	ctx := context.Background()
	opts := []window.Option{window.WithClock(clock)}
	var gopts []throttle.Option
	if feedback == "aimd" {
		a, err := throttle.NewAIMD(ceiling, 1, max(1, ceiling.Count/20), clock)
		require.NoError(t, err)
		opts = append(opts, window.WithQuotas(a.Quota))
		gopts = append(gopts, throttle.WithAIMD(a))
	}
	lim, err := window.NewMemory(ceiling, opts...)
	require.NoError(t, err)
	g, err := throttle.NewGate(lim, gopts...)
	require.NoError(t, err)
	var r partnerRun
	for range 60_000 {
		clock.Advance(time.Millisecond)
		for range 20 {
			d, err := g.Admit(ctx, "tenant", 1)
			require.NoError(t, err)
			if !d.Allowed {
				break
			}
			r.sent++
			pd, err := partner.AllowN(ctx, "tenant", 1)
			require.NoError(t, err)
			if pd.Allowed {
				r.ok++
				continue
			}
			r.tooMany++
			if feedback != "none" {
				require.NoError(t, g.Pause(ctx, "tenant", pd.RetryAfter))
			}
		}
	}
	return r
}

// TestAIMDHiddenQuota measures feedback on a simulated partner whose
// quota (30/s) is below what the worker was configured with (100/s per
// sliding window), for two partners: a sliding window of 30/s, and a
// token bucket of 30/s with a burst of 5, which refuses the worker's
// bursts. Without feedback most requests are 429s. Pausing on each 429
// for its Retry-After gets the whole quota through, with one 429 per
// pause. Halving the limit as well (AIMD) cuts the 429s further, at a cost
// in throughput: a window's limit halves its bursts but does not smooth
// them, so against the bursty-intolerant bucket partner it loses most of
// the throughput. The figures are logged (go test -v -run AIMDHidden).
func TestAIMDHiddenQuota(t *testing.T) {
	ceiling, hidden := throttle.PerSecond(100), 30
	partners := []struct {
		name string
		new  func(c throttle.Clock) (throttle.Limiter, error)
	}{
		{"window 30/s", func(c throttle.Clock) (throttle.Limiter, error) {
			return window.NewMemory(throttle.PerSecond(hidden), window.WithClock(c))
		}},
		{"bucket 30/s burst 5", func(c throttle.Clock) (throttle.Limiter, error) {
			return bucket.NewLocal(throttle.PerSecond(hidden), 5, bucket.WithClock(c))
		}},
	}
	for _, p := range partners {
		runs := map[string]partnerRun{}
		for _, fb := range []string{"none", "pause", "aimd"} {
			clock := throttletest.NewClock(throttletest.T0)
			partner, err := p.new(clock)
			require.NoError(t, err)
			r := simulatePartner(t, ceiling, partner, clock, fb)
			runs[fb] = r
			t.Logf("%-20s %-5s sent %5d  ok %5d (%4.1f/s, %3.0f%% of the hidden quota)  429s %5d (%4.1f%% of sent)",
				p.name, fb, r.sent, r.ok, float64(r.ok)/60, 100*float64(r.ok)/float64(hidden*60),
				r.tooMany, 100*float64(r.tooMany)/float64(r.sent))
		}
		require.Less(t, runs["pause"].tooMany, runs["none"].tooMany, "%s: pausing on a 429", p.name)
		require.GreaterOrEqual(t, runs["pause"].ok, hidden*60*95/100, "%s: pausing keeps the quota", p.name)
		require.Less(t, runs["aimd"].tooMany, runs["pause"].tooMany, "%s: AIMD", p.name)
	}
}
