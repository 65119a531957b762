package window

import (
	"strconv"
	"sync"
	"sync/atomic"
)

// heldUnits is what a Redis window knows of its keys' sets: per Redis
// key, the instant (µs, on the script's clock) until which the set holds
// a unit this process saw admitted. window.lua takes it as the key's held
// argument and, if the set is gone before then, knows it was lost (see
// "Lost sets" in window.lua). Knowledge is a lower bound, so a Refund or
// a Reset, which may empty the set, forgets it.
//
// It holds at most maxHeldKeys keys; the janitor drops the ones past
// (JanitorPeriod), and beyond the bound new keys are not recorded: their
// loss goes unseen, never falsely seen.
type heldUnits struct {
	keys sync.Map // Redis key -> *atomic.Int64
	n    atomic.Int64
	now  atomic.Int64 // the latest script instant seen
	off  bool         // benchmarks: no loss check, to weigh it
}

// maxHeldKeys bounds the keys a heldUnits records.
const maxHeldKeys = 100_000

var argNoneHeld any = "0"

// arg returns key's held argument for window.lua.
func (h *heldUnits) arg(key string) any {
	if h.off {
		return argNoneHeld
	}
	if v, ok := h.keys.Load(key); ok {
		if until := v.(*atomic.Int64).Load(); until > h.now.Load() {
			return strconv.FormatInt(until, 10)
		}
	}
	return argNoneHeld
}

// note records that key's set holds a unit until until (µs), seen at the
// script's now.
func (h *heldUnits) note(key string, until, now int64) {
	if now > h.now.Load() {
		h.now.Store(now) // racing stores keep a recent instant: enough
	}
	v, ok := h.keys.Load(key)
	if !ok {
		if h.n.Load() >= maxHeldKeys {
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

// forget drops what is known of key.
func (h *heldUnits) forget(key string) {
	if _, ok := h.keys.LoadAndDelete(key); ok {
		h.n.Add(-1)
	}
}

// sweep drops the keys whose known units have left.
func (h *heldUnits) sweep() {
	now := h.now.Load()
	h.keys.Range(func(k, v any) bool {
		if v.(*atomic.Int64).Load() <= now {
			h.forget(k.(string))
		}
		return true
	})
}

// noteReply records what the script's reply v (its replyInts integers)
// to r, at the script's now, proves of r's set: an admission holds a unit
// until now + its reset (a Peek writes nothing, and proves nothing).
func (h *heldUnits) noteReply(r *request, v []int64, now int64) {
	if len(v) < replyInts || r.horizon == argPeek {
		return
	}
	if code, reset := v[0], v[2]; code > 0 && reset > 0 {
		h.note(r.key, now+reset, now)
	}
}
