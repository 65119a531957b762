package httpthrottle

import (
	"fmt"
	"net/http"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Middleware returns net/http middleware that decides every request with
// g.Admit(r.Context(), key, cost) before the wrapped handler runs; see the
// package documentation for the responses. The key is the client IP
// unless WithKeyFunc says otherwise, the cost 1 unless WithCostFunc does.
//
// Middleware has no error return and does not panic: with a nil Gate or a
// nil handler, every request gets the error handler with an error
// wrapping throttle.ErrInvalidOption (500 Internal Server Error by
// default), and nothing else runs. The returned handlers are safe for
// concurrent use, as the Gate is.
func Middleware(g *throttle.Gate, opts ...Option) func(http.Handler) http.Handler {
	c := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return &handler{c: c, gate: g, next: next}
	}
}

type handler struct {
	c    *config
	gate *throttle.Gate
	next http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.c
	if h.gate == nil || h.next == nil {
		c.onError(w, r, &throttle.OptionError{Field: "Middleware", Reason: "nil Gate or handler"})
		return
	}
	var key string
	var err error
	if c.keyFunc != nil {
		key, err = c.keyFunc(r)
	} else {
		key, err = c.clientKey(r)
	}
	if err != nil {
		c.onError(w, r, fmt.Errorf("%w: key function: %w", throttle.ErrInvalidKey, err))
		return
	}
	cost := 1
	if c.costFunc != nil {
		if cost, err = c.costFunc(r); err != nil {
			c.onError(w, r, fmt.Errorf("%w: cost function: %w", throttle.ErrInvalidCost, err))
			return
		}
	}
	d, err := h.gate.Admit(r.Context(), key, cost)
	if err != nil {
		c.onError(w, r, err)
		return
	}
	if !d.Allowed && d.RetryAfter == throttle.Never {
		// No wait would admit it: a 429 would invite retries forever.
		c.onError(w, r, fmt.Errorf("%w: key %q, cost %d can never be admitted", throttle.ErrInvalidCost, key, cost))
		return
	}
	c.setHeaders(w.Header(), d)
	if !d.Allowed {
		c.reject(w, r, d)
		return
	}
	h.next.ServeHTTP(w, r)
}
