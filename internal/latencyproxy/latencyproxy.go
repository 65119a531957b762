// Package latencyproxy runs a Toxiproxy (github.com/Shopify/toxiproxy) in
// process, in front of a TCP server, that delays everything each way by a
// latency: a store far away, or a slow network. The worker's
// -redis-latency and the tests' slow-store cases use it.
package latencyproxy

import (
	"fmt"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a running latency proxy.
type Proxy struct {
	proxy *toxiproxy.Proxy
}

// Start starts a proxy to addr (host:port) on a free loopback port that
// delays each way by each (> 0, whole milliseconds: a round trip through
// it takes 2 x each more). Stop it with Stop; it leaves addr's server
// alone.
func Start(addr string, each time.Duration) (*Proxy, error) {
	if each < time.Millisecond {
		return nil, fmt.Errorf("latency proxy: the latency each way must be at least 1ms, got %v", each)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "latency", "127.0.0.1:0", addr)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("latency proxy: %w", err)
	}
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`,
			stream, stream, each.Milliseconds())
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			p.Stop()
			return nil, fmt.Errorf("latency proxy: %w", err)
		}
	}
	return &Proxy{proxy: p}, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// Stop closes the proxy and every connection through it.
func (p *Proxy) Stop() { p.proxy.Stop() }
