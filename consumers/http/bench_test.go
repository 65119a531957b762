package httpthrottle_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	httpthrottle "github.com/queuethrottle/queuethrottle/consumers/http"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// BenchmarkMiddleware measures the middleware around an in-memory window
// that admits everything, without a network: key from RemoteAddr, one
// decision, the two RateLimit fields. Run with -benchmem.
func BenchmarkMiddleware(b *testing.B) {
	lim, err := window.NewMemory(throttle.PerSecond(1 << 30))
	if err != nil {
		b.Fatal(err)
	}
	g, err := throttle.NewGate(lim)
	if err != nil {
		b.Fatal(err)
	}
	h := httpthrottle.Middleware(g)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := httptest.NewRequest("GET", "/", nil)
	w := httptest.NewRecorder()
	for b.Loop() {
		clear(w.Header())
		h.ServeHTTP(w, req)
	}
}
