package benchtest

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestTimeInterleavedRotates(t *testing.T) {
	var order []int
	ops := make([]func() error, 3)
	for i := range ops {
		ops[i] = func() error {
			order = append(order, i)
			if i == 2 {
				time.Sleep(time.Millisecond) // the only op that takes time
			}
			return nil
		}
	}
	spent, steps, err := TimeInterleaved(ops, func(step int) bool { return step < 3 })
	if err != nil || steps != 3 {
		t.Fatalf("steps %d, err %v; want 3, nil", steps, err)
	}
	if want := []int{0, 1, 2, 1, 2, 0, 2, 0, 1}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	// A sleep lasts at least its duration, so this bound holds on any machine:
	// it fails if op 2's time is not charged to op 2.
	if spent[2] < 3*time.Millisecond {
		t.Errorf("spent %v: want op 2's three 1 ms sleeps charged to op 2", spent)
	}
}

func TestTimeInterleavedStopsAtError(t *testing.T) {
	boom := errors.New("boom")
	calls := [2]int{}
	ops := []func() error{
		func() error { calls[0]++; return nil },
		func() error {
			if calls[1]++; calls[1] == 2 {
				return boom
			}
			return nil
		},
	}
	// Step 0 runs op 0 then op 1; step 1 runs op 1 first, which fails.
	_, steps, err := TimeInterleaved(ops, func(int) bool { return true })
	if err == nil || err.Op != 1 || !errors.Is(err, boom) {
		t.Fatalf("err %v, want op 1's boom", err)
	}
	if steps != 1 || calls != [2]int{1, 2} {
		t.Errorf("stopped at step %d after calls %v, want step 1 after [1 2] (nothing run after the error)", steps, calls)
	}
}
