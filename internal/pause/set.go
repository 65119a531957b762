package pause

import (
	"sync"
	"sync/atomic"
)

// Set is the pauses of an in-process limiter: for each paused key, the
// instant its pause ends, in µs on the limiter's clock. It is separate from
// the keys' limiter state so that forgetting a key's state (an LRU, an idle
// sweep) never forgets its pause. A Set is safe for concurrent use; the
// zero Set is empty and ready. While no key is paused, Left costs one
// atomic load.
type Set struct {
	n     atomic.Int64 // len(until), readable without mu
	mu    sync.RWMutex
	until map[string]int64
	sweep int // sweep ended pauses when until reaches this many keys
}

// Extend makes key paused until end (µs) unless it already is until then
// or later: a longer pause extends, a shorter one never shortens. now is
// the current instant, to forget ended pauses.
func (s *Set) Extend(key string, now, end int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = make(map[string]int64)
	}
	if len(s.until) >= s.sweep {
		for k, e := range s.until {
			if e <= now {
				delete(s.until, k)
			}
		}
		s.sweep = 2*len(s.until) + 16
	}
	if end > s.until[key] {
		s.until[key] = end
	}
	s.n.Store(int64(len(s.until)))
}

// Left returns how long key stays paused after now, in µs: > 0 while
// paused, 0 otherwise.
func (s *Set) Left(key string, now int64) int64 {
	if s.n.Load() == 0 {
		return 0
	}
	s.mu.RLock()
	end, ok := s.until[key]
	s.mu.RUnlock()
	if !ok || end <= now {
		return 0
	}
	return end - now
}

// Clear forgets key's pause (Reset).
func (s *Set) Clear(key string) {
	if s.n.Load() == 0 {
		return
	}
	s.mu.Lock()
	delete(s.until, key)
	s.n.Store(int64(len(s.until)))
	s.mu.Unlock()
}
