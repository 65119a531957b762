package httpthrottle

import (
	"net/http"
	"net/netip"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Option configures Middleware. Options that get a nil or out-of-range
// value keep the default.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	keyFunc  func(*http.Request) (string, error) // nil: the client IP
	costFunc func(*http.Request) (int, error)    // nil: 1
	reject   func(http.ResponseWriter, *http.Request, throttle.Decision)
	onError  func(http.ResponseWriter, *http.Request, error)

	// Client IP (see clientip.go).
	trusted    []netip.Prefix
	header     string // canonical name of the forwarding header
	forwarded  bool   // header is RFC 7239 Forwarded
	ipv6Prefix int    // 1..127 masks IPv6 keys; otherwise whole addresses

	// RateLimit headers (see headers.go).
	policy string        // the policy name as an sf-string, quotes included
	window time.Duration // RateLimit-Policy's w; 0 omits it
}

// DefaultPolicyName is the name of the quota policy in the RateLimit and
// RateLimit-Policy headers unless WithPolicyName sets another.
const DefaultPolicyName = "default"

func newConfig(opts []Option) *config {
	c := &config{
		reject:  DefaultReject,
		onError: DefaultError,
		header:  "X-Forwarded-For",
		policy:  sfString(DefaultPolicyName),
	}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	return c
}

// WithKeyFunc sets how a request's limiter key is derived. The default is
// the client IP: the address of RemoteAddr (behind proxies named with
// WithTrustedProxies, the address they report), IPv4-mapped IPv6
// addresses unmapped, zones dropped, in the form of netip.Addr.String
// ("192.0.2.1", "2001:db8::1"; see WithIPv6Prefix). An error means the
// request cannot be decided: the handler does not run and the error
// handler answers (see WithErrorHandler): 400 Bad Request, or 500 Internal
// Server Error when the error wraps ErrInternal (the function itself
// failed, say a lookup of the API key's tenant, rather than the request
// lacking what it needs). Nil keeps the default.
func WithKeyFunc(f func(*http.Request) (string, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.keyFunc = f
		}
	})
}

// WithCostFunc sets the cost n charged for a request. The default charges
// 1 per request. An error, like a cost the limiter refuses (n < 1 or more
// than its limit), means the request is never admitted: the handler does
// not run and the error handler answers, 400 Bad Request (500 when the
// error wraps ErrInternal). Nil keeps the default.
func WithCostFunc(f func(*http.Request) (int, error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.costFunc = f
		}
	})
}

// WithTrustedProxies names the proxies (load balancers, reverse proxies)
// whose forwarding header the default key function believes. Without it,
// X-Forwarded-For and Forwarded are ignored and the client IP is the
// address of RemoteAddr, so a client cannot pick its own key by sending
// them.
//
// With it, when the peer (RemoteAddr) is in one of the prefixes, the
// forwarding header (WithForwardedHeader; default X-Forwarded-For) is
// walked from the right, the entry the nearest proxy appended first,
// skipping addresses in the prefixes: the first address outside them is
// the client. If every address is trusted, the client is the leftmost
// one. An entry that is not an IP address ("unknown", an RFC 7239
// obfuscated identifier such as "_hidden", a Forwarded element without
// for=) ends the walk: the client is then the nearest proxy that reported
// it. Empty list members are skipped. A malformed Forwarded field (an
// unterminated quoted string, a bad parameter) seen from a trusted peer is
// a key error, answered with 400 Bad Request: a client's broken quote must
// not swallow what its proxy appended.
//
// Name every proxy that can reach the server, and only those: an address
// in a prefix is believed when it says who sent it the request. Invalid
// prefixes are ignored; each call adds to the list.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return optionFunc(func(c *config) {
		for _, p := range prefixes {
			if p.IsValid() {
				c.trusted = append(c.trusted, unmapPrefix(p))
			}
		}
	})
}

// WithForwardedHeader sets the header that the proxies of
// WithTrustedProxies append the client's address to: "X-Forwarded-For"
// (the default), "Forwarded" (RFC 7239, parsed for its for= parameters),
// or another header holding a comma-separated list of addresses in the
// X-Forwarded-For form, such as "X-Real-IP" set by a proxy that
// overwrites it. Only this header is read; name the one your proxies set.
// The name is case-insensitive; "" keeps the default.
func WithForwardedHeader(name string) Option {
	return optionFunc(func(c *config) {
		if name != "" {
			c.header = http.CanonicalHeaderKey(name)
			c.forwarded = c.header == "Forwarded"
		}
	})
}

// WithIPv6Prefix makes the default key function key an IPv6 client by
// its network of the given length instead of its whole address, so that
// a client holding a /64 (the usual allocation) cannot spread its requests
// over 2^64 keys: with 64, 2001:db8::1 and 2001:db8::2 share the key
// "2001:db8::/64". IPv4 clients keep their address. Bits outside 1..127
// keep the default (whole addresses).
func WithIPv6Prefix(bits int) Option {
	return optionFunc(func(c *config) {
		if bits >= 1 && bits <= 127 {
			c.ipv6Prefix = bits
		}
	})
}

// WithPolicyName sets the name of the quota policy in the RateLimit and
// RateLimit-Policy headers (default DefaultPolicyName, "default"). Give
// each middleware of a stack its own name: the headers are added, not
// replaced, so a request that passes a per-client and a global gate
// carries both policies. Bytes outside printable ASCII become "_";
// "" keeps the default.
func WithPolicyName(name string) Option {
	return optionFunc(func(c *config) {
		if name != "" {
			c.policy = sfString(name)
		}
	})
}

// WithPolicyWindow sets the time window of the quota policy, advertised
// as RateLimit-Policy's w parameter in whole seconds: pass the Per of the
// limiter's Rate (the Gate does not expose it). The draft has no
// sub-second windows, so a window that is not a whole number of seconds,
// like the default 0, omits w.
func WithPolicyWindow(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d >= 0 {
			c.window = d
		}
	})
}

// WithRejectFunc sets what answers a rejected request. It is called with
// the Decision after the middleware has set the Retry-After, RateLimit and
// RateLimit-Policy headers, and writes the status and body itself; the
// wrapped handler does not run. A degraded rejection (the store was
// unreachable and the Gate fails closed) has Decision.Source
// throttle.SourceDegraded, for a function that prefers to answer it with
// 503 Service Unavailable. The default is DefaultReject. Nil keeps the
// default.
func WithRejectFunc(f func(w http.ResponseWriter, r *http.Request, d throttle.Decision)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.reject = f
		}
	})
}

// WithErrorHandler sets what answers a request that was neither admitted
// nor rejected: a key or cost function error (wrapping
// throttle.ErrInvalidKey or throttle.ErrInvalidCost, and the function's
// error), a usage error from the Gate (throttle.IsUsageError), a decision
// not made before the request's context ended (the context's error), a
// bad configuration (throttle.ErrInvalidOption). The wrapped handler does
// not run. StatusCode says what status the error calls for. The default is
// DefaultError. Nil keeps the default.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onError = f
		}
	})
}
