package redistest

import (
	"log"
	"net"
	"os/exec"
	"time"
)

// ForExample starts a redis-server from PATH on a free loopback port,
// without persistence, for an Example function (which has no testing.T),
// and returns its address and a function that stops it. It exits the
// example if there is no redis-server or it does not come up within 5 s.
func ForExample() (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		log.Fatalf("this example needs redis-server on PATH: %v", err)
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr, stop
		}
		if time.Now().After(deadline) {
			stop()
			log.Fatalf("redis-server on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
