package natsthrottle

import (
	"context"
	"log/slog"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// deliveries tracks, for each message with a delivery waiting in this
// Handler (for a near slot, or held on its last delivery), the newest
// delivery of it seen. The server can deliver a message again while an
// earlier delivery of it waits here (a restarted server redelivers what
// it had pending, whatever NAK delays it had set), and both would be
// admitted at the slot: the second for free, on the admission of the
// first. Only the newest runs the wrapped handler; an earlier one is
// superseded: dropped, neither acknowledged nor NAKed, since the newest
// is the one the server waits on. The zero deliveries is ready to use.
type deliveries struct {
	mu sync.Mutex
	m  map[string]*waitingDeliveries
}

type waitingDeliveries struct {
	newest  uint64 // the highest delivery count seen
	waiting int    // deliveries waiting now
}

// arrived notes a delivery of id, the delivery-th, if one of id waits.
func (d *deliveries) arrived(id string, delivery uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.m[id]; w != nil {
		w.newest = max(w.newest, delivery)
	}
}

// wait notes that the delivery-th delivery of id starts waiting.
func (d *deliveries) wait(id string, delivery uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]*waitingDeliveries{}
	}
	w := d.m[id]
	if w == nil {
		w = &waitingDeliveries{}
		d.m[id] = w
	}
	w.newest = max(w.newest, delivery)
	w.waiting++
}

// superseded reports whether a delivery of id newer than the delivery-th
// was seen while this one waited.
func (d *deliveries) superseded(id string, delivery uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.m[id]
	return w != nil && w.newest > delivery
}

// done notes that a waiting delivery of id stopped waiting.
func (d *deliveries) done(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.m[id]; w != nil {
		if w.waiting--; w.waiting <= 0 {
			delete(d.m, id)
		}
	}
}

// supersede drops r, superseded by a newer delivery of its message: the
// span says so, and nothing goes to the server.
func (h *Handler) supersede(ctx context.Context, span trace.Span, r *request) {
	span.SetAttributes(DispositionAttr.String(DispositionSuperseded))
	if h.cfg.logger != nil {
		h.cfg.logger.DebugContext(ctx, "natsthrottle: dropping a delivery superseded by a newer delivery of its message",
			slog.String("subject", r.msg.Subject()), slog.String("id", r.id), slog.Uint64("delivery", r.delivery))
	}
}

// The Handler's side of deliveries: r's message is known by r.waitKey
// (see requestID); a request without one is not tracked.

// deliveryArrived notes r's arrival (see deliveries.arrived).
func (h *Handler) deliveryArrived(r *request) {
	if r.waitKey != "" {
		h.waiters.arrived(r.waitKey, r.delivery)
	}
}

// waitStarted notes that r waits here until waitDone.
func (h *Handler) waitStarted(r *request) {
	if r.waitKey != "" {
		h.waiters.wait(r.waitKey, r.delivery)
	}
}

// waitDone notes that r stopped waiting (see deliveries).
func (h *Handler) waitDone(r *request) {
	if r.waitKey != "" {
		h.waiters.done(r.waitKey)
	}
}

// superseded reports whether a newer delivery of r's message arrived
// while r waited (see deliveries).
func (h *Handler) superseded(r *request) bool {
	return r.waitKey != "" && h.waiters.superseded(r.waitKey, r.delivery)
}
