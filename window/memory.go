package window

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

const memoryShards = 32

// Memory is an in-process sliding window log with the same semantics as
// Redis: an admission at t counts during [t, t+Per), time is kept in whole
// microseconds, rejected attempts are never counted, and a clock that moves
// backwards is clamped to the newest admission of the key.
//
// Memory is bounded by the keys that admitted something in the last window:
// a key's log holds at most Count entries, and a key whose newest admission
// has left the window is deleted by a periodic sweep (at most once per Per
// for each of its 32 shards). It is safe for concurrent use. Deciding for a
// key seen before allocates nothing.
type Memory struct {
	rate   throttle.Rate
	window int64 // µs
	clock  throttle.Clock
	seed   maphash.Seed
	shards [memoryShards]memoryShard
}

type memoryShard struct {
	mu      sync.Mutex
	logs    map[string]*admissionLog
	sweepAt int64 // µs: next time the shard is swept for idle keys
	_       [40]byte
}

// admissionLog is a ring of admissions, oldest first. Admissions at the
// same microsecond share an entry.
type admissionLog struct {
	ring   []admission
	head   int
	size   int
	count  int   // sum of n over the ring
	newest int64 // µs of the newest admission ever made (also the clock floor)
}

type admission struct {
	at int64 // µs since the Unix epoch
	n  int
}

// NewMemory returns an in-process sliding window admitting r.Count per
// r.Per for each key. Options: WithClock (default the system clock);
// WithPrefix is accepted and ignored. Errors wrap throttle.ErrInvalidOption
// and name the field.
func NewMemory(r throttle.Rate, opts ...Option) (*Memory, error) {
	if err := checkRate(r); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := &Memory{rate: r, window: r.PerMicros(), clock: cfg.clock, seed: maphash.MakeSeed()}
	if m.clock == nil {
		m.clock = throttle.SystemClock
	}
	for i := range m.shards {
		m.shards[i].logs = make(map[string]*admissionLog)
	}
	return m, nil
}

// Rate returns the limit the window enforces.
func (m *Memory) Rate() throttle.Rate { return m.rate }

// Algorithm returns "sliding_window_log".
func (m *Memory) Algorithm() string { return algorithm }

// Allow is AllowN(ctx, key, 1).
func (m *Memory) Allow(ctx context.Context, key string) (throttle.Decision, error) {
	return m.AllowN(ctx, key, 1)
}

// AllowN admits n units for key if the last Per holds at most Count-n
// admitted units, and records them at the current instant; otherwise it
// rejects with the time until enough of the oldest admissions leave the
// window. The only error wraps throttle.ErrInvalidCost, for n < 1 or
// n > Count. ctx is unused.
func (m *Memory) AllowN(_ context.Context, key string, n int) (throttle.Decision, error) {
	if err := throttle.CheckCost(n, m.rate.Count); err != nil {
		return throttle.Decision{}, err
	}
	now := m.clock.Now().UnixMicro()
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if now >= s.sweepAt {
		s.sweep(now, m.window)
	}
	l := s.logs[key]
	if l == nil {
		l = &admissionLog{}
		s.logs[key] = l
	}
	return l.allowN(now, n, m.rate.Count, m.window), nil
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

func (s *memoryShard) sweep(now, window int64) {
	for k, l := range s.logs {
		if l.newest+window <= now {
			delete(s.logs, k)
		}
	}
	s.sweepAt = now + window
}

// allowN is the algorithm, at the instant now (µs).
func (l *admissionLog) allowN(now int64, n, limit int, window int64) throttle.Decision {
	now = max(now, l.newest)
	for l.size > 0 && l.ring[l.head].at <= now-window {
		l.count -= l.ring[l.head].n
		l.head = (l.head + 1) % len(l.ring)
		l.size--
	}
	d := throttle.Decision{Limit: limit, Source: throttle.SourceLocal}
	if l.count+n <= limit {
		l.push(now, n)
		d.Allowed = true
		d.Remaining = limit - l.count
		d.ResetAfter = micros(window)
		return d
	}
	need := l.count + n - limit // units that must leave the window first
	at := l.ring[l.head].at
	for i, left := 0, need; left > 0; i++ {
		e := l.ring[(l.head+i)%len(l.ring)]
		at, left = e.at, left-e.n
	}
	d.Remaining = limit - l.count
	d.RetryAfter = micros(at + window - now)
	d.ResetAfter = micros(l.newest + window - now)
	return d
}

func (l *admissionLog) push(at int64, n int) {
	l.count += n
	l.newest = at
	if l.size > 0 {
		if last := &l.ring[(l.head+l.size-1)%len(l.ring)]; last.at == at {
			last.n += n
			return
		}
	}
	if l.size == len(l.ring) {
		grown := make([]admission, max(4, 2*len(l.ring)))
		for i := 0; i < l.size; i++ {
			grown[i] = l.ring[(l.head+i)%len(l.ring)]
		}
		l.ring, l.head = grown, 0
	}
	l.ring[(l.head+l.size)%len(l.ring)] = admission{at: at, n: n}
	l.size++
}

// micros converts µs to a Duration rounded up to the millisecond.
func micros(us int64) time.Duration {
	return throttle.CeilMillisecond(time.Duration(us) * time.Microsecond)
}
