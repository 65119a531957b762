package window

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestDroppedRepliesChargeOnce puts a proxy that drops replies between a
// worker's limiter and Redis: each of its AllowID calls times out, but
// Redis applies it. Presented again once replies flow (a redelivery, a
// retry, here by another worker), every id is admitted on the decision
// Redis already made: nothing is charged twice, so the limit still has
// room for exactly what was never charged.
func TestDroppedRepliesChargeOnce(t *testing.T) {
	const limit, lost = 10, 6
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv)
	r := throttle.Rate{Count: limit, Per: time.Minute}
	prefix := freshPrefix()
	ctx := context.Background()
	for i := range lost {
		// A worker whose connection is open before its replies are lost
		// (go-redis retires every pooled connection after a timeout, and a
		// new one would wait for the reply to its handshake).
		client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		l, err := NewRedis(client, r, WithPrefix(prefix), WithTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := patient(t, client, l).Peek(ctx, "k", 1); err != nil { // connect, load the script
			t.Fatal(err)
		}
		proxy.DropReplies(true)
		_, err = l.AllowID(ctx, "k", 1, fmt.Sprint("job-", i), time.Minute)
		proxy.DropReplies(false)
		_ = client.Close()
		if err == nil {
			t.Fatal("AllowID with replies dropped succeeded, want a timeout")
		}
	}
	direct := srv.Client(t)
	l := newTestRedis(t, direct, r, WithPrefix(prefix))
	if n := direct.ZCard(ctx, l.key("k")).Val(); n != lost {
		t.Fatalf("Redis holds %d units after %d lost replies, want %d (each applied once)", n, lost, lost)
	}
	for i := range lost {
		d, err := l.AllowID(ctx, "k", 1, fmt.Sprint("job-", i), time.Minute)
		if err != nil || !d.Allowed {
			t.Fatalf("job-%d again: %+v, %v; want admitted on its applied decision", i, d, err)
		}
	}
	admitted := 0
	for i := lost; i < lost+limit; i++ {
		d, err := l.AllowID(ctx, "k", 1, fmt.Sprint("job-", i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != limit-lost {
		t.Fatalf("%d new ids admitted after the lost replies, want %d: a lost reply was charged twice", admitted, limit-lost)
	}
}

// TestStalledRedisAppliesNothingLate: a decision whose caller gave up
// long before a stalled Redis ran it (a pause beyond WithTimeout +
// deadline.LateSlack) applies nothing when Redis resumes, so the redelivery is
// charged at the instant its handler really starts, not admitted free on
// an admission counted seconds earlier (which let the worker run a
// tenant's handlers over its limit after a pause).
func TestStalledRedisAppliesNothingLate(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	l := newTestRedis(t, client, throttle.Rate{Count: 2, Per: time.Minute}, WithTimeout(100*time.Millisecond))
	ctx := context.Background()
	if _, err := patient(t, client, l).AllowID(ctx, "k", 1, "warm", 0); err != nil { // connect, load the script
		t.Fatal(err)
	}
	direct := srv.Client(t)
	scripts := redistest.ScriptCalls(t, direct)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	_, err := l.AllowID(ctx, "k", 1, "m", time.Minute)
	time.Sleep(300 * time.Millisecond) // the deadline passes while Redis is stopped
	if rerr := srv.Resume(); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("AllowID while Redis is stopped succeeded, want a timeout")
	}
	for deadline := time.Now().Add(5 * time.Second); redistest.ScriptCalls(t, direct) < scripts+1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stalled call never ran")
		}
	}
	if direct.ZScore(ctx, l.key("k"), "A1:m").Err() == nil {
		t.Fatal("the stalled call admitted m after its caller's deadline")
	}
	d, err := l.AllowID(ctx, "k", 1, "m", time.Minute)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("m again: %+v, %v; want admitted now, charged once (Remaining 0)", d, err)
	}
}
