package concurrency

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

func TestNewMemoryBadInput(t *testing.T) {
	tests := []struct {
		name  string
		limit int
		opts  []Option
		field string
	}{
		{"zero limit", 0, nil, "limit"},
		{"negative limit", -5, nil, "limit"},
		{"brace in prefix", 1, []Option{WithPrefix("{")}, "WithPrefix"},
		{"zero timeout", 1, []Option{WithTimeout(0)}, "WithTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMemory(tt.limit, tt.opts...)
			if m != nil || !errors.Is(err, throttle.ErrInvalidOption) {
				t.Fatalf("NewMemory = %v, %v; want nil and an error wrapping ErrInvalidOption", m, err)
			}
			var oe *throttle.OptionError
			if !errors.As(err, &oe) || oe.Field != tt.field {
				t.Fatalf("error %v does not name field %q", err, tt.field)
			}
		})
	}
	t.Run("bad lease", func(t *testing.T) {
		m, err := NewMemory(1)
		if err != nil {
			t.Fatal(err)
		}
		checkBadLease(t, m)
		if m.Len() != 0 {
			t.Fatalf("a refused call left %d keys", m.Len())
		}
	})
}

func TestMemoryDecisionFields(t *testing.T) {
	m, err := NewMemory(10, nil, WithClock(nil))
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Acquire(context.Background(), "fields", "a", time.Minute)
	want := throttle.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Minute, Source: throttle.SourceLocal}
	if err != nil || d != want {
		t.Fatalf("Acquire = %+v, %v; want %+v", d, err, want)
	}
}

// TestMemoryForgetsKeys checks that a key is deleted at its last Release,
// and that keys whose holders died are swept once their leases ended.
func TestMemoryForgetsKeys(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	m, err := NewMemory(2, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = m.Acquire(ctx, "k", "a", time.Second)
	must(err)
	must(m.Release(ctx, "k", "a"))
	must(m.Release(ctx, "never", "a"))
	if err := m.Renew(ctx, "never", "a", time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Renew on an unknown key = %v", err)
	}
	if m.Len() != 0 {
		t.Fatalf("Len = %d after the last Release, want 0", m.Len())
	}

	for i := range 10_000 {
		_, err := m.Acquire(ctx, fmt.Sprint("dead-", i), "a", time.Second)
		must(err)
	}
	if m.Len() != 10_000 {
		t.Fatalf("Len = %d, want 10000", m.Len())
	}
	// 1 µs before the leases end nothing is swept, however often.
	clock.Advance(time.Second - us)
	for i := range 1000 {
		_, err := m.Acquire(ctx, fmt.Sprint("live-", i), "a", time.Minute)
		must(err)
	}
	if m.Len() != 11_000 {
		t.Fatalf("Len = %d before the leases ended, want 11000", m.Len())
	}
	// Once they ended, one call in each shard sweeps them.
	clock.Advance(2 * time.Second)
	for i := range 1000 {
		_, err := m.Acquire(ctx, fmt.Sprint("live-", i), "a", time.Minute)
		must(err)
	}
	if m.Len() != 1000 {
		t.Fatalf("Len = %d after the sweep, want the 1000 live keys", m.Len())
	}
}

// TestMemoryNoAllocs checks that Acquire, Renew and Release on a key seen
// before allocate nothing.
func TestMemoryNoAllocs(t *testing.T) {
	m, err := NewMemory(4)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.Acquire(ctx, "k", "warm", time.Minute); err != nil {
		t.Fatal(err)
	}
	_ = m.Release(ctx, "k", "warm")
	allocs := testing.AllocsPerRun(1000, func() {
		_, _ = m.Acquire(ctx, "k", "a", time.Minute)
		_ = m.Renew(ctx, "k", "a", time.Minute)
		_ = m.Release(ctx, "k", "a")
	})
	if allocs != 0 {
		t.Fatalf("Acquire+Renew+Release allocate %v times, want 0", allocs)
	}
}
