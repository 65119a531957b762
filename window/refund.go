package window

import (
	"context"
	_ "embed"
	"fmt"
	"hash/maphash"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Refund takes back what id holds for key (see throttle.Refunder): the n
// units AllowID admitted for it, while they are in the log, or its
// reservation. The log is then as if the request had never been made:
// its units count in no window (reservations placed after it keep their
// slots, which only errs on the side of the limit). It reports whether it
// found anything of id's (units that already left the window may still be
// found, until the log drops them). The only error wraps throttle.ErrInvalidCost, for n < 1
// or n > MaxCost. ctx is unused.
func (m *Memory) Refund(_ context.Context, key string, n int, id string) (bool, error) {
	if err := throttle.CheckCost(n, MaxCost); err != nil {
		return false, err
	}
	s := &m.shards[maphash.String(m.seed, key)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[key]
	if l == nil {
		return false, nil
	}
	return l.refund(id), nil
}

// refund removes id's entry, or its reservation that left the window
// unclaimed, and reports whether there was one.
func (l *windowLog) refund(id string) bool {
	_, late := l.late[id]
	delete(l.late, id)
	if i := l.find(id); i >= 0 {
		l.remove(i)
		return true
	}
	return late
}

// Refund takes back what id holds for key (see throttle.Refunder): the n
// units AllowID admitted for it (members "A1:"+id .. "An:"+id) and its
// reservation ("R1:"+id ..), in one script call (refund.lua), so the sorted set is as if the
// request had never been made (reservations placed after it keep their
// slots, which only errs on the side of the limit; the key's expiry stays).
// It reports whether it found anything of id's (units that already left
// the window may still be found, until a decision drops them).
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > MaxCost,
// before any Redis call; otherwise a Redis or context error (bounded by
// WithTimeout), wrapped as "window: redis: ...", after which the units may
// still be counted (refunding again is safe).
func (l *Redis) Refund(ctx context.Context, key string, n int, id string) (bool, error) {
	if err := throttle.CheckCost(n, MaxCost); err != nil {
		return false, err
	}
	ctx, cancel := deadline.Bound(ctx, l.timeout)
	defer cancel()
	k := l.key(key)
	l.held.Forget(k) // the refund may empty the set
	removed, err := refundScript.Run(ctx, l.client, []string{k, k + hintSuffix}, strconv.Itoa(n), id).Int64()
	if err != nil {
		return false, fmt.Errorf("window: redis: %w", redisopt.Explain("window", err))
	}
	return removed > 0, nil
}

//go:embed refund.lua
var refundLua string

var refundScript = redis.NewScript(refundLua)

var (
	_ throttle.Refunder = (*Memory)(nil)
	_ throttle.Refunder = (*Redis)(nil)
)
