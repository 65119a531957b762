package bucket

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/janitor"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// localShards is the most shards a Local splits its keys over; each has
// its own lock and LRU.
const localShards = 16

// idleChecks is how many of a shard's least recently used keys a new key
// checks, and forgets if they are full again.
const idleChecks = 2

// Local is an in-process token bucket per key: tokens refill lazily from
// the elapsed time (no timers) at Count per Per, up to burst; a request of
// cost n is admitted if n tokens are there and takes them. A rejection
// neither takes tokens nor moves the refill timeline, so a client retrying
// faster than the refill is still admitted at the refill rate. A clock
// that moves backwards counts as no time passing. Time is kept in whole
// microseconds, with the same integer arithmetic as Redis, so both give
// the same decisions at the same instants. AllowID adds reservations,
// which take tokens ahead of time, and idempotent ids (see AllowID).
//
// Per-key state lives in LRU lists (hashicorp/golang-lru's simplelru, one
// per shard), with a lock-free index beside them so that a known key is
// found without the shard's lock; a key's place in the LRU order is
// refreshed at most every 100 ms. A key is forgotten only when that
// changes no decision: its bucket is full again and its ids are past (a
// forgotten key comes back full). New keys forget up to two such keys of
// their shard, and a janitor forgets the others every JanitorPeriod
// without waiting for decisions, giving their memory back. A Local holds
// at most WithMaxKeys keys (default DefaultMaxKeys, split evenly over its
// shards): when a new key's shard is full of keys that are all still
// refilling (each used within one time-to-full, burst/Count × Per), the
// decision for the new key is refused with an error wrapping
// throttle.ErrTooManyKeys, and no existing key is reset: a client that
// mints keys cannot reset everyone's limits.
//
// A Local is safe for concurrent use. Deciding for a key it holds
// allocates nothing. The zero Local is not usable; call NewLocal.
type Local struct {
	lims     *quotaSet // the limiter's own and WithQuotas'
	rate     throttle.Rate
	clock    throttle.Clock
	sysClock bool      // no WithClock: time is base + the monotonic time since
	base     time.Time // when the Local was made, with a monotonic reading
	baseUS   int64     // base in µs since the Unix epoch
	seed     maphash.Seed
	fnvSeed  uint64
	mask     uint64
	shards   []localShard
	pauses   pause.Set // Pause
	refused  atomic.Int64
}

// localShard is a part of the keys. Its lock guards the LRU; each key's
// bucket has a lock of its own, taken after the shard's (never before).
type localShard struct {
	// index finds a key's bucket without a lock; lru, under mu, orders the
	// keys for forgetting and bounds their number. A key is in both or in
	// neither: lru's eviction callback deletes it from index.
	index sync.Map // string -> *localState
	mu    sync.Mutex
	lru   *simplelru.LRU[string, *localState]
	size  int // the most keys lru holds
	peak  int // the most keys lru has held since it was made
	// last is the most recently looked-up key's bucket, which is also the
	// front of lru: deciding again for it needs neither the shard lock nor
	// an LRU update, so a hot key costs one lock, on its own bucket.
	last atomic.Pointer[localState]
	_    [40]byte // keep shards' locks on separate cache lines
}

// promoteEvery is how stale a key's place in the LRU order may get: a key
// looked up again within it is only read from the index, without a lock,
// not moved to the front, which would write the list under the lock.
// The order only decides which keys are forgotten first, so it may be this
// approximate.
const promoteEvery = 100_000 // µs

// localState is one key's bucket: credit (see params; negative while
// reservations are in debt) at ts, µs since the Unix epoch.
type localState struct {
	mu     sync.Mutex
	dead   bool // forgotten by the LRU: look the key up again
	credit int64
	ts     int64
	p      *params      // the params credit is held under (the key's quota when last written)
	key    string       // immutable
	moved  atomic.Int64 // µs: when it was last moved to the LRU's front
	ids    *idSet       // AllowID's ids, made on first use; guarded by mu
}

// NewLocal returns an in-process token bucket per key, refilling r.Count
// tokens per r.Per up to burst (>= 1), starting full.
//
// Options: WithClock (default the system clock, read through its monotonic
// reading so that steps of the wall clock do not matter), WithQuotas,
// WithMaxKeys; the others are accepted and ignored. Errors wrap
// throttle.ErrInvalidOption and name the field: Rate.Count < 1, Rate.Per
// <= 0, burst < 1 (or burst × Per beyond 2^53 µs), a bad option.
func NewLocal(r throttle.Rate, burst int, opts ...Option) (*Local, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	lims, err := newQuotaSet(r, burst, cfg.quotas)
	if err != nil {
		return nil, err
	}
	l := &Local{lims: lims, rate: r, clock: cfg.clock, seed: maphash.MakeSeed()}
	l.fnvSeed = maphash.Comparable(l.seed, 0) | 1
	if l.clock == nil {
		l.clock, l.sysClock = throttle.SystemClock, true
		l.base = time.Now()
		l.baseUS = l.base.UnixMicro()
	}
	// A power of two of shards, no more than keys.
	n := min(localShards, 1<<(bits.Len(uint(cfg.maxKeys))-1))
	l.mask = uint64(n - 1)
	l.shards = make([]localShard, n)
	size := cfg.maxKeys / n // n shards hold at most maxKeys together
	for i := range l.shards {
		s := &l.shards[i]
		s.size = size
		if err := s.newLRU(); err != nil {
			return nil, fmt.Errorf("bucket: local: %w", err)
		}
	}
	janitor.Start(l, (*Local).forgetIdle)
	return l, nil
}

// newLRU gives s an empty LRU list of s.size keys.
func (s *localShard) newLRU() error {
	c, err := simplelru.NewLRU(s.size, s.evicted)
	s.lru = c
	return err
}

// Clock returns the clock the bucket decides on (WithClock, or the
// system clock). All reads it to place one slot in every part.
func (l *Local) Clock() throttle.Clock { return l.clock }

// Rate returns the refill rate.
func (l *Local) Rate() throttle.Rate { return l.rate }

// Burst returns the capacity, in tokens.
func (l *Local) Burst() int { return l.lims.def.p.burst }

// Algorithm returns "token_bucket".
func (l *Local) Algorithm() string { return algorithm }

// Allow is AllowN(ctx, key, 1).
func (l *Local) Allow(ctx context.Context, key string) (throttle.Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN admits a request of cost n for key if the key's bucket holds n
// tokens at the current instant, and takes them; otherwise it rejects,
// taking nothing, with a RetryAfter of (n - tokens) / rate rounded up to
// the millisecond. Remaining is the whole tokens left; ResetAfter the time
// until the bucket is full again. The Decision's Source is
// throttle.SourceLocal.
//
// With WithQuotas, rate, burst and Limit are the key's quota's.
//
// Errors: one wrapping throttle.ErrInvalidCost, for n < 1 or n > burst;
// with WithQuotas, one wrapping throttle.ErrInvalidOption for an invalid
// quota. ctx is unused.
func (l *Local) AllowN(_ context.Context, key string, n int) (throttle.Decision, error) {
	lim, err := l.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	if n < 1 || n > lim.p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, lim.p.burst)
	}
	now := l.now()
	if left := l.pauses.Left(key, now); left > 0 {
		return l.paused(key, lim, n, now, left), nil
	}
	allowed, credit, err := l.take(key, n, &lim.p, now)
	if err != nil {
		return throttle.Decision{}, err
	}
	return lim.p.decision(allowed, n, credit, lim.limit, throttle.SourceLocal), nil
}

// now returns the current instant in µs since the Unix epoch.
func (l *Local) now() int64 {
	if l.sysClock {
		// The monotonic clock only: one clock read instead of time.Now's
		// two, and immune to steps of the wall clock.
		return l.baseUS + int64(time.Since(l.base)/time.Microsecond)
	}
	return l.clock.Now().UnixMicro()
}

// locked returns key's bucket, locked, looking it up (and adding one
// full under p) as needed, and again if it was forgotten meanwhile. The
// error, for a new key in a shard full of live ones, wraps
// ErrTooManyKeys.
func (l *Local) locked(key string, now int64, p *params) (*localState, error) {
	s := &l.shards[l.shardOf(key)]
	st := s.last.Load()
	if st == nil || st.key != key {
		if st = s.lookup(key, now, p); st == nil {
			return nil, l.tooMany(key)
		}
	}
	st.mu.Lock()
	for st.dead {
		st.mu.Unlock()
		if st = s.lookup(key, now, p); st == nil {
			return nil, l.tooMany(key)
		}
		st.mu.Lock()
	}
	return st, nil
}

// JanitorPeriod is how often the janitor of a Local (and of a
// window.Memory) forgets the keys that no decision needs any more.
const JanitorPeriod = janitor.Period

// tooMany counts and returns the refusal of a new key (see Local).
func (l *Local) tooMany(key string) error {
	l.refused.Add(1)
	return fmt.Errorf("bucket: local: key %q refused: %w (its shard holds %d keys, all still refilling; WithMaxKeys %d)",
		key, throttle.ErrTooManyKeys, l.shards[0].size, l.shards[0].size*len(l.shards))
}

// Refused returns how many decisions for new keys the Local refused
// because it held WithMaxKeys live keys (see throttle.ErrTooManyKeys).
func (l *Local) Refused() int64 { return l.refused.Load() }

// take is the algorithm at the instant now (µs), under p (the key's
// params): it reports whether n tokens were taken, and the credit left
// (admitted) or there (rejected).
func (l *Local) take(key string, n int, p *params, now int64) (bool, int64, error) {
	st, err := l.locked(key, now, p)
	if err != nil {
		return false, 0, err
	}
	credit, ts := st.refill(p, now)
	need := int64(n) * p.perUS
	if credit < need {
		st.mu.Unlock()
		return false, credit, nil
	}
	credit -= need
	st.credit, st.ts, st.p = credit, ts, p
	st.mu.Unlock()
	return true, credit, nil
}

// refill is p.refill of st's credit, converted to p's if the key's quota
// changed since it was written (see WithQuotas). The caller holds st.mu.
func (st *localState) refill(p *params, now int64) (int64, int64) {
	credit := st.credit
	if st.p != p {
		credit = p.convert(credit, st.p)
	}
	return p.refill(credit, st.ts, now)
}

// shardOf returns the index of key's shard: FNV-1a from a random seed for
// short keys (cheaper than a call to maphash), maphash for long ones.
func (l *Local) shardOf(key string) uint64 {
	if len(key) > 32 {
		return maphash.String(l.seed, key) & l.mask
	}
	h := l.fnvSeed
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	return (h ^ h>>29 ^ h>>47) & l.mask
}

// lookup returns key's bucket, adding a full one if there is none, and
// makes it the shard's last; nil if there is none and no room for it.
func (s *localShard) lookup(key string, now int64, p *params) *localState {
	if v, ok := s.index.Load(key); ok {
		if st := v.(*localState); now-st.moved.Load() < promoteEvery {
			return st // leaving last alone: no write to the shard's cache line
		}
	}
	s.mu.Lock()
	st, ok := s.lru.Get(key)
	if !ok {
		if st = s.add(key, now, p); st == nil {
			s.mu.Unlock()
			return nil
		}
		s.index.Store(st.key, st)
	}
	st.moved.Store(now)
	if s.last.Load() != st {
		s.last.Store(st)
	}
	s.mu.Unlock()
	return st
}

// add stores a full bucket for key, first forgetting up to idleChecks of
// the least recently used keys whose buckets are full again at now (and
// whose ids are all forgotten); nil, adding nothing, when the shard still
// holds its size. The caller holds s.mu.
func (s *localShard) add(key string, now int64, p *params) *localState {
	for range idleChecks {
		_, old, ok := s.lru.GetOldest()
		if !ok || !s.forget(old, now) {
			break
		}
	}
	if s.lru.Len() >= s.size {
		return nil
	}
	st := &localState{credit: p.cap, ts: now, p: p, key: strings.Clone(key)}
	s.lru.Add(st.key, st) // never evicts: there is room
	s.peak = max(s.peak, s.lru.Len())
	return st
}

// forget removes st from s if it is forgettable at now, and reports
// whether it did. The caller holds s.mu.
func (s *localShard) forget(st *localState, now int64) bool {
	st.mu.Lock()
	full := st.forgettable(now)
	// Marked under its lock, so nobody takes from it once found full.
	st.dead = full
	st.mu.Unlock()
	if full {
		s.lru.Remove(st.key)
	}
	return full
}

// forgetIdle is the janitor's sweep: every forgettable key of every
// shard is forgotten, and a shard left with under a quarter of its peak
// (of at least 256 keys) moves its keys to a fresh LRU, so that the map
// it grew to can be collected (a Go map never shrinks).
func (l *Local) forgetIdle() {
	now := l.now()
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for _, k := range s.lru.Keys() {
			if st, ok := s.lru.Peek(k); ok {
				s.forget(st, now)
			}
		}
		if s.peak >= minRebuildPeak && s.lru.Len() < s.peak/4 {
			s.rebuild()
		}
		s.mu.Unlock()
	}
}

// minRebuildPeak is the smallest peak of keys after which a shard's LRU is
// rebuilt when most of its keys are gone.
const minRebuildPeak = 256

// rebuild moves s's keys, in their order, to a fresh LRU list. The caller
// holds s.mu.
func (s *localShard) rebuild() {
	old := s.lru
	if err := s.newLRU(); err != nil {
		s.lru = old // cannot happen: size >= 1
		return
	}
	for _, k := range old.Keys() { // oldest first
		st, _ := old.Peek(k)
		s.lru.Add(k, st)
	}
	s.peak = s.lru.Len()
}

// evicted marks a bucket the LRU dropped, so that a decision holding it
// looks the key up again.
func (s *localShard) evicted(key string, st *localState) {
	s.index.Delete(key)
	st.mu.Lock()
	st.dead = true
	st.mu.Unlock()
}

// Len reports how many keys the bucket holds state for.
func (l *Local) Len() int {
	total := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		total += s.lru.Len()
		s.mu.Unlock()
	}
	return total
}
