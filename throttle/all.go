package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/uniqueid"
)

// Part is one limit of a stacked limit (see [All]): a Limiter and the key
// it is asked with. Key maps the request's key to the part's; nil Key
// means the request's key itself. For example, with tenants as keys, a
// per-tenant window has a nil Key and a partner's global quota a Key that
// returns "partner" for every tenant. Key must be fast and safe for
// concurrent use.
type Part struct {
	Limiter Limiter
	Key     func(key string) string
}

// All returns a Limiter that admits a request only if every part admits
// it; when one part rejects, what the others charged for it is given back,
// so a rejected request consumes nothing. No part is ever over its own
// limit: each part decides atomically on its own store, and a give-back
// takes back that request's units and never another's.
//
// When every part is a [JointLimiter] and they agree to it (window.Redis
// parts on one Redis client, their keys on one server or in one Redis
// Cluster slot), a decision is one atomic step, one script call: nothing
// is charged unless every part admits, so nothing needs giving back.
//
// Otherwise AllowN asks the parts one after another, in order: each part
// that is a [Refunder] is charged with AllowID under an id unique to the
// request (reserving nothing), and after the first rejection the
// remaining parts are only asked what they would say, with Peek when they
// have one (nothing charged), otherwise charged and given back at once;
// then every part that admitted is refunded. So put the part most likely
// to reject first. At most one part may be a plain Limiter that cannot
// give back (such as bucket.Hybrid): it is asked last, where nothing after
// it can reject.
//
// The Decision: Allowed when every part admitted. RetryAfter is the
// largest of the rejecting parts'. Limit and Remaining are the tightest
// part's: for a rejection, the rejecting part with the largest RetryAfter;
// for an admission, the part with the least Remaining (the first on a
// tie). ResetAfter is the largest of the parts' (with a refunded part's
// counted as it was before its refund, so at most that much too long).
// Source is the farthest any part went: SourceDegraded if a part's failure
// policy decided, else SourceRedis if a part made a round trip, else
// SourceLocal. Reserved is false for AllowN.
//
// Without the one atomic step, two requests racing can each hold a part's
// room for the moment between a charge and its give-back: one may be
// rejected by a part that the other, rejected elsewhere, held. That errs
// on the side of the limits, never over them. A give-back that fails (the
// store is down) leaves its units charged until they leave the part's
// window or refill, again erring on the side of the limits; refunds run
// even after ctx is done, each bounded by its limiter's timeout.
//
// When a part fails, what the others charged is given back and AllowN
// returns the part's error wrapped with its index ("throttle: All
// parts[1]: ..."; from the one atomic step, "throttle: All parts (one
// step): ...", with nothing charged); errors.Is sees through it
// (ErrInvalidCost, ErrInvalidKey, ErrClosed, context errors).
//
// The Limiter All returns has a Peek method, with the same shape as
// window.Memory's (what AllowN would say; nothing charged), when every
// part has one. When every part is a [SlotLimiter] it is an [IDLimiter]:
// AllowID asks every part by the request's id (scoped to the request's
// key in a part with a Key of its own) and, on a rejection within the
// horizon, holds one slot in all of them, the latest of their earliest: a
// part with room gives back its admission and reserves that slot instead
// (AllowIDAfter), and if a part finds it taken, all move to the next
// (at most 4 times); Reserved is then true. A part that will have room
// by the slot without holding it (a token bucket full again by then, which
// holds nothing: tokens taken ahead would add to a burst there; a pause
// that will have ended) decides when the request comes back, so it may
// still reject it if others took that room first. Beyond the horizon in
// any part, nothing is held. A part that
// admitted the id before (Decision.AlreadyAdmitted: it ran) is never
// given back. With horizon 0 and parts that decide in one atomic step,
// AllowID is AllowN. Slots are placed on the first part's Clock (a
// Clock() method), else the system clock: the parts must share it. See
// docs/stacked-and-in-flight.md. It is safe for concurrent use.
//
// Errors from All wrap ErrInvalidOption and name the part: no parts, a nil
// Limiter, a second part that cannot give back, or one limiter twice with
// the request's key (nil Key) both times.
func All(parts ...Part) (Limiter, error) {
	if len(parts) == 0 {
		return nil, &OptionError{Field: "parts", Reason: "All needs at least one part"}
	}
	a := &all{parts: make([]allPart, 0, len(parts))}
	var last *allPart // the part that cannot give back, asked last
	lastIndex := -1
	peekable := true
	names := make([]string, 0, len(parts))
	for i, p := range parts {
		if p.Limiter == nil {
			return nil, &OptionError{Field: fmt.Sprintf("parts[%d].Limiter", i), Reason: "must not be nil"}
		}
		for j := range i {
			if p.Key == nil && parts[j].Key == nil && sameLimiter(p.Limiter, parts[j].Limiter) {
				return nil, &OptionError{Field: fmt.Sprintf("parts[%d]", i), Reason: fmt.Sprintf(
					"is parts[%d] again (the same %T, the same key): a request would be charged once, not twice", j, p.Limiter)}
			}
		}
		ap := allPart{index: i, limiter: p.Limiter, key: p.Key}
		ap.refunder, _ = p.Limiter.(Refunder)
		ap.slots, _ = p.Limiter.(SlotLimiter)
		ap.peeker, _ = p.Limiter.(peeker)
		peekable = peekable && ap.peeker != nil
		if ap.slots == nil && a.slotless == "" {
			a.slotless = fmt.Sprintf("parts[%d] (%T)", i, p.Limiter)
		}
		if alg, ok := p.Limiter.(Algorithmer); ok {
			names = append(names, alg.Algorithm())
		} else {
			names = append(names, "limiter")
		}
		if ap.refunder != nil {
			a.parts = append(a.parts, ap)
			continue
		}
		if last != nil {
			return nil, &OptionError{Field: fmt.Sprintf("parts[%d].Limiter", i), Reason: fmt.Sprintf(
				"%T cannot give back an admission (it is not a throttle.Refunder), and neither can parts[%d] (%T): at most one part may lack Refund, and it is asked last",
				p.Limiter, lastIndex, last.limiter)}
		}
		last, lastIndex = &ap, i
	}
	if last != nil {
		a.parts = append(a.parts, *last)
	}
	a.joint = jointOf(a.parts)
	a.clock = SystemClock
	for _, p := range a.parts {
		if c, ok := p.limiter.(interface{ Clock() Clock }); ok && c.Clock() != nil {
			a.clock = c.Clock()
			break
		}
	}
	a.algorithm = "all(" + strings.Join(names, ",") + ")"
	var err error
	if a.ids, err = uniqueid.New("all:"); err != nil {
		return nil, fmt.Errorf("throttle: All: request ids: %w", err)
	}
	switch {
	case peekable && a.slotless == "":
		return allPeekIDs{&allPeek{a}}, nil
	case peekable:
		return &allPeek{a}, nil
	case a.slotless == "":
		return allIDs{a}, nil
	}
	return a, nil
}

// sameLimiter reports whether a and b are one limiter (never true for
// limiters whose values cannot be compared, such as a LimiterFunc).
func sameLimiter(a, b Limiter) (same bool) {
	defer func() { _ = recover() }() // an uncomparable dynamic type
	return a == b
}

// peeker is a limiter that can say what AllowN would, charging nothing
// (window.Memory.Peek and the like).
type peeker interface {
	Peek(ctx context.Context, key string, n int) (Decision, error)
}

// all is All's Limiter; allPeek adds Peek when every part has it.
type all struct {
	parts     []allPart // in asking order: the part that cannot give back last
	algorithm string
	ids       *uniqueid.Source // All's requests, for the parts' AllowID and Refund
	joint     *jointParts      // nil: the parts cannot be decided in one step
	slotless  string           // the first part that is not a SlotLimiter ("": none)
	clock     Clock            // the first part's that has one, else SystemClock: AllowID's slots
}

type allPeek struct{ *all }

type allPart struct {
	index    int // in All's arguments, for errors
	limiter  Limiter
	refunder Refunder    // nil: cannot give back
	slots    SlotLimiter // nil: cannot reserve a slot after an instant
	peeker   peeker      // nil: no Peek
	key      func(string) string
}

func (p *allPart) keyOf(key string) string {
	if p.key == nil {
		return key
	}
	return p.key(key)
}

// Algorithm returns "all(" + the parts' algorithms, in their order + ")",
// such as "all(sliding_window_log,token_bucket)".
func (a *all) Algorithm() string { return a.algorithm }

// maxStackParts is how many parts a decision tracks without allocating.
const maxStackParts = 8

// AllowN admits n units for key if every part admits them, giving back the
// charges of the parts that admitted when one rejects (see All).
func (a *all) AllowN(ctx context.Context, key string, n int) (Decision, error) {
	if a.joint != nil {
		if d, ok, err := a.allowJoint(ctx, key, n); ok || err != nil {
			return d, err
		}
	}
	var c combined
	var buf [maxStackParts]int
	admitted := buf[:0] // indexes into a.parts of the parts to give back to
	id := ""
	for i := range a.parts {
		p := &a.parts[i]
		k := p.keyOf(key)
		if c.rejected {
			a.ask(ctx, p, k, n, &id, &c)
			continue
		}
		var d Decision
		var err error
		if p.refunder != nil {
			if id == "" {
				id = a.ids.Next()
			}
			d, err = p.refunder.AllowID(ctx, k, n, id, 0)
		} else {
			d, err = p.limiter.AllowN(ctx, k, n)
		}
		if err != nil {
			return Decision{}, errors.Join(
				fmt.Errorf("throttle: All parts[%d]: %w", p.index, err),
				a.refund(ctx, admitted, key, n, id))
		}
		c.add(d)
		if d.Allowed && p.refunder != nil {
			admitted = append(admitted, i)
		}
	}
	if c.rejected {
		// Nothing of a rejected request stays charged; a failed refund
		// errs on the side of the limits (see All) and does not turn the
		// rejection into an error, which a Gate's policy might admit.
		_ = a.refund(ctx, admitted, key, n, id)
	}
	return c.decision(), nil
}

// ask learns what part p would say to a request that another part has
// rejected, charging nothing in the end: with Peek, or by charging and
// giving back at once. A part that can do neither, or fails, is left out
// of the decision.
func (a *all) ask(ctx context.Context, p *allPart, k string, n int, id *string, c *combined) {
	if p.peeker != nil {
		if d, err := p.peeker.Peek(ctx, k, n); err == nil {
			c.add(d)
		}
		return
	}
	if p.refunder == nil {
		return
	}
	if *id == "" {
		*id = a.ids.Next()
	}
	d, err := p.refunder.AllowID(ctx, k, n, *id, 0)
	if err != nil {
		return
	}
	if d.Allowed {
		_, _ = p.refunder.Refund(context.WithoutCancel(ctx), k, n, *id)
	}
	c.add(d)
}

// refund gives back what the parts at indexes charged for the request id,
// even after ctx is done (each limiter bounds its own calls), and returns
// the failures, each wrapped with its part's index.
func (a *all) refund(ctx context.Context, indexes []int, key string, n int, id string) error {
	if len(indexes) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, i := range indexes {
		p := &a.parts[i]
		if _, err := p.refunder.Refund(ctx, p.keyOf(key), n, id); err != nil {
			errs = append(errs, fmt.Errorf("throttle: All parts[%d]: give back: %w", p.index, err))
		}
	}
	return errors.Join(errs...)
}

// Peek returns what AllowN(ctx, key, n) would return at this instant, and
// charges nothing: every part's Peek, combined as AllowN combines the
// parts' decisions. Errors are the first failing part's, wrapped with its
// index.
func (a *allPeek) Peek(ctx context.Context, key string, n int) (Decision, error) {
	var c combined
	for i := range a.parts {
		p := &a.parts[i]
		d, err := p.peeker.Peek(ctx, p.keyOf(key), n)
		if err != nil {
			return Decision{}, fmt.Errorf("throttle: All parts[%d]: %w", p.index, err)
		}
		c.add(d)
	}
	return c.decision(), nil
}

// combined folds the parts' decisions into All's (see All).
type combined struct {
	rejected bool
	tightest Decision // the binding part's decision so far
	any      bool     // tightest is set
	reset    Decision // only ResetAfter and Source are kept
}

func (c *combined) add(d Decision) {
	c.reset.ResetAfter = max(c.reset.ResetAfter, d.ResetAfter)
	c.reset.Source = max(c.reset.Source, d.Source)
	switch {
	case !d.Allowed && (!c.rejected || d.RetryAfter > c.tightest.RetryAfter):
		c.tightest, c.rejected = d, true
	case d.Allowed && !c.rejected && (!c.any || d.Remaining < c.tightest.Remaining):
		c.tightest = d
	}
	c.any = true
}

func (c *combined) decision() Decision {
	return Decision{
		Allowed:    !c.rejected,
		Limit:      c.tightest.Limit,
		Remaining:  c.tightest.Remaining,
		RetryAfter: c.tightest.RetryAfter, // 0 when admitted
		ResetAfter: c.reset.ResetAfter,
		Source:     c.reset.Source,
	}
}

// Pause pauses key for d in every part that is a Pauser, at the part's key
// (see Pauser): a partner's 429 then holds back every request that would
// reach it, whoever's key it came with. Errors are the parts', joined,
// each wrapped with its index; one wrapping ErrCannotPause when no part is
// a Pauser.
func (a *all) Pause(ctx context.Context, key string, d time.Duration) error {
	var errs []error
	paused := false
	for i := range a.parts {
		p := &a.parts[i]
		pp, ok := p.limiter.(Pauser)
		if !ok {
			continue
		}
		paused = true
		if err := pp.Pause(ctx, p.keyOf(key), d); err != nil {
			errs = append(errs, fmt.Errorf("throttle: All parts[%d]: %w", p.index, err))
		}
	}
	if !paused {
		return fmt.Errorf("%w: no part of %s can pause", ErrCannotPause, a.algorithm)
	}
	return errors.Join(errs...)
}
