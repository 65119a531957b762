package bucket

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"
)

// leaseCall is a lease call in flight for a key. done is closed when it
// ends; err is its error, set before.
type leaseCall struct {
	done chan struct{}
	err  error
}

// newWatermark returns the stock, as a fraction of the demand over
// leaseHorizon, at which a refresh starts: between 0.25 and 0.55, from the
// key's hash and a random number.
func (h *Hybrid) newWatermark(e *hybridKey) float64 {
	j := e.hashJitter + rand.Float64()/2
	j -= math.Floor(j)
	return 0.25 + 0.3*j
}

// observe counts a request of cost n into the demand estimate.
func (e *hybridKey) observe(now time.Time, n int) {
	e.lastUse = now
	e.demand += n
	if e.winStart.IsZero() {
		e.winStart = now
		return
	}
	el := now.Sub(e.winStart)
	if el < rateWindow && (e.rate != 0 || el < rateWindow/5) {
		return // the first estimate comes after a fifth of the window
	}
	inst := float64(e.demand) / el.Seconds()
	if e.rate == 0 {
		e.rate = inst
	} else {
		e.rate = (e.rate + inst) / 2
	}
	e.demand = 0
	e.winStart = now
}

// target is the stock a lease tops up to: the demand over leaseHorizon,
// between 1 and the key's lease cap.
func (h *Hybrid) target(e *hybridKey) int {
	t := math.Ceil(e.rate * leaseHorizon.Seconds())
	if c := h.leaseCap(e.lim.p.burst); t >= float64(c) {
		return c
	}
	return max(1, int(t))
}

// leaseCap is the most tokens a lease takes from a bucket of burst: a
// quarter of it, and with WithLocalShare burst/(2 × instances), at least 1.
func (h *Hybrid) leaseCap(burst int) int {
	c := burst / 4
	if h.instances > 0 {
		c = min(c, burst/(2*h.instances))
	}
	return max(1, c)
}

// take spends n tokens of the stock, the older ones first.
func (e *hybridKey) take(n int) {
	e.stock -= n
	e.fresh = min(e.fresh, e.stock)
}

// add puts n leased tokens into the stock at now.
func (e *hybridKey) add(n int, now time.Time) {
	if n <= 0 {
		return
	}
	if e.stock == e.fresh { // no older tokens: the fresh ones become them
		e.oldAt = e.freshAt
	}
	e.fresh, e.freshAt = n, now
	e.stock += n
}

// oldest reports whether some of the stock is older than maxHold.
func (e *hybridKey) oldest(now time.Time) bool {
	at := e.freshAt
	if e.stock > e.fresh {
		at = e.oldAt
	}
	return now.Sub(at) > maxHold
}

// dropOld removes the tokens older than maxHold from the stock and
// returns how many.
func (e *hybridKey) dropOld(now time.Time) int {
	k := 0
	if e.stock > e.fresh && now.Sub(e.oldAt) > maxHold {
		k = e.stock - e.fresh
		e.stock = e.fresh
	}
	if e.fresh > 0 && now.Sub(e.freshAt) > maxHold {
		k += e.fresh
		e.stock, e.fresh = 0, 0
	}
	return k
}

// maybeRefresh starts a background lease for e, under its shard's lock,
// if the stock is at the watermark, none is in flight and Redis may have
// tokens.
func (h *Hybrid) maybeRefresh(e *hybridKey, now time.Time) {
	if e.call != nil || e.rate == 0 || float64(e.stock) > e.rate*leaseHorizon.Seconds()*e.watermark {
		return
	}
	want := h.target(e) - e.stock
	if want < 1 || h.redisEstimate(e, now) < h.batch(e, 1) || !h.track() {
		return
	}
	c := &leaseCall{done: make(chan struct{})}
	e.call = c
	e.watermark = h.newWatermark(e)
	go h.refresh(e, e.lim, c, want)
}

// refresh is the background lease of maybeRefresh, under lim.
func (h *Hybrid) refresh(e *hybridKey, lim *keyLimits, c *leaseCall, want int) {
	defer h.wg.Done()
	g, err := h.lease(h.bgCtx, e.key, lim, 1, want)
	now := h.clock.Now()
	s := e.shard
	s.mu.Lock()
	e.call, c.err = nil, err
	close(c.done)
	if err == nil {
		if e.evicted || e.lim.quota != lim.quota { // dropped, or the quota changed meanwhile
			s.mu.Unlock()
			if g.granted > 0 {
				_ = h.giveBack(h.bgCtx, e.key, lim, g.granted)
			}
			return
		}
		h.applyGrant(e, now, g)
	}
	s.mu.Unlock()
}

// applyGrant records a lease reply, and the pause it reports.
func (h *Hybrid) applyGrant(e *hybridKey, now time.Time, g grant) {
	e.add(g.granted, now)
	e.redisTokens, e.redisAt = g.remaining, now
	if g.paused > 0 {
		h.notePause(e, now, g.paused)
	}
}

// lease calls Redis' lease under lim through the breaker and records it.
func (h *Hybrid) lease(ctx context.Context, key string, lim *keyLimits, least, most int) (grant, error) {
	return h.call(ctx, opLease, key, func(ctx context.Context) (grant, error) { return h.redis.lease(ctx, key, lim, least, most) })
}

// giveBack calls Redis' giveBack through the breaker and records it.
func (h *Hybrid) giveBack(ctx context.Context, key string, lim *keyLimits, n int) error {
	_, err := h.call(ctx, opGiveBack, key, func(ctx context.Context) (grant, error) { return grant{}, h.redis.giveBack(ctx, key, lim, n) })
	return err
}

// giveBackAsync returns n tokens of key in the background. After Close has
// begun they are dropped instead: the bucket then under-admits, never
// over-admits.
func (h *Hybrid) giveBackAsync(key string, lim *keyLimits, n int) {
	if !h.track() {
		return
	}
	go func() {
		defer h.wg.Done()
		if err := h.giveBack(h.bgCtx, key, lim, n); err != nil && h.log != nil && !isCallerDone(err) {
			h.log.LogAttrs(context.Background(), slog.LevelDebug, "bucket: hybrid: returning unused tokens failed",
				slog.Int("tokens", n), slog.Any("error", err))
		}
	}()
}
