package fair

import "time"

// Ticket is one message's claim on a handler: waiting, then granted, then
// released by exactly one of Done, Retry or Leave (Retry puts it back to
// wait). Its methods are safe for concurrent use with the scheduler's.
type Ticket struct {
	s         *Scheduler
	k         *keyState
	granted   chan struct{} // closed at the grant (a new one after Retry)
	deferred  chan struct{} // closed at a deferral
	delay     time.Duration // of the deferral
	maxWait   time.Duration // > 0: deferrable
	state     ticketState
	returning bool
	grantAt   time.Time
	end       time.Time // expected end of its handler
	charged   float64   // virtual time charged at the grant
	endIdx    int       // in the scheduler's end heap; -1 when not granted
}

type ticketState int

const (
	ticketQueued ticketState = iota
	ticketGranted
	ticketLeft // done, or left
)

// Key returns the key the ticket waits for.
func (t *Ticket) Key() string { return t.k.name }

// Granted returns a channel closed when t holds a handler. After Retry it
// returns the channel of the new wait.
func (t *Ticket) Granted() <-chan struct{} {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	return t.granted
}

// Deferred returns a channel closed when the scheduler deferred t (see
// Scheduler.Arrive); t is then out of the scheduler.
func (t *Ticket) Deferred() <-chan struct{} { return t.deferred }

// Delay returns how long the deferred t should stay away.
func (t *Ticket) Delay() time.Duration {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	return t.delay
}

// Done frees t's handler: the handler ran, from the grant until now.
// Calling it on a ticket not granted does nothing.
func (t *Ticket) Done() {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.state != ticketGranted {
		return
	}
	now := s.clock.Now()
	t.state = ticketLeft
	first := !s.service.known()
	s.release(t, now, true)
	if t.k.light && s.lightNow && s.handlers > 1 {
		// Light keys' handlers end about when their next messages come:
		// keep the handler for them a moment.
		s.keptLight = append(s.keptLight, now.Add(seconds(soonEnd*s.service.v/float64(s.handlers))))
	}
	if first {
		s.dirty = true // the first handler time: waits can be estimated, and trimmed
	}
	s.dispatch(now)
}

// Retry gives back t's handler unused (its rate or in-flight limit said
// no) and puts t back at the head of its key's queue, the key blocked as b
// says. On a ticket not granted it only applies b.
func (t *Ticket) Retry(b Block) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if t.state == ticketGranted {
		s.release(t, now, false)
		t.granted = make(chan struct{})
		t.returning = true
		t.maxWait = 0
		s.enqueue(t, true)
	}
	s.block(t.k, b, now)
	s.dispatch(now)
}

// Leave withdraws t: waiting, it leaves its key's queue; granted, its
// handler is given back unused. b blocks the key (the rejection that made
// t leave holds for the key's other messages too). Leave after Done does
// nothing.
func (t *Ticket) Leave(b Block) {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	switch t.state {
	case ticketQueued:
		s.unqueue(t)
	case ticketGranted:
		t.state = ticketLeft
		s.release(t, now, false)
	default:
		return
	}
	s.block(t.k, b, now)
	s.dispatch(now)
}
