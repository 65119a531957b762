package deadline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestRoundTrip(t *testing.T) {
	r := NewRoundTrip(100 * time.Millisecond)
	if g := r.Grace(); g != 200*time.Millisecond {
		t.Fatalf("grace before any reply = %v, want 2 x the timeout", g)
	}
	// Before any reply, a caller's deadline sooner than the grace still
	// leaves the script until that deadline.
	soon := time.Now().Add(50 * time.Millisecond)
	if at := r.Expiry(soon); at != soon.UnixMicro() {
		t.Fatalf("expiry before any reply %d, want the deadline %d", at, soon.UnixMicro())
	}
	// A reply after 10 ms whose server clock is 5 s ahead of this one.
	start := time.Now().Add(-10 * time.Millisecond)
	server := start.Add(5*time.Millisecond + 5*time.Second).UnixMicro()
	if err := r.Done(start, server, nil); err != nil {
		t.Fatal(err)
	}
	if rtt := r.Estimate(); rtt < 10*time.Millisecond || rtt > 100*time.Millisecond {
		t.Fatalf("estimate %v after a 10 ms round trip", rtt)
	}
	if off := r.Offset(); off < 5*time.Second-10*time.Millisecond || off > 5*time.Second+10*time.Millisecond {
		t.Fatalf("offset %v, want about 5s", off)
	}
	ctx, cancel := r.Bound(context.Background())
	defer cancel()
	dl, _ := ctx.Deadline()
	at := r.Expiry(dl)
	// The script must run by the timeout, in the server's clock.
	want := dl.Add(r.Offset() - r.Grace()).UnixMicro()
	if at != want || time.Until(dl) > 100*time.Millisecond+r.Grace() {
		t.Fatalf("expiry %d, want %d; deadline in %v", at, want, time.Until(dl))
	}

	// Timeouts longer than the estimate raise it; past the timeout, the
	// error says so.
	var err error
	for range 40 {
		err = r.Done(time.Now().Add(-300*time.Millisecond), -1, context.DeadlineExceeded)
	}
	var slow *throttle.SlowStoreError
	if !errors.As(err, &slow) || !errors.Is(err, context.DeadlineExceeded) || slow.Timeout != 100*time.Millisecond {
		t.Fatalf("error %v, want a *throttle.SlowStoreError wrapping the deadline", err)
	}
	if g := r.Grace(); g != 200*time.Millisecond {
		t.Fatalf("grace %v under a 300 ms round trip, want capped at 2 x the timeout", g)
	}
	if err := r.Explain(errors.New("connection refused")); errors.As(err, &slow) {
		t.Fatal("an error other than a timeout explained as slow")
	}
}
