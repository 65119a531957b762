package redistest

import (
	"context"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()

	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Stop succeeded")
	}
	s.Stop() // idempotent

	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Fatalf("Addr after Restart = %s, want %s", s.Addr(), addr)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k after Restart = %d, %v; want 0 (no persistence)", n, err)
	}
}

func TestPauseResume(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING to a paused server succeeded")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := c.Ping(ctx2).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
	// Stop works on a paused server.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := s.Pause(); err == nil {
		t.Fatal("Pause of a stopped server succeeded")
	}
}

func TestSharedAndFlushAll(t *testing.T) {
	s1, s2 := Shared(t), Shared(t)
	if s1 != s2 {
		t.Fatal("Shared returned two servers")
	}
	c := s1.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "redistest:flush", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s1.FlushAll(t)
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after FlushAll = %d, %v", n, err)
	}
	if err := c.Do(ctx, "DEBUG", "SLEEP", "0").Err(); err != nil {
		t.Fatalf("DEBUG is not enabled: %v", err)
	}
}

func TestMissingBinarySkips(t *testing.T) {
	skipped := false
	t.Run("no redis-server", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		t.Setenv("REDIS_SERVER", "")
		t.Setenv("CI", "")
		defer func() { skipped = t.Skipped() }()
		Start(t)
	})
	if !skipped {
		t.Fatal("Start without redis-server did not skip")
	}
}
