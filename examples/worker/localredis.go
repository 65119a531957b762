package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisLocal is the value of -redis that makes the worker start its own
// redis-server.
const redisLocal = "local"

// localRedisStartTimeout bounds how long redis-server may take to answer
// PING, at start and after a restart (which replays the append-only file).
const localRedisStartTimeout = 10 * time.Second

// localRedis is the redis-server of -redis local: a process of redis-server
// from PATH on a free loopback port, with its data in a temporary
// directory. For a run that kills it (kill-redis), persistence is on
// (appendonly yes, appendfsync always: every write is in the append-only
// file, fsynced, before Redis replies), so a SIGKILL and a restart on the
// same port keep asynq's queues and the limiters' keys: what Redis
// acknowledged survives. Otherwise it runs without persistence: an fsync
// per write would slow every decision (a quiet tenant beside a flood got
// 29 NAKs and a p99 wait of 2.6 s with it, 0 and 30 ms without). RDB
// snapshots are off. Its methods are safe for concurrent use.
type localRedis struct {
	bin, dir string
	port     int
	version  string
	durable  bool // with persistence (see localRedis)

	mu     sync.Mutex
	cmd    *exec.Cmd
	waited chan struct{} // closed when cmd has been waited for
	log    *boundedBuffer
}

// The persistence settings of a localRedis that a fault kills, and of one
// that lives the whole run.
var (
	durableRedisArgs = []string{"--save", "", "--appendonly", "yes", "--appendfsync", "always"}
	memoryRedisArgs  = []string{"--save", "", "--appendonly", "no"}
)

// startLocalRedis starts redis-server from PATH on a free loopback port
// and returns once it answers PING, with persistence if durable. The
// caller must call stop.
func startLocalRedis(durable bool) (*localRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("-redis local: redis-server not found on PATH (install it, e.g. apt-get install redis-server, or pass -redis URL): %w", err)
	}
	dir, err := os.MkdirTemp("", "queuethrottle-worker-redis-")
	if err != nil {
		return nil, fmt.Errorf("-redis local: %w", err)
	}
	r := &localRedis{bin: bin, dir: dir, version: redisVersion(bin), durable: durable}
	for range 5 { // a free port may be taken before redis-server binds it
		if r.port, err = freeLoopbackPort(); err != nil {
			continue
		}
		if err = r.start(); err == nil {
			return r, nil
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("-redis local: %w", err)
}

// redisVersion returns the version redis-server --version reports, or
// "(version unknown)".
func redisVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err == nil {
		for _, f := range strings.Fields(string(out)) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				return v
			}
		}
	}
	return "(version unknown)"
}

// freeLoopbackPort returns a loopback TCP port that was free a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// addr is "127.0.0.1:port"; it stays the same across restarts.
func (r *localRedis) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// url is the Redis URL of database 0.
func (r *localRedis) url() string { return "redis://" + r.addr() + "/0" }

// describe is the line the run prints about the server.
func (r *localRedis) describe() string {
	if !r.durable {
		return fmt.Sprintf("started redis-server %s on %s (pid %d) without persistence", r.version, r.addr(), r.pid())
	}
	return fmt.Sprintf("started redis-server %s on %s (pid %d) with persistence (%s) in %s: asynq's queues and the limiters' keys survive kill-redis",
		r.version, r.addr(), r.pid(), strings.Join(durableRedisArgs[2:], " "), r.dir)
}

// persistence returns the server's persistence settings.
func (r *localRedis) persistence() []string {
	if r.durable {
		return durableRedisArgs
	}
	return memoryRedisArgs
}

// pid is the process id of the running server, or 0.
func (r *localRedis) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// start runs redis-server on r.port and waits until it answers PING.
func (r *localRedis) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return fmt.Errorf("redis-server on port %d is already running", r.port)
	}
	args := append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir}, r.persistence()...)
	cmd := exec.Command(r.bin, args...)
	log := &boundedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr() // dies with this process
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", r.bin, err)
	}
	waited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(waited)
	}()
	r.cmd, r.waited, r.log = cmd, waited, log
	for deadline := time.Now().Add(localRedisStartTimeout); ; {
		select {
		case <-waited:
			r.cmd = nil
			return fmt.Errorf("redis-server on port %d exited at start: %s", r.port, strings.TrimSpace(log.String()))
		default:
		}
		err := pingRedis(r.addr())
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			r.killLocked()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v (%v): %s", r.port, localRedisStartTimeout, err, strings.TrimSpace(log.String()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pingRedis sends PING on a fresh connection and expects +PONG (a server
// still loading its append-only file answers -LOADING).
func pingRedis(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
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

// kill sends SIGKILL (which also ends a paused server) and waits for the
// process to exit. The data directory stays for restart.
func (r *localRedis) kill() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return errors.New("redis-server is not running")
	}
	r.killLocked()
	return nil
}

func (r *localRedis) killLocked() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	<-r.waited
	r.cmd = nil
}

// restart starts the server again on the same port, from its append-only
// file, and returns once it answers PING.
func (r *localRedis) restart() error {
	var err error
	for range 3 {
		if err = r.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	return fmt.Errorf("restart redis-server on port %d: %w", r.port, err)
}

// wipe removes the data of a stopped server (its append-only files), so
// that restart starts it empty.
func (r *localRedis) wipe() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return errors.New("redis-server is running: kill it before wiping its data")
	}
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(r.dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// flushAll runs FLUSHALL on the server.
func (r *localRedis) flushAll(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: r.addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("FLUSHALL on %s: %w", r.addr(), err)
	}
	return nil
}

// pause stops the process (SIGSTOP): connections stay open and nothing is
// answered, as with a hung server. resume undoes it.
func (r *localRedis) pause() error { return r.signal(pauseSignal) }

// resume continues a paused server (SIGCONT).
func (r *localRedis) resume() error { return r.signal(resumeSignal) }

func (r *localRedis) signal(sig os.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return fmt.Errorf("%v: redis-server is not running", sig)
	}
	return r.cmd.Process.Signal(sig)
}

// stop kills the server for good and removes its directory.
func (r *localRedis) stop() {
	r.mu.Lock()
	r.killLocked()
	r.mu.Unlock()
	os.RemoveAll(r.dir)
}

// boundedBuffer keeps the first MiB written to it, for an error message.
// It is safe for concurrent use.
type boundedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() < 1<<20 {
		b.buf.Write(p)
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
