package window

import (
	"context"
	_ "embed"
	"fmt"
	"hash/maphash"
	"sort"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Peek returns what AllowN(ctx, key, n) would return at this instant,
// reservations included, and charges nothing: it records no admission,
// reserves nothing and renews no expiry. Errors are those of AllowN. A
// paced consumer sizes its pulls with it (see natsthrottle.ConsumePaced).
func (m *Memory) Peek(_ context.Context, key string, n int) (throttle.Decision, error) {
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
	l := s.logs[key]
	if l == nil {
		l = &windowLog{}
	}
	return l.peek(now, n, limits{limit: r.Count, window: window, nominal: perUS}), nil
}

// Reset forgets key: it is back to its initial state, with no admission,
// no reservation and no pause. Resetting an unknown key is not an error.
func (m *Memory) Reset(_ context.Context, key string) error {
	m.pauses.Clear(key)
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	delete(s.logs, key)
	s.mu.Unlock()
	return nil
}

// peek is decide for AllowN without its writes (units that left the window
// are not counted, as decide's drop would forget them).
func (l *windowLog) peek(now int64, n int, lim limits) throttle.Decision {
	now = max(now, l.floor)
	units, newest := 0, l.floor // newest as decide's drop would leave it
	for _, e := range l.live() {
		if e.at > now-lim.window {
			units += e.n
			newest = max(newest, e.at)
		}
	}
	slot := now
	if units+n > lim.limit {
		// slot reads the live entries; those that left the window are
		// skipped by its bounds (all after now - window).
		live := l.live()
		c := *l
		c.units = units
		c.head = l.head + sort.Search(len(live), func(i int) bool { return live[i].at > now-lim.window })
		slot = c.slot(now, now, n, lim.limit, lim.window)
	}
	d := throttle.Decision{Limit: lim.limit, Source: throttle.SourceLocal}
	if slot == now {
		d.Allowed = true
		d.Remaining = max(lim.limit-units-n, 0)
		d.ResetAfter = micros(max(newest, now) + lim.nominal - now)
		return d
	}
	d.Remaining = max(lim.limit-units, 0)
	d.RetryAfter = max(micros(slot-now), throttle.CeilMillisecond(1))
	d.ResetAfter = micros(newest + lim.nominal - now)
	return d
}

// Peek returns what AllowN(ctx, key, n) would return at this instant,
// reservations included, and charges nothing: one script call that writes
// nothing (no admission, no reservation, no expiry renewed). Errors are
// those of AllowN.
func (l *Redis) Peek(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return l.decide(ctx, key, n, "", argPeek)
}

//go:embed reset.lua
var resetLua string

//go:embed replan.lua
var replanLua string

var replanScript = redis.NewScript(replanLua)

// Replan plans key's reservations ahead again at its limit now, and
// returns how many units moved: when the key's limit has gone down (a
// quota lowered, an adaptive partner limit after a 429), slots planned at
// the old pace would keep the schedule overbooked, and in bunches. When
// every reservation still fits at its slot (the limit went up, or not
// far enough down), nothing moves. Else, in slot order (reservations of
// one slot in the order of their ids), each reservation moves to the earliest instant, no earlier than
// its slot, at which the window ending there (with what was admitted and
// the reservations placed before it) has room for it under the limit now,
// and no earlier than the one placed before it plus that one's share of
// the window (Per / Count per unit): the reservations keep their order and
// are spread at the new pace, where a full window would otherwise repeat
// the bunches of the old one window after window. A request whose slot
// moved is told its new one when it comes back at the old (one delivery
// more, as a dropped slot would cost); a reservation of more units than
// the limit now never fits, and goes (counted as moved). Admissions, and
// reservations whose slot has come, stay. One script call (replan.lua)
// for every process. Errors are the quota's (see WithQuotas), or Redis or
// context errors (bounded by WithTimeout), wrapped as "window: redis: ...".
func (l *Redis) Replan(ctx context.Context, key string) (int, error) {
	r, err := quotaOf(l.quotas, l.rate, key)
	if err != nil {
		return 0, err
	}
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	k := l.key(key)
	now := ""
	if l.clock != nil {
		now = strconv.FormatInt(l.clock.Now().UnixMicro(), 10)
	}
	n, err := replanScript.Run(ctx, l.client, []string{k, k + hintSuffix}, now, r.PerMicros(), r.Count).Int()
	if err != nil {
		return 0, fmt.Errorf("window: redis: %w", err)
	}
	return n, nil
}

// Replan plans key's reservations ahead again at its limit now, as
// Redis.Replan does, and returns how many units moved. Errors are the
// quota's.
func (m *Memory) Replan(_ context.Context, key string) (int, error) {
	r, perUS, err := m.rateOf(key)
	if err != nil {
		return 0, err
	}
	now, window := instant(m.clock.Now(), perUS)
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[key]
	if l == nil {
		return 0, nil
	}
	return l.replan(now, window, r.Count), nil
}

var resetScript = redis.NewScript(resetLua)

// argPeek is the horizon argument that tells window.lua to write nothing.
var argPeek any = "-2"

// Reset deletes key's sorted set (and its clock floor, schedule and pause):
// the key is back to its initial state in every process that shares the
// Redis. Resetting an unknown key is not an error. Errors are Redis or context errors
// (bounded by WithTimeout), wrapped as "window: redis: ...".
func (l *Redis) Reset(ctx context.Context, key string) error {
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	k := l.key(key)
	l.held.Forget(k) // the set is emptied on purpose
	if err := resetScript.Run(ctx, l.client, []string{k, k + floorSuffix, k + hintSuffix, k + pause.Suffix}).Err(); err != nil {
		return fmt.Errorf("window: redis: %w", err)
	}
	return nil
}
