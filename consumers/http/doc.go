// Package httpthrottle gates net/http handlers with a throttle.Gate: every
// request is decided before the handler runs; admitted requests run,
// rejected ones get 429 Too Many Requests with Retry-After, and both carry
// the RateLimit-Policy and RateLimit header fields. The Gate traces,
// counts and logs each decision; its decision span is a child of the
// request's context (an otelhttp server span, when there is one).
//
// Quick start, 100 requests per second per client IP:
//
//	lim, _ := window.NewMemory(throttle.PerSecond(100))
//	gate, _ := throttle.NewGate(lim)
//	mw := httpthrottle.Middleware(gate, httpthrottle.WithPolicyWindow(time.Second))
//	http.ListenAndServe(":8080", mw(mux))
//
// # Each request
//
// The key (default: the client IP; WithKeyFunc) and cost (default 1;
// WithCostFunc) go to Gate.Admit with the request's context. Then:
//
//   - Admitted: the wrapped handler runs, with RateLimit-Policy and
//     RateLimit already in its response headers.
//   - Rejected: the wrapped handler does not run. The response has
//     Retry-After, RateLimit-Policy and RateLimit, and the reject function
//     (WithRejectFunc; default DefaultReject: 429, a text/plain body)
//     writes the status and body.
//   - Degraded (the limiter's store failed; Decision.Source is
//     throttle.SourceDegraded): the Gate's failure policy has decided, and
//     the middleware renders its Decision. With throttle.FailOpen the
//     handler runs, with RateLimit-Policy but no RateLimit (the remaining
//     quota is unknown); with throttle.FailClosed the request is rejected
//     with the Gate's degraded retry-after (throttle.WithDegradedRetryAfter,
//     default 1 s).
//   - Neither: a key or cost function error, a request the limiter can
//     never admit (throttle.IsUsageError, or a rejection with RetryAfter
//     throttle.Never), a context that ended before the decision, a nil
//     Gate or handler. The wrapped handler does not run; the error handler
//     (WithErrorHandler; default DefaultError) answers with StatusCode(err):
//     400 Bad Request for the request's own faults, 500 Internal Server
//     Error for configuration errors and errors wrapping ErrInternal, 503
//     Service Unavailable for an ended context. Never 429: no wait would
//     help.
//
// # Header fields
//
// The RateLimit fields follow draft-ietf-httpapi-ratelimit-headers-11
// (23 May 2026), whose policy identifiers are Structured Field Strings:
//
//	RateLimit-Policy: "default";q=100;w=1
//	RateLimit: "default";r=0;t=1
//	Retry-After: 1
//
// q is Decision.Limit (omitted, with the whole RateLimit-Policy field,
// when the Limit is unknown), w the window of WithPolicyWindow in seconds
// (omitted unless set to whole seconds), r is Decision.Remaining. t is,
// for an admission, Decision.ResetAfter rounded up to whole seconds, and
// for a rejection the Retry-After. Retry-After (rejections only) is
// Decision.RetryAfter in whole seconds rounded up and at least 1: 300 ms
// gives 1, 1001 ms gives 2. The fields are added, not replaced, so two
// middlewares in a row with different policy names (WithPolicyName) both
// show.
//
// # Client IP
//
// By default the key is the address of Request.RemoteAddr, normalized:
// IPv4-mapped IPv6 addresses unmapped (::ffff:192.0.2.1 is 192.0.2.1),
// zones dropped, IPv6 in netip.Addr.String form (WithIPv6Prefix keys a
// whole IPv6 network instead). X-Forwarded-For and Forwarded are ignored,
// so a client cannot dodge its limit by sending them. Behind a load
// balancer, name the proxies with WithTrustedProxies (and the header they
// append to with WithForwardedHeader): the header is then walked from the
// right, past trusted addresses, to the first untrusted one, the client.
// RemoteAddr without an IP address (a Unix socket listener) is an error
// wrapping ErrInternal, 500 by default: give such servers a key function.
package httpthrottle
