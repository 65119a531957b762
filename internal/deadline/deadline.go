// Package deadline bounds a store call by a per-call timeout without
// extending a sooner deadline the caller already set.
package deadline

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func noCancel() {}

// Check returns the error of the WithTimeout option for d, or nil if
// d > 0.
func Check(d time.Duration) error {
	if d <= 0 {
		return &throttle.OptionError{Field: "WithTimeout", Reason: fmt.Sprintf("must be > 0, got %v", d)}
	}
	return nil
}

// Bound returns ctx with a deadline d from now, or ctx itself (and a no-op
// cancel) when ctx already ends within d.
func Bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, d)
}

// Shared bounds calls made under context.Background (or TODO) by a
// deadline d from about when they start, sharing one context among the
// calls that start within d/16 of each other, so that a call costs no
// allocation for its deadline: each is bounded by at most d and at least
// d - d/16. Calls under any other context get Bound's own. A Shared is
// safe for concurrent use; the zero Shared is not usable: use NewShared.
type Shared struct {
	d     time.Duration
	extra func() time.Duration // added to d (a RoundTrip's grace); nil: none
	cur   atomic.Pointer[shared]
}

type shared struct {
	ctx     context.Context
	cancel  context.CancelFunc // called by the context's own timer at its deadline
	created time.Time
}

// NewShared returns a Shared for the per-call timeout d (> 0).
func NewShared(d time.Duration) *Shared { return &Shared{d: d} }

// Bound is Bound(ctx, d), but with a shared context for background calls.
// The shared context ends only at its deadline: its cancel is a no-op.
func (s *Shared) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	d := s.d
	if s.extra != nil {
		d += s.extra()
	}
	if ctx != context.Background() && ctx != context.TODO() {
		return Bound(ctx, d)
	}
	now := time.Now()
	if c := s.cur.Load(); c != nil && now.Sub(c.created) < s.d/16 {
		return c.ctx, noCancel
	}
	c := &shared{created: now}
	c.ctx, c.cancel = context.WithDeadline(context.Background(), now.Add(d))
	s.cur.Store(c)
	return c.ctx, noCancel
}
