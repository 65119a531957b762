package concurrency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// op is one call of a step.
type op int

const (
	acquire op = iota
	renew
	release
)

func (o op) String() string { return [...]string{"Acquire", "Renew", "Release"}[o] }

// step is one call at instant at (from throttletest.T0) on key "k". For
// Acquire, want is the Decision expected (Source aside); for Renew and
// Release, err is the error expected (nil or ErrNotHeld).
type step struct {
	at    time.Duration
	op    op
	id    string
	lease time.Duration
	want  throttle.Decision
	err   error
}

// admit and reject build the expected Decisions of limit 2.
func admit(remaining int, reset time.Duration) throttle.Decision {
	return throttle.Decision{Allowed: true, Limit: 2, Remaining: remaining, ResetAfter: reset}
}

func reject(retry, reset time.Duration) throttle.Decision {
	return throttle.Decision{Limit: 2, RetryAfter: retry, ResetAfter: reset}
}

const (
	ms = time.Millisecond
	us = time.Microsecond
)

var conformance = []struct {
	name  string
	steps []step
}{
	{"limit, renew by acquire, release, lease end", []step{
		{at: 0, op: acquire, id: "a", lease: time.Second, want: admit(1, time.Second)},
		{at: 0, op: acquire, id: "b", lease: time.Second, want: admit(0, time.Second)},
		{at: 0, op: acquire, id: "c", lease: time.Second, want: reject(time.Second, time.Second)},
		// a again: renewed to end at 1.5 s, nothing new taken.
		{at: 500 * ms, op: acquire, id: "a", lease: time.Second, want: admit(0, time.Second)},
		{at: 500 * ms, op: acquire, id: "c", lease: time.Second, want: reject(500*ms, time.Second)},
		{at: 600 * ms, op: release, id: "b"},
		{at: 600 * ms, op: acquire, id: "c", lease: time.Second, want: admit(0, time.Second)},
		{at: 600 * ms, op: release, id: "b"}, // releasing twice is not an error
		{at: 600 * ms, op: renew, id: "b", lease: time.Second, err: ErrNotHeld},
		{at: 600 * ms, op: renew, id: "never", lease: time.Second, err: ErrNotHeld},
		// a's lease ends at 1.5 s: still held 1 µs before.
		{at: 1500*ms - us, op: acquire, id: "d", lease: time.Second, want: reject(ms, 101*ms)},
		{at: 1500 * ms, op: acquire, id: "d", lease: time.Second, want: admit(0, time.Second)},
		{at: 1500 * ms, op: renew, id: "a", lease: time.Second, err: ErrNotHeld},
		{at: 1500 * ms, op: renew, id: "c", lease: 2 * time.Second},
		{at: 1500 * ms, op: acquire, id: "a", lease: time.Second, want: reject(time.Second, 2*time.Second)},
	}},
	{"a newcomer at the end of the leases", []step{
		{at: 0, op: acquire, id: "a", lease: time.Second, want: admit(1, time.Second)},
		{at: 0, op: acquire, id: "b", lease: time.Second, want: admit(0, time.Second)},
		{at: time.Second - us, op: acquire, id: "c", lease: time.Second, want: reject(ms, ms)},
		{at: time.Second, op: acquire, id: "c", lease: time.Second, want: admit(1, time.Second)},
		{at: time.Second, op: renew, id: "a", lease: time.Second, err: ErrNotHeld},
	}},
	{"renew extends and shortens", []step{
		{at: 0, op: acquire, id: "a", lease: time.Second, want: admit(1, time.Second)},
		{at: 0, op: acquire, id: "b", lease: time.Second, want: admit(0, time.Second)},
		{at: 900 * ms, op: renew, id: "a", lease: 5 * time.Second},
		{at: 900 * ms, op: renew, id: "b", lease: 50 * ms},
		{at: 900 * ms, op: acquire, id: "c", lease: time.Second, want: reject(50*ms, 5*time.Second)},
		{at: 950 * ms, op: acquire, id: "c", lease: time.Second, want: admit(0, 4950*ms)},
		{at: 950 * ms, op: renew, id: "a", lease: 10 * ms},
		{at: 950 * ms, op: acquire, id: "d", lease: time.Second, want: reject(10*ms, time.Second)},
	}},
	{"release frees at once; the last release empties the key", []step{
		{at: 0, op: release, id: "nobody"},
		{at: 0, op: acquire, id: "a", lease: time.Minute, want: admit(1, time.Minute)},
		{at: 0, op: release, id: "a"},
		{at: 0, op: renew, id: "a", lease: time.Minute, err: ErrNotHeld},
		{at: 0, op: acquire, id: "b", lease: time.Minute, want: admit(1, time.Minute)},
		{at: 0, op: acquire, id: "a", lease: time.Minute, want: admit(0, time.Minute)},
	}},
	// b's long lease comes first, so that the Redis key never expires
	// during the steps (its expiry runs on the server's real clock).
	{"durations round up to the ms", []step{
		{at: 0, op: acquire, id: "b", lease: time.Minute, want: admit(1, time.Minute)},
		{at: 0, op: acquire, id: "a", lease: 1500 * us, want: admit(0, time.Minute)},
		{at: 0, op: acquire, id: "c", lease: time.Second, want: reject(2*ms, time.Minute)},
		{at: 1499 * us, op: acquire, id: "c", lease: time.Second, want: reject(ms, 59999*ms)},
		{at: 1500 * us, op: acquire, id: "c", lease: time.Nanosecond, want: admit(0, 59999*ms)}, // 1 µs
		{at: 1500 * us, op: acquire, id: "d", lease: time.Second, want: reject(ms, 59999*ms)},
		{at: 1501 * us, op: acquire, id: "d", lease: time.Second, want: admit(0, 59999*ms)},
	}},
	{"a clock that moves backwards is clamped", []step{
		{at: time.Second, op: acquire, id: "a", lease: time.Second, want: admit(1, time.Second)},
		{at: time.Second, op: acquire, id: "b", lease: 2 * time.Second, want: admit(0, 2*time.Second)},
		// Decided at 1 s, not at 0.
		{at: 0, op: acquire, id: "c", lease: time.Second, want: reject(time.Second, 2*time.Second)},
		{at: 2*time.Second - us, op: acquire, id: "c", lease: time.Second, want: reject(ms, 1001*ms)},
		{at: 2 * time.Second, op: acquire, id: "c", lease: time.Second, want: admit(0, time.Second)},
		// Back to 1.5 s: a's lease, ended at 2 s, stays ended.
		{at: 1500 * ms, op: renew, id: "a", lease: time.Second, err: ErrNotHeld},
		{at: 1500 * ms, op: acquire, id: "d", lease: time.Second, want: reject(time.Second, time.Second)},
	}},
}

func TestConformance(t *testing.T) {
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			for _, tt := range conformance {
				t.Run(tt.name, func(t *testing.T) {
					clock := throttletest.NewClock(throttletest.T0)
					l := impl.new(t, 2, clock)
					runSteps(t, l, clock, "k", tt.steps)
				})
			}
		})
	}
}

// runSteps makes the calls of steps on key and checks each result.
func runSteps(t *testing.T, l limiter, clock *throttletest.Clock, key string, steps []step) {
	t.Helper()
	ctx := context.Background()
	for i, s := range steps {
		clock.Set(throttletest.T0.Add(s.at))
		what := fmt.Sprintf("step %d at %v: %v(%q, %v)", i+1, s.at, s.op, s.id, s.lease)
		switch s.op {
		case acquire:
			d, err := l.Acquire(ctx, key, s.id, s.lease)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			d.Source = 0
			if d != s.want {
				t.Fatalf("%s = %+v, want %+v", what, d, s.want)
			}
		case renew, release:
			var err error
			if s.op == renew {
				err = l.Renew(ctx, key, s.id, s.lease)
			} else {
				err = l.Release(ctx, key, s.id)
			}
			if !errors.Is(err, s.err) || (s.err == nil && err != nil) {
				t.Fatalf("%s = %v, want %v", what, err, s.err)
			}
		}
	}
}

// TestKeysApart fills two slots on every one of throttletest.OddKeys: if
// any two keys shared state, a first Acquire would see a slot taken.
func TestKeysApart(t *testing.T) {
	ctx := context.Background()
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			l := impl.new(t, 2, clock)
			keys := throttletest.OddKeys()
			rounds := []struct {
				id   string
				want throttle.Decision
			}{
				{"a", admit(1, time.Minute)},
				{"b", admit(0, time.Minute)},
				{"c", reject(time.Minute, time.Minute)},
			}
			for _, r := range rounds {
				for i, k := range keys {
					d, err := l.Acquire(ctx, k, r.id, time.Minute)
					if err != nil {
						t.Fatalf("key %d (%.20q): %v", i, k, err)
					}
					d.Source = 0
					if d != r.want {
						t.Fatalf("key %d (%.20q), id %q: %+v, want %+v", i, k, r.id, d, r.want)
					}
				}
			}
		})
	}
}

// oddIDs are ids that must be told apart and recognised: empty, binary,
// very long, differing in case or in their last byte, and ones that look
// like escapes or hash tags.
func oddIDs() []string {
	long := strings.Repeat("i", 64<<10)
	return []string{
		"", "\x00", "\x00\xff", "\xff", " ", "a", "A", "a:b", "{", "}", "{a}", "%", "%25", "%E",
		"acquire", "release", "renew", ":clock", "-inf", "+inf", "1", "1.0", "nan",
		long, long[:len(long)-1] + "j", long + "\x00",
	}
}

// TestIDsOpaque takes one slot per odd id, then acquires each again
// (admitted, nothing new taken), releases each and checks that each was
// freed.
func TestIDsOpaque(t *testing.T) {
	ctx := context.Background()
	ids := oddIDs()
	for _, impl := range implementations {
		t.Run(impl.name, func(t *testing.T) {
			clock := throttletest.NewClock(throttletest.T0)
			l := impl.new(t, len(ids), clock)
			for round := range 2 {
				for i, id := range ids {
					d, err := l.Acquire(ctx, "ids", id, time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					want := len(ids) - 1 - i
					if round == 1 {
						want = 0 // renewed: no new slot
					}
					if !d.Allowed || d.Remaining != want {
						t.Fatalf("round %d, id %d (%.20q): %+v, want admitted with Remaining %d", round, i, id, d, want)
					}
				}
			}
			if d, err := l.Acquire(ctx, "ids", "one too many", time.Minute); err != nil || d.Allowed {
				t.Fatalf("Acquire beyond the limit = %+v, %v", d, err)
			}
			for i, id := range ids {
				if err := l.Renew(ctx, "ids", id, time.Minute); err != nil {
					t.Fatalf("Renew id %d (%.20q): %v", i, id, err)
				}
				if err := l.Release(ctx, "ids", id); err != nil {
					t.Fatalf("Release id %d (%.20q): %v", i, id, err)
				}
				if err := l.Renew(ctx, "ids", id, time.Minute); !errors.Is(err, ErrNotHeld) {
					t.Fatalf("Renew id %d (%.20q) after Release = %v, want ErrNotHeld", i, id, err)
				}
				for j, other := range ids[i+1:] {
					if err := l.Renew(ctx, "ids", other, time.Minute); err != nil {
						t.Fatalf("Release of id %d (%.20q) freed id %d: %v", i, id, i+1+j, err)
					}
				}
			}
		})
	}
}
