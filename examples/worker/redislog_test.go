package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRedisLogThins: a flood of go-redis lines prints one line per
// interval, and the next one shown says how many were left out.
func TestRedisLogThins(t *testing.T) {
	var out strings.Builder
	l := newRedisLog(&out, 50*time.Millisecond)
	ctx := context.Background()
	for i := range 100 {
		l.Printf(ctx, "dial %d failed", i)
	}
	time.Sleep(60 * time.Millisecond)
	l.Printf(ctx, "dial %d failed", 100)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines for 101 calls over two intervals, want 2:\n%s", len(lines), out.String())
	}
	if !strings.Contains(lines[0], "dial 0 failed") || !strings.Contains(lines[1], "dial 100 failed (and 99 more") {
		t.Fatalf("lines:\n%s", out.String())
	}
}
