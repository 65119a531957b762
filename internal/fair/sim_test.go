package fair

import (
	"container/heap"
	"math"
	"slices"
	"testing"
	"time"
)

// The simulations replay job traces through a Scheduler in virtual time
// (a fakeClock): every job holds a handler for its duration from its
// grant. They are deterministic, so their waits and spans are checked
// like any other result.

type simJob struct {
	key    string
	at     time.Duration // arrival
	dur    time.Duration // handler time
	start  time.Duration // -1 until granted
	defers int
	ticket *Ticket
}

// simMode is how messages reach the scheduler.
type simMode struct {
	// keyed: one waiting ticket per key, the rest counted as its backlog
	// (natsthrottle's per-key pulls); otherwise every message arrives and
	// may be deferred (natsthrottle's Handle, asynqthrottle).
	keyed bool
	// maxWait and early: a deferrable arrival waits at most maxWait; a
	// deferred one comes back early by that much before its slot.
	maxWait, early time.Duration
}

type simResult struct {
	jobs      []*simJob
	span      time.Duration // first arrival to last handler end
	ideal     time.Duration // the handler time over the handlers
	deferrals int
}

// simulate replays jobs (sorted by arrival) through a scheduler of cfg.
func simulate(tb testing.TB, cfg Config, mode simMode, jobs []*simJob) simResult {
	tb.Helper()
	clock := newFakeClock()
	cfg.Clock = clock
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	var granted []*Ticket
	s.onGrant = func(t *Ticket) { granted = append(granted, t) }
	byTicket := map[*Ticket]*simJob{}
	pending := map[string][]*simJob{} // keyed: arrived, not yet granted, head first
	arrivals := &jobHeap{}
	for _, j := range jobs {
		j.start = -1
		heap.Push(arrivals, simEvent{at: j.at, j: j})
	}
	ends := &jobHeap{}
	var total time.Duration
	for _, j := range jobs {
		total += j.dur
	}
	res := simResult{jobs: jobs, ideal: total / time.Duration(cfg.Handlers)}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	now := func() time.Duration { return clock.Now().Sub(t0) }

	offer := func(key string) { // keyed: the head of key waits for a handler
		q := pending[key]
		if len(q) == 0 || q[0].ticket != nil {
			return
		}
		t := s.Arrive(key, Arrival{})
		q[0].ticket = t
		byTicket[t] = q[0]
		s.SetBacklog(key, len(q)-1)
	}
	arrive := func(j *simJob) {
		if mode.keyed {
			pending[j.key] = append(pending[j.key], j)
			s.SetBacklog(j.key, len(pending[j.key])-1)
			if (*arrivals).Len() == 0 || (*arrivals)[0].at != j.at || (*arrivals)[0].j.key != j.key {
				offer(j.key) // after the key's last arrival of this instant
			}
			return
		}
		t := s.Arrive(j.key, Arrival{MaxWait: mode.maxWait, Returning: j.defers > 0})
		j.ticket = t
		byTicket[t] = j
	}
	var deferred []*Ticket
	s.onDefer = func(t *Ticket) { deferred = append(deferred, t) }
	for {
		// Deferrals of the last step come back when they were told to.
		for _, t := range deferred {
			j := byTicket[t]
			j.defers++
			res.deferrals++
			heap.Push(arrivals, simEvent{at: now() + max(t.delay-mode.early, 0), j: j})
		}
		deferred = deferred[:0]
		// Grants of the last step start their handlers now.
		for len(granted) > 0 {
			t := granted[0]
			granted = granted[1:]
			j := byTicket[t]
			j.start = now()
			heap.Push(ends, simEvent{at: now() + j.dur, j: j})
			if mode.keyed {
				pending[j.key] = pending[j.key][1:]
				offer(j.key)
			}
		}
		next := time.Duration(math.MaxInt64)
		if arrivals.Len() > 0 {
			next = (*arrivals)[0].at
		}
		if ends.Len() > 0 && (*ends)[0].at < next {
			next = (*ends)[0].at
		}
		if tm, ok := clock.next(); ok && tm.Sub(t0) < next {
			clock.advance(tm) // a timer may grant
			continue
		}
		if next == time.Duration(math.MaxInt64) {
			break
		}
		clock.advance(at(next))
		if ends.Len() > 0 && (*ends)[0].at == next {
			e := heap.Pop(ends).(simEvent)
			e.j.ticket.Done()
			res.span = max(res.span, next-jobs[0].at)
			continue
		}
		// Every arrival of this instant, as a broker would show them.
		for arrivals.Len() > 0 && (*arrivals)[0].at == next {
			arrive(heap.Pop(arrivals).(simEvent).j)
		}
	}
	for _, j := range jobs {
		if j.start < 0 {
			tb.Fatalf("job of %s arriving at %v never started", j.key, j.at)
		}
	}
	s.Stop()
	return res
}

type simEvent struct {
	at time.Duration
	j  *simJob
}

type jobHeap []simEvent

func (h jobHeap) Len() int           { return len(h) }
func (h jobHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h jobHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *jobHeap) Push(x any)        { *h = append(*h, x.(simEvent)) }
func (h *jobHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// traces

const work = 300 * time.Millisecond

// flood returns n jobs of key at t=0.
func flood(key string, n int) []*simJob {
	jobs := make([]*simJob, n)
	for i := range jobs {
		jobs[i] = &simJob{key: key, dur: work}
	}
	return jobs
}

// steady returns a job of key every interval from 0 to until.
func steady(key string, every, until time.Duration) []*simJob {
	var jobs []*simJob
	for at := time.Duration(0); at < until; at += every {
		jobs = append(jobs, &simJob{key: key, at: at, dur: work})
	}
	return jobs
}

// poisson returns jobs of key at rate per second from 0 to until, from a
// fixed linear congruential sequence.
func poisson(key string, rate float64, until time.Duration, seed uint64) []*simJob {
	var jobs []*simJob
	x := seed
	at := 0.0
	for {
		x = x*6364136223846793005 + 1442695040888963407
		u := float64(x>>11) / float64(1<<53)
		at += -math.Log(1-u) / rate
		if d := time.Duration(at * float64(time.Second)); d < until {
			jobs = append(jobs, &simJob{key: key, at: d, dur: work})
			continue
		}
		return jobs
	}
}

func trace(parts ...[]*simJob) []*simJob {
	var all []*simJob
	for _, p := range parts {
		all = append(all, p...)
	}
	slices.SortStableFunc(all, func(a, b *simJob) int { return int(a.at - b.at) })
	return all
}

// waits returns the waits (arrival to grant) of key's jobs, sorted.
func (r simResult) waits(key string) []time.Duration {
	var w []time.Duration
	for _, j := range r.jobs {
		if j.key == key {
			w = append(w, j.start-j.at)
		}
	}
	slices.Sort(w)
	return w
}

func p99(ds []time.Duration) time.Duration { return ds[int(0.99*float64(len(ds)-1))] }

// startsIn counts the grants of key in [from, to).
func (r simResult) startsIn(key string, from, to time.Duration) int {
	n := 0
	for _, j := range r.jobs {
		if j.key == key && j.start >= from && j.start < to {
			n++
		}
	}
	return n
}

// jain is Jain's fairness index of xs: 1 when all are equal.
func jain(xs ...float64) float64 {
	sum, sq := 0.0, 0.0
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}
