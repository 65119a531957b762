package window

import (
	"sort"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// This file is the sliding window log with reservations, in memory. It is
// the reference for window.lua, which makes the same decisions on a Redis
// sorted set: every rule here has its twin there.
//
// The log holds entries at instants (µs): admissions, at the instant they
// were admitted, and reservations, at the future slot they hold. An entry
// at t counts during [t, t+window). The limit holds when every window of
// length window holds at most limit units, reservations included.

// entry is n units at instant at (µs); reserved entries hold a future
// slot for id.
type entry struct {
	at       int64
	n        int
	id       string // with named: the request's identity (AllowID)
	named    bool
	reserved bool
}

// windowLog is one key's log: live entries es[head:], sorted by at
// (admissions at the same instant in arrival order).
type windowLog struct {
	es    []entry
	head  int
	units int   // sum of n over the live entries
	floor int64 // µs: the newest admission ever made, the clock floor
	span  int64 // µs: the window of the last decision
	ids   map[string]int64
	// late holds the slots of reservations that left the window
	// unclaimed, which a late claim may still take for up to the grace of
	// the decision (see lateGrace); lateUntil bounds them all.
	late      map[string]int64
	lateUntil int64 // µs: when the last of late passes its grace
	lateFloor int64 // µs: slots at or before it are gone (the Redis set dropped them)
	lateSweep int64 // µs: when late is next pruned
}

// lateGrace is how long after its window a reservation that was never
// claimed can still be claimed, with its priority, instead of queueing
// again at the tail: a broker can redeliver seconds late (JetStream
// checks a long pending list only between acks), and a reservation
// passes unclaimed after one window. A decision's grace is the smaller of
// this and its horizon (none for AllowN).
const lateGrace = 10_000_000 // µs

// grace returns the late-claim grace of a decision with horizon µs.
func grace(withID bool, horizon int64) int64 {
	if !withID {
		return 0
	}
	return min(horizon, lateGrace)
}

func (l *windowLog) live() []entry { return l.es[l.head:] }

// idle reports whether l decides nothing any more by now: every unit left
// its window, and no reservation can be claimed late. A reservation that
// left its window reaches late only at the next decision's drop, so the
// live ones count with the longest grace (the next decision's drop
// forgets what its own grace does not cover).
func (l *windowLog) idle(now int64) bool {
	if l.newest()+l.span+1 > now || l.lateUntil > now {
		return false
	}
	for _, e := range l.live() {
		if e.reserved && e.at+l.span+lateGrace > now {
			return false
		}
	}
	return true
}

// newest returns the instant of the newest entry, or floor.
func (l *windowLog) newest() int64 {
	if len(l.es) > l.head {
		return max(l.es[len(l.es)-1].at, l.floor)
	}
	return l.floor
}

// drop forgets the entries that left the window by now, keeping the slots
// of unclaimed reservations for grace µs more, and forgets those older.
func (l *windowLog) drop(now, window, grace int64) {
	l.lateFloor = max(l.lateFloor, now-window-grace)
	for l.head < len(l.es) && l.es[l.head].at <= now-window {
		e := &l.es[l.head]
		l.units -= e.n
		if e.named {
			delete(l.ids, e.id)
			if e.reserved && e.at > l.lateFloor {
				if l.late == nil {
					l.late = make(map[string]int64)
				}
				l.late[e.id] = e.at
				l.lateUntil = max(l.lateUntil, e.at+window+grace)
			}
		}
		*e = entry{}
		l.head++
	}
	if l.head == len(l.es) {
		l.es, l.head = l.es[:0], 0
	}
	if len(l.late) > 0 && now >= l.lateSweep {
		for id, slot := range l.late {
			if slot <= l.lateFloor {
				delete(l.late, id)
			}
		}
		l.lateSweep = now + window
	}
}

// lateSlot returns the slot of id's reservation if it left the window
// unclaimed and is still within its grace, and forgets it.
func (l *windowLog) lateSlot(id string) (int64, bool) {
	slot, ok := l.late[id]
	if ok {
		delete(l.late, id)
	}
	return slot, ok && slot > l.lateFloor
}

// insert adds e at its place: after every entry at or before e.at.
func (l *windowLog) insert(e entry) {
	l.units += e.n
	if e.named {
		if l.ids == nil {
			l.ids = make(map[string]int64)
		}
		l.ids[e.id] = e.at
	}
	live := l.live()
	i := len(live)
	if i > 0 && live[i-1].at > e.at {
		i = sort.Search(len(live), func(j int) bool { return live[j].at > e.at })
	} else if i > 0 && !e.named {
		// Anonymous admissions at the same instant share an entry.
		if last := &live[i-1]; last.at == e.at && !last.named && !last.reserved {
			last.n += e.n
			return
		}
	}
	if len(l.es) == cap(l.es) && l.head > 0 {
		// Reuse the room of dropped entries before growing.
		n := copy(l.es, l.es[l.head:])
		clear(l.es[n:])
		l.es, l.head = l.es[:n], 0
	}
	i += l.head
	l.es = append(l.es, entry{})
	copy(l.es[i+1:], l.es[i:])
	l.es[i] = e
}

// find returns the index in es of id's entry, or -1.
func (l *windowLog) find(id string) int {
	at, ok := l.ids[id]
	if !ok {
		return -1
	}
	live := l.live()
	i := sort.Search(len(live), func(j int) bool { return live[j].at >= at })
	for ; i < len(live) && live[i].at == at; i++ {
		if live[i].named && live[i].id == id {
			return l.head + i
		}
	}
	return -1
}

// remove deletes the entry at index i of es.
func (l *windowLog) remove(i int) {
	e := l.es[i]
	l.units -= e.n
	if e.named {
		delete(l.ids, e.id)
	}
	copy(l.es[i:], l.es[i+1:])
	l.es[len(l.es)-1] = entry{}
	l.es = l.es[:len(l.es)-1]
}

// replan plans the reservations ahead of now again at limit, as
// replan.lua does (see Redis.Replan), and returns the units moved or gone:
// none when every reservation still fits at its slot.
func (l *windowLog) replan(now, window int64, limit int) int {
	// Reservations of one slot in the order of their ids, as the Redis set
	// orders equal scores by member.
	for i := l.head; i < len(l.es); {
		j := i + 1
		for j < len(l.es) && l.es[j].at == l.es[i].at {
			j++
		}
		if l.es[i].at > now {
			sort.SliceStable(l.es[i:j], func(a, b int) bool {
				x, y := l.es[i+a], l.es[i+b]
				return x.reserved && y.reserved && x.id < y.id
			})
		}
		i = j
	}
	if _, moved := l.place(now, window, limit, false); moved == 0 {
		return 0
	}
	slots, moved := l.place(now, window, limit, true)
	for i := len(l.es) - 1; i >= l.head; i-- {
		switch at := slots[i-l.head]; {
		case at < 0:
			l.remove(i)
		case at != l.es[i].at:
			e := &l.es[i]
			e.at = at
			if e.named {
				l.ids[e.id] = at
			}
		}
	}
	return moved
}

// place returns the slot of each live entry once the reservations ahead
// of now are placed at limit in order (-1: a reservation of more units
// than limit, which never fits), and the units whose slot changed. Each
// goes to the earliest instant, no earlier than its slot, at which the
// window ending there, with the entries placed before it, has room; with
// spread, also no earlier than the reservation placed before it plus its
// share of the window (window / limit per unit).
func (l *windowLog) place(now, window int64, limit int, spread bool) ([]int64, int) {
	live := l.live()
	slots := make([]int64, len(live))
	pace := float64(window) / float64(limit)
	var nextAt int64             // no reservation before it, with spread
	moved, first, sum := 0, 0, 0 // live[first:i] placed within the window: sum units
	for i, e := range live {
		slots[i] = e.at
		if e.at <= now-window {
			first = i + 1
			continue
		}
		ahead := e.reserved && e.at > now
		if ahead && e.n > limit {
			slots[i] = -1
			moved += e.n
			continue
		}
		at := e.at
		if ahead && spread {
			at = max(at, nextAt)
		}
		for {
			for first < i && (slots[first] < 0 || slots[first] <= at-window) {
				if slots[first] >= 0 {
					sum -= live[first].n
				}
				first++
			}
			if !ahead || sum+e.n <= limit {
				break
			}
			at = slots[first] + window // the oldest in the window leaves
		}
		if at != e.at {
			moved += e.n
		}
		slots[i] = at
		sum += e.n
		if ahead {
			nextAt = max(nextAt, int64(float64(at)+float64(e.n)*pace))
		}
	}
	return slots, moved
}

// ahead returns what a claim of the reservation at slot is judged on: the
// units in (from, to] that were admitted or hold an earlier slot
// (reservations for the same or later slots, even overdue, are not ahead
// of it: whoever of them comes first goes first). When they
// and n more exceed limit, it also returns the instant the k-th oldest of
// them leaves, k = units + n - limit: where the claim fits.
func (l *windowLog) ahead(from, to, slot int64, n, limit int, window int64) (int, int64) {
	counts := func(e entry) bool { return e.at > from && e.at <= to && (!e.reserved || e.at < slot) }
	sum := 0
	for _, e := range l.live() {
		if counts(e) {
			sum += e.n
		}
	}
	if sum+n <= limit {
		return sum, 0
	}
	k := sum + n - limit
	for _, e := range l.live() {
		if counts(e) {
			if k -= e.n; k <= 0 {
				return sum, e.at + window
			}
		}
	}
	return sum, to + window // not reached: k <= sum
}

// kthUnit returns the instant of the k-th oldest unit (k >= 1) among the
// entries after from, or the newest instant if there are fewer.
func (l *windowLog) kthUnit(from int64, k int) int64 {
	at := l.newest()
	for _, e := range l.live() {
		if e.at <= from {
			continue
		}
		if k -= e.n; k <= 0 {
			return e.at
		}
	}
	return at
}

// limits are what one decision is made against: at most limit units in
// any window (µs); nominal is the limiter's own window, which ResetAfter
// counts in (window may be a µs longer, see instant).
type limits struct {
	limit           int
	window, nominal int64
	spaced          bool // WithSpacedReservations
}

// decide is the algorithm at the instant now (µs) for a request of cost n
// with identity id (withID), reserving up to horizon µs ahead (0: never),
// at a slot no earlier than now + after (µs; AllowIDAfter, else 0). The
// caller has checked n and holds the key's lock.
func (l *windowLog) decide(now int64, n int, id string, withID bool, horizon, after int64, lim limits) throttle.Decision {
	limit, window := lim.limit, lim.window
	l.span = window
	now = max(now, l.floor)
	g := grace(withID, horizon)
	l.drop(now, window, g)
	if withID {
		slot, claim := l.lateSlot(id)
		if i := l.find(id); i >= 0 {
			e := l.es[i]
			switch {
			case !e.reserved: // admitted and still counted: not charged again
				d := l.allowed(now, lim)
				d.AlreadyAdmitted = true
				return d
			case e.at > now && e.at >= now+after: // too early for its slot
				return l.rejected(now, e.at, true, lim)
			}
			// Its slot has come, or lies before now + after: given up,
			// claimed below or searched for anew from now + after.
			l.remove(i)
			slot, claim = e.at, true
		}
		if claim && after == 0 {
			// Its slot has come (or passed): admitted now if the last
			// window allows it. It is judged on the past alone, and only
			// on what is ahead of it (admissions, and reservations for
			// earlier slots): a late claim must not push
			// the schedule behind it, nor wait for reservations made
			// after it. If others came first, it is re-reserved where the
			// last window will allow it.
			if past, fit := l.ahead(now-window, now, slot, n, limit, window); past+n > limit {
				l.insert(entry{at: fit, n: n, id: id, named: true, reserved: true})
				return l.rejected(now, fit, true, lim)
			}
			return l.admit(now, n, id, true, lim)
		}
	}
	slot := now + after
	if l.units+n > limit {
		if last := l.newest(); lim.spaced && withID && last > now {
			// WithSpacedReservations: after the last reservation, by the
			// share of the window of n units.
			slot = max(slot, last+int64(n)*window/int64(limit))
		}
		slot = l.slot(now, slot, n, limit, window)
	}
	if slot == now {
		return l.admit(now, n, id, withID, lim)
	}
	if withID && slot-now <= horizon {
		l.insert(entry{at: slot, n: n, id: id, named: true, reserved: true})
		return l.rejected(now, slot, true, lim)
	}
	return l.rejected(now, slot, false, lim)
}

func (l *windowLog) admit(now int64, n int, id string, named bool, lim limits) throttle.Decision {
	l.insert(entry{at: now, n: n, id: id, named: named})
	l.floor = now
	return l.allowed(now, lim)
}

func (l *windowLog) allowed(now int64, lim limits) throttle.Decision {
	return throttle.Decision{
		Allowed:    true,
		Limit:      lim.limit,
		Remaining:  max(lim.limit-l.units, 0),
		ResetAfter: micros(l.newest() + lim.nominal - now),
		Source:     throttle.SourceLocal,
	}
}

func (l *windowLog) rejected(now, slot int64, reserved bool, lim limits) throttle.Decision {
	return throttle.Decision{
		Limit:      lim.limit,
		Remaining:  max(lim.limit-l.units, 0),
		RetryAfter: max(micros(slot-now), throttle.CeilMillisecond(1)),
		ResetAfter: micros(l.newest() + lim.nominal - now),
		Source:     throttle.SourceLocal,
		Reserved:   reserved,
	}
}

// slot returns the earliest instant >= from (>= now) at which n more
// units keep every window within limit, reservations included: the tail
// of the schedule, or a gap before it, however far ahead (a gap looked
// for only within some windows of from would leave a small request behind
// the tail when a long schedule has room for it further on, and a key of
// mixed costs would lose that room for good). The caller has found that
// the units held and n exceed limit.
func (l *windowLog) slot(now, from int64, n, limit int, window int64) int64 {
	tail := max(from, l.kthUnit(now-window, l.units+n-limit)+window)
	if l.newest() <= from {
		// Nothing ahead of from: the windows through it only lose units,
		// so the classic sliding window's instant is the first fit.
		return tail
	}
	return firstFit(l.live(), from, tail, tail, n, limit, window)
}

// firstFit returns the earliest s in [from, end) at which n more units fit
// among es (sorted by at), or tail if there is none. n units fit at s when
// the window ending at s holds at most limit-n units, and so does every
// window ending at an entry in (s, s+window): those are all the windows
// that contain s.
func firstFit(es []entry, from, end, tail int64, n, limit int, window int64) int64 {
	room := limit - n
	var (
		lo, hi int // entries in (s-window, s] are es[lo:hi]
		sum    int // their units
		q      int // the next entry that may end a full window
		qlo    int // entries in (es[q].at-window, es[q].at] start at qlo
		qsum   int // units of es[qlo:qhi]
		qhi    int
	)
	for s := from; s < end; {
		for hi < len(es) && es[hi].at <= s {
			sum += es[hi].n
			hi++
		}
		for lo < hi && es[lo].at <= s-window {
			sum -= es[lo].n
			lo++
		}
		// The first entry after s that ends a window holding more than
		// room, if it lies within (s, s+window).
		q = max(q, hi)
		bad := false
		for q < len(es) && es[q].at < s+window {
			for qhi < len(es) && es[qhi].at <= es[q].at {
				qsum += es[qhi].n
				qhi++
			}
			for qlo < qhi && es[qlo].at <= es[q].at-window {
				qsum -= es[qlo].n
				qlo++
			}
			if qsum > room {
				bad = true
				break
			}
			q = qhi
		}
		if sum <= room && !bad {
			return s
		}
		next := s + 1
		if sum > room {
			next = max(next, es[lo].at+window) // the oldest unit must leave first
		}
		if bad {
			next = max(next, es[q].at+1) // past the full window's end
		}
		s = next
	}
	return tail
}
