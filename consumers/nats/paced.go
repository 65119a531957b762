package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Peeker is a limiter that says what an admission would say without
// charging anything: window.Memory and window.Redis.
type Peeker interface {
	Peek(ctx context.Context, key string, n int) (throttle.Decision, error)
}

// maxPacedBatch bounds one pull of ConsumePaced.
const maxPacedBatch = 256

// ConsumePaced pulls the messages of cons, which must all share the
// throttle key key, and hands each to h.Handle, fetching only as many as
// lim (the limiter behind h's Gate) has room for: it asks lim.Peek for
// the room, fetches at most that many (jetstream.Consumer.Fetch, waiting
// up to a second for them), and when there is no room sleeps until there
// is. So messages are not delivered only to be NAKed, and none uses a
// delivery. Each message is still decided by h (and admitted: the room
// was there, unless another consumer took it or a message costs more than
// one unit, in which case it goes back as usual). Build h without
// WithConcurrency, so that each pull is decided before the next room is
// read. ConsumePaced returns when ctx is done: nil, or the last error of
// Peek if it failed meanwhile (a failing Peek is retried every 100 ms,
// and nothing is fetched until it answers); or earlier, with the error of
// a failed fetch other than a timeout.
func ConsumePaced(ctx context.Context, cons jetstream.Consumer, h *Handler, lim Peeker, key string) error {
	if cons == nil || h == nil || lim == nil {
		return &throttle.OptionError{Field: "ConsumePaced", Reason: "consumer, handler and limiter must not be nil"}
	}
	var lastErr error
	for ctx.Err() == nil {
		d, err := lim.Peek(ctx, key, 1)
		switch {
		case err != nil:
			lastErr = err
			sleep(ctx, 100*time.Millisecond)
			continue
		case !d.Allowed:
			sleep(ctx, d.RetryAfter)
			continue
		}
		batch, err := cons.Fetch(min(d.Remaining+1, maxPacedBatch), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("natsthrottle: fetch: %w", err)
		}
		for msg := range batch.Messages() {
			h.Handle(msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("natsthrottle: fetch: %w", err)
		}
	}
	if lastErr != nil {
		return fmt.Errorf("natsthrottle: peek: %w", lastErr)
	}
	return nil
}

// sleep waits d or until ctx is done, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
