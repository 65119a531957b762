package natsthrottle

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/queuethrottle/queuethrottle/concurrency"
	"github.com/queuethrottle/queuethrottle/internal/natsserver"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// coreRecorder counts the messages a core handler ran and the give-ups it
// was told of.
type coreRecorder struct {
	mu      sync.Mutex
	handled map[string]int
	givenUp []*GiveUpError
	other   []error
}

func newCoreRecorder() *coreRecorder { return &coreRecorder{handled: map[string]int{}} }

func (r *coreRecorder) handle(m *nats.Msg) {
	r.mu.Lock()
	r.handled[string(m.Data)]++
	r.mu.Unlock()
	if m.Reply != "" {
		_ = m.Respond([]byte("ok"))
	}
}

func (r *coreRecorder) onError(_ *nats.Msg, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ge *GiveUpError
	if errors.As(err, &ge) {
		r.givenUp = append(r.givenUp, ge)
		return
	}
	r.other = append(r.other, err)
}

func (r *coreRecorder) counts() (handled, twice, givenUp int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.handled {
		handled++
		if n > 1 {
			twice++
		}
	}
	return handled, twice, len(r.givenUp)
}

// coreSub subscribes h (a Core's Handle) on subject of a fresh server and
// returns the connection.
func coreSub(t *testing.T, subject string, h nats.MsgHandler) *nats.Conn {
	t.Helper()
	s := natsserver.Run(t)
	nc, _ := natsserver.Connect(t, s)
	if _, err := nc.Subscribe(subject, h); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return nc
}

func newCore(t *testing.T, next nats.MsgHandler, g *throttle.Gate, opts ...CoreOption) *Core {
	t.Helper()
	c, err := NewCore(next, g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// TestCoreWaitsForSlots: 30 messages of one key at once at 10 per 300 ms,
// with reservations: 10 run at once, the others wait in process for their
// slots, every one handled exactly once, none given up, and the limiter's
// admissions hold the limit.
func TestCoreWaitsForSlots(t *testing.T) {
	r := throttle.Rate{Count: 10, Per: 300 * time.Millisecond}
	lim := newInstantsLimiter(t, r)
	g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := newCoreRecorder()
	c := newCore(t, rec.handle, g, WithCoreErrorHandler(rec.onError))
	nc := coreSub(t, "core.a", c.Handle)
	for i := range 30 {
		if err := nc.Publish("core.a", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "30 handled", func() bool { h, _, _ := rec.counts(); return h >= 30 })
	time.Sleep(100 * time.Millisecond)
	if h, twice, up := rec.counts(); h != 30 || twice != 0 || up != 0 || c.GivenUp() != 0 {
		t.Errorf("handled %d (twice %d), given up %d (%d counted); want 30, 0, 0", h, twice, up, c.GivenUp())
	}
	if n := maxInWindow(lim.admitted(), r.Per); n > 10 {
		t.Errorf("%d admissions within %v, want <= 10", n, r.Per)
	}
}

// TestCoreGivesUpAndAnswers: with WithCoreMaxWait(100ms), requests beyond
// it are answered at once with the services error headers (429, the
// reason, Retry-After); every request gets an answer, the give-ups are
// reported with subject and key and counted exactly.
func TestCoreGivesUpAndAnswers(t *testing.T) {
	g := newGate(t, throttle.Rate{Count: 5, Per: time.Second}, nil)
	rec := newCoreRecorder()
	c := newCore(t, rec.handle, g, WithCoreErrorHandler(rec.onError), WithCoreMaxWait(100*time.Millisecond))
	nc := coreSub(t, "core.req", c.Handle)
	const total = 20
	var mu sync.Mutex
	ok, limited := 0, 0
	var wg sync.WaitGroup
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := nc.Request("core.req", []byte(strconv.Itoa(i)), 3*time.Second)
			if err != nil {
				t.Errorf("request %d: no answer: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case resp.Header.Get(HeaderServiceErrorCode) == "429" && resp.Header.Get(HeaderRetryAfter) != "" && resp.Header.Get(HeaderServiceError) != "":
				limited++
			case string(resp.Data) == "ok":
				ok++
			default:
				t.Errorf("request %d: answer %q, headers %v", i, resp.Data, resp.Header)
			}
		}()
	}
	wg.Wait()
	h, twice, up := rec.counts()
	if ok != 5 || limited != total-5 || h != 5 || twice != 0 || up != total-5 || c.GivenUp() != int64(total-5) {
		t.Errorf("%d ok, %d answered 429; handled %d (twice %d), given up %d (%d counted); want 5, 15, 5, 0, 15", ok, limited, h, twice, up, c.GivenUp())
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, ge := range rec.givenUp {
		if ge.Subject != "core.req" || ge.Key != "core.req" || ge.Reason != "max wait" || !errors.Is(ge, throttle.ErrLimited) {
			t.Errorf("give-up %+v: want subject and key core.req, reason max wait, ErrLimited", ge)
		}
	}
}

// TestCoreMaxWaitingAndClose: at most WithCoreMaxWaiting messages of a key
// wait; the others are given up at once; Close gives up those waiting, and
// every message arriving after it, each reported.
func TestCoreMaxWaitingAndClose(t *testing.T) {
	g := newGate(t, throttle.Rate{Count: 1, Per: time.Minute}, nil)
	rec := newCoreRecorder()
	c, err := NewCore(rec.handle, g, WithCoreErrorHandler(rec.onError), WithCoreMaxWaiting(2), WithCoreMaxWait(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	nc := coreSub(t, "core.w", c.Handle)
	for i := range 10 {
		nc.Publish("core.w", []byte(strconv.Itoa(i)))
	}
	waitFor(t, 5*time.Second, "7 given up", func() bool { _, _, up := rec.counts(); return up >= 7 })
	if h, _, up := rec.counts(); h != 1 || up != 7 {
		t.Fatalf("handled %d, given up %d before Close; want 1 and 7 (2 waiting)", h, up)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	nc.Publish("core.w", []byte("late"))
	waitFor(t, 5*time.Second, "10 given up", func() bool { _, _, up := rec.counts(); return up >= 10 })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	closed := 0
	for _, ge := range rec.givenUp {
		if ge.Reason == "closed" {
			closed++
			if !errors.Is(ge, throttle.ErrClosed) {
				t.Errorf("closed give-up %v does not match ErrClosed", ge)
			}
		}
	}
	if closed != 3 {
		t.Errorf("%d given up as closed, want 3 (2 waiting, 1 after Close)", closed)
	}
}

// TestCoreSlowConsumer: a handler slower than its messages arrive fills
// the subscription's pending limits and NATS drops messages: the Core
// reports the drops (nats.ErrSlowConsumer) to the error handler.
func TestCoreSlowConsumer(t *testing.T) {
	g := newGate(t, throttle.PerSecond(100_000), nil)
	rec := newCoreRecorder()
	slow := func(m *nats.Msg) { time.Sleep(20 * time.Millisecond); rec.handle(m) }
	c := newCore(t, slow, g, WithCoreErrorHandler(rec.onError))
	s := natsserver.Run(t)
	nc, _ := natsserver.Connect(t, s, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	sub, err := nc.Subscribe("core.slow", c.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(5, 1<<20); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		nc.Publish("core.slow", []byte(strconv.Itoa(i)))
	}
	nc.Flush()
	waitFor(t, 10*time.Second, "a slow-consumer report", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, err := range rec.other {
			if errors.Is(err, nats.ErrSlowConsumer) {
				return true
			}
		}
		return false
	})
}

// TestNewCoreErrors: bad settings are refused, naming the field.
func TestNewCoreErrors(t *testing.T) {
	g := newGate(t, throttle.PerSecond(10), nil)
	h := func(*nats.Msg) {}
	for name, f := range map[string]func() error{
		"next":                func() error { _, err := NewCore(nil, g); return err },
		"gate":                func() error { _, err := NewCore(h, nil); return err },
		"WithCoreMaxWait":     func() error { _, err := NewCore(h, g, WithCoreMaxWait(-1)); return err },
		"WithCoreMaxWaiting":  func() error { _, err := NewCore(h, g, WithCoreMaxWaiting(-1)); return err },
		"WithCoreConcurrency": func() error { _, err := NewCore(h, g, WithCoreConcurrency(-1)); return err },
		"WithCoreInFlight": func() error {
			slots, err := concurrency.NewMemory(2)
			if err != nil {
				return err
			}
			_, err = NewCore(h, g, WithCoreInFlight(slots, 0))
			return err
		},
		"WithCoreMaxWaitingTotal": func() error {
			_, err := NewCore(h, g, WithCoreConcurrency(4), WithCoreMaxWaitingTotal(0))
			return err
		},
	} {
		var oe *throttle.OptionError
		if err := f(); !errors.As(err, &oe) || oe.Field != name {
			t.Errorf("%s: %v, want an OptionError naming it", name, err)
		}
	}
}

// TestCoreFloodGivesBackSlots: a flood of 2,000 messages on one key under
// reservations: those given up give back the slots they reserved, so once
// the flood is over the key admits again within a window, not after the
// horizon the flood booked; every message is handled or given up, counted
// exactly.
func TestCoreFloodGivesBackSlots(t *testing.T) {
	lim, err := window.NewMemory(throttle.Rate{Count: 20, Per: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g, err := throttle.NewGate(lim, throttle.WithReservations(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rec := newCoreRecorder()
	c := newCore(t, rec.handle, g, WithCoreErrorHandler(rec.onError), WithCoreMaxWait(300*time.Millisecond))
	nc := coreSub(t, "core.flood", c.Handle)
	const total = 2000
	for i := range total {
		nc.Publish("core.flood", []byte(strconv.Itoa(i)))
	}
	nc.Flush()
	waitFor(t, 10*time.Second, "every message handled or given up", func() bool { h, _, up := rec.counts(); return h+up >= total })
	h, twice, up := rec.counts()
	if h+up != total || twice != 0 || int64(up) != c.GivenUp() {
		t.Fatalf("handled %d (twice %d), given up %d (%d counted); want %d in all", h, twice, up, c.GivenUp(), total)
	}
	time.Sleep(600 * time.Millisecond) // the last admissions leave the window
	nc.Publish("core.flood", []byte("after"))
	waitFor(t, 2*time.Second, "the message after the flood handled", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.handled["after"] == 1
	})
}
