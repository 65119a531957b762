package httpthrottle_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newWindow returns an in-memory window of r on a fake clock at T0.
func newWindow(t *testing.T, r throttle.Rate) (*window.Memory, *throttletest.Clock) {
	t.Helper()
	clk := throttletest.NewClock(throttletest.T0)
	lim, err := window.NewMemory(r, window.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	return lim, clk
}

func newGate(t *testing.T, l throttle.Limiter, opts ...throttle.Option) *throttle.Gate {
	t.Helper()
	g, err := throttle.NewGate(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// counter is a handler that counts its calls and answers 200 "ok".
type counter struct{ n atomic.Int64 }

func (c *counter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	c.n.Add(1)
	_, _ = io.WriteString(w, "ok")
}

// server is a real HTTP server on loopback running h, closed at cleanup.
type server struct {
	t   *testing.T
	srv *httptest.Server
}

func serve(t *testing.T, h http.Handler) *server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return &server{t: t, srv: s}
}

// response is what a test reads of one response.
type response struct {
	status int
	header http.Header
	body   string
}

// get sends GET / with the header fields of hdr (name, value pairs; a
// name may repeat).
func (s *server) get(hdr ...string) response {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.srv.URL+"/", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// recorder is a Limiter that records the keys and costs it is asked
// about and passes them on to next.
type recorder struct {
	next  throttle.Limiter
	mu    sync.Mutex
	keys  []string
	costs []int
}

func (r *recorder) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	r.mu.Lock()
	r.keys = append(r.keys, key)
	r.costs = append(r.costs, n)
	r.mu.Unlock()
	return r.next.AllowN(ctx, key, n)
}

// Rate makes the Gate see the limit of next, when it has one.
func (r *recorder) Rate() throttle.Rate {
	if rl, ok := r.next.(interface{ Rate() throttle.Rate }); ok {
		return rl.Rate()
	}
	return throttle.Rate{}
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

// fixed is a limiter with a Rate that answers every request with d and
// err.
type fixed struct {
	rate throttle.Rate
	d    throttle.Decision
	err  error
}

func (f *fixed) AllowN(context.Context, string, int) (throttle.Decision, error) { return f.d, f.err }
func (f *fixed) Rate() throttle.Rate                                            { return f.rate }
