package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/queuethrottle/queuethrottle/internal/natsserver"
)

// embeddedNATS is the nats-server of a run without -nats: in this process,
// JetStream on, its store in a temporary directory. For restart-nats it
// can be shut down and started again on the same port and store, where
// the stream and the durable consumer (file storage) are found again. Its
// methods are safe for concurrent use.
type embeddedNATS struct {
	dir  string
	port int

	mu  sync.Mutex
	srv *server.Server // nil while down
}

// startEmbeddedNATS starts the server on a free loopback port. The caller
// must call close.
func startEmbeddedNATS() (*embeddedNATS, error) {
	dir, err := os.MkdirTemp("", "queuethrottle-worker-")
	if err != nil {
		return nil, err
	}
	srv, err := natsserver.Start(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded nats-server listens on %v, not TCP", srv.Addr())
	}
	return &embeddedNATS{dir: dir, port: addr.Port, srv: srv}, nil
}

// url is the client URL; it stays the same across restarts.
func (e *embeddedNATS) url() string { return "nats://127.0.0.1:" + strconv.Itoa(e.port) }

// shutdown stops the server, as a clean shutdown does: JetStream writes
// its state to the store first. Clients reconnect once it is back.
func (e *embeddedNATS) shutdown() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.srv = nil
	}
}

// restart starts the server again on its port and store, after shutdown,
// and returns once it accepts clients with JetStream on.
func (e *embeddedNATS) restart() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	var err error
	for range 3 { // the port may linger briefly
		var srv *server.Server
		if srv, err = e.startLocked(); err == nil {
			e.srv = srv
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("restart nats-server on port %d: %w", e.port, err)
}

func (e *embeddedNATS) startLocked() (*server.Server, error) {
	opts := natsserver.Options(e.dir)
	opts.Port = e.port
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	srv.Start()
	if !srv.ReadyForConnections(natsserver.ReadyTimeout) || !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("not ready with JetStream within %v", natsserver.ReadyTimeout)
	}
	return srv, nil
}

// close shuts the server down for good and removes its store.
func (e *embeddedNATS) close() {
	e.shutdown()
	os.RemoveAll(e.dir)
}
