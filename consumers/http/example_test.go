package httpthrottle_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	httpthrottle "github.com/queuethrottle/queuethrottle/consumers/http"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// Two requests per minute per client IP: the third gets 429 with
// Retry-After and the RateLimit fields, and the handler never sees it.
func ExampleMiddleware() {
	lim, err := window.NewMemory(throttle.PerMinute(2))
	if err != nil {
		log.Fatal(err)
	}
	gate, err := throttle.NewGate(lim)
	if err != nil {
		log.Fatal(err)
	}
	mw := httpthrottle.Middleware(gate, httpthrottle.WithPolicyWindow(time.Minute))
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello\n")
	})
	srv := httptest.NewServer(mw(hello))
	defer srv.Close()

	for range 3 {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status)
		for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit"} {
			if v := resp.Header.Get(h); v != "" {
				fmt.Printf("%s: %s\n", h, v)
			}
		}
		fmt.Printf("%s", body)
	}
	// Output:
	// 200 OK
	// RateLimit-Policy: "default";q=2;w=60
	// RateLimit: "default";r=1;t=60
	// hello
	// 200 OK
	// RateLimit-Policy: "default";q=2;w=60
	// RateLimit: "default";r=0;t=60
	// hello
	// 429 Too Many Requests
	// Retry-After: 60
	// RateLimit-Policy: "default";q=2;w=60
	// RateLimit: "default";r=0;t=60
	// Too Many Requests
}

// Behind a load balancer on 10.0.0.0/8 that appends to X-Forwarded-For:
// the client is the first address from the right outside that network.
// Without WithTrustedProxies the header is ignored.
func ExampleWithTrustedProxies() {
	lim, err := window.NewMemory(throttle.PerSecond(100))
	if err != nil {
		log.Fatal(err)
	}
	gate, err := throttle.NewGate(lim)
	if err != nil {
		log.Fatal(err)
	}
	mw := httpthrottle.Middleware(gate,
		httpthrottle.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")),
		httpthrottle.WithIPv6Prefix(64))
	http.Handle("/api/", mw(http.NotFoundHandler()))
}
