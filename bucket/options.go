package bucket

import (
	"fmt"
	"math"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Option configures a Local, Redis or Hybrid bucket. Options that do not
// apply to a type are accepted and ignored by it.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// config is what the options set. Defaults are set by newConfig before the
// options run.
type config struct {
	clock      throttle.Clock // nil: Redis uses its TIME; Local uses throttle.SystemClock
	prefix     string         // Redis key prefix, default "throttle:bucket:"
	timeout    time.Duration  // per Redis call, default 50 ms
	localShare struct {       // WithLocalShare (Hybrid only)
		instances int
		safety    float64
		set       bool
	}
	maxKeys int // Local: most keys held, default DefaultMaxKeys
	// server: WithServerClock; serverLocal is the local clock under the
	// estimate (tests: nil means throttle.SystemClock).
	server      bool
	serverLocal throttle.Clock
	quotas      throttle.QuotaFunc // WithQuotas; nil: the limiter's own for every key
	// oneKeyPerCall: WithOneKeyPerCall.
	oneKeyPerCall bool
}

const (
	defaultPrefix  = "throttle:bucket:"
	defaultTimeout = 50 * time.Millisecond
)

// DefaultMaxKeys is the most keys a Local holds state for. See Local for
// what happens beyond it.
const DefaultMaxKeys = 100_000

func newConfig(opts []Option) (config, error) {
	c := config{prefix: defaultPrefix, timeout: defaultTimeout, maxKeys: DefaultMaxKeys}
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

// WithClock makes the bucket read time from c instead of the default: for
// Redis, the server's TIME (so every process shares one clock); for Local,
// the system clock. With a client clock the Redis script never moves a
// key's stored time backwards (elapsed time is clamped at 0). Nil is
// ignored.
func WithClock(c throttle.Clock) Option {
	return optionFunc(func(cfg *config) error {
		if c != nil {
			cfg.clock = c
		}
		return nil
	})
}

// WithPrefix sets the prefix of every Redis key, default "throttle:bucket:".
// It must not contain '{' or '}', which would break the key's hash tag.
// Local ignores it.
func WithPrefix(p string) Option {
	return optionFunc(func(cfg *config) error {
		if err := rediskey.PrefixError(p); err != nil {
			return err
		}
		cfg.prefix = p
		return nil
	})
}

// WithTimeout bounds every Redis call, default 50 ms; it must be > 0. It
// is applied as a context deadline (unless the caller's context already
// ends sooner), which go-redis only honours on a client created with
// ContextTimeoutEnabled: true; NewRedis refuses a *redis.Client,
// *redis.ClusterClient or *redis.Ring without it unless its ReadTimeout and
// WriteTimeout are both within the timeout (the rule every Redis limiter of
// this module applies). The deadline also covers waiting for a pooled
// connection. See the package documentation. Local ignores it.
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
// The Hybrid stops waiting at the timeout; its call finishes in the
// background within the grace, and tokens it leased are given back.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(cfg *config) error {
		if err := deadline.Check(d); err != nil {
			return err
		}
		cfg.timeout = d
		return nil
	})
}

// WithLocalShare applies to the Hybrid only: while Redis is unreachable (or
// its circuit breaker is open), the Hybrid admits in this process at most
// Count/instances × safety per Per, with decisions of Source
// throttle.SourceDegraded. instances is the number of processes sharing
// the limit (>= 1) and safety a fraction in (0, 1]. Without it, the Hybrid
// returns the error and the Gate's failure policy decides. Local and Redis
// ignore it.
func WithLocalShare(instances int, safety float64) Option {
	return optionFunc(func(cfg *config) error {
		if instances < 1 {
			return &throttle.OptionError{Field: "WithLocalShare.instances", Reason: fmt.Sprintf("must be >= 1, got %d", instances)}
		}
		if math.IsNaN(safety) || safety <= 0 || safety > 1 {
			return &throttle.OptionError{Field: "WithLocalShare.safety", Reason: fmt.Sprintf("must be in (0, 1], got %v", safety)}
		}
		cfg.localShare.instances = instances
		cfg.localShare.safety = safety
		cfg.localShare.set = true
		return nil
	})
}

// WithServerClock makes a Redis bucket (and the Redis calls of a Hybrid)
// decide on the Redis server's clock without calling TIME in its scripts,
// for Redis services whose scripts may not call it: the limiter estimates
// the server's clock from the TIME command (the midpoint of the shortest
// of 3 round trips), re-estimates it every 10 s in the background (keeping
// the estimate of the shortest round trip, up to a minute old), and sends
// the estimate as the scripts' time, as WithClock does. Every process then
// refills on one clock, however far apart their own clocks are; the error
// of an estimate is at most half its round trip plus the local clock's
// drift since (a few ppm). The first call makes the first estimate, within
// the call's timeout; until one succeeds, calls fail (the Gate's failure
// policy decides). On a Redis Cluster or Ring TIME goes to one node, whose
// clock stands for all of them. The client must have a Time method
// (*redis.Client, *redis.ClusterClient and *redis.Ring do). It cannot be
// combined with WithClock. Local ignores it, and so does a Hybrid's local
// bucket.
//
// Where the server has no usable clock at all, WithClock with a client
// clock is what remains: the scripts never move a key's stored time
// backwards (a lagging client's elapsed time is clamped at 0), but a
// client whose clock runs ahead refills every key it touches early for
// everyone: keep the clients' clocks synchronised (NTP).
func WithServerClock() Option {
	return optionFunc(func(cfg *config) error {
		cfg.server = true
		return nil
	})
}

// withServerClockOver is WithServerClock over local instead of the system
// clock (tests: processes whose clocks disagree).
func withServerClockOver(local throttle.Clock) Option {
	return optionFunc(func(cfg *config) error {
		cfg.server, cfg.serverLocal = true, local
		return nil
	})
}

// WithOneKeyPerCall makes a Redis bucket (and a Hybrid's Redis calls) send one script call per key,
// pipelined, instead of one call for every key of a coalesced flush (on a
// *redis.Client) or one per Redis Cluster hash slot (on a
// *redis.ClusterClient): for a proxy in front of Redis that refuses
// scripts of several keys, or that routes a script by its first key alone
// and could run it where the other keys do not live (a proxy that answers
// CROSSSLOT needs no option: the limiter moves to fewer keys per call by
// itself, at the cost of one refused call). Decisions are the same either
// way, and processes with and without it decide the same keys together
// exactly; it costs Redis a script call per key of a flush instead of per
// flush (or slot). A *redis.Ring and clients other than *redis.Client and
// *redis.ClusterClient always send one key per call. Local ignores it.
func WithOneKeyPerCall() Option {
	return optionFunc(func(cfg *config) error {
		cfg.oneKeyPerCall = true
		return nil
	})
}
