package concurrency

import (
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Option configures a Redis or Memory limiter.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	clock   throttle.Clock // nil: Redis uses its TIME; Memory uses throttle.SystemClock
	prefix  string
	timeout time.Duration // per Redis call
}

const (
	defaultPrefix  = "throttle:concurrency:"
	defaultTimeout = 50 * time.Millisecond
)

// checkLimit validates the limit given to a constructor.
func checkLimit(limit int) error {
	if limit < 1 {
		return &throttle.OptionError{Field: "limit", Reason: fmt.Sprintf("must be >= 1, got %d", limit)}
	}
	return nil
}

func newConfig(opts []Option) (config, error) {
	c := config{prefix: defaultPrefix, timeout: defaultTimeout}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&c); err != nil {
			return config{}, err
		}
	}
	return c, nil
}

// WithClock makes the limiter read time from c instead of the default: for
// Redis, the server's TIME (so every worker shares one clock); for Memory,
// the system clock. With a client clock, the Redis script never moves a
// key's stored time backwards: a call whose clock reads earlier than the
// latest call on the key is decided at that latest instant. Redis still
// expires keys on its own clock, a lease after the call, so the clock
// must keep real speed. Nil is ignored.
func WithClock(c throttle.Clock) Option {
	return optionFunc(func(cfg *config) error {
		if c != nil {
			cfg.clock = c
		}
		return nil
	})
}

// WithPrefix sets the prefix of every Redis key, default
// "throttle:concurrency:". It must not contain '{' or '}', which would
// break the key's hash tag. Memory ignores it.
func WithPrefix(p string) Option {
	return optionFunc(func(cfg *config) error {
		if err := rediskey.PrefixError(p); err != nil {
			return err
		}
		cfg.prefix = p
		return nil
	})
}

// WithTimeout bounds every Redis call, default 50 ms; it must be > 0. It is
// applied as a context deadline (unless the caller's context already ends
// sooner), which go-redis honours only on a client created with
// ContextTimeoutEnabled: true; NewRedis refuses a *redis.Client,
// *redis.ClusterClient or *redis.Ring without it unless its ReadTimeout and
// WriteTimeout are both within the timeout (the rule every Redis limiter of
// this module applies). The deadline also covers waiting for a pooled
// connection. A call
// that times out returns an error. Memory ignores it.
//
// A call whose reply is on its way at the timeout waits one round trip
// more (its grace: the moving average of this limiter's round trips, at
// most 2 x the timeout, and that most before the first reply), so that
// go-redis keeps the connection rather than retire it (a new one takes 3
// round trips of handshake: with a round trip near the timeout, no call
// would succeed again). A call returns within the timeout plus its
// grace. A timeout while the measured round trip is longer than the
// timeout is a *throttle.SlowStoreError (throttle.ErrSlowStore), which
// says the timeout to set.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(cfg *config) error {
		if err := deadline.Check(d); err != nil {
			return err
		}
		cfg.timeout = d
		return nil
	})
}
