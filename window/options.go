package window

import (
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
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
	timeout  time.Duration // per Redis call
	quotas   throttle.QuotaFunc
	maxKeys  int // Memory: most keys held, default DefaultMaxKeys
	// server: WithServerClock; serverLocal is the local clock under the
	// estimate (tests: nil means throttle.SystemClock).
	server      bool
	serverLocal throttle.Clock
	// oneKeyPerCall: WithOneKeyPerCall.
	oneKeyPerCall bool
	// spaced: WithSpacedReservations.
	spaced bool
}

const (
	defaultPrefix  = "throttle:window:"
	defaultTimeout = 50 * time.Millisecond
)

// maxPerMicros bounds the window so that admission times plus the window
// stay exact in a Lua number (a float64): 2^52 µs, about 142 years.
const maxPerMicros = 1 << 52

// checkRate validates r for a window.
func checkRate(r throttle.Rate) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.PerMicros() > maxPerMicros {
		return &throttle.OptionError{Field: "Rate.Per", Reason: fmt.Sprintf("%v is longer than the 2^52 µs (about 142 years) a window can be", r.Per)}
	}
	return nil
}

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

// WithServerClock makes a Redis window decide on the Redis server's clock
// without calling TIME in its script, for Redis services whose scripts may
// not call it: the limiter estimates the server's clock from the TIME
// command (the midpoint of the shortest of 3 round trips), re-estimates it
// every 10 s in the background (keeping the estimate of the shortest round
// trip, up to a minute old), and sends the estimate as the script's time,
// as WithClock does. Every process then decides on one clock, however far
// apart their own clocks are; the error of an estimate is at most half its
// round trip (tens of µs on a LAN) plus the local clock's drift since (a
// few ppm). The first decision makes the first estimate, within the
// decision's timeout; until one succeeds, decisions fail (the Gate's
// failure policy decides). On a Redis Cluster or Ring TIME goes to one
// node, whose clock stands for all of them (NTP keeps them within
// milliseconds). The client must have a Time method (*redis.Client,
// *redis.ClusterClient and *redis.Ring do). It cannot be combined with
// WithClock. Memory ignores it.
//
// Where the server has no usable clock at all (TIME refused as a command
// too), WithClock with a client clock is what remains: the script never
// moves a key's stored time backwards, so a client whose clock lags is
// clamped to the newest admission of the key (its admissions count from
// there), but a client whose clock runs ahead moves every key it touches
// forward for everyone, and the window holds exactly only as far as the
// clients' clocks agree: keep them synchronised (NTP) to well within Per.
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

// WithPrefix sets the prefix of every Redis key, default "throttle:window:".
// It must not contain '{' or '}', which would break the key's hash tag.
// Memory ignores it.
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
// connection. A
// decision that times out is an error, and the throttle.Gate's failure
// policy decides. Memory ignores it.
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
// A script that runs after its call's timeout, in the server's clock
// (estimated from the replies, which carry the server's instant), applies
// nothing: a decision applied is one its caller reads.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(cfg *config) error {
		if err := deadline.Check(d); err != nil {
			return err
		}
		cfg.timeout = d
		return nil
	})
}

// WithSpacedReservations makes the reservations of a key no earlier than
// the key's last reservation plus their share of the window (Per/Count a
// unit): a backlog served through reservations (AllowID,
// natsthrottle.ConsumeByKey, asynqthrottle with reservations) is served
// evenly. Without it each reservation takes the earliest instant with
// room, so the units admitted together (after a pause, or a burst) leave
// the window together, and the reservations that take their room come
// together too, window after window: a sliding window repeats the bunches
// a disturbance left, and a partner that counts per second sees uneven
// seconds. With it a bunch is spread within a window. The pace is the
// limit's, so no throughput is lost to it while a backlog lasts; a
// request admitted at once (room now) is not delayed, and a reservation
// is no longer placed in a gap before the last one. Redis and Memory
// alike. Processes with and without it can share a key: each places its
// own reservations, and every window stays within the limit either way.
func WithSpacedReservations() Option {
	return optionFunc(func(cfg *config) error {
		cfg.spaced = true
		return nil
	})
}

// WithOneKeyPerCall makes a Redis window send one script call per key,
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
// *redis.ClusterClient always send one key per call. Memory ignores it.
func WithOneKeyPerCall() Option {
	return optionFunc(func(cfg *config) error {
		cfg.oneKeyPerCall = true
		return nil
	})
}

// errHorizon is the error of AllowID for a negative horizon.
func errHorizon(h time.Duration) error {
	return &throttle.OptionError{Field: "horizon", Reason: fmt.Sprintf("must be >= 0, got %v", h)}
}

// horizonMicros converts a reservation horizon to µs, rounded down (a slot
// is reserved only if it lies within the horizon).
func horizonMicros(h time.Duration) int64 { return int64(h / time.Microsecond) }

// DefaultMaxKeys is the most keys a Memory holds state for by default.
const DefaultMaxKeys = 1_000_000

// WithMaxKeys bounds how many keys a Memory holds state for (split evenly
// over its 32 shards), default DefaultMaxKeys; n must be >= 32. A key is
// only forgotten once its log is empty (see Memory), so when a new key's
// shard is full of keys whose logs still count, the decision for the new
// key is refused with an error wrapping throttle.ErrTooManyKeys and no
// existing key is reset. Redis ignores it.
func WithMaxKeys(n int) Option {
	return optionFunc(func(c *config) error {
		if n < memoryShards {
			return &throttle.OptionError{Field: "WithMaxKeys", Reason: fmt.Sprintf("must be >= %d (one per shard), got %d", memoryShards, n)}
		}
		c.maxKeys = n
		return nil
	})
}
