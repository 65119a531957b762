package redisclock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// fakeTimer answers TIME with the local clock plus offset, after advancing
// the local clock by the round trip of each call in rtts.
type fakeTimer struct {
	local  *manualClock
	offset time.Duration
	rtts   []time.Duration
	err    error
}

type manualClock struct{ t time.Time }

func (c *manualClock) Now() time.Time { return c.t }

func (f *fakeTimer) Time(ctx context.Context) *redis.TimeCmd {
	cmd := redis.NewTimeCmd(ctx)
	if f.err != nil {
		cmd.SetErr(f.err)
		return cmd
	}
	rtt := f.rtts[0]
	f.rtts = f.rtts[1:]
	// The server reads its clock a quarter into the round trip.
	cmd.SetVal(f.local.t.Add(rtt / 4).Add(f.offset).Truncate(time.Microsecond))
	f.local.t = f.local.t.Add(rtt)
	return cmd
}

func TestEstimateKeepsShortestRoundTrip(t *testing.T) {
	local := &manualClock{t: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := &fakeTimer{local: local, offset: 10 * time.Second, rtts: []time.Duration{
		800 * time.Microsecond, 100 * time.Microsecond, 400 * time.Microsecond, // first estimate: 100 µs
		50 * time.Microsecond, 60 * time.Microsecond, 70 * time.Microsecond, // shorter: replaces it
		time.Millisecond, time.Millisecond, time.Millisecond, // longer: kept out
	}}
	c := New(f, local)
	if err := c.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	check := func(rtt time.Duration) {
		t.Helper()
		if c.Bound() != rtt/2 {
			t.Fatalf("Bound = %v, want %v", c.Bound(), rtt/2)
		}
		if err := (c.Offset() - 10*time.Second).Abs(); err > rtt/2 {
			t.Fatalf("Offset = %v, want 10s within %v", c.Offset(), rtt/2)
		}
		if got := c.Now().Sub(local.Now()); got != c.Offset() {
			t.Fatalf("Now - local = %v, want the offset %v", got, c.Offset())
		}
	}
	check(100 * time.Microsecond)
	if err := c.Estimate(context.Background()); err != nil {
		t.Fatal(err)
	}
	check(50 * time.Microsecond)
	if err := c.Estimate(context.Background()); err != nil {
		t.Fatal(err)
	}
	check(50 * time.Microsecond)
}

func TestReadyWithoutServer(t *testing.T) {
	down := errors.New("connection refused")
	c := New(&fakeTimer{err: down}, nil)
	err := c.Ready(context.Background())
	if !errors.Is(err, ErrNoEstimate) || !errors.Is(err, down) {
		t.Fatalf("Ready = %v, want ErrNoEstimate wrapping the Redis error", err)
	}
}

func TestRealServer(t *testing.T) {
	client := redistest.Start(t).Client(t)
	c := New(client, throttle.ClockFunc(func() time.Time { return time.Now().Add(-time.Hour) }))
	if err := c.Ready(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The estimate is off by at most its Bound (half the best round
	// trip): both are only as good as this machine's loopback, so the
	// check is against the Bound, which must be above 0 and far below the
	// hour it would show if it measured the wrong thing.
	if c.Bound() <= 0 || c.Bound() > time.Second {
		t.Fatalf("Bound = %v", c.Bound())
	}
	if d := (c.Offset() - time.Hour).Abs(); d > c.Bound()+time.Millisecond {
		t.Fatalf("Offset = %v, want 1h within the bound %v (the local clock is an hour behind)", c.Offset(), c.Bound())
	}
}
