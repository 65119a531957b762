// Package natsserver starts a nats-server with JetStream inside the current
// process, for tests and the example worker. The server listens on a free
// loopback port and keeps its JetStream store in a directory the caller
// chooses (a t.TempDir() in tests).
package natsserver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadyTimeout is how long Start waits for the server to accept clients.
const ReadyTimeout = 10 * time.Second

// Options returns the server options Start uses: JetStream on, host
// 127.0.0.1, a random free port (-1), the store in storeDir, no logging and
// no signal handlers.
func Options(storeDir string) *server.Options {
	return &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
	}
}

// Start starts an embedded nats-server with JetStream whose store lives in
// storeDir, and waits up to ReadyTimeout until it accepts connections. The
// caller owns the server: call Shutdown and then WaitForShutdown when done.
// The client URL is s.ClientURL(). storeDir must not be empty.
func Start(storeDir string) (*server.Server, error) {
	if storeDir == "" {
		return nil, errors.New("natsserver: storeDir must not be empty")
	}
	s, err := server.NewServer(Options(storeDir))
	if err != nil {
		return nil, fmt.Errorf("natsserver: new server: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(ReadyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("natsserver: server not ready for connections after %v", ReadyTimeout)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, errors.New("natsserver: JetStream is not enabled")
	}
	return s, nil
}

// Run starts an embedded nats-server with JetStream for the test, with its
// store in t.TempDir(). The server is shut down, and waited for, in
// t.Cleanup. Run fails the test if the server does not start.
func Run(t testing.TB) *server.Server {
	t.Helper()
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect connects to s and returns the connection and a JetStream context
// on it. The connection is closed in t.Cleanup (which runs before the
// server's shutdown registered by Run, cleanups being last in, first out).
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("natsserver: connect to %s: %v", s.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natsserver: jetstream: %v", err)
	}
	return nc, js
}

// Stream creates (or updates) a stream named name on subjects, in file
// storage, and fails the test on error.
func Stream(t testing.TB, js jetstream.JetStream, name string, subjects ...string) jetstream.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects})
	if err != nil {
		t.Fatalf("natsserver: create stream %s: %v", name, err)
	}
	return st
}
