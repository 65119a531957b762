package natsthrottle

import (
	"context"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/fair"
)

// maxDeferred bounds the deliveries remembered as deferred by the fair
// shares (so that they wait, not go back again, when they return).
const maxDeferred = 100_000

// arrive takes msg into the fair shares of the WithConcurrency handlers
// (Handle with a scheduler): it waits here on a goroutine of its own for
// its handler, or goes back to the server once, to when its key's share
// reaches it. Handle returns at once, but before any handler has ended it
// waits while the scheduler's queue is full (nothing can be deferred
// before a handler time is known).
func (h *Handler) arrive(ctx context.Context, span trace.Span, r *request) {
	<-h.sched.Room()
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		h.decide(ctx, span, r) // as without fair shares
		return
	}
	h.wg.Add(1)
	h.waitStarted(r)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		defer h.waitDone(r)
		h.schedule(ctx, span, r)
	}()
}

// schedule is the life of a message in the fair shares, once it has
// arrived. It asks for a handler: deferred, it is NAKed to come back half
// of WithMaxWait before its key's share reaches it, not charged. Waiting
// here, its rate decides at once (deciding once a handler is free would
// push a key that sends at its rate later with every wait): refused, it
// waits in process for a near retry-after (a reserved slot at most
// WithMaxWait ahead, or any on its last delivery: held) and asks again, or
// is NAKed to its retry-after. Admitted, it waits for its handler
// (heartbeats with InProgress), takes its in-flight slot (refused, it
// waits for one of its key's handlers to end) and runs. It ends span.
func (h *Handler) schedule(ctx context.Context, span trace.Span, r *request) {
	defer span.End()
	last := h.lastDelivery(r.msg)
	returning := h.wasDeferred(r)
	beat := time.NewTicker(h.heartbeat)
	defer beat.Stop()
	hold := holdState{h: h, span: span}
	defer hold.release()
	// The message's AckWait restarts now: how long it sat in the client's
	// buffer is not known.
	_ = r.msg.InProgress()
	started := time.Now()
	admitted := false
	for {
		maxWait := time.Duration(0) // on its last delivery: never deferred
		if !last {
			maxWait = max(min(h.cfg.maxWait, h.cfg.shortestAckWait()/2-time.Since(started)), time.Nanosecond)
		}
		t := h.sched.Arrive(r.key, fair.Arrival{MaxWait: maxWait, Returning: returning})
		if !admitted {
			if deferredNow(t) {
				h.defer_(ctx, span, r, t)
				return
			}
			v := h.rate(ctx, span, r)
			switch {
			case v.done:
				t.Leave(fair.Block{})
				return
			case !v.run:
				t.Leave(fair.Refused(time.Now(), v.retry, v.reserved))
				if !h.rateWait(ctx, span, r, v, last, started, &hold, beat) {
					return
				}
				returning = true
				continue
			}
			admitted = true
		}
		for {
			select {
			case <-t.Granted():
			case <-t.Deferred():
				h.defer_(ctx, span, r, t) // admitted: its id is admitted again, free, while still counted
				return
			case <-beat.C:
				h.inProgress(ctx, span, r.msg)
				continue
			case <-h.stop:
				t.Leave(fair.Block{})
				h.giveUp(ctx, span, r, 0)
				return
			}
			s, retry, refused, ok := h.acquire(ctx, span, r)
			if ok {
				hold.release()
				h.run(ctx, span, r, s)
				t.Done()
				return
			}
			if last {
				hold.start(ctx, r)
			}
			t.Retry(fair.Block{Until: time.Now().Add(retry), UntilDone: refused})
		}
	}
}

// deferredNow reports whether t was deferred as it arrived.
func deferredNow(t *fair.Ticket) bool {
	select {
	case <-t.Deferred():
		return true
	default:
		return false
	}
}

// defer_ sends r back to the server, deferred by the fair shares: NAKed
// to come back half of WithMaxWait before t's delay, to wait here for the
// rest.
func (h *Handler) defer_(ctx context.Context, span trace.Span, r *request, t *fair.Ticket) {
	h.deferred(r)
	span.SetAttributes(DeferredAttr.Bool(true))
	h.nak(ctx, span, r, DispositionDeferred, max(t.Delay()-h.cfg.maxWait/2, 0), false)
}

// rateWait handles r refused by its rate (v): on its last delivery it is
// held until the retry-after; a reserved slot at most WithMaxWait ahead,
// that keeps the delivery within half its ack wait, is waited for here;
// any other is NAKed to its retry-after. It reports whether r waited (and
// asks again) rather than left.
func (h *Handler) rateWait(ctx context.Context, span trace.Span, r *request, v verdict, last bool, started time.Time, hold *holdState, beat *time.Ticker) bool {
	switch {
	case last:
		hold.start(ctx, r)
	case v.reserved && v.retry <= h.cfg.maxWait && time.Since(started)+v.retry <= h.cfg.shortestAckWait()/2:
		span.SetAttributes(WaitedAttr.Bool(true))
		h.dispose(ctx, r, DispositionWait)
	default:
		if v.reserved {
			h.nak(ctx, span, r, DispositionNak, v.retry-h.cfg.maxWait/2, false)
		} else {
			h.nak(ctx, span, r, DispositionNak, v.retry, true)
		}
		return false
	}
	return h.sleep(ctx, span, r, h.delay(v.retry), beat)
}

// sleep waits d for r, sending InProgress with beat, and reports false if
// Close gave up meanwhile (r is then given up).
func (h *Handler) sleep(ctx context.Context, span trace.Span, r *request, d time.Duration, beat *time.Ticker) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	start := time.Now()
	for {
		select {
		case <-timer.C:
			return true
		case <-beat.C:
			h.inProgress(ctx, span, r.msg)
		case <-h.stop:
			h.giveUp(ctx, span, r, d-time.Since(start))
			return false
		}
	}
}

// giveUp gives r back when Close gave up waiting: on its last delivery it
// is abandoned (a NAK would drop it), a superseded delivery is dropped,
// and any other is NAKed to come back after left.
func (h *Handler) giveUp(ctx context.Context, span trace.Span, r *request, left time.Duration) {
	switch {
	case h.superseded(r):
		h.supersede(ctx, span, r)
	case h.lastDelivery(r.msg):
		h.abandon(ctx, span, r.msg)
	default:
		h.nak(ctx, span, r, DispositionNak, max(left, time.Millisecond), false)
	}
}

// holdState counts a message on its last delivery as held (Held) while its
// limits keep it from running, so that Close waits for it.
type holdState struct {
	h       *Handler
	span    trace.Span
	holding bool
}

func (s *holdState) start(ctx context.Context, r *request) {
	if s.holding {
		return
	}
	s.holding = true
	s.h.holding.Add(1)
	s.h.held.Add(1)
	s.span.SetAttributes(HeldAttr.Bool(true))
	s.h.dispose(ctx, r, DispositionHold)
}

func (s *holdState) release() {
	if s.holding {
		s.holding = false
		s.h.held.Add(-1)
		s.h.holding.Done()
	}
}

// deferredSet remembers the deliveries the fair shares sent back, by
// message (request.waitKey), so that their next delivery waits its turn
// here instead of going back again.
func newDeferredSet() *lru.Cache[string, struct{}] {
	c, _ := lru.New[string, struct{}](maxDeferred)
	return c
}

// deferred notes that r goes back to the server, deferred by the fair
// shares.
func (h *Handler) deferred(r *request) {
	if r.waitKey != "" {
		h.deferredIDs.Add(r.waitKey, struct{}{})
	}
}

// wasDeferred reports whether r's message was deferred before, and forgets
// it.
func (h *Handler) wasDeferred(r *request) bool {
	if r.waitKey == "" {
		return false
	}
	_, ok := h.deferredIDs.Peek(r.waitKey)
	if ok {
		h.deferredIDs.Remove(r.waitKey)
	}
	return ok
}
