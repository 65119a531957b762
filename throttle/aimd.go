package throttle

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// AIMD is a per-key limit that adapts to the feedback of the partner a
// key's work calls, as TCP's congestion control does: additive increase,
// multiplicative decrease. Each key starts at the ceiling Rate; a Decrease
// (a 429 from the partner) halves its Count, down to a floor, and without
// feedback it grows back by a step per Per, up to the ceiling. Feedback
// within one Per of the last decrease is taken as the same congestion and
// does not halve again (TCP halves once per round trip).
//
// Quota is a QuotaFunc: give it to a limiter (window.WithQuotas), and the
// limiter decides with the key's current limit; give the AIMD to the Gate
// (WithAIMD), and Gate.Pause, which the consumers' Backoff helpers call on
// a 429, also decreases the key's limit. The limits are kept in this
// process: each worker adapts to the feedback it receives.
//
// An AIMD is safe for concurrent use. It holds state only for keys below
// the ceiling. The zero AIMD is not usable: call NewAIMD.
type AIMD struct {
	ceiling Rate
	floor   int
	step    int
	clock   Clock

	mu   sync.Mutex
	keys map[string]*aimdKey
}

// aimdKey is a key below the ceiling: count at at, and the last decrease.
type aimdKey struct {
	count     float64
	at        time.Time
	decreased time.Time
}

// NewAIMD returns an AIMD whose keys start at, and never exceed, ceiling
// (Count per Per); a decrease halves a key's Count, never below floor
// (>= 1, <= ceiling.Count); without feedback it grows by step (>= 1) per
// Per. clock may be nil: the system clock. Errors wrap ErrInvalidOption
// and name the field.
func NewAIMD(ceiling Rate, floor, step int, clock Clock) (*AIMD, error) {
	if err := ceiling.Validate(); err != nil {
		return nil, err
	}
	if floor < 1 || floor > ceiling.Count {
		return nil, &OptionError{Field: "floor", Reason: fmt.Sprintf("must be in [1, %d], got %d", ceiling.Count, floor)}
	}
	if step < 1 {
		return nil, &OptionError{Field: "step", Reason: fmt.Sprintf("must be >= 1, got %d", step)}
	}
	if clock == nil {
		clock = SystemClock
	}
	return &AIMD{ceiling: ceiling, floor: floor, step: step, clock: clock, keys: make(map[string]*aimdKey)}, nil
}

// Limit returns key's current Count per the ceiling's Per.
func (a *AIMD) Limit(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limit(key, a.clock.Now())
}

// limit is Limit at now, under a.mu; it forgets keys back at the ceiling.
func (a *AIMD) limit(key string, now time.Time) int {
	k := a.keys[key]
	if k == nil {
		return a.ceiling.Count
	}
	grown := k.count + float64(a.step)*float64(now.Sub(k.at))/float64(a.ceiling.Per)
	if grown >= float64(a.ceiling.Count) {
		delete(a.keys, key)
		return a.ceiling.Count
	}
	return max(int(math.Floor(grown)), a.floor)
}

// Quota returns key's current limit: the zero Quota (the limiter's own)
// at the ceiling, else Count per the ceiling's Per. It is a QuotaFunc.
func (a *AIMD) Quota(key string) Quota {
	n := a.Limit(key)
	if n >= a.ceiling.Count {
		return Quota{}
	}
	return Quota{Rate: Rate{Count: n, Per: a.ceiling.Per}}
}

// Decrease halves key's limit (not below the floor), unless it was
// decreased less than one Per ago, and returns the new limit.
func (a *AIMD) Decrease(key string) int {
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.limit(key, now)
	k := a.keys[key]
	if k != nil && now.Sub(k.decreased) < a.ceiling.Per {
		return cur
	}
	next := max(cur/2, a.floor)
	a.keys[key] = &aimdKey{count: float64(next), at: now, decreased: now}
	return next
}

// WithAIMD makes Gate.Pause also decrease the key's limit in a (see
// AIMD): the limiter should take its quotas from a.Quota. Nil is ignored.
func WithAIMD(a *AIMD) Option {
	return optionFunc(func(c *gateConfig) error {
		if a != nil {
			c.aimd = a
		}
		return nil
	})
}
