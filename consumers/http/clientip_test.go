package httpthrottle

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestClientKey(t *testing.T) {
	trusted := WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48"),
		netip.MustParsePrefix("::ffff:172.16.0.0/108"), netip.Prefix{})
	tests := []struct {
		name   string
		opts   []Option
		remote string
		hdr    []string // name, value pairs
		want   string
	}{
		{name: "IPv4", remote: "192.0.2.1:1234", want: "192.0.2.1"},
		{name: "bare IP", remote: "192.0.2.1", want: "192.0.2.1"},
		{name: "IPv6 normalized", remote: "[2001:DB8:0:0::1]:443", want: "2001:db8::1"},
		{name: "IPv4-mapped unmapped", remote: "[::ffff:192.0.2.1]:1234", want: "192.0.2.1"},
		{name: "zone dropped", remote: "[fe80::1%eth0]:80", want: "fe80::1"},
		{name: "XFF ignored without trusted proxies", remote: "192.0.2.1:1", hdr: []string{"X-Forwarded-For", "198.51.100.1"}, want: "192.0.2.1"},
		{name: "XFF ignored from an untrusted peer", opts: []Option{trusted}, remote: "192.0.2.1:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1"}, want: "192.0.2.1"},
		{name: "one trusted proxy", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1"}, want: "198.51.100.1"},
		{name: "rightmost untrusted wins", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "6.6.6.6, 198.51.100.1, 10.2.2.2,10.3.3.3"}, want: "198.51.100.1"},
		{name: "mapped peer matches an IPv4 prefix", opts: []Option{trusted}, remote: "[::ffff:10.0.0.1]:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1"}, want: "198.51.100.1"},
		{name: "mapped prefix matches an IPv4 hop", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1, 172.16.5.5"}, want: "198.51.100.1"},
		{name: "IPv6 hops with brackets and ports", opts: []Option{trusted}, remote: "[2001:db8:ffff::9]:1",
			hdr: []string{"X-Forwarded-For", "[2001:db8::7]:5555, [2001:db8:ffff::2]"}, want: "2001:db8::7"},
		{name: "hop with a port", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1:8080"}, want: "198.51.100.1"},
		{name: "zones in XFF make no new keys", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "fe80::1%abc"}, want: "fe80::1"},
		{name: "empty members skipped", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1, ,", "X-Forwarded-For", ""}, want: "198.51.100.1"},
		{name: "all trusted: the leftmost", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "10.9.9.9, 10.8.8.8"}, want: "10.9.9.9"},
		{name: "garbage ends the walk at the reporting proxy", opts: []Option{trusted}, remote: "10.0.0.1:1",
			hdr: []string{"X-Forwarded-For", "198.51.100.1, unknown, 10.8.8.8"}, want: "10.8.8.8"},
		{name: "no header: the proxy", opts: []Option{trusted}, remote: "10.0.0.1:1", want: "10.0.0.1"},
		{name: "other header named", opts: []Option{trusted, WithForwardedHeader("x-real-ip")}, remote: "10.0.0.1:1",
			hdr: []string{"X-Real-Ip", "198.51.100.3", "X-Forwarded-For", "198.51.100.4"}, want: "198.51.100.3"},
		{name: "Forwarded", opts: []Option{trusted, WithForwardedHeader("Forwarded")}, remote: "10.0.0.1:1",
			hdr: []string{"Forwarded", `for=198.51.100.9;proto=https, for="[2001:db8:ffff::5]:80"`, "X-Forwarded-For", "6.6.6.6"}, want: "198.51.100.9"},
		{name: "Forwarded obfuscated", opts: []Option{trusted, WithForwardedHeader("Forwarded")}, remote: "10.0.0.1:1",
			hdr: []string{"Forwarded", `for=198.51.100.9, for=_hidden, for=10.4.4.4`}, want: "10.4.4.4"},
		{name: "Forwarded element without for", opts: []Option{trusted, WithForwardedHeader("Forwarded")}, remote: "10.0.0.1:1",
			hdr: []string{"Forwarded", `for=198.51.100.9, proto=https;by=10.5.5.5`}, want: "10.0.0.1"},
		{name: "IPv6 prefix", opts: []Option{WithIPv6Prefix(64)}, remote: "[2001:db8:1:2:3:4:5:6]:1", want: "2001:db8:1:2::/64"},
		{name: "IPv6 prefix leaves IPv4", opts: []Option{WithIPv6Prefix(64)}, remote: "[::ffff:192.0.2.1]:1", want: "192.0.2.1"},
		{name: "IPv6 prefix out of range", opts: []Option{WithIPv6Prefix(128)}, remote: "[2001:db8::1]:1", want: "2001:db8::1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newConfig(tt.opts)
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for i := 0; i+1 < len(tt.hdr); i += 2 {
				r.Header.Add(tt.hdr[i], tt.hdr[i+1])
			}
			got, err := c.clientKey(r)
			if err != nil || got != tt.want {
				t.Errorf("clientKey = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestClientKeyErrors(t *testing.T) {
	c := newConfig([]Option{WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), WithForwardedHeader("Forwarded")})
	tests := []struct {
		name, remote, forwarded string
		is                      error
	}{
		{"unix socket", "@", "", ErrInternal},
		{"empty RemoteAddr", "", "", ErrInternal},
		{"malformed Forwarded", "10.0.0.1:1", `for="198.51.100.1`, throttle.ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			if tt.forwarded != "" {
				r.Header.Set("Forwarded", tt.forwarded)
			}
			if _, err := c.clientKey(r); !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want one matching %v", err, tt.is)
			}
		})
	}
}

func TestForwardedFor(t *testing.T) {
	tests := []struct {
		in   string
		want string // fmt.Sprint of the result, or "error"
	}{
		{`for=192.0.2.43`, `[192.0.2.43]`},
		{`For="[2001:db8:cafe::17]:4711"`, `[[2001:db8:cafe::17]:4711]`},
		{`for=192.0.2.60;proto=http;by=203.0.113.43`, `[192.0.2.60]`},
		{`for=192.0.2.43, for=198.51.100.17`, `[192.0.2.43 198.51.100.17]`},
		{`for=192.0.2.43,for="[2001:db8::1]" , for=unknown`, `[192.0.2.43 [2001:db8::1] unknown]`},
		{`proto=https;by=10.0.0.1`, `[unknown]`},
		{`for="_gazonk"`, `[_gazonk]`},
		{`for="a\"b\\c"`, `[a"b\c]`},
		{`for=192.0.2.1:8080`, `[192.0.2.1:8080]`},
		{`, ,for=192.0.2.1,;`, `[192.0.2.1]`},
		{``, `[]`},
		{`for="192.0.2.1, for=198.51.100.1`, `error`},
		{`for="192.0.2.1\`, `error`},
		{`for=1.1.1.1;for=2.2.2.2`, `error`},
		{`for`, `error`},
		{`for=`, `error`},
		{`=1.1.1.1`, `error`},
		{`for="1.1.1.1"x`, `error`},
		{`for=1.1.1.1 x=2`, `error`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := forwardedFor(tt.in)
			s := fmt.Sprint(got)
			if err != nil {
				s = "error"
				if !errors.Is(err, throttle.ErrInvalidKey) {
					t.Errorf("error %v does not wrap ErrInvalidKey", err)
				}
			}
			if s != tt.want {
				t.Errorf("forwardedFor(%q) = %s (%v), want %s", tt.in, s, err, tt.want)
			}
		})
	}
}

func TestSFString(t *testing.T) {
	for in, want := range map[string]string{
		"default":     `"default"`,
		`a "b" \c`:    `"a \"b\" \\c"`,
		"tab\there":   `"tab_here"`,
		"caf\u00e9":   `"caf__"`,
		"~ printable": `"~ printable"`,
	} {
		if got := sfString(in); got != want {
			t.Errorf("sfString(%q) = %s, want %s", in, got, want)
		}
	}
}
