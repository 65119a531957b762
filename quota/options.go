package quota

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Option configures a RedisHash.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	refresh time.Duration
	timeout time.Duration
	onError func(error)
	logger  *slog.Logger
}

// DefaultRefresh is how often a RedisHash reads its hash by default: a
// change is seen by every process within about this long (plus one read).
const DefaultRefresh = 250 * time.Millisecond

// defaultTimeout bounds each read of the hash.
const defaultTimeout = time.Second

// WithRefresh sets how often the hash is read (HGETALL), default
// DefaultRefresh; it must be > 0. Each read costs Redis O(fields): raise
// it for hashes of many thousands of fields.
func WithRefresh(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return &throttle.OptionError{Field: "WithRefresh", Reason: fmt.Sprintf("must be > 0, got %v", d)}
		}
		c.refresh = d
		return nil
	})
}

// WithTimeout bounds each read of the hash, default 1 s; it must be > 0.
// It is a context deadline, which go-redis honours only on a client made
// with ContextTimeoutEnabled: true.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return &throttle.OptionError{Field: "WithTimeout", Reason: fmt.Sprintf("must be > 0, got %v", d)}
		}
		c.timeout = d
		return nil
	})
}

// WithErrorHandler makes f receive the errors of the background refresh:
// a failed read (wrapping the Redis error; at most one per 5 s while
// reads keep failing), a field whose value is not a quota (a
// *FieldError, once per bad value) and a hash that reads empty after it
// had fields (a *LostError, once per loss). f runs on the goroutine that read the
// hash, under the RedisHash's lock: it should return quickly and must not
// call Set, Delete or Refresh. Nil, the default, means none.
func WithErrorHandler(f func(error)) Option {
	return optionFunc(func(c *config) error {
		c.onError = f
		return nil
	})
}

// WithLogger logs the errors of WithErrorHandler at Warn to l. Nil, the
// default, means no logs. Both may be set.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		c.logger = l
		return nil
	})
}
