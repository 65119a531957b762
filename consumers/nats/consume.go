package natsthrottle

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Consume consumes c with h.Handle and the pull settings the Handler
// needs: the client buffers at most as many messages as the Handler
// decides at once (jetstream.PullMaxMessages of WithConcurrency's n; 1
// without it), so that no buffered message waits past its AckWait, is
// delivered again and handled twice (the worker example, 16 handlers of
// 1 s, handled 113 of 368 jobs twice with nats.go's default of 500). opts
// are passed on, the buffer bound after them, so that it wins over a
// PullMaxMessages among them; do not pass PullMaxBytes (nats.go refuses
// it beside PullMaxMessages). Stop the returned ConsumeContext, then
// Close the Handler. Errors are Consume's, and one wrapping
// throttle.ErrInvalidOption for a nil c or a Handler not built by New.
func (h *Handler) Consume(c jetstream.Consumer, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	switch {
	case c == nil:
		return nil, &throttle.OptionError{Field: "Consume", Reason: "the consumer must not be nil"}
	case h == nil || h.next == nil || h.gate == nil:
		return nil, &throttle.OptionError{Field: "Consume", Reason: "the Handler was not built by New"}
	}
	opts = append(opts[:len(opts):len(opts)], jetstream.PullMaxMessages(max(h.cfg.concurrency, 1)))
	cc, err := c.Consume(h.Handle, opts...)
	if err != nil {
		return nil, fmt.Errorf("natsthrottle: Consume: %w", err)
	}
	return cc, nil
}
