package httpthrottle

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// clientKey is the default key function: the client IP (see WithKeyFunc,
// WithTrustedProxies and WithIPv6Prefix).
func (c *config) clientKey(r *http.Request) (string, error) {
	a, err := c.clientAddr(r)
	if err != nil {
		return "", err
	}
	if c.ipv6Prefix > 0 && a.Is6() {
		p, _ := a.Prefix(c.ipv6Prefix) // cannot fail: 1 <= bits <= 127 and no zone
		return p.String(), nil
	}
	return a.String(), nil
}

// clientAddr returns the client's address: the peer's, or behind trusted
// proxies the first untrusted address of the forwarding header, walked
// from the right.
func (c *config) clientAddr(r *http.Request) (netip.Addr, error) {
	peer, ok := parseRemoteAddr(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: RemoteAddr %q holds no IP address", ErrInternal, r.RemoteAddr)
	}
	if !c.isTrusted(peer) {
		return peer, nil
	}
	values := r.Header[c.header]
	client := peer
	for i := len(values) - 1; i >= 0; i-- {
		var hops []string
		if c.forwarded {
			var err error
			if hops, err = forwardedFor(values[i]); err != nil {
				return netip.Addr{}, err
			}
		} else {
			hops = strings.Split(values[i], ",")
		}
		for j := len(hops) - 1; j >= 0; j-- {
			h := strings.TrimSpace(hops[j])
			if h == "" {
				continue // an empty list member (RFC 9110, section 5.6.1)
			}
			a, ok := parseHop(h)
			if !ok {
				return client, nil // "unknown", obfuscated, or garbage: trust stops here
			}
			if !c.isTrusted(a) {
				return a, nil
			}
			client = a
		}
	}
	return client, nil
}

func (c *config) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// normalize unmaps IPv4-mapped IPv6 addresses and drops zones: a zone in
// a forwarding header is text the client may choose, and must not make
// one address many keys.
func normalize(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// unmapPrefix turns an IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104)
// into its IPv4 prefix, as addresses are unmapped before they are
// compared, and masks it.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// parseRemoteAddr parses http.Request.RemoteAddr: "ip:port", or a bare
// IP as some test setups and handlers behind other middleware leave it.
func parseRemoteAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}
	return netip.Addr{}, false
}

// parseHop parses one address of a forwarding header: an IP address with
// or without a port, an IPv6 address in brackets with or without one.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	if n := len(s); n > 2 && s[0] == '[' && s[n-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : n-1]); err == nil && a.Is6() {
			return normalize(a), true
		}
	}
	return netip.Addr{}, false
}

// forwardedFor parses one Forwarded field value (RFC 7239, section 4) and
// returns the for= value of each element, in order; "unknown" for an
// element without one. Empty elements are skipped. Parameter names are
// case-insensitive tokens; values are tokens or quoted strings, and an
// unquoted value may hold any character but whitespace, '"', ';' and ','
// (proxies that forget to quote "192.0.2.1:8080" are common). A malformed
// value, such as an unterminated quoted string or a repeated for=, is an
// error wrapping throttle.ErrInvalidKey.
func forwardedFor(s string) ([]string, error) {
	var out []string
	var forVal string
	hasPairs, hasFor := false, false
	flush := func() {
		if hasPairs {
			if !hasFor {
				forVal = "unknown"
			}
			out = append(out, forVal)
		}
		forVal, hasPairs, hasFor = "", false, false
	}
	bad := func(why string) error {
		return fmt.Errorf("%w: malformed Forwarded header: %s", throttle.ErrInvalidKey, why)
	}
	i := 0
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i == len(s) {
			flush()
			return out, nil
		}
		switch s[i] {
		case ',':
			flush()
			i++
			continue
		case ';':
			i++
			continue
		}
		start := i
		for i < len(s) && isTokenChar(s[i]) {
			i++
		}
		if start == i {
			return nil, bad(fmt.Sprintf("unexpected %q at %d", s[i], i))
		}
		name := s[start:i]
		if i == len(s) || s[i] != '=' {
			return nil, bad("parameter " + name + " without a value")
		}
		i++
		var val string
		if i < len(s) && s[i] == '"' {
			i++
			var b strings.Builder
			for {
				if i == len(s) {
					return nil, bad("unterminated quoted string")
				}
				ch := s[i]
				i++
				if ch == '"' {
					break
				}
				if ch == '\\' {
					if i == len(s) {
						return nil, bad("unterminated quoted string")
					}
					ch = s[i]
					i++
				}
				b.WriteByte(ch)
			}
			val = b.String()
		} else {
			start := i
			for i < len(s) && !strings.ContainsRune(" \t\";,", rune(s[i])) {
				i++
			}
			if start == i {
				return nil, bad("parameter " + name + " with an empty value")
			}
			val = s[start:i]
		}
		hasPairs = true
		if strings.EqualFold(name, "for") {
			if hasFor {
				return nil, bad("for= twice in one element")
			}
			forVal, hasFor = val, true
		}
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i < len(s) && s[i] != ';' && s[i] != ',' {
			return nil, bad(fmt.Sprintf("unexpected %q at %d", s[i], i))
		}
	}
}

// isTokenChar reports whether ch is a tchar (RFC 9110, section 5.6.2).
func isTokenChar(ch byte) bool {
	switch {
	case 'a' <= ch && ch <= 'z', 'A' <= ch && ch <= 'Z', '0' <= ch && ch <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", ch) >= 0
}
