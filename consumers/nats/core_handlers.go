package natsthrottle

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/queuethrottle/queuethrottle/internal/fair"
)

// scheduled is the life of a message with WithCoreConcurrency handlers,
// on a goroutine of its own, counted in process (enter) until its handler
// starts, and among its key's waiting messages (waitSlot) while its
// rate or its key's share keeps it waiting. Its rate decides it at once
// (deciding once a handler is free would push a key that sends at its
// rate later with every wait): refused, it waits for the retry-after and
// asks again. With fair shares
// it first asks the scheduler for a handler, and a message of a key above
// its share waits uncharged until the share reaches it (the scheduler's
// deferral, served here rather than by a broker). Admitted, it waits for
// its handler, takes its in-flight slot (refused, it waits for one of its
// key's handlers to end) and runs. Every wait ends at deadline (the
// message is then given up, "max wait") or at Close ("closed").
func (c *Core) scheduled(m *nats.Msg, key string, cost int, id string, deadline time.Time) {
	defer c.wg.Done()
	inProcess := true
	defer func() { c.exit(key, inProcess, false) }()
	var t turn
	admitted, returning := false, false
	for {
		t = c.turn(key, deadline, returning)
		returning = true
		if !admitted {
			if delay, deferred := t.deferredNow(); deferred {
				if !c.waitSlot(m, key, cost, id, deadline, delay) {
					return
				}
				continue
			}
			d, err := c.gate.AdmitID(context.Background(), key, cost, id)
			switch {
			case err != nil:
				t.leave(fair.Block{})
				c.giveUp(m, key, cost, id, "invalid", 0, err)
				return
			case !d.Allowed:
				t.leave(fair.Refused(time.Now(), d.RetryAfter, d.Reserved))
				if !c.waitSlot(m, key, cost, id, deadline, d.RetryAfter) {
					return
				}
				continue
			}
			admitted = true
		}
		granted, slot, delay := c.awaitHandler(m, key, cost, id, deadline, t)
		if !granted {
			if delay < 0 || !c.waitSlot(m, key, cost, id, deadline, delay) {
				return // given up
			}
			continue // deferred once admitted: its id is admitted again, free
		}
		inProcess = false
		c.exit(key, true, false)
		c.run(m, key, id, slot)
		t.done()
		return
	}
}

// awaitHandler waits for t's handler and takes m's in-flight slot. It
// returns granted when m may run (slot: holding an in-flight slot), or
// the delay of a deferral, or a negative delay when m was given up
// (Close, or deadline).
func (c *Core) awaitHandler(m *nats.Msg, key string, cost int, id string, deadline time.Time, t turn) (granted, slot bool, delay time.Duration) {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	expired := false
	for {
		select {
		case <-t.granted():
		case <-t.deferred():
			return false, false, t.ticket.Delay() // only a ticket is deferred
		case <-c.stop:
			t.leave(fair.Block{})
			c.giveUp(m, key, cost, id, "closed", 0, nil)
			return false, false, -1
		case <-timeout.C:
			expired = true
			if !t.grantedNow() { // a grant that came with the deadline goes first
				t.leave(fair.Block{})
				c.giveUp(m, key, cost, id, "max wait", 0, nil)
				return false, false, -1
			}
		}
		held, ok, retry := c.acquire(m, key, id)
		switch {
		case ok:
			return true, held, 0
		case expired:
			t.giveBack(fair.Block{Until: time.Now().Add(retry), UntilDone: true})
			c.giveUp(m, key, cost, id, "max wait", retry, nil)
			return false, false, -1
		}
		// Every slot of the key is held: its turn comes again when one of
		// its handlers ends here (or the earliest lease does).
		if t.ticket != nil {
			t.ticket.Retry(fair.Block{Until: time.Now().Add(retry), UntilDone: true})
			continue
		}
		ended := c.handlerEnds()
		t.giveBack(fair.Block{})
		if !c.pause(m, key, cost, id, deadline, retry, ended) {
			return false, false, -1
		}
	}
}

// waitSlot is pause for a message waiting for its slot or its key's
// share, counted among its key's (WithCoreMaxWaiting).
func (c *Core) waitSlot(m *nats.Msg, key string, cost int, id string, deadline time.Time, d time.Duration) bool {
	if !c.enter(m, key, cost, id, d, false, true) {
		return false
	}
	defer c.exit(key, false, true)
	return c.pause(m, key, cost, id, deadline, d, nil)
}

// pause waits d in process for m, uncharged or on its reservation, or
// until early is closed, and reports false when m was given up instead:
// d reaches beyond deadline ("max wait"), or Close came first ("closed").
func (c *Core) pause(m *nats.Msg, key string, cost int, id string, deadline time.Time, d time.Duration, early <-chan struct{}) bool {
	if time.Now().Add(d).After(deadline) {
		c.giveUp(m, key, cost, id, "max wait", d, nil)
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-early:
		return true
	case <-c.stop:
		c.giveUp(m, key, cost, id, "closed", d, nil)
		return false
	}
}

// turn is a message's claim on a WithCoreConcurrency handler: a ticket of
// the fair shares, or, with WithCoreFair(false), a place in line for a
// free handler (first come, first served).
type turn struct {
	c      *Core
	ticket *fair.Ticket // nil without fair shares
}

// turn asks for a handler for a message of key. With fair shares the
// scheduler may defer it (its key is above its share, or too many of its
// messages wait) when the wait would be long; a deferral beyond deadline
// gives the message up at once.
func (c *Core) turn(key string, deadline time.Time, returning bool) turn {
	if c.sched == nil {
		return turn{c: c}
	}
	maxWait := max(time.Until(deadline), time.Nanosecond)
	return turn{c: c, ticket: c.sched.Arrive(key, fair.Arrival{MaxWait: maxWait, Returning: returning})}
}

// deferredNow reports whether the scheduler deferred t as it arrived, and
// for how long.
func (t turn) deferredNow() (time.Duration, bool) {
	if t.ticket == nil || !deferredNow(t.ticket) {
		return 0, false
	}
	return t.ticket.Delay(), true
}

// granted returns a channel that yields when t holds a handler: a closed
// channel, or (first come, first served) a free handler's token.
func (t turn) granted() <-chan struct{} {
	if t.ticket == nil {
		return t.c.tokens
	}
	return t.ticket.Granted()
}

// grantedNow reports whether t holds a handler already (taking it, first
// come, first served).
func (t turn) grantedNow() bool {
	select {
	case <-t.granted():
		return true
	default:
		return false
	}
}

// deferred returns a channel closed when the scheduler defers t (never
// without fair shares).
func (t turn) deferred() <-chan struct{} {
	if t.ticket == nil {
		return nil
	}
	return t.ticket.Deferred()
}

// done frees t's handler once the handler ran.
func (t turn) done() {
	if t.ticket != nil {
		t.ticket.Done()
		return
	}
	t.c.tokens <- struct{}{}
	t.c.endsMu.Lock()
	if t.c.ends != nil {
		close(t.c.ends)
		t.c.ends = nil
	}
	t.c.endsMu.Unlock()
}

// handlerEnds returns a channel closed when a handler next ends (first
// come, first served): a message refused an in-flight slot waits for it,
// since a slot may come back then, rather than for the earliest lease.
func (c *Core) handlerEnds() <-chan struct{} {
	c.endsMu.Lock()
	defer c.endsMu.Unlock()
	if c.ends == nil {
		c.ends = make(chan struct{})
	}
	return c.ends
}

// leave withdraws t, the key blocked as b says. Without fair shares t
// holds no handler while it waits, so there is nothing to give back.
func (t turn) leave(b fair.Block) {
	if t.ticket != nil {
		t.ticket.Leave(b)
	}
}

// giveBack withdraws t, which holds a handler, unused: the key blocked as
// b says (first come, first served: the handler's token back).
func (t turn) giveBack(b fair.Block) {
	if t.ticket != nil {
		t.ticket.Leave(b)
		return
	}
	t.c.tokens <- struct{}{}
}
