package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// allIDs and allPeekIDs are All's Limiter when every part is a
// SlotLimiter: an IDLimiter whose reservations hold one slot in every part.
type (
	allIDs     struct{ *all }
	allPeekIDs struct{ *allPeek }
)

// AllowID decides a request with identity id in every part, reserving one
// slot in all of them on a rejection (see All).
func (a allIDs) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (Decision, error) {
	return a.allowID(ctx, key, n, id, horizon)
}

// AllowID decides a request with identity id in every part, reserving one
// slot in all of them on a rejection (see All).
func (a allPeekIDs) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (Decision, error) {
	return a.allowID(ctx, key, n, id, horizon)
}

// allOf returns the *all behind l, if l is All's Limiter.
func allOf(l Limiter) *all {
	switch a := l.(type) {
	case *all:
		return a
	case *allPeek:
		return a.all
	case allIDs:
		return a.all
	case allPeekIDs:
		return a.all
	}
	return nil
}

// slotRounds bounds how often AllowID moves parts to a later slot when
// others took the one it aimed at: beyond it the request is rejected with
// nothing held.
const slotRounds = 4

// slotTolerance is how far before the latest slot a part's own may lie and
// still count as that slot. A part moved to a slot gets one no earlier than
// the call's start plus the wait, on the store's clock when the call
// arrives: later, by up to the call's time, than the others. A later
// decision (the request back before its slot) sees the others early by as
// much, and moving them would give up their places for a few ms (in a
// full schedule, the next free slot is at its tail). So the tolerance is
// the largest of a millisecond (RetryAfter is rounded up to it), twice the
// slowest part call of this decision, and a fiftieth of the wait up to
// 50 ms. A part's slot held that early is claimed that much late: at most
// that much of one unit's time in its window, never an admission beyond
// its limit (a claim is judged when it is made).
func slotTolerance(wait, slowest time.Duration) time.Duration {
	return max(time.Millisecond, 2*slowest, min(wait/50, 50*time.Millisecond))
}

// partSlot is what one part of an AllowID holds for the request. The part
// decided at an instant within its call, on its own clock, so its slot
// lies in [lo, hi]: the call's start and end plus its RetryAfter.
type partSlot struct {
	d      Decision
	lo, hi time.Time
	holds  bool // admitted or reserved by this request: given back if it fails
	pinned bool // admitted before this request (AlreadyAdmitted): never given back
}

// allowID is AllowID: every part is asked by id (the request's own, scoped
// to the request's key in parts with a key of their own). When all admit,
// the request is admitted. Otherwise the slot is the latest of the parts'
// (T); every part admitted or reserved before T by this request is moved
// to T (given back, then AllowIDAfter), and again to a later T when a part
// finds T taken, at most slotRounds times. The request is then rejected
// with RetryAfter = the time to T and Reserved. A part that does not hold
// T but will have room by then (a token bucket that will be full again, a
// pause that will have ended) stays open and decides when the request
// comes back; beyond the horizon, nothing is held. A part that admitted
// the id before (AlreadyAdmitted) keeps that admission whatever happens.
func (a *all) allowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (Decision, error) {
	if horizon < 0 {
		return Decision{}, &OptionError{Field: "horizon", Reason: fmt.Sprintf("must be >= 0, got %v", horizon)}
	}
	if horizon == 0 && a.joint != nil {
		return a.AllowN(ctx, key, n) // one atomic step; nothing to reserve
	}
	var buf [maxStackParts]partSlot
	slots := buf[:0]
	if len(a.parts) > maxStackParts {
		slots = make([]partSlot, 0, len(a.parts))
	}
	slots = slots[:len(a.parts)]
	for i := range a.parts {
		if err := a.askSlot(ctx, i, &slots[i], key, n, id, horizon, time.Time{}); err != nil {
			return Decision{}, errors.Join(err, a.giveBack(ctx, slots[:i], key, n, id))
		}
	}
	for round := 0; ; round++ {
		// latest: no part's slot is after it; earliest: no part's slot
		// of the latest kind is before it.
		latest, earliest, allowed := slots[0].hi, slots[0].lo, true
		var slowest time.Duration
		for i := range slots {
			latest, earliest = later(latest, slots[i].hi), later(earliest, slots[i].lo)
			allowed = allowed && slots[i].d.Allowed
			slowest = max(slowest, slots[i].hi.Sub(slots[i].lo))
		}
		if allowed {
			return combine(slots, Decision{}), nil
		}
		now := a.clock.Now()
		wait := latest.Sub(now)
		if wait > horizon || round == slotRounds {
			// Nothing to hold: whatever the parts hold for it goes back; a
			// failure errs on the side of the limits and does not turn the
			// rejection into an error.
			_ = a.giveBack(ctx, slots, key, n, id)
			return combine(slots, Decision{RetryAfter: CeilMillisecond(max(wait, time.Millisecond))}), nil
		}
		moved := false
		tolerance := slotTolerance(wait, slowest)
		for i := range slots {
			s := &slots[i]
			early := s.d.Allowed || (s.d.Reserved && s.hi.Before(earliest.Add(-tolerance)))
			if s.pinned || !early {
				continue
			}
			if s.d.Allowed {
				p := &a.parts[i]
				if _, err := p.slots.Refund(context.WithoutCancel(ctx), p.keyOf(key), n, partID(key, p, id)); err != nil {
					s.holds = true
					return Decision{}, errors.Join(fmt.Errorf("throttle: All parts[%d]: give back: %w", p.index, err), a.giveBack(ctx, slots, key, n, id))
				}
				s.holds = false
			}
			if err := a.askSlot(ctx, i, s, key, n, id, horizon, latest); err != nil {
				return Decision{}, errors.Join(err, a.giveBack(ctx, slots, key, n, id))
			}
			moved = true
		}
		if moved {
			continue // a part may have found the slot taken: check again
		}
		// Every part holds the slot, is pinned, or is open by then (none
		// is open beyond it): the request has its slot, if some part
		// holds it (every part open, paused say, holds nothing).
		held := false
		for i := range slots {
			held = held || slots[i].d.Reserved
		}
		return combine(slots, Decision{RetryAfter: CeilMillisecond(max(wait, time.Millisecond)), Reserved: held}), nil
	}
}

// Refund gives back what id holds for key in every part (see
// throttle.Refunder): a request that will not run. It reports whether any
// part held something; errors are the parts', joined, each with its
// index.
func (a *all) Refund(ctx context.Context, key string, n int, id string) (bool, error) {
	held := false
	var errs []error
	for i := range a.parts {
		p := &a.parts[i]
		if p.refunder == nil {
			continue
		}
		ok, err := p.refunder.Refund(ctx, p.keyOf(key), n, partID(key, p, id))
		held = held || ok
		if err != nil {
			errs = append(errs, fmt.Errorf("throttle: All parts[%d]: %w", p.index, err))
		}
	}
	return held, errors.Join(errs...)
}

// askSlot asks part i for the request, its slot no earlier than target
// (AllowIDAfter; the zero time: AllowID), into s.
func (a *all) askSlot(ctx context.Context, i int, s *partSlot, key string, n int, id string, horizon time.Duration, target time.Time) error {
	p := &a.parts[i]
	asked := a.clock.Now()
	var after time.Duration
	if !target.IsZero() {
		after = max(target.Sub(asked), time.Microsecond)
	}
	d, err := p.slots.AllowIDAfter(ctx, p.keyOf(key), n, partID(key, p, id), horizon, after)
	if err != nil {
		return fmt.Errorf("throttle: All parts[%d]: %w", p.index, err)
	}
	s.d = d
	s.pinned = d.Allowed && d.AlreadyAdmitted
	s.holds = !s.pinned && (d.Allowed || d.Reserved)
	s.lo, s.hi = asked.Add(d.RetryAfter), a.clock.Now().Add(d.RetryAfter)
	return nil
}

// giveBack refunds what the parts in slots hold for the request (never an
// admission made before it), even after ctx is done, and returns the
// failures, each wrapped with its part's index.
func (a *all) giveBack(ctx context.Context, slots []partSlot, key string, n int, id string) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for i := range slots {
		if !slots[i].holds {
			continue
		}
		p := &a.parts[i]
		if _, err := p.slots.Refund(ctx, p.keyOf(key), n, partID(key, p, id)); err != nil {
			errs = append(errs, fmt.Errorf("throttle: All parts[%d]: give back: %w", p.index, err))
		}
		slots[i].holds = false
	}
	return errors.Join(errs...)
}

// combine folds the parts' decisions as All's AllowN does, with the
// RetryAfter and Reserved of out for a rejection; an admission is
// AlreadyAdmitted when some part had admitted the id before (so that no
// two calls for one id both report a fresh admission).
func combine(slots []partSlot, out Decision) Decision {
	var c combined
	already := false
	for i := range slots {
		c.add(slots[i].d)
		already = already || slots[i].d.AlreadyAdmitted
	}
	d := c.decision()
	if d.Allowed {
		d.AlreadyAdmitted = already
		return d
	}
	d.RetryAfter, d.Reserved = out.RetryAfter, out.Reserved
	return d
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// partID is the id a part holds the request under: id itself in a part
// asked with the request's key, else scoped to that key (its length, ":",
// the key, ":", id), since ids are scoped to a key and a part's key (a
// partner's "partner") gathers many.
func partID(key string, p *allPart, id string) string {
	if p.key == nil {
		return id
	}
	return strconv.Itoa(len(key)) + ":" + key + ":" + id
}
