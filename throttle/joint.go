package throttle

import (
	"context"
	"fmt"
)

// JointLimiter is an optional Limiter capability: deciding one request in
// several limiters of one kind in a single atomic step, so that nothing
// needs giving back. [All] uses it when every part has it: window.Redis
// does, for windows on one Redis client whose keys share a Redis Cluster
// slot (any keys on a single Redis server), in one script call.
type JointLimiter interface {
	Limiter
	// AllowJoint decides a request of cost n in every limiter of parts,
	// asked with the key of the same index in keys, atomically: it admits
	// the request in all of them or charges none. It is called on one of
	// parts. ds[i] is what parts[i] says: for a fitting part, Allowed with
	// the Remaining after the request (as Peek says it); for a part the
	// request does not fit, a rejection with its own RetryAfter. When ok
	// is false nothing was decided and nothing charged: these limiters, or
	// this request, cannot be decided together (another kind, client or
	// clock; keys in different slots; a cost a part cannot take), and the
	// caller asks them one by one. Errors mean the store could not decide;
	// nothing is then known to be charged.
	AllowJoint(ctx context.Context, parts []Limiter, keys []string, n int) (ds []Decision, ok bool, err error)
}

// jointParts are All's parts when every one is a JointLimiter.
type jointParts struct {
	first    JointLimiter
	limiters []Limiter
}

func jointOf(parts []allPart) *jointParts {
	j := &jointParts{limiters: make([]Limiter, len(parts))}
	for i, p := range parts {
		jl, ok := p.limiter.(JointLimiter)
		if !ok {
			return nil
		}
		j.limiters[i] = p.limiter
		if i == 0 {
			j.first = jl
		}
	}
	return j
}

// allowJoint decides in one atomic step when the parts agree to it (ok).
func (a *all) allowJoint(ctx context.Context, key string, n int) (Decision, bool, error) {
	var buf [maxStackParts]string
	keys := buf[:0]
	for i := range a.parts {
		keys = append(keys, a.parts[i].keyOf(key))
	}
	ds, ok, err := a.joint.first.AllowJoint(ctx, a.joint.limiters, keys, n)
	if err != nil {
		return Decision{}, false, fmt.Errorf("throttle: All parts (one step): %w", err)
	}
	if !ok || len(ds) != len(a.parts) {
		return Decision{}, false, nil
	}
	var c combined
	for _, d := range ds {
		c.add(d)
	}
	return c.decision(), true, nil
}
