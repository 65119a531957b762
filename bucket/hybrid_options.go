package bucket

import (
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/metric"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// hybridConfig holds the settings that only NewHybrid reads. The shared
// settings (clock, prefix, timeout, local share) live in config.
type hybridConfig struct {
	logger        *slog.Logger         // nil: no logs
	meterProvider metric.MeterProvider // nil: otel.GetMeterProvider()
	maxKeys       int
}

// defaultHybridMaxKeys is the default bound on the keys a Hybrid tracks.
const defaultHybridMaxKeys = 10000

// hybridOption is an Option that only NewHybrid reads; NewLocal and
// NewRedis accept and ignore it.
type hybridOption func(*hybridConfig) error

func (hybridOption) apply(*config) error { return nil }

func (o hybridOption) applyHybrid(c *hybridConfig) error { return o(c) }

// newHybridConfig applies the hybrid-only options in opts.
func newHybridConfig(opts []Option) (hybridConfig, error) {
	c := hybridConfig{maxKeys: defaultHybridMaxKeys}
	for _, o := range opts {
		if ho, ok := o.(interface {
			applyHybrid(*hybridConfig) error
		}); ok {
			if err := ho.applyHybrid(&c); err != nil {
				return hybridConfig{}, err
			}
		}
	}
	return c, nil
}

// WithLogger makes a Hybrid log circuit breaker state changes (Warn when
// the breaker opens, Info otherwise) and failed returns of leased tokens
// to l. Nil, the default, means no logs. Other limiters ignore it.
func WithLogger(l *slog.Logger) Option {
	return hybridOption(func(c *hybridConfig) error {
		c.logger = l
		return nil
	})
}

// WithMeterProvider sets the provider of a Hybrid's metrics (see
// HybridDecisionsMetric and the other Hybrid*Metric constants). Nil, the
// default, means the global provider (otel.GetMeterProvider()). Other
// limiters ignore it.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return hybridOption(func(c *hybridConfig) error {
		if mp != nil {
			c.meterProvider = mp
		}
		return nil
	})
}

// WithMaxKeys bounds how many keys a limiter keeps state for; n must be
// >= 1. A Hybrid (default 10000) drops the least recently used key beyond
// it and returns its unused tokens to Redis: its state is a cache of
// Redis'. A Local (default DefaultMaxKeys) never drops a key whose bucket
// is not full: once it holds n keys that are all still refilling, a
// decision for a new key is refused (see throttle.ErrTooManyKeys) until
// some are full again. NewRedis ignores it.
func WithMaxKeys(n int) Option { return maxKeysOption(n) }

type maxKeysOption int

func (o maxKeysOption) check() error {
	if o < 1 {
		return &throttle.OptionError{Field: "WithMaxKeys", Reason: fmt.Sprintf("must be >= 1, got %d", int(o))}
	}
	return nil
}

func (o maxKeysOption) apply(c *config) error {
	if err := o.check(); err != nil {
		return err
	}
	c.maxKeys = int(o)
	return nil
}

func (o maxKeysOption) applyHybrid(c *hybridConfig) error {
	if err := o.check(); err != nil {
		return err
	}
	c.maxKeys = int(o)
	return nil
}
