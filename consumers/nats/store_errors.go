package natsthrottle

import (
	"context"
	"log/slog"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// storeFailure reports, rate limited, a decision for r that the Gate's
// failure policy made because the limiter failed (d.Err): to the error
// handler and the logger. The Gate's decision span has recorded the error
// already; the message's own disposition follows the decision as usual.
func (h *Handler) storeFailure(ctx context.Context, r *request, d throttle.Decision) {
	err := h.storeErrs.Report(h.gate, r.key, d)
	if err == nil {
		return
	}
	if h.cfg.onError != nil {
		h.cfg.onError(r.msg, err)
	}
	if h.cfg.logger != nil {
		h.cfg.logger.ErrorContext(ctx, "natsthrottle: message error",
			slog.String("subject", r.msg.Subject()), slog.Any("error", err))
	}
}
