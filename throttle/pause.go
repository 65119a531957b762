package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Pauser is an optional Limiter capability: stopping every admission of
// one key for a while, for instance when the partner that the key's work
// calls answered 429 with a Retry-After. window.Memory, window.Redis,
// bucket.Local, bucket.Redis and bucket.Hybrid implement it; the Gate uses
// it in Gate.Pause, and the consumers' Backoff helpers through the Gate.
type Pauser interface {
	Limiter
	// Pause rejects every decision for key for d from now: AllowN,
	// AllowID and Peek return a rejection with Remaining 0 and a
	// RetryAfter of at least the time left of the pause (more when the
	// limit is still full when it ends), charging and reserving nothing.
	// A pause longer than the one in force extends it; a shorter one
	// never shortens it. Limiters kept in a store (Redis) record the
	// pause there, so it holds for every process sharing the store.
	//
	// Errors: one wrapping ErrInvalidOption (naming the field "d") for
	// d <= 0 or d beyond 2^52 µs (about 142 years); a store or context
	// error for the limiters kept in a store.
	Pause(ctx context.Context, key string, d time.Duration) error
}

// ErrCannotPause is wrapped by the error of Gate.Pause when the Gate's
// limiter does not implement Pauser.
var ErrCannotPause = errors.New("throttle: the limiter cannot pause")

// Pause pauses key in the Gate's limiter for d (see Pauser): until then
// every decision for key is a rejection with a RetryAfter of at least the
// time left, in every process sharing the limiter's store. The consumers'
// Backoff helpers call it when a handler reports that the partner answered
// 429. With WithAIMD, a successful pause also halves the key's limit.
//
// Errors: one wrapping ErrCannotPause when the limiter does not implement
// Pauser; ErrInvalidOption for the zero Gate and for a d the limiter
// refuses (d <= 0); otherwise the limiter's store or context error. A
// pause that failed is logged at Warn (WithLogger), one that succeeded at
// Debug.
func (g *Gate) Pause(ctx context.Context, key string, d time.Duration) error {
	if g == nil || g.limiter == nil {
		return &OptionError{Field: "Gate", Reason: "not built by NewGate"}
	}
	p, ok := g.limiter.(Pauser)
	if !ok {
		return fmt.Errorf("%w: %T", ErrCannotPause, g.limiter)
	}
	err := p.Pause(ctx, key, d)
	if g.aimd != nil && err == nil {
		g.aimd.Decrease(key)
	}
	if g.logger != nil {
		if err != nil {
			g.logger.LogAttrs(ctx, slog.LevelWarn, "throttle: pause failed",
				slog.String("key", key), slog.Duration("pause", d), slog.Any("error", err))
		} else {
			g.logger.LogAttrs(ctx, slog.LevelDebug, "throttle: paused",
				slog.String("key", key), slog.Duration("pause", d))
		}
	}
	return err
}
