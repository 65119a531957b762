package fair

import (
	"container/heap"
	"math"
	"slices"
	"time"
)

// use is how many handlers k uses, as the shares see it: its average
// running count, or what it runs now if that is more; a key blocked until
// one of its handlers ends (its in-flight limit) uses what it could run.
func (k *keyState) use() float64 {
	d := max(k.busy.v, float64(k.running))
	if k.untilDone {
		d = max(d, float64(k.inFlightCap))
	}
	return d
}

// waiting is how many messages of k wait for a handler: here, in the
// broker (its backlog) and deferred; none while k is blocked (they could
// not run).
func (k *keyState) waiting(now time.Time) float64 {
	if k.blockedNow() {
		return 0
	}
	w := float64(len(k.queue) + k.backlog)
	if k.cursor.After(now) {
		w += math.Ceil(k.cursor.Sub(now).Seconds() * k.pace)
	}
	return w
}

// keyAhead is how many waiting messages a key under its share may show
// (natsthrottle's ConsumeByKey pulls up to 2 ahead).
const keyAhead = 2

// floodFactor: a key with more than this many times its part of the
// handlers waiting needs more than any share (a flood), whatever it used
// so far.
const floodFactor = 4

// flooded reports whether w messages of k waiting are a flood (see
// floodFactor; at least that many, whatever its part), with wsum the
// active keys' weights.
func (s *Scheduler) flooded(k *keyState, w, wsum float64) bool {
	return w > floodFactor*max(1, float64(s.handlers)*k.weight/max(wsum, k.weight))
}

// noteFlood makes a light key heavy at once when a flood of its messages
// waits, between classifications.
func (s *Scheduler) noteFlood(k *keyState, now time.Time) {
	if !k.light || !s.flooded(k, k.waiting(now), s.wsum) {
		return
	}
	k.light, k.share = false, s.level*k.weight
	s.retrim = true
	s.readyChanged(k)
}

// classify splits the active keys into light and heavy by max-min fair
// (water-filling) shares of the handlers, when the last split is stale,
// and drops the state of keys idle for dropAfter.
func (s *Scheduler) classify(now time.Time) {
	if !s.dirty && now.Sub(s.classified) < max(s.period, classifyEvery) {
		return
	}
	s.dirty = false
	s.classified = now
	// A classification costs O(keys log keys): space them to 50 times
	// what the last one took, so that many keys cost a bounded share.
	began := time.Now()
	defer func() { s.period = 50 * time.Since(began) }()
	type active struct {
		k *keyState
		d float64
	}
	var keys []active
	wsum := 0.0
	for name, k := range s.keys {
		k.busy.update(now, k.running)
		d := k.use()
		if d < busyFloor && k.running == 0 && k.waiting(now) == 0 {
			k.light, k.share = true, 0
			if now.Sub(k.lastSeen) > dropAfter && !k.cursor.After(now) && !k.blockedNow() {
				delete(s.keys, name)
			}
			continue
		}
		keys = append(keys, active{k, d})
		wsum += k.weight
	}
	wsum0 := wsum
	// A key's demand is what it uses, measured over about a second, or
	// what it has waiting but for a couple if that is more (a message or
	// two waiting for a moment are what a key under its share looks like),
	// or no share at all when a flood of them waits.
	for i := range keys {
		k := keys[i].k
		w := k.waiting(now)
		if s.flooded(k, w, wsum) {
			keys[i].d = math.Inf(1)
		} else {
			keys[i].d = max(keys[i].d, w-keyAhead) // but for a couple, they would all run at once
		}
	}
	slices.SortFunc(keys, func(a, b active) int {
		x, y := a.d/a.k.weight, b.d/b.k.weight
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return int(a.k.seq) - int(b.k.seq)
	})
	left := float64(s.handlers)
	s.lightNow = false
	s.lightShare = 0
	i := 0
	for ; i < len(keys); i++ {
		a := keys[i]
		if a.d > left/wsum*a.k.weight {
			break // needs more than its share: it and the keys after it are heavy
		}
		a.k.light, a.k.share = true, a.d
		s.lightShare += a.d
		left -= a.d
		wsum -= a.k.weight
		if a.k.running > 0 || len(a.k.queue) > 0 || now.Sub(a.k.lastSeen) < activeFor {
			s.lightNow = true
		}
	}
	s.wsum, s.level = wsum0, float64(s.handlers)/max(wsum0, 1e-9)
	if wsum > 0 {
		s.level = left / wsum
	}
	for _, a := range keys[i:] {
		a.k.light, a.k.share = false, left/wsum*a.k.weight
		if a.k.untilDone {
			a.k.share = min(a.k.share, a.k.use()) // no more than its in-flight limit lets it run
		}
	}
	heap.Init(&s.ready)
	s.retrim = true // the shares moved: so did the expected waits
}

// rate is how many grants per second k can expect: its share divided by
// its handler time; 0 when unknown.
func (s *Scheduler) rate(k *keyState) float64 {
	svc := s.expectedService(k)
	if svc <= 0 || k.share <= 0 {
		return 0
	}
	return k.share / svc
}

// expectedWait is how long the waiting t can expect to wait for its grant,
// and whether that is known (handler times measured).
func (s *Scheduler) expectedWait(k *keyState, t *Ticket, now time.Time) (time.Duration, bool) {
	var wait time.Duration
	if !k.blockedUntil.IsZero() {
		wait = k.blockedUntil.Sub(now)
	}
	if k.light && !k.blockedNow() {
		return wait, true
	}
	r := s.rate(k)
	if r <= 0 {
		return wait, false
	}
	pos := len(k.queue)
	for i, q := range k.queue {
		if q == t {
			pos = i + 1
			break
		}
	}
	return wait + seconds(float64(pos)/r), true
}

// trim defers the deferrable tickets at the back of k's queue that are
// over its bound (twice its share, at least 2) or would wait longer than
// they may, once handler times are known.
func (s *Scheduler) trim(k *keyState, now time.Time) {
	if !s.service.known() || len(k.queue) == 0 || (k.light && !k.blockedNow()) {
		return
	}
	bound := queueBound(k)
	cut := len(k.queue)
	for cut > 0 {
		t := k.queue[cut-1]
		if t.maxWait <= 0 {
			break
		}
		wait, known := s.expectedWait(k, t, now)
		if cut <= bound && !(known && wait > t.maxWait) {
			break
		}
		cut--
	}
	if cut < len(k.queue) {
		s.evict(k.queue[cut:], now)
	}
}

// trimLongest defers the last deferrable waiting ticket of the heavy key
// (not blocked) furthest over its own bound (see trim), once handler times
// are known: MaxQueued is exceeded. A key within its bound keeps its
// tickets: what overfills the queue then is messages back from a
// deferral, which wait whatever the bounds.
func (s *Scheduler) trimLongest(now time.Time) {
	if !s.service.known() {
		return
	}
	var worst *keyState
	over := 0
	for _, k := range s.ready.items {
		n := len(k.queue)
		if (k.light && !k.blockedNow()) || k.queue[n-1].maxWait <= 0 {
			continue
		}
		if o := n - queueBound(k); o > over {
			worst, over = k, o
		}
	}
	if worst != nil {
		s.evict(worst.queue[len(worst.queue)-1:], now)
	}
}

// queueBound is how many tickets of k may wait: twice its share, at
// least 2.
func queueBound(k *keyState) int { return int(math.Ceil(max(2, 2*k.share))) }

// evict defers the waiting tickets ts of one key, in their order: each
// gets the next slot of its key's share (see deferral).
func (s *Scheduler) evict(ts []*Ticket, now time.Time) {
	for _, t := range slices.Clone(ts) {
		wait, _ := s.expectedWait(t.k, t, now)
		s.unqueue(t)
		t.delay = s.deferral(t.k, now, wait)
		close(t.deferred)
		if s.onDefer != nil {
			s.onDefer(t)
		}
	}
}

// deferral returns the delay of a message of k deferred now, expected to
// wait wait here: the next slot of its key's share after the messages
// deferred before it, which it then takes.
func (s *Scheduler) deferral(k *keyState, now time.Time, wait time.Duration) time.Duration {
	r := s.rate(k)
	if r <= 0 {
		r = 1 // unknown: one a second
	}
	slot := now.Add(wait)
	if k.cursor.After(slot) {
		slot = k.cursor
	}
	k.cursor = slot.Add(seconds(1 / r))
	k.pace = r
	return slot.Sub(now)
}

// Starved returns the keys whose share of the handlers goes unused: they
// have messages deferred and still to come back (slots ahead), none
// waiting here, while handlers are free (free of them). Their share grew
// after they were deferred (other keys went quiet); a caller that can
// bring deferred messages back sooner (asynq's Inspector.RunTask) uses
// it. When handlers are free, retry is when a key that is not starved
// only because it is blocked (its rate or its in-flight limit) is free
// again, the earliest such (zero: none, or no handler free).
func (s *Scheduler) Starved() (keys []string, free int, retry time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	free = s.handlers - s.running - s.queued
	if free <= 0 {
		return nil, 0, time.Time{}
	}
	for name, k := range s.keys {
		if !k.cursor.After(now) || len(k.queue) > 0 {
			continue
		}
		// A block that has passed counts as none (the scheduler's timer
		// lifts it a moment later).
		switch at := k.freeAt(); {
		case !k.blockedNow() || (!at.IsZero() && !at.After(now)):
			keys = append(keys, name)
		case !at.IsZero() && (retry.IsZero() || at.Before(retry)):
			retry = at
		}
	}
	slices.Sort(keys)
	return keys, free, retry
}
