package httpthrottle_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	httpthrottle "github.com/queuethrottle/queuethrottle/consumers/http"
	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestRejectionHeaders(t *testing.T) {
	lim, clk := newWindow(t, throttle.PerSecond(2))
	h := &counter{}
	s := serve(t, httpthrottle.Middleware(newGate(t, lim), httpthrottle.WithPolicyWindow(time.Second))(h))

	steps := []struct {
		name       string
		advance    time.Duration
		status     int
		retryAfter string // "" means absent
		rateLimit  string
	}{
		{"first", 0, 200, "", `"default";r=1;t=1`},
		{"second", 0, 200, "", `"default";r=0;t=1`},
		{"third rejected", 0, 429, "1", `"default";r=0;t=1`},
		{"700 ms later, 300 ms to go", 700 * time.Millisecond, 429, "1", `"default";r=0;t=1`},
		{"window passed", 300 * time.Millisecond, 200, "", `"default";r=1;t=1`},
	}
	for _, st := range steps {
		clk.Advance(st.advance)
		r := s.get()
		if r.status != st.status {
			t.Fatalf("%s: status %d, want %d", st.name, r.status, st.status)
		}
		if got := r.header.Get("Retry-After"); got != st.retryAfter {
			t.Errorf("%s: Retry-After %q, want %q", st.name, got, st.retryAfter)
		}
		if got := r.header.Values("RateLimit"); len(got) != 1 || got[0] != st.rateLimit {
			t.Errorf("%s: RateLimit %q, want %q", st.name, got, st.rateLimit)
		}
		if got := r.header.Values("RateLimit-Policy"); len(got) != 1 || got[0] != `"default";q=2;w=1` {
			t.Errorf("%s: RateLimit-Policy %q", st.name, got)
		}
		if st.status == 429 {
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("%s: Content-Type %q", st.name, ct)
			}
			if r.body != "Too Many Requests\n" {
				t.Errorf("%s: body %q", st.name, r.body)
			}
		}
	}
	if n := h.n.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3 (never for a rejection)", n)
	}
}

func TestRetryAfterRounding(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter time.Duration
		want       string
	}{
		{"zero is still a rejection", 0, "1"},
		{"1ns", time.Nanosecond, "1"},
		{"300ms", 300 * time.Millisecond, "1"},
		{"1s", time.Second, "1"},
		{"1001ms", 1001 * time.Millisecond, "2"},
		{"1500ms", 1500 * time.Millisecond, "2"},
		{"59999ms", 59999 * time.Millisecond, "60"},
		{"1h", time.Hour, "3600"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fixed{rate: throttle.PerMinute(10), d: throttle.Decision{Limit: 10, RetryAfter: tt.retryAfter, ResetAfter: time.Minute, Source: throttle.SourceLocal}}
			h := &counter{}
			rec := httptest.NewRecorder()
			httpthrottle.Middleware(newGate(t, lim))(h).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != 429 {
				t.Fatalf("status %d", rec.Code)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.want {
				t.Errorf("Retry-After %q, want %q", got, tt.want)
			}
			if got, want := rec.Header().Get("RateLimit"), `"default";r=0;t=`+tt.want; got != want {
				t.Errorf("RateLimit %q, want %q (t is the Retry-After on a rejection)", got, want)
			}
			if got := rec.Header().Get("RateLimit-Policy"); got != `"default";q=10` {
				t.Errorf("RateLimit-Policy %q (no w without WithPolicyWindow)", got)
			}
			if h.n.Load() != 0 {
				t.Error("handler ran for a rejection")
			}
		})
	}
}

func TestAdmittedHeaders(t *testing.T) {
	tests := []struct {
		name       string
		resetAfter time.Duration
		remaining  int
		window     time.Duration
		wantRL     string
		wantPolicy string
	}{
		{"reset 0", 0, 9, time.Minute, `"default";r=9;t=0`, `"default";q=10;w=60`},
		{"reset 1ms", time.Millisecond, 9, time.Minute, `"default";r=9;t=1`, `"default";q=10;w=60`},
		{"reset 2001ms", 2001 * time.Millisecond, 3, time.Minute, `"default";r=3;t=3`, `"default";q=10;w=60`},
		{"sub-second window omits w", 800 * time.Millisecond, 0, 250 * time.Millisecond, `"default";r=0;t=1`, `"default";q=10`},
		{"fractional window omits w", time.Second, 5, 1500 * time.Millisecond, `"default";r=5;t=1`, `"default";q=10`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fixed{rate: throttle.PerMinute(10), d: throttle.Decision{Allowed: true, Limit: 10, Remaining: tt.remaining, ResetAfter: tt.resetAfter, Source: throttle.SourceLocal}}
			h := &counter{}
			rec := httptest.NewRecorder()
			httpthrottle.Middleware(newGate(t, lim), httpthrottle.WithPolicyWindow(tt.window))(h).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != 200 || h.n.Load() != 1 {
				t.Fatalf("status %d, handler ran %d times", rec.Code, h.n.Load())
			}
			if got := rec.Header().Get("RateLimit"); got != tt.wantRL {
				t.Errorf("RateLimit %q, want %q", got, tt.wantRL)
			}
			if got := rec.Header().Get("RateLimit-Policy"); got != tt.wantPolicy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tt.wantPolicy)
			}
			if got := rec.Header().Get("Retry-After"); got != "" {
				t.Errorf("Retry-After %q on an admission", got)
			}
		})
	}
}

// A client that sends a new X-Forwarded-For (or Forwarded, or X-Real-IP)
// with every request is still limited by its RemoteAddr.
func TestForwardingHeadersIgnoredByDefault(t *testing.T) {
	lim, _ := newWindow(t, throttle.PerMinute(5))
	rec := &recorder{next: lim}
	h := &counter{}
	s := serve(t, httpthrottle.Middleware(newGate(t, rec))(h))
	admitted := 0
	for i := range 100 {
		ip := fmt.Sprintf("198.51.100.%d", i)
		r := s.get("X-Forwarded-For", ip, "Forwarded", "for="+ip, "X-Real-IP", ip)
		if r.status == 200 {
			admitted++
		}
	}
	if admitted != 5 || h.n.Load() != 5 {
		t.Errorf("admitted %d, handler ran %d times; want 5 of 100", admitted, h.n.Load())
	}
	for _, k := range rec.seen() {
		if k != "127.0.0.1" {
			t.Fatalf("key %q, want 127.0.0.1 (RemoteAddr) for every request", k)
		}
	}
}

// The same through a trusted proxy: the proxy on loopback appends the
// address it sees, so the client's own entries are to the left of it.
func TestTrustedProxyChain(t *testing.T) {
	lim, _ := newWindow(t, throttle.PerMinute(1))
	rec := &recorder{next: lim}
	h := &counter{}
	s := serve(t, httpthrottle.Middleware(newGate(t, rec), httpthrottle.WithTrustedProxies(
		netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")))(h))

	steps := []struct {
		name   string
		hdr    []string
		status int
		key    string
	}{
		{"client behind two proxies", []string{"X-Forwarded-For", "203.0.113.7, 10.1.2.3"}, 200, "203.0.113.7"},
		{"same client, forged entries to the left", []string{"X-Forwarded-For", "1.1.1.1, 2.2.2.2, 203.0.113.7, 10.1.2.3"}, 429, "203.0.113.7"},
		{"split over two fields", []string{"X-Forwarded-For", "9.9.9.9, 203.0.113.7", "X-Forwarded-For", "10.9.9.9"}, 429, "203.0.113.7"},
		{"another client", []string{"X-Forwarded-For", "203.0.113.8"}, 200, "203.0.113.8"},
		{"no header: the proxy itself", nil, 200, "127.0.0.1"},
		{"Forwarded is not the configured header", []string{"Forwarded", "for=192.0.2.99"}, 429, "127.0.0.1"},
	}
	for _, st := range steps {
		r := s.get(st.hdr...)
		keys := rec.seen()
		if r.status != st.status || keys[len(keys)-1] != st.key {
			t.Errorf("%s: status %d key %q, want %d %q", st.name, r.status, keys[len(keys)-1], st.status, st.key)
		}
	}
}

func TestForwardedHeaderThroughProxy(t *testing.T) {
	lim, _ := newWindow(t, throttle.PerMinute(100))
	rec := &recorder{next: lim}
	s := serve(t, httpthrottle.Middleware(newGate(t, rec),
		httpthrottle.WithTrustedProxies(netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("2001:db8:ffff::/48")),
		httpthrottle.WithForwardedHeader("forwarded"))(&counter{}))
	tests := []struct {
		name   string
		value  string
		status int
		key    string
	}{
		{"quoted IPv6 with port", `for="[2001:DB8:cafe::17]:4711";proto=https`, 200, "2001:db8:cafe::17"},
		{"chain through a trusted IPv6 proxy", `for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:ffff::1]"`, 200, "192.0.2.60"},
		{"IPv4-mapped", `for="[::ffff:192.0.2.61]"`, 200, "192.0.2.61"},
		{"unknown ends the walk at the proxy", `for=unknown`, 200, "127.0.0.1"},
		{"XFF ignored", ``, 200, "127.0.0.1"},
		{"unterminated quote", `for="192.0.2.62, for=192.0.2.63`, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(rec.seen())
			hdr := []string{"X-Forwarded-For", "192.0.2.200"}
			if tt.value != "" {
				hdr = append(hdr, "Forwarded", tt.value)
			}
			r := s.get(hdr...)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d (%s)", r.status, tt.status, r.body)
			}
			keys := rec.seen()
			if tt.key == "" {
				if len(keys) != before {
					t.Errorf("a malformed header reached the limiter as %q", keys[len(keys)-1])
				}
				return
			}
			if keys[len(keys)-1] != tt.key {
				t.Errorf("key %q, want %q", keys[len(keys)-1], tt.key)
			}
		})
	}
}

type failing struct{ rate throttle.Rate }

func (f failing) AllowN(context.Context, string, int) (throttle.Decision, error) {
	return throttle.Decision{}, errors.New("store down")
}
func (f failing) Rate() throttle.Rate { return f.rate }

func TestFailurePolicy(t *testing.T) {
	t.Run("fail open runs the handler", func(t *testing.T) {
		h := &counter{}
		g := newGate(t, failing{throttle.PerSecond(50)}, throttle.WithFailurePolicy(throttle.FailOpen))
		r := serve(t, httpthrottle.Middleware(g, httpthrottle.WithPolicyWindow(time.Second))(h)).get()
		if r.status != 200 || h.n.Load() != 1 || r.body != "ok" {
			t.Fatalf("status %d, handler ran %d times", r.status, h.n.Load())
		}
		if got := r.header.Get("RateLimit-Policy"); got != `"default";q=50;w=1` {
			t.Errorf("RateLimit-Policy %q", got)
		}
		if got := r.header.Values("RateLimit"); got != nil {
			t.Errorf("RateLimit %q on a degraded admission, want none (remaining unknown)", got)
		}
	})
	t.Run("fail closed rejects with the degraded retry-after", func(t *testing.T) {
		h := &counter{}
		g := newGate(t, throttle.LimiterFunc(failing{}.AllowN),
			throttle.WithFailurePolicy(throttle.FailClosed), throttle.WithDegradedRetryAfter(2500*time.Millisecond))
		r := serve(t, httpthrottle.Middleware(g)(h)).get()
		if r.status != 429 || h.n.Load() != 0 {
			t.Fatalf("status %d, handler ran %d times", r.status, h.n.Load())
		}
		if got := r.header.Get("Retry-After"); got != "3" {
			t.Errorf("Retry-After %q, want 3", got)
		}
		if got := r.header.Get("RateLimit"); got != `"default";r=0;t=3` {
			t.Errorf("RateLimit %q", got)
		}
		if got := r.header.Values("RateLimit-Policy"); got != nil {
			t.Errorf("RateLimit-Policy %q with an unknown limit", got)
		}
	})
	t.Run("a reject func may answer degraded rejections with 503", func(t *testing.T) {
		g := newGate(t, failing{throttle.PerSecond(50)})
		reject := func(w http.ResponseWriter, r *http.Request, d throttle.Decision) {
			code := http.StatusTooManyRequests
			if d.Source == throttle.SourceDegraded {
				code = http.StatusServiceUnavailable
			}
			w.WriteHeader(code)
		}
		r := serve(t, httpthrottle.Middleware(g, httpthrottle.WithRejectFunc(reject))(&counter{})).get()
		if r.status != 503 || r.header.Get("Retry-After") != "1" {
			t.Errorf("status %d, Retry-After %q; want 503 and 1", r.status, r.header.Get("Retry-After"))
		}
	})
}

func TestErrors(t *testing.T) {
	lim, _ := newWindow(t, throttle.PerSecond(5))
	gate := newGate(t, lim)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	ctxLimiter := throttle.LimiterFunc(func(ctx context.Context, _ string, _ int) (throttle.Decision, error) {
		return throttle.Decision{}, ctx.Err()
	})
	never := &fixed{rate: throttle.PerSecond(5), d: throttle.Decision{Limit: 5, RetryAfter: throttle.Never}}
	tests := []struct {
		name    string
		gate    *throttle.Gate
		nilNext bool
		opts    []httpthrottle.Option
		remote  string
		ctx     context.Context
		status  int
		is      error
	}{
		{name: "key function error", gate: gate, status: 400, is: throttle.ErrInvalidKey,
			opts: []httpthrottle.Option{httpthrottle.WithKeyFunc(func(*http.Request) (string, error) { return "", errors.New("no API key") })}},
		{name: "key function failed internally", gate: gate, status: 500, is: httpthrottle.ErrInternal,
			opts: []httpthrottle.Option{httpthrottle.WithKeyFunc(func(*http.Request) (string, error) {
				return "", fmt.Errorf("%w: tenant lookup: timeout", httpthrottle.ErrInternal)
			})}},
		{name: "RemoteAddr without an IP", gate: gate, remote: "@", status: 500, is: httpthrottle.ErrInternal},
		{name: "cost function error", gate: gate, status: 400, is: throttle.ErrInvalidCost,
			opts: []httpthrottle.Option{httpthrottle.WithCostFunc(func(*http.Request) (int, error) { return 0, errors.New("bad size") })}},
		{name: "cost above the limit", gate: gate, status: 400, is: throttle.ErrInvalidCost,
			opts: []httpthrottle.Option{httpthrottle.WithCostFunc(func(*http.Request) (int, error) { return 6, nil })}},
		{name: "rejection that no wait admits", gate: newGate(t, never), status: 400, is: throttle.ErrInvalidCost},
		{name: "context ended", gate: newGate(t, ctxLimiter), ctx: canceled, status: 503, is: context.Canceled},
		{name: "nil gate", status: 500, is: throttle.ErrInvalidOption},
		{name: "nil handler", gate: gate, nilNext: true, status: 500, is: throttle.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &counter{}
			var next http.Handler = h
			if tt.nilNext {
				next = nil
			}
			req := httptest.NewRequest("GET", "/", nil)
			if tt.remote != "" {
				req.RemoteAddr = tt.remote
			}
			if tt.ctx != nil {
				req = req.WithContext(tt.ctx)
			}

			rec := httptest.NewRecorder()
			httpthrottle.Middleware(tt.gate, tt.opts...)(next).ServeHTTP(rec, req)
			if rec.Code != tt.status || h.n.Load() != 0 {
				t.Errorf("default: status %d, handler ran %d times; want %d, never", rec.Code, h.n.Load(), tt.status)
			}
			if rec.Header().Get("Retry-After") != "" {
				t.Errorf("Retry-After on an error: a client must not retry it")
			}

			var got error
			onErr := httpthrottle.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
				got = err
				w.WriteHeader(httpthrottle.StatusCode(err))
			})
			rec = httptest.NewRecorder()
			httpthrottle.Middleware(tt.gate, append(tt.opts, onErr)...)(next).ServeHTTP(rec, req)
			if !errors.Is(got, tt.is) || rec.Code != tt.status {
				t.Errorf("error handler got %v (status %d), want one matching %v", got, rec.Code, tt.is)
			}
		})
	}
}

func TestKeyAndCostFuncs(t *testing.T) {
	lim, _ := newWindow(t, throttle.PerMinute(10))
	rec := &recorder{next: lim}
	mw := httpthrottle.Middleware(newGate(t, rec),
		httpthrottle.WithKeyFunc(func(r *http.Request) (string, error) { return "tenant:" + r.Header.Get("X-Tenant"), nil }),
		httpthrottle.WithCostFunc(func(r *http.Request) (int, error) {
			if r.Method == http.MethodPost {
				return 4, nil
			}
			return 1, nil
		}))
	s := serve(t, mw(&counter{}))
	if r := s.get("X-Tenant", "acme"); r.header.Get("RateLimit") != `"default";r=9;t=60` {
		t.Errorf("GET: RateLimit %q", r.header.Get("RateLimit"))
	}
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL, nil)
	req.Header.Set("X-Tenant", "acme")
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("RateLimit"); got != `"default";r=5;t=60` {
		t.Errorf("POST of cost 4: RateLimit %q", got)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if fmt.Sprint(rec.keys, rec.costs) != "[tenant:acme tenant:acme] [1 4]" {
		t.Errorf("keys %v costs %v", rec.keys, rec.costs)
	}
}

// Two middlewares in a row, a per-client and a global one: both
// policies show, and the one that rejects sets Retry-After.
func TestStackedPolicies(t *testing.T) {
	perIP, _ := newWindow(t, throttle.PerMinute(10))
	global, _ := newWindow(t, throttle.PerSecond(1))
	h := &counter{}
	outer := httpthrottle.Middleware(newGate(t, perIP), httpthrottle.WithPolicyName("per-ip"), httpthrottle.WithPolicyWindow(time.Minute))
	inner := httpthrottle.Middleware(newGate(t, global), httpthrottle.WithPolicyName(`all "clients"`), httpthrottle.WithPolicyWindow(time.Second))
	s := serve(t, outer(inner(h)))
	r := s.get()
	wantPolicy := []string{`"per-ip";q=10;w=60`, `"all \"clients\"";q=1;w=1`}
	if r.status != 200 || fmt.Sprint(r.header.Values("RateLimit-Policy")) != fmt.Sprint(wantPolicy) {
		t.Errorf("status %d, RateLimit-Policy %q, want %q", r.status, r.header.Values("RateLimit-Policy"), wantPolicy)
	}
	r = s.get()
	wantRL := []string{`"per-ip";r=8;t=60`, `"all \"clients\"";r=0;t=1`}
	if r.status != 429 || r.header.Get("Retry-After") != "1" || fmt.Sprint(r.header.Values("RateLimit")) != fmt.Sprint(wantRL) {
		t.Errorf("status %d, Retry-After %q, RateLimit %q, want 429, 1, %q", r.status, r.header.Get("Retry-After"), r.header.Values("RateLimit"), wantRL)
	}
	if h.n.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", h.n.Load())
	}
}
