package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is a private redis-server on a free loopback port, a short copy of
// the library's internal/redistest start logic (an internal package cannot
// be imported from this module).
type server struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

// startServer starts redis-server (or $REDIS_SERVER) without persistence and
// waits until it answers PING. The process is killed if this one dies.
func startServer() (*server, error) {
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	dir, err := os.MkdirTemp("", "qt-bench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lastErr = err
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start %s: %w (install redis-server or set REDIS_SERVER)", bin, err)
		}
		s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir}
		c := redis.NewClient(&redis.Options{Addr: s.addr})
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if lastErr = c.Ping(context.Background()).Err(); lastErr == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.Close()
		if lastErr == nil {
			return s, nil
		}
		s.stop()
		dir, _ = os.MkdirTemp("", "qt-bench-redis-")
	}
	return nil, fmt.Errorf("redis-server did not start: %w", lastErr)
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	os.RemoveAll(s.dir)
}

// client returns a client of the server. ContextTimeoutEnabled is set
// because bucket.NewHybrid requires it; it costs nothing with a context
// without deadline. Every contender shares the same client.
func (s *server) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr, ContextTimeoutEnabled: true})
}
