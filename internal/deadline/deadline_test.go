package deadline

import (
	"context"
	"testing"
	"time"
)

func TestBound(t *testing.T) {
	ctx, cancel := Bound(context.Background(), 50*time.Millisecond)
	defer cancel()
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) > 50*time.Millisecond {
		t.Fatalf("deadline %v, %v: want within 50ms", dl, ok)
	}

	sooner, cancelSooner := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelSooner()
	got, cancel2 := Bound(sooner, time.Second)
	defer cancel2()
	if got != sooner {
		t.Fatal("a sooner caller deadline must be kept as is")
	}
}

func TestShared(t *testing.T) {
	const d = 160 * time.Millisecond
	s := NewShared(d)
	before := time.Now()
	a, _ := s.Bound(context.Background())
	b, _ := s.Bound(context.TODO())
	after := time.Now()
	if a != b {
		t.Fatal("two background calls started together must share one context")
	}
	dl, ok := a.Deadline()
	if !ok || dl.Before(before.Add(d)) || dl.After(after.Add(d)) {
		t.Fatalf("deadline %v after the call, %v: want %v", dl.Sub(before), ok, d)
	}
	time.Sleep(d/16 + time.Millisecond)
	if c, _ := s.Bound(context.Background()); c == a {
		t.Fatal("a call started d/16 later must not share the older context")
	}
	type key struct{}
	own := context.WithValue(context.Background(), key{}, 1)
	c, cancel := s.Bound(own)
	defer cancel()
	if c.Value(key{}) != 1 {
		t.Fatal("a caller's context must keep its values")
	}
}
