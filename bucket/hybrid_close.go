package bucket

import (
	"context"
	"fmt"
	"time"
)

// track registers background work with Close; it reports false once Close
// has begun.
func (h *Hybrid) track() bool {
	h.life.RLock()
	defer h.life.RUnlock()
	if h.closed.Load() {
		return false
	}
	h.wg.Add(1)
	return true
}

// janitor drops idle keys (returning their stock) until Close.
func (h *Hybrid) janitor() {
	defer h.wg.Done()
	t := time.NewTicker(janitorEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			now := h.clock.Now()
			for i := range h.shards {
				h.dropIdle(&h.shards[i], now)
			}
		}
	}
}

// dropIdle drops the keys of s unused for maxHold, least recent first.
func (h *Hybrid) dropIdle(s *hybridShard, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		_, e, ok := s.lru.GetOldest()
		if !ok || e.call != nil || now.Sub(e.lastUse) <= maxHold {
			return
		}
		s.lru.RemoveOldest() // calls h.evicted
	}
}

// Close stops the Hybrid's background work, waits for its Redis calls in
// flight and returns every unused leased token to Redis. It waits until
// ctx ends at most for the calls in flight (then abandons background ones,
// each bounded by the timeout anyway) and stops returning tokens when ctx
// ends. Tokens it cannot return are lost for this period: the limit is
// under-used, never exceeded. Close is safe to call more than once; later
// calls return nil at once. After Close, AllowN returns an error wrapping
// ErrHybridClosed.
//
// The error, if any, says how many keys' tokens could not be returned and
// wraps the first such error (a Redis error, gobreaker.ErrOpenState or
// ctx's error).
func (h *Hybrid) Close(ctx context.Context) error {
	h.life.Lock() // no wg.Add after this
	already := h.closed.Swap(true)
	h.life.Unlock()
	if already {
		return nil
	}
	close(h.stop)
	defer h.bgCancel()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		h.bgCancel()
		<-done
	}
	type unused struct {
		key string
		lim *keyLimits
		n   int
	}
	var all []unused
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for _, e := range s.lru.Values() {
			if e.stock > 0 {
				all = append(all, unused{e.key, e.lim, e.stock})
				e.stock, e.fresh = 0, 0
			}
		}
		s.mu.Unlock()
	}
	var first error
	failed := 0
	for _, u := range all {
		err := ctx.Err()
		if err == nil {
			err = h.giveBack(ctx, u.key, u.lim, u.n)
		}
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if first != nil {
		return fmt.Errorf("bucket: hybrid: close: could not return unused tokens of %d keys: %w", failed, first)
	}
	return nil
}
