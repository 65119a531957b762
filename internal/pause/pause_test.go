package pause

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestSet(t *testing.T) {
	var s Set
	if got := s.Left("k", 0); got != 0 {
		t.Fatalf("empty set: Left = %d", got)
	}
	s.Extend("k", 0, 100)
	s.Extend("k", 10, 50) // shorter: kept at 100
	if got := s.Left("k", 10); got != 90 {
		t.Fatalf("Left = %d, want 90", got)
	}
	s.Extend("k", 10, 200)
	if got := s.Left("k", 10); got != 190 {
		t.Fatalf("after a longer pause: Left = %d, want 190", got)
	}
	if got := s.Left("k", 200); got != 0 {
		t.Fatalf("at the end: Left = %d, want 0", got)
	}
	// Ended pauses are forgotten as the set grows.
	for i := range 1000 {
		s.Extend(fmt.Sprint(i), int64(i), int64(i)+1)
	}
	if n := s.n.Load(); n > 100 {
		t.Fatalf("%d pauses kept, want the ended ones forgotten", n)
	}
	s.Extend("x", 0, 1<<40)
	s.Clear("x")
	if got := s.Left("x", 0); got != 0 {
		t.Fatalf("after Clear: Left = %d", got)
	}
}

func TestCheck(t *testing.T) {
	for _, d := range []time.Duration{0, -1, Max + time.Microsecond} {
		var oe *throttle.OptionError
		if err := Check(d); !errors.As(err, &oe) || oe.Field != "d" {
			t.Errorf("Check(%v) = %v; want an OptionError naming d", d, err)
		}
	}
	if err := Check(time.Nanosecond); err != nil {
		t.Errorf("Check(1ns) = %v", err)
	}
	if got := Micros(1500 * time.Nanosecond); got != 2 {
		t.Errorf("Micros(1.5µs) = %d, want 2 (rounded up)", got)
	}
}
