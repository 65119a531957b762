package redistest

import (
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/latencyproxy"
)

// NewLatencyProxy starts a latencyproxy.Proxy in front of s, delaying each
// way by each, stopped when the test ends.
func NewLatencyProxy(t testing.TB, s *Server, each time.Duration) *latencyproxy.Proxy {
	t.Helper()
	p, err := latencyproxy.Start(s.Addr(), each)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}
