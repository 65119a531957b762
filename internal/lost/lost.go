// Package lost remembers what a Redis-backed limiter saw of its keys, so
// that its scripts can tell a key Redis lost (FLUSHALL, a restart without
// persistence, eviction, a failover to a replica that lacked it) from a
// key never used: per Redis key, the instant (µs, on the script's clock)
// until which the key must exist, because this process saw a decision
// that leaves it there until then (an admission in a window, tokens taken
// from a bucket). The scripts take it as an argument (Arg) and answer with
// their instant, so the check costs no round trip.
//
// Knowledge is a lower bound: what may empty a key on purpose (a refund, a
// reset) must Forget it first. At most MaxKeys keys are recorded; the
// janitor drops the ones past (Sweep), and beyond the bound new keys are
// not recorded: their loss goes unseen, never falsely seen.
package lost

import (
	"strconv"
	"sync"
	"sync/atomic"
)

// MaxKeys bounds the keys a Held records.
const MaxKeys = 100_000

// None is Arg's value for a key nothing is known of.
var None any = "0"

// Held is what one limiter knows. The zero Held is ready; it is safe for
// concurrent use.
type Held struct {
	keys sync.Map // Redis key -> *atomic.Int64
	n    atomic.Int64
	now  atomic.Int64 // the latest script instant seen
	// Off turns the check off (benchmarks weigh it with it).
	Off bool
}

// Arg returns the script argument for key: the instant until which it
// must exist, or None.
func (h *Held) Arg(key string) any {
	if h.Off {
		return None
	}
	if v, ok := h.keys.Load(key); ok {
		if until := v.(*atomic.Int64).Load(); until > h.now.Load() {
			return strconv.FormatInt(until, 10)
		}
	}
	return None
}

// Note records that key exists until until (µs), as a script saw at now.
func (h *Held) Note(key string, until, now int64) {
	if now > h.now.Load() {
		h.now.Store(now) // racing stores keep a recent instant: enough
	}
	if until <= now {
		return
	}
	v, ok := h.keys.Load(key)
	if !ok {
		if h.n.Load() >= MaxKeys {
			return
		}
		var loaded bool
		if v, loaded = h.keys.LoadOrStore(key, new(atomic.Int64)); !loaded {
			h.n.Add(1)
		}
	}
	u := v.(*atomic.Int64)
	for {
		old := u.Load()
		if until <= old || u.CompareAndSwap(old, until) {
			return
		}
	}
}

// Forget drops what is known of key.
func (h *Held) Forget(key string) {
	if _, ok := h.keys.LoadAndDelete(key); ok {
		h.n.Add(-1)
	}
}

// Sweep drops the keys known only until a past instant.
func (h *Held) Sweep() {
	now := h.now.Load()
	h.keys.Range(func(k, v any) bool {
		if v.(*atomic.Int64).Load() <= now {
			h.Forget(k.(string))
		}
		return true
	})
}
