package throttle

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// WithLogger makes the Gate log through l: every decision at level Debug
// (key, outcome, source, remaining, retry-after, cost), and every limiter
// failure that the failure policy decided for at level Warn, at most 3 at
// once and then 2 per second, each with the number of failures left
// unlogged since the previous one. A failure that will not go away by
// itself (the limiter's error carries a hint, such as a Redis that does
// not let scripts call TIME, or a store whose round trip is longer than
// the limiter's timeout; or the same error on 3 decisions in a row) is
// also logged once at level Error, with the way out, once per distinct
// error text (up to 32 texts per Gate; once for all slow-store errors). By default the Gate logs nothing.
// Nil keeps the default.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *gateConfig) error {
		if l != nil {
			c.logger = l
		}
		return nil
	})
}

// repeatedFailures is how many decisions in a row must fail with the same
// error text for the Gate to log it at level Error as persistent.
const repeatedFailures = 3

// failureLog is the Gate's record of limiter failures for its logger.
type failureLog struct {
	warn sampler
	once onceSet

	mu     sync.Mutex
	last   string // text of the latest failure
	streak int    // decisions in a row that failed with last
	// failing is true from a failure to the next decision that succeeds,
	// which clears it (an atomic load per successful decision).
	failing atomic.Bool
}

// succeeded ends a streak of failures.
func (f *failureLog) succeeded() {
	if f.failing.Load() {
		f.failing.Store(false)
	}
}

// record notes a failure with text and returns the length of the streak
// of decisions that failed with it.
func (f *failureLog) record(text string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.failing.Load() || text != f.last {
		f.last, f.streak = text, 0
	}
	f.failing.Store(true)
	f.streak++
	return f.streak
}

// logFailure logs the limiter failure err for key (Warn, sampled) and, if
// it looks persistent, once at Error with its hint.
func (g *Gate) logFailure(ctx context.Context, key string, err error) {
	f := &g.failures
	text := err.Error()
	streak := f.record(text)
	var h interface{ Hint() string }
	hint := ""
	if errors.As(err, &h) {
		hint = h.Hint()
	}
	once := text
	if errors.Is(err, ErrSlowStore) {
		once = ErrSlowStore.Error() // its text carries the round trip, which varies
	}
	if (hint != "" || streak >= repeatedFailures) && f.once.first(once) {
		if hint == "" {
			hint = "check that the store is up and reachable from this process and that the limiter's settings suit it"
		}
		g.logger.LogAttrs(ctx, slog.LevelError, "throttle: the limiter fails every decision the same way; the failure policy decides them all until this is fixed",
			slog.String("algorithm", g.algorithm),
			slog.String("policy", g.policyFor(err).String()),
			slog.String("key", key),
			slog.String("error", text),
			slog.String("hint", hint))
	}
	if ok, skipped := f.warn.allow(time.Now()); ok {
		g.logger.LogAttrs(ctx, slog.LevelWarn, "throttle: limiter failed; the failure policy decided",
			slog.String("algorithm", g.algorithm),
			slog.String("policy", g.policyFor(err).String()),
			slog.String("key", key),
			slog.String("error", text),
			slog.Int("suppressed", skipped))
	}
}

// logDecision logs d at level Debug; err is the Gate's error, if any.
func (g *Gate) logDecision(ctx context.Context, key string, n int, d Decision, err error) {
	if !g.logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs,
		slog.String("key", key),
		slog.String("outcome", outcomes[outcomeOf(d)]),
		slog.String("source", d.Source.String()),
		slog.Int("remaining", d.Remaining),
		slog.Duration("retry_after", d.RetryAfter),
		slog.Int("cost", n),
	)
	if err == nil {
		err = d.Err
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	g.logger.LogAttrs(ctx, slog.LevelDebug, "throttle: decision", attrs...)
}

// StoreErrors rate-limits the store failures a consumer adapter reports to
// its error handler: Report returns, at most 3 at once and then 2 per
// second, a *StoreError for a Decision whose Err is set, carrying the
// number of failures not reported since the previous one (for a key
// refused as one too many, the ErrTooManyKeys error itself); otherwise
// nil.
// The zero StoreErrors is ready; it is safe for concurrent use.
type StoreErrors struct{ s sampler }

// Report returns the error to report for d, a decision of g for key, or
// nil: d has no Err, or too many were reported lately.
func (r *StoreErrors) Report(g *Gate, key string, d Decision) error {
	if d.Err == nil {
		return nil
	}
	ok, skipped := r.s.allow(time.Now())
	if !ok {
		return nil
	}
	if errors.Is(d.Err, ErrTooManyKeys) {
		return d.Err // not a store failure, and no policy decided
	}
	p := FailClosed
	if g != nil {
		p = g.policyFor(d.Err)
	}
	return &StoreError{Key: key, Policy: p, Suppressed: skipped, Err: d.Err}
}
