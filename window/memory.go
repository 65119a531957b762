package window

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/janitor"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/throttle"
)

const memoryShards = 32

// Memory is an in-process sliding window log with the same semantics as
// Redis: an admission at t counts during [t, t+Per), time is kept in whole
// microseconds, rejected attempts are never counted, and a clock that moves
// backwards is clamped to the newest admission of the key.
//
// Memory is bounded by the keys that admitted something in the last window:
// a key's log holds at most Count entries (plus its reservations), and a
// key is forgotten only once forgetting it changes no decision: its
// newest admission has left the window and its unclaimed reservations
// have passed their grace. Such keys are deleted by a sweep of each of its
// 32 shards, at most once per Per on the next decision that lands in the
// shard, and by a janitor every JanitorPeriod without waiting for
// decisions. So memory is O(keys active within the last one to two
// windows × their entries), however many distinct keys came and went
// before: a Go map never shrinks, so a shard whose sweep leaves fewer than
// a quarter of the keys it held at its peak (of at least 256) is rebuilt
// into a map of the live keys, and a spike of millions of keys gives its
// memory back to the garbage collector within a janitor period of the
// spike's keys leaving their window. A Memory holds at most WithMaxKeys
// keys (default DefaultMaxKeys): when a new key's shard is full of keys
// still counting, the decision for the new key is refused with an error
// wrapping throttle.ErrTooManyKeys, and no existing key is reset, so a
// client that mints keys cannot reset everyone's limits.
//
// It is safe for concurrent use. Deciding for a key seen before allocates
// nothing.
type Memory struct {
	rate   throttle.Rate
	quotas throttle.QuotaFunc
	window int64 // µs
	clock  throttle.Clock
	seed   maphash.Seed
	pauses pause.Set // Pause
	shards [memoryShards]memoryShard
	// shardKeys is the most keys a shard holds (WithMaxKeys / 32).
	shardKeys int
	refused   atomic.Int64
	spaced    bool // WithSpacedReservations
}

type memoryShard struct {
	mu      sync.Mutex
	logs    map[string]*windowLog
	sweepAt int64 // µs: next time the shard is swept for idle keys
	// fullSweepAt (µs) spaces the sweeps of a full shard that a new key
	// asks for, so that a flood of new keys costs O(1) each.
	fullSweepAt int64
	peak        int // the most keys logs has held since it was made
	_           [32]byte
}

// NewMemory returns an in-process sliding window admitting r.Count per
// r.Per for each key. Options: WithClock (default the system clock),
// WithQuotas, WithMaxKeys; the others are accepted and ignored. Errors
// wrap throttle.ErrInvalidOption and name the field.
func NewMemory(r throttle.Rate, opts ...Option) (*Memory, error) {
	if err := checkRate(r); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := &Memory{rate: r, quotas: cfg.quotas, window: r.PerMicros(), clock: cfg.clock, seed: maphash.MakeSeed(), shardKeys: cfg.maxKeys / memoryShards, spaced: cfg.spaced}
	if m.clock == nil {
		m.clock = throttle.SystemClock
	}
	for i := range m.shards {
		m.shards[i].logs = make(map[string]*windowLog)
	}
	janitor.Start(m, (*Memory).sweepAll)
	return m, nil
}

// JanitorPeriod is how often the janitor of a Memory (and of a
// bucket.Local) forgets the keys that no decision needs any more.
const JanitorPeriod = janitor.Period

// sweepAll is the janitor's sweep of every shard.
func (m *Memory) sweepAll() {
	now, _ := instant(m.clock.Now(), 0)
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		s.sweep(now, m.window)
		s.mu.Unlock()
	}
}

// Refused returns how many decisions for new keys the Memory refused
// because it held WithMaxKeys live keys (see throttle.ErrTooManyKeys).
func (m *Memory) Refused() int64 { return m.refused.Load() }

// Rate returns the limit the window enforces.
func (m *Memory) Rate() throttle.Rate { return m.rate }

// Clock returns the clock the window decides on (WithClock, or the
// system clock). All reads it to place one slot in every part.
func (m *Memory) Clock() throttle.Clock { return m.clock }

// Algorithm returns "sliding_window_log".
func (m *Memory) Algorithm() string { return algorithm }

// Allow is AllowN(ctx, key, 1).
func (m *Memory) Allow(ctx context.Context, key string) (throttle.Decision, error) {
	return m.AllowN(ctx, key, 1)
}

// AllowN admits n units for key if every window of Per that contains the
// current instant holds at most Count-n units (admissions and
// reservations), and records them at that instant; otherwise it rejects
// with the time until they would fit. The only error wraps
// throttle.ErrInvalidCost, for n < 1 or n > Count. ctx is unused.
func (m *Memory) AllowN(_ context.Context, key string, n int) (throttle.Decision, error) {
	return m.decide(key, n, "", false, 0, 0)
}

// AllowID is AllowN for a request with identity id, reserving its own
// future slot on a rejection when the slot lies within horizon (see
// throttle.IDLimiter and the package documentation). Errors: one wrapping
// throttle.ErrInvalidCost for n < 1 or n > Count, one wrapping
// throttle.ErrInvalidOption for horizon < 0. ctx is unused.
func (m *Memory) AllowID(_ context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	if horizon < 0 {
		return throttle.Decision{}, errHorizon(horizon)
	}
	return m.decide(key, n, id, true, horizonMicros(horizon), 0)
}

// AllowIDAfter is AllowID for a request that must not start before now +
// after, as throttle.SlotLimiter describes: All uses it to hold one slot
// in every part. after is rounded up to the µs. Errors: those of AllowID,
// and one wrapping throttle.ErrInvalidOption for after < 0. ctx is
// unused.
func (m *Memory) AllowIDAfter(_ context.Context, key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	if horizon < 0 {
		return throttle.Decision{}, errHorizon(horizon)
	}
	us, err := throttle.AfterMicros(after)
	if err != nil {
		return throttle.Decision{}, err
	}
	return m.decide(key, n, id, true, horizonMicros(horizon), us)
}

// rateOf returns key's rate (its quota, or the Memory's) and its window
// in µs.
func (m *Memory) rateOf(key string) (throttle.Rate, int64, error) {
	if m.quotas == nil {
		return m.rate, m.window, nil
	}
	r, err := quotaOf(m.quotas, m.rate, key)
	return r, r.PerMicros(), err
}

func (m *Memory) decide(key string, n int, id string, withID bool, horizon, after int64) (throttle.Decision, error) {
	r, perUS, err := m.rateOf(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	if err := throttle.CheckCost(n, r.Count); err != nil {
		return throttle.Decision{}, err
	}
	now, window := instant(m.clock.Now(), perUS)
	if left := m.pauses.Left(key, now); left > 0 {
		return m.paused(key, now, left, r, perUS), nil
	}
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if now >= s.sweepAt {
		s.sweep(now, m.window)
	}
	l := s.logs[key]
	if l == nil {
		if len(s.logs) >= m.shardKeys {
			if now >= s.fullSweepAt {
				s.sweep(now, m.window)
				s.fullSweepAt = now + min(m.window, fullSweepEvery)
			}
			if len(s.logs) >= m.shardKeys {
				m.refused.Add(1)
				return throttle.Decision{}, fmt.Errorf("window: memory: key %q refused: %w (its shard holds %d keys whose logs still count; WithMaxKeys %d)",
					key, throttle.ErrTooManyKeys, m.shardKeys, m.shardKeys*memoryShards)
			}
		}
		l = &windowLog{}
		s.logs[key] = l
		s.peak = max(s.peak, len(s.logs))
	}
	return l.decide(now, n, id, withID, horizon, after, limits{limit: r.Count, window: window, nominal: perUS, spaced: m.spaced}), nil
}

// Len reports how many keys the window holds state for.
func (m *Memory) Len() int {
	total := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		total += len(s.logs)
		s.mu.Unlock()
	}
	return total
}

// sweep forgets the keys whose every unit has left its window (the window
// of the key's last decision, plus the µs a reading between two µs adds)
// and whose reservations can no longer be claimed late, and schedules the
// next sweep every window.
func (s *memoryShard) sweep(now, window int64) {
	for k, l := range s.logs {
		if l.idle(now) {
			delete(s.logs, k)
		}
	}
	s.sweepAt = now + window
	if s.peak >= minRebuildPeak && len(s.logs) < s.peak/4 {
		s.rebuild()
	}
}

// fullSweepEvery is the least time (µs) between two sweeps of a full
// shard for new keys.
const fullSweepEvery = 10_000

// minRebuildPeak is the smallest peak of keys after which a shard's map is
// rebuilt when most of its keys are gone: smaller maps cost too little to
// be worth the copy.
const minRebuildPeak = 256

// rebuild copies the live keys into a fresh map, so that the buckets the
// old one grew to at its peak (a Go map never shrinks) can be collected.
// It costs O(live keys) under the shard's lock, and runs at most once per
// sweep after the shard has lost three quarters of its peak.
func (s *memoryShard) rebuild() {
	fresh := make(map[string]*windowLog, len(s.logs))
	for k, l := range s.logs {
		fresh[k] = l
	}
	s.logs = fresh
	s.peak = len(fresh)
}

// micros converts µs to a Duration rounded up to the millisecond.
func micros(us int64) time.Duration {
	return throttle.CeilMillisecond(time.Duration(us) * time.Microsecond)
}
