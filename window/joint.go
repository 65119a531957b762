package window

import (
	"context"
	_ "embed"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/throttle"
)

//go:embed joint.lua
var jointLua string

var jointScript = redis.NewScript(unitsLua + jointLua)

// AllowJoint decides a request of cost n in several Redis windows at once
// (see throttle.JointLimiter), in one script call (joint.lua): n units are
// admitted in every window, at one instant, only if each window admits
// them by AllowN's rule; otherwise none is written. throttle.All uses it,
// so stacked Redis windows cost one round trip and never hold room for a
// request that another of them rejects.
//
// It applies (ok) when every part is a *Redis on the same client as l,
// all on the Redis server's TIME or all on one comparable WithClock clock
// (WithServerClock: a single window only), the client is a *redis.Client
// (one server: any keys) or a *redis.ClusterClient with every key in one
// hash slot (the same key under different prefixes, for example), and n
// is a cost every window accepts (else the caller's one-by-one path gives
// the error). A rejected window's RetryAfter is AllowN's: with
// reservations ahead of now, a Peek of that window (a second round trip)
// finds the earliest gap. The decisions' Source is throttle.SourceRedis.
// With a client clock, the instant is the newest of the windows' clock
// floors.
//
// Errors are Redis or context errors (bounded by l's WithTimeout),
// wrapped as "window: redis: ...": nothing is then known to be charged.
// As for AllowN, a script that runs more than 1 s after ctx's deadline
// (a stalled Redis) applies nothing and the call fails.
func (l *Redis) AllowJoint(ctx context.Context, parts []throttle.Limiter, keys []string, n int) ([]throttle.Decision, bool, error) {
	if len(parts) == 0 || len(parts) != len(keys) || n < 1 || n > MaxCost {
		return nil, false, nil
	}
	ws := make([]*Redis, len(parts))
	limits := make([]int, len(parts))
	rkeys := make([]string, 0, 3*len(parts))
	args := make([]any, 5, 5+3*len(parts))
	for i, p := range parts {
		w, ok := p.(*Redis)
		if !ok || !same(w.client, l.client) || !sameClock(w.clock, l.clock) || (w.server != nil && len(parts) > 1) {
			return nil, false, nil
		}
		r, err := quotaOf(w.quotas, w.rate, keys[i])
		if err != nil || throttle.CheckCost(n, r.Count) != nil || redisopt.CheckExact("Rate.Count", int64(r.Count)) != nil {
			return nil, false, nil
		}
		ws[i], limits[i] = w, r.Count
		k := w.key(keys[i])
		rkeys = append(rkeys, k, k+floorSuffix, k+pause.Suffix)
		args = append(args, strconv.FormatInt(r.PerMicros(), 10), strconv.Itoa(r.Count), w.held.Arg(k))
	}
	if !oneSlot(l.client, rkeys) {
		return nil, false, nil
	}
	ctx, cancel := l.rt.Bound(ctx)
	defer cancel()
	args[0], args[1], args[2], args[3], args[4] = strconv.Itoa(n), l.member.next(), "", "0", argNoExpiry
	if l.clock == nil {
		args[4] = l.expiry(ctx) // a stalled Redis applies nothing late
	} else {
		if l.server != nil {
			if err := l.server.Ready(ctx); err != nil {
				return nil, false, fmt.Errorf("window: redis: %w", err)
			}
		}
		now, slack := instant(l.clock.Now(), 0)
		args[2] = strconv.FormatInt(now, 10)
		if slack != 0 {
			args[3] = "1"
		}
	}
	start := time.Now()
	vals, err := jointScript.Run(ctx, l.client, rkeys, args...).Int64Slice()
	if err = redisscript.Observe(l.rt, start, vals, err); err != nil {
		return nil, false, fmt.Errorf("window: redis: %w", redisopt.Explain("window", err))
	}
	if late(vals) {
		return nil, false, l.rt.Explain(errLate)
	}
	if len(vals) != replyInts*len(parts)+1 { // and now
		return nil, false, fmt.Errorf("%w: %v", errReply, vals)
	}
	now, admitted := vals[len(vals)-1], true
	for i := range parts {
		admitted = admitted && vals[replyInts*i] > 0
	}
	ds := make([]throttle.Decision, len(parts))
	for i := range ds {
		if reset := vals[replyInts*i+2]; admitted && reset > 0 { // the units written in every part
			ws[i].held.Note(rkeys[3*i], now+reset, now)
		}
		if err := decisions(vals[replyInts*i:replyInts*(i+1)], ds[i:i+1], limits[i]); err != nil {
			return nil, false, err
		}
		d := ds[i]
		// joint.lua's reserved mark says that reservations lie ahead: the
		// earliest gap may come before the tail. Nothing was written, so
		// Peek sees the same log.
		if d.Reserved {
			d.Reserved = false
			if p, err := ws[i].Peek(ctx, keys[i], n); err == nil {
				d.RetryAfter = max(p.RetryAfter, time.Millisecond)
			}
		}
		ds[i] = d
	}
	return ds, true, nil
}

// sameClock reports whether two windows read one clock: both the Redis
// server's TIME (nil), or one comparable clock value.
func sameClock(a, b throttle.Clock) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return same(a, b)
}

// same reports whether a and b are one comparable value (== would panic
// on values of an incomparable type, such as a func).
func same(a, b any) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// oneSlot reports whether one script may touch all of keys through c: on
// one server, any keys; on a Redis Cluster, keys of one hash slot.
func oneSlot(c redis.Scripter, keys []string) bool {
	switch c.(type) {
	case *redis.Client:
		return true
	case *redis.ClusterClient:
		slot := rediskey.Slot(keys[0])
		for _, k := range keys[1:] {
			if rediskey.Slot(k) != slot {
				return false
			}
		}
		return true
	}
	return false
}

var _ throttle.JointLimiter = (*Redis)(nil)
