// Package deadline bounds a store call by a per-call timeout without
// extending a sooner deadline the caller already set.
package deadline

import (
	"context"
	"fmt"
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
