package bucket

import (
	"context"
	"strings"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// AllowID is AllowN for a request with identity id (opaque bytes, scoped
// to key), as throttle.IDLimiter describes, with tokens taken ahead of
// time as golang.org/x/time/rate's ReserveN takes them; the rules are in
// the package documentation ("Reservations and ids"). horizon 0 never
// reserves; horizons beyond 2^52 µs act as 2^52 µs. The same id should be
// presented with the same n.
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > burst, and
// one wrapping throttle.ErrInvalidOption (naming "horizon") for horizon <
// 0, or (WithQuotas) for an invalid quota. ctx is unused. AllowID
// allocates when it records a new id.
func (l *Local) AllowID(_ context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	return l.allowID(key, n, id, horizon, 0)
}

// AllowIDAfter is AllowID for a request that must not start before now +
// after, as throttle.SlotLimiter describes: All uses it to hold one slot
// in every part. It takes the tokens now and reserves the later of its own
// slot and now + after, but a slot later than its own only while the
// bucket, without this request, would not be full again by then (tokens
// taken ahead of a slot after the bucket refilled would add to a burst
// there): otherwise it takes nothing and answers RetryAfter = after.
// after is rounded up to the µs. Errors: those of AllowID, and one
// wrapping throttle.ErrInvalidOption for after < 0. ctx is unused.
func (l *Local) AllowIDAfter(_ context.Context, key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	return l.allowID(key, n, id, horizon, after)
}

func (l *Local) allowID(key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	lim, err := l.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	if n < 1 || n > lim.p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, lim.p.burst)
	}
	if horizon < 0 {
		return throttle.Decision{}, errHorizon(horizon)
	}
	us, err := throttle.AfterMicros(after)
	if err != nil {
		return throttle.Decision{}, err
	}
	now := l.now()
	if left := l.pauses.Left(key, now); left > 0 {
		return l.paused(key, lim, n, now, left), nil
	}
	st, err := l.locked(key, now, &lim.p)
	if err != nil {
		return throttle.Decision{}, err
	}
	d := decideID(st, lim, now, n, id, horizonMicros(horizon), us)
	st.mu.Unlock()
	return d, nil
}

// decideID is AllowID's algorithm at the instant now (µs), on st, locked,
// under the key's limits, with the slot no earlier than now + after µs
// (AllowIDAfter; 0 for AllowID); bucket_id.lua is its twin.
func decideID(st *localState, lim *keyLimits, now int64, n int, id string, horizon, after int64) throttle.Decision {
	p, limit := &lim.p, lim.limit
	credit, ts := st.refill(p, now)
	now = ts // a clock behind the bucket's time counts as no time passing
	need := int64(n) * p.perUS
	if ids := st.ids; ids != nil {
		ids.forget(now - p.memUS)
		if r, ok := ids.m[id]; ok {
			switch {
			case !r.reserved:
				d := p.decision(true, n, credit, limit, throttle.SourceLocal)
				d.AlreadyAdmitted = true
				return d
			case r.at > now && r.at >= now+after:
				d := p.decision(false, n, credit, limit, throttle.SourceLocal)
				d.RetryAfter, d.Reserved = micros(r.at-now), true
				return d
			case after == 0:
				ids.add(id, now, false, p.memUS) // admitted on its reservation
				return p.decision(true, n, credit, limit, throttle.SourceLocal)
			}
			// A slot before now + after: its tokens go back (as Refund)
			// and the request is decided anew.
			delete(ids.m, id)
			credit = min(credit+need, p.cap)
			st.credit, st.ts, st.p = credit, ts, p
		}
	}
	if after > 0 {
		return reserveAfter(st, p, limit, now, n, id, credit, horizon, after)
	}
	if credit >= need {
		credit -= need
		st.credit, st.ts, st.p = credit, ts, p
		st.idSet().add(id, now, false, p.memUS)
		return p.decision(true, n, credit, limit, throttle.SourceLocal)
	}
	wait, after, ok := p.reservation(n, credit, horizon)
	if !ok {
		return p.decision(false, n, credit, limit, throttle.SourceLocal)
	}
	st.credit, st.ts, st.p = after, ts, p
	st.idSet().add(id, now+wait, true, p.memUS)
	d := p.decision(false, n, after, limit, throttle.SourceLocal)
	d.RetryAfter, d.Reserved = micros(wait), true
	return d
}

// reserveAfter is decideID for a new request whose slot is no earlier than
// now + after (µs, > 0): the tokens are taken now, as for a reservation,
// and the later of the request's own slot and now + after is reserved, a
// slot later than its own only while credit (the bucket without the
// request) would not refill to the cap by then.
func reserveAfter(st *localState, p *params, limit int, now int64, n int, id string, credit, horizon, after int64) throttle.Decision {
	left := credit - int64(n)*p.perUS // after taking the tokens
	wait := int64(0)
	if left < 0 {
		wait = ceilDiv(-left, p.count, p.invCount)
	}
	slot := max(wait, after)
	if slot > wait && slot > (p.cap-credit)/p.count { // credit + count×slot > cap: full by then
		slot = after
	} else if slot <= horizon && -left <= p.maxDebt {
		st.credit, st.ts, st.p = left, now, p
		st.idSet().add(id, now+slot, true, p.memUS)
		d := p.decision(false, n, left, limit, throttle.SourceLocal)
		d.RetryAfter, d.Reserved = micros(slot), true
		return d
	}
	d := p.decision(false, n, credit, limit, throttle.SourceLocal)
	d.RetryAfter = max(micros(slot), time.Millisecond)
	return d
}

// idSet returns st's ids, making them on first use. The caller holds
// st.mu.
func (st *localState) idSet() *idSet {
	if st.ids == nil {
		st.ids = &idSet{m: make(map[string]idRecord)}
	}
	return st.ids
}

// forgettable reports whether st may be forgotten at now: its bucket is
// full again (under the params it was written with) and every id it
// remembers is forgotten. The caller holds st.mu.
func (st *localState) forgettable(now int64) bool {
	c, _ := st.p.refill(st.credit, st.ts, now)
	return c >= st.p.cap && (st.ids == nil || st.ids.until <= now)
}

// idSet is the ids one key's bucket remembers: each with the instant (µs)
// of its admission, or of the slot it holds. Ids are forgotten lazily, by
// the key's next AllowID, from two queues in the order of their instants
// (admissions come at now, slots in the order they are made, both
// nondecreasing with the bucket's time; a slot of AllowIDAfter may come
// before one made earlier, and is then forgotten after it), so each id
// costs O(1) amortized
// and the set holds only the ids of the last burst × Per / Count, plus the
// reservations ahead.
type idSet struct {
	m     map[string]idRecord
	queue [2]idQueue // [0] admitted, [1] reserved
	until int64      // µs: every id is forgotten by then
}

type idRecord struct {
	at       int64 // µs: admitted at, or the slot held
	reserved bool
}

type idQueue struct {
	items []idItem // items[head:] wait to be forgotten
	head  int
}

type idItem struct {
	id string
	at int64
}

// add records id at at (µs), reserved or admitted, to be forgotten at at
// + mem.
func (s *idSet) add(id string, at int64, reserved bool, mem int64) {
	id = strings.Clone(id) // not retaining the caller's memory
	s.m[id] = idRecord{at: at, reserved: reserved}
	q := &s.queue[0]
	if reserved {
		q = &s.queue[1]
	}
	q.items = append(q.items, idItem{id: id, at: at})
	s.until = max(s.until, at+mem)
}

// forget drops the ids recorded at or before cutoff (µs).
func (s *idSet) forget(cutoff int64) {
	for i := range s.queue {
		q := &s.queue[i]
		reserved := i == 1
		for q.head < len(q.items) && q.items[q.head].at <= cutoff {
			it := q.items[q.head]
			// The id may have been recorded again since (a reservation
			// admitted, or an id forgotten and seen anew): only its own
			// record goes.
			if r, ok := s.m[it.id]; ok && r.at == it.at && r.reserved == reserved {
				delete(s.m, it.id)
			}
			q.items[q.head] = idItem{}
			q.head++
		}
		switch {
		case q.head == len(q.items):
			q.items, q.head = q.items[:0], 0
		case q.head >= 64 && q.head*2 >= len(q.items):
			k := copy(q.items, q.items[q.head:])
			clear(q.items[k:])
			q.items, q.head = q.items[:k], 0
		}
	}
}

// idCount reports how many ids key's bucket remembers (for tests).
func (l *Local) idCount(key string) int {
	s := &l.shards[l.shardOf(key)]
	v, ok := s.index.Load(key)
	if !ok {
		return 0
	}
	st := v.(*localState)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ids == nil {
		return 0
	}
	return len(st.ids.m)
}

var _ throttle.IDLimiter = (*Local)(nil)
