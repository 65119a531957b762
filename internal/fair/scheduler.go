package fair

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Tuning of the rules in the package documentation (chosen by replaying
// traces of the kind in sim_test.go with handler times of 0-10 % jitter).
const (
	paceSpacing = 0.6 // least spacing of two grants to heavy keys, in mean handler times divided by the handlers they have
	soonEnd     = 1.5 // in mean handler times divided by the handlers: a handler end this near lets a heavy key take the last free handler
)

const (
	// classifyEvery bounds how stale the light/heavy classes may be.
	classifyEvery = 20 * time.Millisecond
	// activeFor is how long a light key counts as active after its last
	// arrival or handler end (for the last free handler).
	activeFor = time.Second
	// dropAfter is how long an idle key's state is kept.
	dropAfter = 10 * time.Second
	// weightEvery is how often a key's weight is asked again.
	weightEvery = time.Second
	// startup bounds the rule of holdHeavy before any handler has ended.
	startup = time.Second
	// busyFloor is the average running count below which an idle key no
	// longer counts as active for the shares.
	busyFloor = 0.05
)

// Config configures a Scheduler.
type Config struct {
	// Handlers is how many handlers the scheduler shares: at most that many
	// tickets are granted at once. It must be > 0.
	Handlers int
	// Weight returns a key's weight (> 0, finite; anything else counts as
	// 1). Nil gives every key 1. It is asked when a key is first seen and
	// again on an arrival once its answer is a second old, never under
	// the scheduler's lock.
	Weight func(key string) float64
	// MaxQueued bounds the tickets waiting across keys before arrivals
	// that may be deferred are deferred (returning ones always wait). 0
	// means 4 × Handlers.
	MaxQueued int
	// Clock is the time source; nil is the system clock.
	Clock Clock
}

// Scheduler shares Handlers handlers among keys (see the package
// documentation). It is safe for concurrent use.
type Scheduler struct {
	handlers  int
	weightFn  func(string) float64
	maxQueued int
	clock     Clock

	mu         sync.Mutex
	keys       map[string]*keyState
	seq        uint64 // order keys were created, for ties
	running    int
	queued     int
	ready      indexed[*keyState] // keys with waiting tickets, not blocked
	blocked    indexed[*keyState] // keys blocked until a time
	ends       indexed[*Ticket]   // expected ends of granted tickets
	vnow       float64            // start tag of the latest grant
	service    meanTime           // handler time over every key
	firstGrant time.Time
	lastHeavy  time.Time
	lightShare float64 // handlers the light keys need
	classified time.Time
	dirty      bool          // classify at the next dispatch (the first handler time)
	period     time.Duration // between classifications: classifyEvery, longer when one takes long
	wsum       float64       // the active keys' weights, at the last classification
	level      float64       // handlers per weight of the heavy keys, at the last classification
	lightNow   bool          // a light key is active
	keptLight  []time.Time   // ends of light handlers kept for light keys, until then
	timer      Timer
	wakeAt     time.Time
	wakeGen    uint64 // of the pending timer
	stopped    bool
	roomCh     chan struct{} // closed when there is room again (see Room)
	retrim     bool          // the shares moved since the waiting tickets were last trimmed

	onGrant func(*Ticket) // tests: called under the lock at every grant
	onDefer func(*Ticket) // tests: called under the lock at every deferral
}

// New returns a Scheduler for cfg; an error names the bad field.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Handlers <= 0 {
		return nil, fmt.Errorf("fair: Handlers must be > 0, got %d", cfg.Handlers)
	}
	if cfg.MaxQueued < 0 {
		return nil, fmt.Errorf("fair: MaxQueued must be >= 0, got %d", cfg.MaxQueued)
	}
	s := &Scheduler{handlers: cfg.Handlers, weightFn: cfg.Weight, maxQueued: cfg.MaxQueued, clock: cfg.Clock, keys: map[string]*keyState{},
		ready:   indexed[*keyState]{less: readyFirst, at: func(k *keyState) *int { return &k.readyIdx }},
		blocked: indexed[*keyState]{less: freedFirst, at: func(k *keyState) *int { return &k.blockedIdx }},
		ends:    indexed[*Ticket]{less: endsFirst, at: func(t *Ticket) *int { return &t.endIdx }},
	}
	if s.maxQueued == 0 {
		s.maxQueued = 4 * cfg.Handlers
	}
	if s.clock == nil {
		s.clock = systemClock{}
	}
	return s, nil
}

// Handlers returns how many handlers s shares.
func (s *Scheduler) Handlers() int { return s.handlers }

// ErrStopped is what Arrive reports after Stop: the deferral is the only
// way out.
var ErrStopped = errors.New("fair: scheduler stopped")

// keyState is what the scheduler knows of one key.
type keyState struct {
	name     string
	seq      uint64
	weight   float64
	weightAt time.Time
	vtime    float64 // seconds of handler time divided by weight
	running  int
	queue    []*Ticket
	backlog  int // waiting outside the process (the broker's count)

	blockedUntil time.Time // zero: not blocked by time (its rate)
	untilDone    bool      // blocked until a handler of the key ends (its in-flight limit) ...
	doneBy       time.Time // ... or until then
	inFlightCap  int       // running when last blocked until a handler ends

	cursor   time.Time // the next deferral slot
	pace     float64   // grants per second at the last deferral
	service  meanTime
	busy     timeAverage
	lastSeen time.Time
	light    bool
	share    float64 // handlers, from the last classification

	readyIdx, blockedIdx int // -1 when not in the heap
}

func (k *keyState) blockedNow() bool { return !k.blockedUntil.IsZero() || k.untilDone }

// freeAt is when k's blocks end at the latest.
func (k *keyState) freeAt() time.Time {
	if k.untilDone && k.doneBy.After(k.blockedUntil) {
		return k.doneBy
	}
	return k.blockedUntil
}

// Arrival says how a ticket may wait.
type Arrival struct {
	// MaxWait, when > 0, lets the scheduler defer the message instead of
	// keeping it waiting (see Arrive).
	MaxWait time.Duration
	// Returning marks a message back from a deferral (or from a wait of
	// its own): it waits here, ahead of its key's other waiting messages,
	// whatever the bounds.
	Returning bool
}

// Arrive asks a handler for a message of key and returns its ticket,
// waiting for its grant (granted already if a handler was free for it).
//
// With a.MaxWait > 0 the scheduler may defer the ticket instead, at once
// or while it waits: when its expected wait is longer than a.MaxWait, or
// when the waiting tickets of its key (twice its share of the handlers,
// at least 2) or of every key (MaxQueued) are too many. Its Deferred
// channel is then closed and Delay says when the key's share of the
// handlers reaches it, after the messages deferred before it: the caller
// sends it back to the broker for that long (a deferral: the reservation
// idea applied to handler time). Nothing is deferred before a handler
// time has been measured. After Stop every deferrable arrival is deferred
// by a second, and others are never granted.
func (s *Scheduler) Arrive(key string, a Arrival) *Ticket {
	w, wAt := s.weightOf(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	k := s.key(key, now)
	if !wAt.IsZero() && wAt.After(k.weightAt) {
		k.weight, k.weightAt = w, wAt
	}
	t := &Ticket{s: s, k: k, granted: make(chan struct{}), deferred: make(chan struct{}), endIdx: -1, returning: a.Returning}
	if !a.Returning {
		t.maxWait = a.MaxWait
	}
	if s.stopped {
		if t.maxWait > 0 {
			t.state = ticketLeft
			t.delay = time.Second
			close(t.deferred)
		}
		return t
	}
	if k.running == 0 && len(k.queue) == 0 {
		k.vtime = max(k.vtime, s.vnow) // no credit for idleness
	}
	k.lastSeen = now
	s.enqueue(t, a.Returning)
	s.dispatch(now)
	s.trim(k, now)
	if s.queued > s.maxQueued {
		s.trimLongest(now)
	}
	return t
}

// weightOf asks the weight function for key, outside the lock, when the
// key's weight is unknown or a second old; it returns the zero time when
// it did not ask.
func (s *Scheduler) weightOf(key string) (float64, time.Time) {
	if s.weightFn == nil {
		return 1, time.Time{}
	}
	s.mu.Lock()
	k := s.keys[key]
	now := s.clock.Now()
	fresh := k != nil && now.Sub(k.weightAt) < weightEvery
	s.mu.Unlock()
	if fresh {
		return 0, time.Time{}
	}
	w := s.weightFn(key)
	if !(w > 0) || math.IsInf(w, 1) {
		w = 1
	}
	return w, now
}

// key returns the state of key, created if new.
func (s *Scheduler) key(name string, now time.Time) *keyState {
	k := s.keys[name]
	if k == nil {
		s.seq++
		// A new key has used nothing: it is light until classified.
		k = &keyState{name: name, seq: s.seq, weight: 1, light: true, readyIdx: -1, blockedIdx: -1, lastSeen: now}
		s.keys[name] = k
	}
	return k
}

// SetBacklog tells s how many messages of key wait outside the process (a
// per-key consumer's pending count): they count in its demand.
func (s *Scheduler) SetBacklog(key string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	k := s.key(key, now)
	k.backlog = max(n, 0)
	s.noteFlood(k, now)
	if n > 0 {
		k.lastSeen = now
	}
}

// Stop stops the timer; waiting tickets are never granted after it (their
// callers give up on them with Leave). Later arrivals are deferred.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.roomCh != nil {
		close(s.roomCh)
		s.roomCh = nil
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

// Room returns a channel that is closed while a deferrable arrival can be
// taken in: fewer than MaxQueued tickets wait, or a handler time has been
// measured (so that the excess can be deferred). Before the first handler
// ends nothing can be deferred, and a caller that pulls messages as fast
// as they come (natsthrottle's Handle) waits on it instead of queueing
// the whole backlog.
func (s *Scheduler) Room() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.roomy() {
		return closedCh
	}
	if s.roomCh == nil {
		s.roomCh = make(chan struct{})
	}
	return s.roomCh
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (s *Scheduler) roomy() bool { return s.stopped || s.queued < s.maxQueued || s.service.known() }

// Stats is a snapshot of a Scheduler.
type Stats struct {
	Running, Queued, Keys int
}

// Stats returns how many tickets are granted and waiting, and how many
// keys have state.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Running: s.running, Queued: s.queued, Keys: len(s.keys)}
}

// enqueue adds t to its key's queue: at the back, or ahead of the
// non-returning ones.
func (s *Scheduler) enqueue(t *Ticket, front bool) {
	k := t.k
	t.state = ticketQueued
	i := len(k.queue)
	if front {
		for i > 0 && !k.queue[i-1].returning {
			i--
		}
	}
	k.queue = append(k.queue, nil)
	copy(k.queue[i+1:], k.queue[i:])
	k.queue[i] = t
	s.queued++
	s.noteFlood(k, s.clock.Now())
	s.readyChanged(k)
}

// unqueue removes the waiting t from its key's queue.
func (s *Scheduler) unqueue(t *Ticket) {
	k := t.k
	for i, q := range k.queue {
		if q == t {
			k.queue = append(k.queue[:i], k.queue[i+1:]...)
			s.queued--
			break
		}
	}
	t.state = ticketLeft
	s.readyChanged(k)
}

// readyChanged puts k into the ready heap or takes it out, as its queue
// and block say.
func (s *Scheduler) readyChanged(k *keyState) {
	s.ready.place(k, len(k.queue) > 0 && !k.blockedNow())
}

// dispatch grants handlers while the rules allow, and sets the timer for
// when they may allow more.
func (s *Scheduler) dispatch(now time.Time) {
	if s.stopped {
		return
	}
	s.unblockDue(now)
	s.classify(now)
	var wake time.Time
	for s.running < s.handlers && s.ready.Len() > 0 {
		k := s.ready.top()
		if !k.light {
			if at, hold := s.holdHeavy(now); hold {
				wake = at
				break
			}
			if at, hold := s.holdLast(now); hold {
				wake = at
				break
			}
			if at, kept := s.keptForLight(now); kept {
				wake = at
				break
			}
		} else if len(s.keptLight) > 0 {
			s.keptLight = s.keptLight[1:]
		}
		s.grant(k, now)
	}
	if s.retrim {
		// What still waits, waits: trim it to the new shares.
		s.retrim = false
		for _, k := range slices.Concat(s.ready.items, s.blocked.items) {
			s.trim(k, now) // the keys with waiting tickets
		}
	}
	if s.blocked.Len() > 0 {
		if at := s.blocked.top().freeAt(); wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	s.wake(now, wake)
	if s.roomCh != nil && s.roomy() {
		close(s.roomCh)
		s.roomCh = nil
	}
}

// spacing is the least time between two grants: paceSpacing mean handler
// times divided by the handlers (0 before a handler has ended).
// holdHeavy reports whether a heavy key must wait for its grant, and
// until when: grants to heavy keys are paced, paceSpacing mean handler
// times divided by the handlers left to heavy keys apart, so that their
// handlers' ends spread over a handler time; and before any handler has
// ended (for up to startup) heavy keys leave a quarter of the handlers
// free, since the light keys' demand and the handler time are unknown.
func (s *Scheduler) holdHeavy(now time.Time) (time.Time, bool) {
	if !s.service.known() {
		if s.handlers < 4 || (!s.firstGrant.IsZero() && now.Sub(s.firstGrant) >= startup) || s.running < s.handlers-s.handlers/4 {
			return time.Time{}, false
		}
		return s.firstGrant.Add(startup), true
	}
	spacing := seconds(paceSpacing * s.service.v / max(1, float64(s.handlers)-s.lightShare))
	if at := s.lastHeavy.Add(spacing); now.Before(at) {
		return at, true
	}
	return time.Time{}, false
}

// holdLast reports whether the last free handler is kept from a heavy key
// (a light key is active and no handler is expected to end soon), and
// when to look again.
func (s *Scheduler) holdLast(now time.Time) (time.Time, bool) {
	if s.handlers < 2 || s.handlers-s.running > 1 || !s.lightNow {
		return time.Time{}, false
	}
	if !s.service.known() {
		return time.Time{}, true // no handler has ended: when the next will is unknown
	}
	soon := now.Add(seconds(soonEnd * s.service.v / float64(s.handlers)))
	if s.ends.Len() > 0 && !s.ends.top().end.After(soon) {
		return time.Time{}, false
	}
	if s.ends.Len() == 0 || !s.service.known() {
		return time.Time{}, true // woken by a handler's end
	}
	return s.ends.top().end.Add(soon.Sub(now) * -1), true
}

// keptForLight reports whether every free handler is kept for light keys
// (a light handler ended less than soonEnd mean handler times divided by
// the handlers ago), and until when.
func (s *Scheduler) keptForLight(now time.Time) (time.Time, bool) {
	i := 0
	for i < len(s.keptLight) && !s.keptLight[i].After(now) {
		i++
	}
	s.keptLight = s.keptLight[i:]
	if !s.lightNow || len(s.keptLight) < s.handlers-s.running {
		return time.Time{}, false
	}
	return s.keptLight[0], true
}

// grant gives the first waiting ticket of k a handler.
func (s *Scheduler) grant(k *keyState, now time.Time) {
	t := k.queue[0]
	k.queue = k.queue[1:]
	s.queued--
	k.busy.update(now, k.running)
	k.running++
	s.running++
	if s.firstGrant.IsZero() {
		s.firstGrant = now
	}
	if !k.light {
		s.lastHeavy = now
	}
	t.state = ticketGranted
	t.grantAt = now
	s.vnow = max(s.vnow, k.vtime)
	t.charged = s.expectedService(k) / k.weight
	k.vtime += t.charged
	t.end = now.Add(seconds(s.expectedService(k)))
	heap.Push(&s.ends, t)
	s.readyChanged(k)
	close(t.granted)
	if s.onGrant != nil {
		s.onGrant(t)
	}
}

// expectedService is the handler time expected of k, in seconds: its mean,
// else the mean over every key, else 0.
func (s *Scheduler) expectedService(k *keyState) float64 {
	if k.service.known() {
		return k.service.v
	}
	return s.service.v
}

// release frees the handler of the granted t. ran says the handler ran
// (its time is measured and charged); otherwise its charge is refunded.
func (s *Scheduler) release(t *Ticket, now time.Time, ran bool) {
	k := t.k
	k.busy.update(now, k.running)
	k.running--
	s.running--
	heap.Remove(&s.ends, t.endIdx)
	if ran {
		d := now.Sub(t.grantAt)
		k.service.add(d)
		s.service.add(d)
		k.vtime += d.Seconds()/k.weight - t.charged
		if k.untilDone {
			k.untilDone, k.doneBy = false, time.Time{}
			s.blockChanged(k)
		}
	} else {
		k.vtime -= t.charged
	}
	k.lastSeen = now
	s.readyChanged(k)
}

// Block says how long a key must wait before its tickets are granted
// again.
type Block struct {
	// Until is when the key may run again (zero: not blocked by time).
	Until time.Time
	// UntilDone also unblocks the key when one of its handlers ends here:
	// its in-flight limit refused a slot, and a slot comes back then.
	// Until is the fallback (a slot held by another process).
	UntilDone bool
}

func (b Block) none() bool { return b.Until.IsZero() && !b.UntilDone }

// Refused is the block of a key whose rate refused a message at at, to
// retry after retryAfter: until then, since the key's other messages
// would be refused as well; none when the refusal reserved the message's
// own slot (the others may still fit before it).
func Refused(at time.Time, retryAfter time.Duration, reserved bool) Block {
	if reserved {
		return Block{}
	}
	return Block{Until: at.Add(retryAfter)}
}

// block blocks k as b says.
func (s *Scheduler) block(k *keyState, b Block, now time.Time) {
	if b.none() {
		return
	}
	switch {
	case b.UntilDone && k.running > 0:
		k.untilDone, k.inFlightCap = true, k.running
		if b.Until.After(k.doneBy) {
			k.doneBy = b.Until
		}
	case b.Until.After(now) && b.Until.After(k.blockedUntil):
		k.blockedUntil = b.Until // no handler of k ends here: only the time
	}
	s.blockChanged(k)
}

// blockChanged keeps the blocked heap and the ready heap in step with k's
// block.
func (s *Scheduler) blockChanged(k *keyState) {
	s.blocked.place(k, !k.freeAt().IsZero())
	s.readyChanged(k)
}

// unblockDue unblocks the keys whose block has passed.
func (s *Scheduler) unblockDue(now time.Time) {
	for s.blocked.Len() > 0 && !s.blocked.top().freeAt().After(now) {
		k := s.blocked.top()
		k.blockedUntil = time.Time{}
		k.untilDone, k.doneBy = false, time.Time{} // the fallback has passed
		s.blockChanged(k)
	}
}

// wake sets the timer for at (zero: none needed).
func (s *Scheduler) wake(now, at time.Time) {
	if at.IsZero() || (s.timer != nil && !s.wakeAt.After(at) && s.wakeAt.After(now)) {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.wakeGen++
	gen := s.wakeGen
	s.wakeAt = at
	s.timer = s.clock.AfterFunc(max(at.Sub(now), 0), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if gen == s.wakeGen {
			s.timer = nil
		}
		s.dispatch(s.clock.Now())
	})
}

// seconds converts seconds to a Duration, rounding up.
func seconds(x float64) time.Duration {
	return time.Duration(math.Ceil(x * float64(time.Second)))
}
