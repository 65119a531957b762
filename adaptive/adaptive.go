// Package adaptive is a partner's limit that adapts to the partner's 429s
// and is shared by every process through Redis: one limit, one decrease
// per congestion event, however many workers call the partner.
//
// A Limit is a throttle.QuotaFunc (Quota): give it to the limiter on the
// partner's key (window.WithQuotas, bucket.WithQuotas), and tell it what
// the partner answered: Accepted for a call it accepted, Rejected for a
// 429. Each key starts at the ceiling (its first window paced, with
// WithPacedStart). The first 429 of a congestion event
// (none within one Per of the last decrease) sets the limit to an
// estimate of the partner's quota: the calls it accepted in the last Per,
// every process's, since a partner that counts in windows accepted exactly
// its quota in the window where its 429s began; less a margin (5 %, rounded
// to the nearest call: 10 for 10, 24 for 25), never below the floor, and
// above the limit then in force (a lone 429 at 10 with 10 accepted keeps
// 10, as a call that reached the partner a little early; a second such
// event within 10 windows of the last goes a call below, or 5 % when that
// is less: 9.5, which Quota paces as 10 calls per 1.053 Per). A 429 at
// or beyond the last estimate whose count is at most a call (or 5 %)
// short of it keeps that estimate (the last accepted calls may still be
// on their way); RejectedAfter narrows the count with the 429's
// Retry-After. After a hold of two windows without a decrease, the limit
// grows by 2 % of the estimate per Per back to the estimate (with
// fractions of a call: see Quota), then probes beyond it in whole calls,
// slowly near it and faster away from it (as TCP CUBIC does near its last
// maximum): the excess is 0.02 % of the estimate times the square of the
// windows since it passed the estimate (one more call of 25 after 14
// windows, twice the estimate after 70), up to the ceiling. So a partner
// whose quota grows is found again, and one whose quota stays (25, say)
// is probed past it about once every 16 windows; each overshoot costs the
// few calls of one 429 and its Retry-After. A saw-tooth that halves
// (throttle.AIMD) averages about 0.75 of the quota; this one stays within
// the margin of it.
//
// The state is a hash in Redis beside the accepted calls (a sorted set),
// prefix + "{" + escaped key + "}" + ":state" and ":ok", in one Redis
// Cluster slot, on Redis's TIME. Each process reads it at most every
// WithRefresh (100 ms) and computes the growth in between. If the state
// is lost (FLUSHALL, a restart without data), a process that knew it
// writes back its last state: the limit restarts from the last estimate,
// never from the ceiling.
package adaptive

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/uniqueid"
	"github.com/queuethrottle/queuethrottle/throttle"
)

var (
	//go:embed accepted.lua
	acceptedLua    string
	acceptedScript = redis.NewScript(acceptedLua)
	//go:embed rejected.lua
	rejectedLua    string
	rejectedScript = redis.NewScript(rejectedLua)
	//go:embed state.lua
	stateLua    string
	stateScript = redis.NewScript(stateLua)
)

const (
	// DefaultRefresh is how often a process reads a key's state.
	DefaultRefresh = 100 * time.Millisecond
	marginPerMille = 50              // taken off the estimate
	holdWindows    = 2               // windows without a decrease before the limit grows
	growPerWindow  = 0.02            // of the estimate, per window, once it grows, up to the estimate
	probeGrowth    = 0.0002          // of the estimate, per window squared, beyond it
	stateKeep      = time.Hour       // the state's life without a 429
	callTimeout    = 2 * time.Second // each Redis call, unless ctx ends first
	maxSplit       = 10              // WithPacedStart paces the first window in at most this many parts
)

// Limit is an adaptive limit per key (see the package documentation). It
// is safe for concurrent use.
type Limit struct {
	client    redis.Scripter
	prefix    string
	ceiling   throttle.Rate
	floor     int
	refresh   time.Duration
	replan    func(ctx context.Context, key string) // after a decrease this process made
	members   *uniqueid.Source                      // the accepted calls' members
	paced     bool                                  // WithPacedStart
	pacedCost int                                   // its maxCost
	split     int                                   // the parts of a paced first window (<= 1: not paced)

	mu   sync.Mutex
	keys map[string]*keyState
}

// keyState is what this process knows of a key's state.
type keyState struct {
	limit     float64 // calls per the ceiling's Per, with a fraction; -1: none yet (the ceiling)
	estimate  int     // the partner's quota, as last estimated
	decreased int64   // µs, Redis's clock: the last decrease
	redisNow  int64   // µs, Redis's clock, when fetched
	fetched   time.Time
	first     time.Time // this process's first Quota of the key
	fetching  bool
	known     bool // the state existed: a loss restarts from it
}

// Option configures a Limit.
type Option func(*Limit)

// WithPrefix sets the prefix of the Redis keys (default
// "throttle:adaptive:").
func WithPrefix(p string) Option { return func(l *Limit) { l.prefix = p } }

// WithRefresh sets how often a process reads a key's state (default
// DefaultRefresh): another process's decrease reaches it within that.
func WithRefresh(d time.Duration) Option { return func(l *Limit) { l.refresh = d } }

// WithPacedStart paces a key's first Per in this process, before any
// decrease: k parts of Count/k per Per/k, k = min(10, Count/maxCost), so
// that no part is too small for a request of maxCost units (the largest
// cost the key's requests have: a larger one would be refused as never
// admissible while it lasts). That admits no more than the ceiling in any
// Per and no burst of it at once, so a partner whose quota is below the
// ceiling answers its first 429 after a few calls, not after every caller
// called at once. Off by default; maxCost must be >= 1.
func WithPacedStart(maxCost int) Option {
	return func(l *Limit) { l.pacedCost, l.paced = maxCost, true }
}

// WithReplan sets what a process runs after it decreased key's limit:
// plan the reservations made at the old pace again at the new limit
// (window.Redis's Replan: in order, spread at the new pace). Without it
// they keep their slots, and are re-planned one by one as they find their
// windows full.
func WithReplan(f func(ctx context.Context, key string)) Option {
	return func(l *Limit) { l.replan = f }
}

// NewRedis returns a Limit whose keys start at ceiling (Count per Per)
// and never go below floor (1 <= floor <= ceiling.Count). Errors wrap
// throttle.ErrInvalidOption and name the field.
func NewRedis(client redis.Scripter, ceiling throttle.Rate, floor int, opts ...Option) (*Limit, error) {
	if client == nil {
		return nil, &throttle.OptionError{Field: "client", Reason: "must not be nil"}
	}
	if err := ceiling.Validate(); err != nil {
		return nil, err
	}
	if floor < 1 || floor > ceiling.Count {
		return nil, &throttle.OptionError{Field: "floor", Reason: fmt.Sprintf("must be in [1, %d], got %d", ceiling.Count, floor)}
	}
	l := &Limit{client: client, prefix: "throttle:adaptive:", ceiling: ceiling, floor: floor, refresh: DefaultRefresh, keys: map[string]*keyState{}}
	for _, o := range opts {
		o(l)
	}
	if l.refresh <= 0 {
		return nil, &throttle.OptionError{Field: "WithRefresh", Reason: fmt.Sprintf("must be > 0, got %v", l.refresh)}
	}
	if l.paced {
		if l.pacedCost < 1 {
			return nil, &throttle.OptionError{Field: "WithPacedStart", Reason: fmt.Sprintf("maxCost must be >= 1, got %d", l.pacedCost)}
		}
		l.split = min(maxSplit, ceiling.Count/l.pacedCost)
	}
	var err error
	if l.members, err = uniqueid.New(""); err != nil {
		return nil, err
	}
	return l, nil
}

// Quota returns key's limit now, as a throttle.QuotaFunc: the state read
// at most WithRefresh ago, with the growth since; with WithPacedStart, a
// key's first Per before any decrease is paced. A read that is due runs
// on a goroutine of its own, so Quota never waits for Redis.
//
// A limit with a fraction of a call (9.5, below the estimate: after a
// decrease, growing back, or one event's small step) is its whole calls
// rounded up per a Per stretched to match (10 per 1.0526 Per): no Per
// ever holds more calls than the estimate, and the pace is the fraction's.
// Beyond the estimate the limit probes in whole calls per Per.
func (l *Limit) Quota(key string) throttle.Quota {
	c, paced := l.limit(key)
	if paced {
		return throttle.Quota{Rate: throttle.Rate{Count: l.ceiling.Count / l.split, Per: l.ceiling.Per / time.Duration(l.split)}}
	}
	n := math.Ceil(c)
	if n == c {
		return throttle.Quota{Rate: throttle.Rate{Count: int(n), Per: l.ceiling.Per}}
	}
	return throttle.Quota{Rate: throttle.Rate{Count: int(n), Per: time.Duration(float64(l.ceiling.Per) * n / c)}}
}

// Limit returns key's limit now in whole calls per the ceiling's Per,
// rounded down (see Calls; in the paced first window, the ceiling's
// Count).
func (l *Limit) Limit(key string) int {
	c, _ := l.limit(key)
	return int(c)
}

// Calls returns key's limit now in calls per the ceiling's Per, with its
// fraction (see Quota).
func (l *Limit) Calls(key string) float64 {
	c, _ := l.limit(key)
	return c
}

// limit returns key's limit now (calls per the ceiling's Per: whole
// beyond the estimate, see Quota), and whether its first window paces it,
// starting a read when one is due.
func (l *Limit) limit(key string) (float64, bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.state(key)
	if now.Sub(k.fetched) >= l.refresh && !k.fetching {
		k.fetching = true
		go l.fetch(key)
	}
	if k.limit < 0 && l.split > 1 {
		if k.first.IsZero() {
			k.first = now
		}
		if now.Sub(k.first) < l.ceiling.Per {
			return float64(l.ceiling.Count), true
		}
	}
	return l.current(k, now), false
}

// Accepted records a call for key that the partner accepted. Errors are
// Redis's or ctx's, wrapped as "adaptive: redis: ...".
func (l *Limit) Accepted(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := acceptedScript.Run(ctx, l.client, []string{l.key(key, ":ok")}, l.perUS(), l.members.Next()).Err(); err != nil {
		return fmt.Errorf("adaptive: redis: %w", err)
	}
	return nil
}

// Rejected records a 429 for key and returns the limit then (as Limit
// says it): the first of a congestion event decreases it, for every
// process (see the package documentation). It is RejectedAfter without a
// Retry-After. Errors are Redis's or ctx's, wrapped as "adaptive: redis:
// ..."; the limit is then unchanged.
func (l *Limit) Rejected(ctx context.Context, key string) (int, error) {
	return l.RejectedAfter(ctx, key, 0)
}

// RejectedAfter records a 429 for key whose Retry-After was retryAfter
// (0: none or unknown), as Rejected does. A partner that counts in a
// sliding window of the ceiling's Per answers a Retry-After r below Per
// when the oldest call of its window leaves in r: the quota it accepted
// then lies within the last Per - r. So the estimate counts the accepted
// calls of the last Per - r (and a fiftieth of Per more, for the oldest
// of them, recorded a little after the partner took it), not of the whole
// Per, which after a quota cut still holds the calls taken at the old
// quota (25 a second cut to 10: the first 429's Retry-After of about
// 600 ms gives 10, where the whole Per gives 25). A Retry-After of Per or
// more (whole seconds, say) tells nothing, and the whole Per counts.
// Errors are as Rejected's.
func (l *Limit) RejectedAfter(ctx context.Context, key string, retryAfter time.Duration) (int, error) {
	seen := l.Calls(key)
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	span := l.ceiling.Per
	if retryAfter > 0 && retryAfter < span {
		span = min(span, span-retryAfter+span/50)
	}
	keys := []string{l.key(key, ":state"), l.key(key, ":ok")}
	args := append([]any{l.perUS(), l.floor, seen, marginPerMille}, l.known(key)...)
	args = append(args, span.Microseconds())
	v, err := rejectedScript.Run(ctx, l.client, keys, args...).Int64Slice()
	if err != nil {
		return int(seen), fmt.Errorf("adaptive: redis: %w", err)
	}
	if len(v) != 5 {
		return int(seen), fmt.Errorf("adaptive: redis: unexpected reply %v", v)
	}
	l.mu.Lock()
	k := l.state(key)
	l.set(k, v[0], v[1], v[2], v[3])
	limit := l.current(k, time.Now())
	l.mu.Unlock()
	if v[4] == 1 && l.replan != nil {
		l.replan(ctx, key)
	}
	return int(limit), nil
}

// Read reads key's state from Redis now and returns its limit. Errors
// are Redis's or ctx's, wrapped as "adaptive: redis: ...".
func (l *Limit) Read(ctx context.Context, key string) (int, error) {
	if err := l.read(ctx, key); err != nil {
		return l.Limit(key), err
	}
	return l.Limit(key), nil
}

// fetch is Quota's read, on a goroutine of its own.
func (l *Limit) fetch(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_ = l.read(ctx, key)
}

// read reads key's state, writing back what this process knew when the
// state is gone.
func (l *Limit) read(ctx context.Context, key string) error {
	args := l.known(key)
	args = append(args[1:], args[0]) // state.lua takes keep last
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	v, err := stateScript.Run(ctx, l.client, []string{l.key(key, ":state")}, args...).Int64Slice()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.state(key)
	k.fetching = false
	if err == nil && len(v) != 4 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		k.fetched = time.Now() // try again after a refresh
		return fmt.Errorf("adaptive: redis: %w", err)
	}
	if v[0] < 0 && k.known && k.limit >= 0 {
		// No state, and nothing written back: this read began before this
		// process learnt one (a Rejected meanwhile), which a loss has
		// since wiped. Keep it; the next read writes it back.
		k.fetched = time.Now()
		return nil
	}
	l.set(k, v[0], v[1], v[2], v[3])
	return nil
}

// known returns the scripts' arguments for what this process knows of
// key's state: the state's life (ms), then limit, estimate and decreased,
// or three "" when it knows none.
func (l *Limit) known(key string) []any {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.state(key)
	if k.known && k.limit >= 0 {
		return []any{stateKeep.Milliseconds(), k.limit, k.estimate, k.decreased}
	}
	return []any{stateKeep.Milliseconds(), "", "", ""}
}

// state returns key's state, under l.mu.
func (l *Limit) state(key string) *keyState {
	k := l.keys[key]
	if k == nil {
		k = &keyState{limit: -1}
		l.keys[key] = k
	}
	return k
}

// set records a state read from Redis (the limit in thousandths of a
// call, -1 for none), under l.mu.
func (l *Limit) set(k *keyState, milliLimit, estimate, decreased, now int64) {
	k.limit = -1
	if milliLimit >= 0 {
		k.limit = float64(milliLimit) / 1000
	}
	k.estimate, k.decreased, k.redisNow, k.fetched = int(estimate), decreased, now, time.Now()
	k.known = k.known || milliLimit >= 0
}

// current is k's limit at t, under l.mu: the last decrease's, after
// holdWindows grown by growPerWindow of the estimate per window up to the
// estimate, then by probeGrowth of it times the square of the windows
// since it passed the estimate; beyond the estimate, in whole calls.
func (l *Limit) current(k *keyState, t time.Time) float64 {
	if k.limit < 0 {
		return float64(l.ceiling.Count)
	}
	per := l.ceiling.Per.Microseconds()
	windows := float64(k.redisNow+t.Sub(k.fetched).Microseconds()-k.decreased-holdWindows*per) / float64(per)
	c := float64(k.limit)
	if windows > 0 {
		e := float64(max(k.estimate, l.floor))
		toEstimate := max(0, (e-c)/(growPerWindow*e)) // windows
		if windows <= toEstimate {
			c += growPerWindow * e * windows
		} else {
			past := windows - toEstimate
			c = max(c, e) + probeGrowth*e*past*past
		}
	}
	if c > float64(k.estimate) {
		c = max(float64(k.estimate), math.Floor(c))
	}
	return max(float64(l.floor), min(float64(l.ceiling.Count), c))
}

func (l *Limit) perUS() int64 { return l.ceiling.Per.Microseconds() }

func (l *Limit) key(key, suffix string) string { return rediskey.Key(l.prefix, key) + suffix }
