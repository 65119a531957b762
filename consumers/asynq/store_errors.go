package asynqthrottle

import (
	"context"

	"github.com/hibiken/asynq"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// storeFailure passes, rate limited, a decision for t that the Gate's
// failure policy made because the limiter failed (d.Err) to the error
// handler. The Gate's decision span has recorded the error already.
func (h *handler) storeFailure(ctx context.Context, t *asynq.Task, key string, d throttle.Decision) {
	if h.cfg.onError == nil {
		return
	}
	if err := h.storeErrs.Report(h.gate, key, d); err != nil {
		h.cfg.onError(ctx, t, err)
	}
}
