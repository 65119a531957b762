package window

import (
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Option configures a Redis or Memory window.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	clock    throttle.Clock // nil: Redis uses its TIME; Memory uses throttle.SystemClock
	prefix   string
	clockSet bool
}

const defaultPrefix = "throttle:window:"

func newConfig(opts []Option) (config, error) {
	c := config{prefix: defaultPrefix}
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
// key's stored time backwards. Nil is ignored.
func WithClock(c throttle.Clock) Option {
	return optionFunc(func(cfg *config) error {
		if c != nil {
			cfg.clock = c
			cfg.clockSet = true
		}
		return nil
	})
}

// WithPrefix sets the prefix of every Redis key, default "throttle:window:".
// It must not contain '{' or '}', which would break the key's hash tag.
// Memory ignores it.
func WithPrefix(p string) Option {
	return optionFunc(func(cfg *config) error {
		if !rediskey.CheckPrefix(p) {
			return &throttle.OptionError{Field: "WithPrefix", Reason: "must not contain '{' or '}' (they would break the Redis Cluster hash tag)"}
		}
		cfg.prefix = p
		return nil
	})
}
