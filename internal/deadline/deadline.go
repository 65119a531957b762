// Package deadline bounds a store call by a per-call timeout without
// extending a sooner deadline the caller already set.
package deadline

import (
	"context"
	"time"
)

func noCancel() {}

// Bound returns ctx with a deadline d from now, or ctx itself (and a no-op
// cancel) when ctx already ends within d.
func Bound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, d)
}
