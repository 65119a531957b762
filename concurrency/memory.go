package concurrency

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

const (
	memoryShards = 32
	// sweepEvery is how often, at most, a shard looks for keys whose
	// leases have all ended (holders that died without a Release).
	sweepEvery = int64(time.Second / time.Microsecond)
	// maxFree bounds the slot sets a shard keeps for reuse.
	maxFree = 16
)

// Memory is an in-process in-flight limit with the same semantics as
// Redis: at most limit ids hold a slot of a key at once, a lease ending at
// e is held until e and free at e, time is kept in whole microseconds, and
// a clock that moves backwards is clamped to the latest instant used on
// the key.
//
// Memory is bounded by the keys with a lease that has not ended: a key
// holds at most limit ids, a key whose last slot is released is deleted at
// once, and one whose leases all ended is deleted by a periodic sweep (at
// most once a second for each of its 32 shards). Each call costs
// O(limit): the ids of a key are scanned, which suits limits up to the low
// thousands. It is safe for concurrent use. A call on a key seen before
// allocates nothing. The zero Memory is not usable: create one with
// NewMemory.
type Memory struct {
	limit  int
	clock  throttle.Clock
	seed   maphash.Seed
	shards [memoryShards]memoryShard
}

type memoryShard struct {
	mu      sync.Mutex
	sets    map[string]*slotSet
	free    []*slotSet // emptied sets, for reuse
	sweepAt int64      // µs: next time the shard is swept for ended keys
	_       [40]byte
}

// slotSet is the ids holding a slot of one key, in no order.
type slotSet struct {
	holders []holder
	floor   int64 // µs: the latest instant used on the key
}

type holder struct {
	id  string
	end int64 // µs since the Unix epoch: the lease is held until end
}

// NewMemory returns an in-process in-flight limit of limit slots per key.
// Options: WithClock (default the system clock); WithPrefix and
// WithTimeout are validated and otherwise ignored. Errors wrap
// throttle.ErrInvalidOption and name the field ("limit" for a limit < 1).
func NewMemory(limit int, opts ...Option) (*Memory, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := &Memory{limit: limit, clock: cfg.clock, seed: maphash.MakeSeed()}
	if m.clock == nil {
		m.clock = throttle.SystemClock
	}
	for i := range m.shards {
		m.shards[i].sets = make(map[string]*slotSet)
	}
	return m, nil
}

// Acquire gives id a slot of key for lease, as Redis.Acquire does: an id
// already holding a slot is admitted with its lease renewed; otherwise it
// is admitted if fewer than limit ids hold a slot, else rejected with a
// RetryAfter of the time until the earliest lease ends. The only error
// wraps throttle.ErrInvalidCost, for lease <= 0 (or longer than 2^52 µs).
// Source is throttle.SourceLocal. ctx is unused.
func (m *Memory) Acquire(_ context.Context, key, id string, lease time.Duration) (throttle.Decision, error) {
	us, err := leaseMicros(lease)
	if err != nil {
		return throttle.Decision{}, err
	}
	s, now := m.lock(key)
	defer s.mu.Unlock()
	set := s.sets[key]
	if set == nil {
		set = s.alloc(now)
		s.sets[key] = set
	}
	now = set.advance(now)
	allowed := false
	if i := set.find(id); i >= 0 {
		set.holders[i].end = now + us
		allowed = true
	} else if len(set.holders) < m.limit {
		set.holders = append(set.holders, holder{id: id, end: now + us})
		allowed = true
	}
	first, last := set.bounds()
	return decision(allowed, m.limit, len(set.holders), first-now, last-now, throttle.SourceLocal), nil
}

// Renew makes the lease of id on key end lease from now, as Redis.Renew
// does. It returns an error wrapping ErrNotHeld if id holds no slot, or
// one wrapping throttle.ErrInvalidCost for lease <= 0. ctx is unused.
func (m *Memory) Renew(_ context.Context, key, id string, lease time.Duration) error {
	us, err := leaseMicros(lease)
	if err != nil {
		return err
	}
	s, now := m.lock(key)
	defer s.mu.Unlock()
	set := s.sets[key]
	if set == nil {
		return ErrNotHeld
	}
	now = set.advance(now)
	i := set.find(id)
	if i < 0 {
		s.tidy(key, set)
		return ErrNotHeld
	}
	set.holders[i].end = now + us
	return nil
}

// Release frees the slot id holds on key; releasing a slot that is not
// held is not an error. It returns nil. ctx is unused.
func (m *Memory) Release(_ context.Context, key, id string) error {
	s, now := m.lock(key)
	defer s.mu.Unlock()
	set := s.sets[key]
	if set == nil {
		return nil
	}
	set.advance(now)
	if i := set.find(id); i >= 0 {
		set.remove(i)
	}
	s.tidy(key, set)
	return nil
}

// Len reports how many keys the limiter holds state for.
func (m *Memory) Len() int {
	total := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		total += len(s.sets)
		s.mu.Unlock()
	}
	return total
}

// lock reads the clock, locks the shard of key, and sweeps it when due.
func (m *Memory) lock(key string) (*memoryShard, int64) {
	now := m.clock.Now().UnixMicro()
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	if now >= s.sweepAt {
		s.sweep(now)
	}
	return s, now
}

// alloc returns an empty set whose clock floor is now.
func (s *memoryShard) alloc(now int64) *slotSet {
	if n := len(s.free); n > 0 {
		set := s.free[n-1]
		s.free = s.free[:n-1]
		set.floor = now
		return set
	}
	return &slotSet{floor: now}
}

// tidy deletes the set of key if it holds no slot.
func (s *memoryShard) tidy(key string, set *slotSet) {
	if len(set.holders) > 0 {
		return
	}
	delete(s.sets, key)
	if len(s.free) < maxFree {
		s.free = append(s.free, set)
	}
}

// sweep deletes the keys whose leases have all ended at now.
func (s *memoryShard) sweep(now int64) {
	for k, set := range s.sets {
		if _, last := set.bounds(); last <= now {
			clear(set.holders) // drop the ids for the garbage collector
			set.holders = set.holders[:0]
			s.tidy(k, set)
		}
	}
	s.sweepAt = now + sweepEvery
}

// advance clamps now to the set's clock floor, moves the floor to it, and
// drops the leases that have ended at it. It returns the clamped now.
func (set *slotSet) advance(now int64) int64 {
	now = max(now, set.floor)
	set.floor = now
	for i := 0; i < len(set.holders); {
		if set.holders[i].end <= now {
			set.remove(i)
			continue
		}
		i++
	}
	return now
}

// find returns the index of id in the set, or -1.
func (set *slotSet) find(id string) int {
	for i := range set.holders {
		if set.holders[i].id == id {
			return i
		}
	}
	return -1
}

// remove deletes the holder at i (the order is not kept).
func (set *slotSet) remove(i int) {
	n := len(set.holders) - 1
	set.holders[i] = set.holders[n]
	set.holders[n] = holder{} // drop the id for the garbage collector
	set.holders = set.holders[:n]
}

// bounds returns the earliest and the latest lease end, or 0, 0 for an
// empty set.
func (set *slotSet) bounds() (first, last int64) {
	for i, h := range set.holders {
		if i == 0 || h.end < first {
			first = h.end
		}
		if h.end > last {
			last = h.end
		}
	}
	return first, last
}
