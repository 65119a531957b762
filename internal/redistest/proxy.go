package redistest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy in front of a Server whose replies can be dropped:
// the commands still reach Redis, and Redis still runs them, but the
// client never sees what they did (a reply lost to a network fault or a
// timeout).
type Proxy struct {
	ln     net.Listener
	target string
	drop   atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

// NewProxy starts a proxy to s on a free loopback port, stopped when the
// test ends.
func NewProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: s.Addr()}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropReplies makes the proxy discard (drop true) or forward (false) what
// Redis sends back.
func (p *Proxy) DropReplies(drop bool) { p.drop.Store(drop) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		r, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, r)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(r, c); _ = r.Close() }()
		go func() { defer p.wg.Done(); p.replies(c, r); _ = c.Close() }()
	}
}

// replies copies from Redis to the client, dropping while p.drop is set.
func (p *Proxy) replies(c, r net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && !p.drop.Load() {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
