package throttle

import (
	"fmt"
	"testing"
	"time"
)

var sampleT0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func TestSampler(t *testing.T) {
	s := &sampler{burst: 2, every: 100 * time.Millisecond}
	steps := []struct {
		at      time.Duration
		ok      bool
		skipped int
	}{
		{0, true, 0},
		{0, true, 0},
		{0, false, 0},
		{50 * time.Millisecond, false, 0},
		{100 * time.Millisecond, true, 2},
		{100 * time.Millisecond, false, 0},
		{time.Second, true, 1},
		{time.Second, true, 0}, // the credit is capped at the burst
		{time.Second, false, 0},
		{time.Second - time.Millisecond, false, 0}, // a clock going back adds nothing
	}
	for i, st := range steps {
		ok, skipped := s.allow(sampleT0.Add(st.at))
		if ok != st.ok || skipped != st.skipped {
			t.Fatalf("step %d at %v: Allow = %v, %d; want %v, %d", i, st.at, ok, skipped, st.ok, st.skipped)
		}
	}
}

func TestZeroSampler(t *testing.T) {
	var s sampler
	n := 0
	for range 10 {
		if ok, _ := s.allow(sampleT0); ok {
			n++
		}
	}
	if n != sampleBurst {
		t.Fatalf("zero sampler let %d through at once, want %d", n, sampleBurst)
	}
}

func TestOnceSet(t *testing.T) {
	var o onceSet
	if !o.first("a") || o.first("a") || !o.first("b") {
		t.Fatal("first: want true once per text")
	}
	for i := range maxOnce * 2 {
		o.first(fmt.Sprint(i))
	}
	if o.first("new") {
		t.Fatal("first after maxOnce texts = true, want false")
	}
}
