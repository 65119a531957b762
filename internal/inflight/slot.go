// Package inflight holds the in-flight slot of one message for the
// consumers (natsthrottle, asynqthrottle): acquired after the rate
// admission, renewed every third of its lease while the handler has the
// message, and released once, when the handler is done with it.
package inflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// minRenew is the shortest interval between two renewals of a slot.
const minRenew = time.Millisecond

// Slot is a slot of Key held by ID on Limiter. Its methods are safe for
// concurrent use; a nil *Slot does nothing (a message run without a slot,
// under FailOpen).
type Slot struct {
	lim     throttle.InFlightLimiter
	key, id string
	lease   time.Duration
	timeout time.Duration   // bound of every Renew and Release
	ctx     context.Context // values only: never canceled
	report  func(error)     // errors of Renew and Release

	mu       sync.Mutex
	released bool
	stop     chan struct{} // closed by Release
}

// Acquire asks lim for a slot of key for id, bounded by timeout. It
// returns the slot when admitted, else nil with the Decision (a rejection)
// or the limiter's error. ctx gives the values (trace) of later calls;
// they are bounded by timeout, never canceled with ctx. report gets the
// errors of later Renew and Release calls (wrapped, with the key and
// id), and may be nil.
func Acquire(ctx context.Context, lim throttle.InFlightLimiter, key, id string, lease, timeout time.Duration, report func(error)) (*Slot, throttle.Decision, error) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	d, err := lim.Acquire(actx, key, id, lease)
	cancel()
	if err != nil {
		return nil, d, fmt.Errorf("in-flight limiter: acquire a slot of key %q for %q: %w", key, id, err)
	}
	if !d.Allowed {
		return nil, d, nil
	}
	if report == nil {
		report = func(error) {}
	}
	return &Slot{lim: lim, key: key, id: id, lease: lease, timeout: timeout,
		ctx: context.WithoutCancel(ctx), report: report, stop: make(chan struct{})}, d, nil
}

// KeepAlive renews the slot every third of its lease (at least every
// millisecond) on a goroutine of its own until Release.
func (s *Slot) KeepAlive() {
	if s == nil {
		return
	}
	every := max(s.lease/3, minRenew)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.Renew()
			}
		}
	}()
}

// Renew renews the slot's lease, unless it was released; an error goes to
// the report function (the slot may be lost: another id may take it).
func (s *Slot) Renew() {
	if s == nil || s.isReleased() {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	err := s.lim.Renew(ctx, s.key, s.id, s.lease)
	cancel()
	if err != nil && !s.isReleased() {
		s.report(fmt.Errorf("in-flight limiter: renew the slot of key %q held by %q: %w", s.key, s.id, err))
	}
}

// Release frees the slot, the first time it is called; an error goes to
// the report function (the slot is then reclaimed when its lease ends).
func (s *Slot) Release() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return
	}
	s.released = true
	close(s.stop)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	err := s.lim.Release(ctx, s.key, s.id)
	cancel()
	if err != nil {
		s.report(fmt.Errorf("in-flight limiter: release the slot of key %q held by %q (reclaimed when its lease ends): %w", s.key, s.id, err))
	}
}

// Released reports whether Release was called.
func (s *Slot) Released() bool { return s != nil && s.isReleased() }

func (s *Slot) isReleased() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// RandomID returns a random id for a message without an identity of its
// own: every such message then holds a slot of its own.
func RandomID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
