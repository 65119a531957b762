package natsthrottle

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/queuethrottle/queuethrottle/internal/fair"
	"github.com/queuethrottle/queuethrottle/internal/uniqueid"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Core NATS has no NAK and no redelivery: a message the limit refuses now
// waits in process for its slot, or is given up, and a give-up is always
// reported. These are the bounds of the wait.
const (
	// DefaultCoreMaxWait is how long a message may wait in process from
	// its arrival (WithCoreMaxWait).
	DefaultCoreMaxWait = 10 * time.Second
	// DefaultCoreMaxWaiting is how many messages of one key may wait at
	// once for their slot (WithCoreMaxWaiting).
	DefaultCoreMaxWaiting = 1000
	// DefaultCoreMaxWaitingTotal is how many messages may wait in process
	// at once over every key (WithCoreMaxWaitingTotal).
	DefaultCoreMaxWaitingTotal = 10_000
)

// Headers of the reply to a request the Core gave up, after the NATS
// services convention (micro.ErrorCodeHeader, micro.ErrorHeader), and the
// wait the limit asked for.
const (
	HeaderServiceErrorCode = "Nats-Service-Error-Code" // "429"
	HeaderServiceError     = "Nats-Service-Error"      // what GiveUpError says
	HeaderRetryAfter       = "Retry-After"             // whole seconds, rounded up
	HeaderRetryAfterMs     = "Retry-After-Ms"          // milliseconds
)

// DispositionGivenUp is the disposition (throttle.DispositionsMetric) of a
// core NATS message the Core gave up.
const DispositionGivenUp = "given_up"

// GiveUpError reports a core NATS message that the Core gave up: it was not
// handled, and core NATS will not deliver it again. It matches
// throttle.ErrLimited with errors.Is when the limit refused it.
type GiveUpError struct {
	Subject, Key string
	// Reason is why: "max wait" (its slot lay beyond WithCoreMaxWait of
	// its arrival), "max waiting" (WithCoreMaxWaiting of its key were
	// waiting), "closed" (Close, or after it), or "invalid" (a key or
	// cost error, or a request the Gate refuses as a usage error, in Err).
	Reason string
	// RetryAfter is the limit's wait when it refused the message.
	RetryAfter time.Duration
	Err        error
}

func (e *GiveUpError) Error() string {
	s := fmt.Sprintf("natsthrottle: gave up a message on %s (key %q): %s", e.Subject, e.Key, e.Reason)
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(", the limit asked to wait %v", e.RetryAfter)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the decision's error, or throttle.ErrLimited when the
// limit refused the message.
func (e *GiveUpError) Unwrap() error {
	if e.Err != nil {
		return e.Err
	}
	if e.Reason == "closed" {
		return throttle.ErrClosed
	}
	return throttle.ErrLimited
}

// Core gates a core NATS message handler (a plain subscription, a queue
// group, a request-reply service) with a Gate: every message is decided by
// its key and cost, with an id of its own, before the handler runs.
//
//   - Admitted: the handler runs, on the subscription's goroutine (with
//     WithCoreConcurrency, on the message's own goroutine once one of the
//     handlers is its, by fair shares among keys).
//   - Refused: the message waits in process, on a goroutine of its own, for
//     the limit's RetryAfter (its reserved slot, with
//     throttle.WithReservations), and is decided again, until admitted;
//     the handler then runs on that goroutine. So the handler must be safe
//     for concurrent use.
//   - Given up, since core NATS cannot deliver it again: when its slot lies
//     beyond WithCoreMaxWait of its arrival, when WithCoreMaxWaiting of its
//     key already wait, on Close, or when it can never be admitted. A
//     request (a message with a reply subject) gets an error reply at once,
//     with the Nats-Service-Error-Code 429 (400 when invalid),
//     Nats-Service-Error, Retry-After and Retry-After-Ms headers. Every
//     give-up goes to the error handler, the logger and
//     throttle.DispositionsMetric (disposition "given_up"), and is counted
//     in GivenUp: nothing is dropped silently. What the message held in
//     the limit (its reserved slot) is given back (Gate.Release).
//
// A message waiting here counts against the subscription's pending limits
// only while the callback has not returned, which it does at once; a
// handler slower than the messages arrive fills them, and NATS then drops
// messages (a slow consumer). The Core reports the drops it sees (the
// subscription's Dropped count, looked at every 100 ms as messages come).
type Core struct {
	next nats.MsgHandler
	gate *throttle.Gate
	cfg  coreConfig

	ids    *uniqueid.Source // every message an id of its own
	sched  *fair.Scheduler  // the fair shares of the WithCoreConcurrency handlers; nil without, or WithCoreFair(false)
	tokens chan struct{}    // WithCoreConcurrency with WithCoreFair(false): one per free handler
	endsMu sync.Mutex
	ends   chan struct{} // closed when a handler ends, with tokens (see handlerEnds)

	mu         sync.Mutex
	waiting    map[string]int // per key: messages waiting for their slot
	inProcess  int            // messages in process that have not started
	closed     bool
	dropped    map[*nats.Subscription]int
	watchedAt  atomic.Int64 // ns (time.Now().UnixNano()): the last look at the drops
	watchLater atomic.Bool  // a look at the drops is due when watchEvery has passed
	stop       chan struct{}
	wg         sync.WaitGroup
	givenUp    atomic.Int64
}

// NewCore returns a Core running next for the messages g admits. Errors
// wrap throttle.ErrInvalidOption and name the field.
func NewCore(next nats.MsgHandler, g *throttle.Gate, opts ...CoreOption) (*Core, error) {
	cfg := coreConfig{
		key:        func(m *nats.Msg) (string, error) { return m.Subject, nil },
		cost:       func(*nats.Msg) (int, error) { return 1, nil },
		maxWait:    DefaultCoreMaxWait,
		maxWaiting: DefaultCoreMaxWaiting,
		maxTotal:   DefaultCoreMaxWaitingTotal,
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case next == nil:
		return nil, &throttle.OptionError{Field: "next", Reason: "must not be nil"}
	case g == nil:
		return nil, &throttle.OptionError{Field: "gate", Reason: "must not be nil"}
	case cfg.key == nil || cfg.cost == nil:
		return nil, &throttle.OptionError{Field: "WithCoreKeyFunc", Reason: "key and cost functions must not be nil"}
	case cfg.maxWait < 0:
		return nil, &throttle.OptionError{Field: "WithCoreMaxWait", Reason: fmt.Sprintf("must be >= 0, got %v", cfg.maxWait)}
	case cfg.maxWaiting < 0:
		return nil, &throttle.OptionError{Field: "WithCoreMaxWaiting", Reason: fmt.Sprintf("must be >= 0, got %d", cfg.maxWaiting)}
	case cfg.maxTotal < 0 || cfg.maxTotal == 0 && cfg.handlers > 0:
		return nil, &throttle.OptionError{Field: "WithCoreMaxWaitingTotal", Reason: fmt.Sprintf("must be >= 0 (>= 1 with WithCoreConcurrency, where every message waits for a handler in process), got %d", cfg.maxTotal)}
	case cfg.handlers < 0:
		return nil, &throttle.OptionError{Field: "WithCoreConcurrency", Reason: fmt.Sprintf("must be >= 1 (or 0: none), got %d", cfg.handlers)}
	case cfg.inFlight != nil && cfg.lease <= 0:
		return nil, &throttle.OptionError{Field: "WithCoreInFlight", Reason: fmt.Sprintf("the lease must be > 0, got %v", cfg.lease)}
	}
	ids, err := uniqueid.New("core:")
	if err != nil {
		return nil, err
	}
	c := &Core{next: next, gate: g, cfg: cfg, ids: ids,
		waiting: map[string]int{}, dropped: map[*nats.Subscription]int{}, stop: make(chan struct{})}
	switch {
	case cfg.handlers == 0:
	case cfg.noFair:
		c.tokens = make(chan struct{}, cfg.handlers)
		for range cfg.handlers {
			c.tokens <- struct{}{}
		}
	default:
		// Waiting is bounded here (WithCoreMaxWaitingTotal), so the
		// scheduler need not trim its queue across keys.
		if c.sched, err = fair.New(fair.Config{Handlers: cfg.handlers, Weight: cfg.weights, MaxQueued: cfg.maxTotal}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Waiting returns how many messages wait in process right now, for their
// slot or (WithCoreConcurrency) a handler: at most WithCoreMaxWaitingTotal.
func (c *Core) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inProcess
}

// GivenUp returns how many messages the Core gave up.
func (c *Core) GivenUp() int64 { return c.givenUp.Load() }

// Handle decides m and runs the handler, now or after a wait, or gives it
// up (see Core). It is a nats.MsgHandler.
func (c *Core) Handle(m *nats.Msg) {
	c.watch(m)
	key, err := c.cfg.key(m)
	if err != nil {
		c.giveUp(m, key, 0, "", "invalid", 0, err)
		return
	}
	cost, err := c.cfg.cost(m)
	if err != nil {
		c.giveUp(m, key, 0, "", "invalid", 0, err)
		return
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		c.giveUp(m, key, cost, "", "closed", 0, nil)
		return
	}
	deadline := time.Now().Add(c.cfg.maxWait)
	id := c.ids.Next()
	if c.cfg.handlers > 0 {
		if c.enter(m, key, cost, "", 0, true, false) {
			go c.scheduled(m, key, cost, id, deadline)
		}
		return
	}
	retry, waits := c.settle(m, key, cost, id, deadline)
	if waits && c.enter(m, key, cost, id, retry, true, true) {
		go c.waitOut(m, key, cost, id, deadline, retry)
	}
}

// enter counts m as waiting in process: with goroutine, as a message on a
// goroutine the caller starts (within WithCoreMaxWaitingTotal, and only
// while the Core is open), and with forSlot, among its key's messages
// waiting for their slot or share (within WithCoreMaxWaiting). Beyond a
// bound m is given up instead (id is "" when m was not decided yet,
// retry the limit's wait when it was refused). exit ends what it counted.
func (c *Core) enter(m *nats.Msg, key string, cost int, id string, retry time.Duration, goroutine, forSlot bool) bool {
	c.mu.Lock()
	reason := ""
	switch {
	case goroutine && c.closed:
		reason = "closed"
	case goroutine && c.inProcess >= c.cfg.maxTotal || forSlot && c.waiting[key] >= c.cfg.maxWaiting:
		reason = "max waiting"
	}
	if reason != "" {
		c.mu.Unlock()
		c.giveUp(m, key, cost, id, reason, retry, nil)
		return false
	}
	if goroutine {
		c.inProcess++
		c.wg.Add(1)
	}
	if forSlot {
		c.waiting[key]++
	}
	c.mu.Unlock()
	return true
}

// exit ends what enter counted: goroutine, once m starts or is given up
// (its goroutine no longer waits), and forSlot.
func (c *Core) exit(key string, goroutine, forSlot bool) {
	c.mu.Lock()
	if goroutine {
		c.inProcess--
	}
	if forSlot {
		if c.waiting[key]--; c.waiting[key] <= 0 {
			delete(c.waiting, key)
		}
	}
	c.mu.Unlock()
}

// settle decides m by id and acts on it, unless it is to wait: it runs the
// handler when admitted, and gives m up when it can never be admitted or
// its slot lies beyond deadline. Otherwise it returns the wait.
func (c *Core) settle(m *nats.Msg, key string, cost int, id string, deadline time.Time) (retry time.Duration, waits bool) {
	ctx := context.Background()
	slot, ok, retry := c.acquire(m, key, id)
	if !ok {
		return c.wait(m, key, cost, id, deadline, retry)
	}
	d, err := c.gate.AdmitID(ctx, key, cost, id)
	if slot && (err != nil || !d.Allowed) {
		c.release(m, key, id)
	}
	switch {
	case err != nil:
		c.giveUp(m, key, cost, id, "invalid", 0, err)
	case d.Allowed:
		c.run(m, key, id, slot)
	default:
		return c.wait(m, key, cost, id, deadline, d.RetryAfter)
	}
	return 0, false
}

// wait is settle's answer for a message refused for retry: wait, unless
// that goes beyond deadline (the message is then given up).
func (c *Core) wait(m *nats.Msg, key string, cost int, id string, deadline time.Time, retry time.Duration) (time.Duration, bool) {
	if time.Now().Add(retry).After(deadline) {
		c.giveUp(m, key, cost, id, "max wait", retry, nil)
		return 0, false
	}
	return retry, true
}

// acquire takes m's in-flight slot (WithCoreInFlight): ok when the
// handler may run, held when m then holds a slot (not so without an
// in-flight limit, or under FailOpen when it failed); refused, retry is
// the wait.
func (c *Core) acquire(m *nats.Msg, key, id string) (held, ok bool, retry time.Duration) {
	if c.cfg.inFlight == nil {
		return false, true, 0
	}
	s, err := c.cfg.inFlight.Acquire(context.Background(), key, id, c.cfg.lease)
	switch {
	case err != nil:
		c.report(m, fmt.Errorf("natsthrottle: in-flight slot of %s (key %q): %w", m.Subject, key, err))
		if c.gate.Policy() == throttle.FailOpen {
			return false, true, 0
		}
		return false, false, time.Second
	case s.Allowed:
		return true, true, 0
	}
	return false, false, s.RetryAfter
}

// run runs the handler for m; with slot, renewing its in-flight slot every
// third of the lease until it returns, then releasing it.
func (c *Core) run(m *nats.Msg, key, id string, slot bool) {
	if !slot {
		c.next(m)
		return
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(c.cfg.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := c.cfg.inFlight.Renew(context.Background(), key, id, c.cfg.lease); err != nil {
					c.report(m, fmt.Errorf("natsthrottle: renew the in-flight slot of %s (key %q): %w", m.Subject, key, err))
				}
			}
		}
	}()
	defer c.release(m, key, id)
	defer close(done)
	c.next(m)
}

func (c *Core) release(m *nats.Msg, key, id string) {
	if err := c.cfg.inFlight.Release(context.Background(), key, id); err != nil {
		c.report(m, fmt.Errorf("natsthrottle: release the in-flight slot of %s (key %q): %w", m.Subject, key, err))
	}
}

// waitOut is the life of a refused message until it runs or is given up.
func (c *Core) waitOut(m *nats.Msg, key string, cost int, id string, deadline time.Time, retry time.Duration) {
	defer c.wg.Done()
	defer c.exit(key, true, true)
	for {
		t := time.NewTimer(retry)
		select {
		case <-c.stop:
			t.Stop()
			c.giveUp(m, key, cost, id, "closed", retry, nil)
			return
		case <-t.C:
		}
		var waits bool
		if retry, waits = c.settle(m, key, cost, id, deadline); !waits {
			return
		}
	}
}

// giveUp answers a request, gives back what id holds in the limit (its
// reservation: no redelivery will claim it), reports the give-up and
// counts it. id is "" for a message never decided.
func (c *Core) giveUp(m *nats.Msg, key string, cost int, id, reason string, retry time.Duration, cause error) {
	ge := &GiveUpError{Subject: m.Subject, Key: key, Reason: reason, RetryAfter: retry, Err: cause}
	c.answer(m, ge) // at once: giving back the slot may wait for the store
	// An invalid message was never charged (its key, cost or request was
	// refused), nor was one never decided.
	if reason != "invalid" {
		if err := c.gate.Release(context.Background(), key, cost, id); err != nil {
			c.report(m, fmt.Errorf("natsthrottle: give back the slot of a message given up on %s: %w", m.Subject, err))
		}
	}
	c.givenUp.Add(1)
	c.gate.CountDisposition(context.Background(), key, DispositionGivenUp)
	c.report(m, ge)
}

// answer replies to m, when it is a request, that it was given up (ge):
// the services error headers, and the limit's wait when it gave one.
func (c *Core) answer(m *nats.Msg, ge *GiveUpError) {
	if m.Reply == "" {
		return
	}
	resp := nats.NewMsg(m.Reply)
	code := "429"
	if ge.Reason == "invalid" {
		code = "400"
	}
	resp.Header.Set(HeaderServiceErrorCode, code)
	resp.Header.Set(HeaderServiceError, ge.Error())
	if ge.RetryAfter > 0 {
		resp.Header.Set(HeaderRetryAfter, strconv.FormatInt(int64((ge.RetryAfter+time.Second-1)/time.Second), 10))
		resp.Header.Set(HeaderRetryAfterMs, strconv.FormatInt(ge.RetryAfter.Milliseconds(), 10))
	}
	if err := m.RespondMsg(resp); err != nil {
		c.report(m, fmt.Errorf("natsthrottle: reply to a request given up on %s: %w", m.Subject, err))
	}
}

// watchEvery spaces the looks at a subscription's drops: each takes the
// subscription's lock and the Core's.
const watchEvery = 100 * time.Millisecond

// watch reports the messages NATS dropped from m's subscription since the
// last look (a slow consumer), at most every watchEvery; a look skipped as
// too soon is made when the interval ends.
func (c *Core) watch(m *nats.Msg) {
	if m.Sub == nil {
		return
	}
	now := time.Now().UnixNano()
	at := c.watchedAt.Load()
	if wait := int64(watchEvery) - (now - at); wait > 0 {
		// Too soon: look again when the interval ends, so that drops
		// after the last message to arrive are reported too.
		if c.watchLater.CompareAndSwap(false, true) {
			time.AfterFunc(time.Duration(wait), func() {
				c.watchLater.Store(false)
				c.watch(m)
			})
		}
		return
	}
	if !c.watchedAt.CompareAndSwap(at, now) {
		return
	}
	n, err := m.Sub.Dropped()
	if err != nil {
		return
	}
	c.mu.Lock()
	last := c.dropped[m.Sub]
	c.dropped[m.Sub] = n
	c.mu.Unlock()
	if n > last {
		msgs, bytes, _ := m.Sub.PendingLimits()
		c.report(m, fmt.Errorf("natsthrottle: %w: NATS dropped %d messages of %s (%d in all; pending limits %d messages, %d bytes)",
			nats.ErrSlowConsumer, n-last, m.Sub.Subject, n, msgs, bytes))
	}
}

func (c *Core) report(m *nats.Msg, err error) {
	if c.cfg.onError != nil {
		c.cfg.onError(m, err)
	}
	if c.cfg.logger != nil {
		c.cfg.logger.Warn("natsthrottle: core message", "subject", m.Subject, "error", err)
	}
}

// Close gives up every message that waits, and every message that arrives
// from now on, each reported (see Core), and waits for the waiting ones
// to be given up (or admitted and handled) up to ctx. Errors: ctx's, when
// it ended first.
func (c *Core) Close(ctx context.Context) error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
		if c.sched != nil {
			c.sched.Stop() // what still waits for a handler sees stop and is given up
		}
	}
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("natsthrottle: Core.Close: %w", ctx.Err())
	}
}
