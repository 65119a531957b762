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
