package redistest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// Server is a redis-server process on a loopback port. Its methods are safe
// for concurrent use.
type Server struct {
	bin  string
	port int
	dir  string
	args []string // more arguments, after the common ones

	mu     sync.Mutex
	cmd    *exec.Cmd
	waited chan struct{} // closed when cmd has been waited for
	log    *syncBuffer
}

// Start starts a private server for t and stops it at t's cleanup. It skips
// t (or fails it under CI=true) when redis-server is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := newServer(lookBinary(t))
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.shutdown)
	return s
}

var shared struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// Shared returns the test binary's shared server, starting it on first use.
// It stays up until [Main] stops it or the process exits. Tests on it must
// use keys of their own and must not stop, restart or pause it.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := lookBinary(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = newServer(bin)
	}
	if shared.err != nil {
		t.Fatalf("redistest: shared server: %v", shared.err)
	}
	return shared.srv
}

// Main runs the tests and then stops the shared server, if one was started,
// before exiting with the tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	if shared.srv != nil {
		shared.srv.shutdown()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// lookBinary finds redis-server or skips t (fails it under CI=true).
func lookBinary(t testing.TB) string {
	t.Helper()
	return lookTool(t, "REDIS_SERVER", "redis-server")
}

// lookTool returns $env if set, else name's path on $PATH; when it is not
// there it skips t, or fails it when CI is "true".
func lookTool(t testing.TB, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		msg := fmt.Sprintf("redistest: %s not found on PATH (set %s or install it, e.g. apt-get install redis-server)", name, env)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

func newServer(bin string) (*Server, error) { return newServerArgs(bin, nil) }

// newServerArgs starts a server on a free port; extra, if not nil, returns
// more arguments for the port chosen (it is called again for each port
// tried).
func newServerArgs(bin string, extra func(port int) ([]string, error)) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		s.port = port
		if extra != nil {
			if s.args, lastErr = extra(port); lastErr != nil {
				continue
			}
		}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs the process on s.port and waits until it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("server on port %d is already running", s.port)
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--enable-debug-command", "local",
	}
	cmd := exec.Command(s.bin, append(args, s.args...)...)
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	waited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(waited)
	}()
	s.cmd, s.waited, s.log = cmd, waited, log

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-waited:
			s.cmd = nil
			return fmt.Errorf("redis-server on port %d exited at start: %s", s.port, strings.TrimSpace(log.String()))
		default:
		}
		if ping(s.addr()) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.killLocked()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v: %s", s.port, startTimeout, strings.TrimSpace(log.String()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ping sends PING on a fresh connection and expects +PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Addr returns the server's "127.0.0.1:port". The port stays the same
// across Restart.
func (s *Server) Addr() string { return s.addr() }

// Client returns a new client of the server, with ContextTimeoutEnabled so
// context deadlines bound every call, closed at t's cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  s.addr(),
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// FlushAll removes every key from the server.
func (s *Server) FlushAll(t testing.TB) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("redistest: FLUSHALL: %v", err)
	}
}

// Stop kills the server (SIGKILL, so a paused server stops too) and waits
// for it to exit. Stopping a stopped server does nothing; Restart starts it
// again. No data survives Stop.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

// shutdown stops the server for good and removes its directory.
func (s *Server) shutdown() {
	s.Stop()
	_ = os.RemoveAll(s.dir)
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill() // SIGKILL works on a stopped process too
	<-s.waited
	s.cmd = nil
}

// Restart stops the server if it runs and starts a fresh, empty one on the
// same port, returning when it answers PING. It returns an error if the
// server does not come back within a few seconds.
func (s *Server) Restart() error {
	s.Stop()
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	return fmt.Errorf("redistest: restart: %w", err)
}

// Pause stops the server process (SIGSTOP): connections stay open but
// nothing is answered, as with a hung server. Resume undoes it; Stop and
// Restart work on a paused server. It returns an error if the server is
// not running.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT). It returns an error if the
// server is not running.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("redistest: %v: server on port %d is not running", sig, s.port)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: %v: %w", sig, err)
	}
	return nil
}

// Log returns what the server has written to stdout and stderr since it
// was last started.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 {
		return len(p), nil // enough for a diagnosis
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StartArgs is Start with extra redis-server arguments, such as
// "--rename-command", "TIME", "" for a server whose scripts cannot call
// TIME.
func StartArgs(t testing.TB, args ...string) *Server {
	t.Helper()
	s, err := newServerArgs(lookBinary(t), func(int) ([]string, error) { return args, nil })
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.shutdown)
	return s
}

// ScriptCalls returns how many EVAL and EVALSHA calls the server of c has
// run since it started (INFO commandstats).
func ScriptCalls(t testing.TB, c *redis.Client) int {
	t.Helper()
	calls := CommandCalls(t, c)
	return calls["eval"] + calls["evalsha"]
}

// CommandCalls returns the calls of each command the server of c has run
// since it started or its last CONFIG RESETSTAT (INFO commandstats), by
// lower-case name ("zadd"; a subcommand as "config|resetstat").
func CommandCalls(t testing.TB, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		calls[strings.TrimPrefix(name, "cmdstat_")], err = strconv.Atoi(n)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
	}
	return calls
}

// CountArgv adds a hook to c that counts the EVALSHA calls it sends whose
// ARGV[i] (from 1) is value, and returns the count: a test's way to see
// which form of a script's arguments a limiter sent.
func CountArgv(c *redis.Client, i int, value string) *atomic.Int64 {
	n := new(atomic.Int64)
	c.AddHook(argvHook{n, i, value})
	return n
}

type argvHook struct {
	n     *atomic.Int64
	i     int
	value string
}

func (argvHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h argvHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA sha numkeys KEYS... ARGV...
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 2 {
			if k, err := strconv.Atoi(fmt.Sprint(args[2])); err == nil && len(args) > 2+k+h.i && fmt.Sprint(args[2+k+h.i]) == h.value {
				h.n.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}

func (argvHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
