package throttle

import (
	"sync"
	"time"
)

// Default rate of reports: a burst of 3, then 2 per second.
const (
	sampleBurst = 3
	sampleEvery = 500 * time.Millisecond
)

// sampler rate-limits reports (log lines, error handler calls) of events
// that can come at the rate of decisions, such as store failures: it lets
// through at most burst reports at once and one per every after that, and
// counts the events it kept back, which the next report carries. It is
// safe for concurrent use. The zero sampler lets sampleBurst through, then
// one per sampleEvery.
type sampler struct {
	mu      sync.Mutex
	every   time.Duration
	burst   int
	tokens  time.Duration // credit, in units of time: every per report
	last    time.Time
	skipped int
	started bool
}

// allow reports whether an event at now should be reported, and, if so,
// how many events were not reported since the last report.
func (s *sampler) allow(now time.Time) (ok bool, skipped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	every, burst := s.every, s.burst
	if every <= 0 {
		every = sampleEvery
	}
	if burst <= 0 {
		burst = sampleBurst
	}
	capacity := time.Duration(burst) * every
	if !s.started {
		s.started, s.tokens, s.last = true, capacity, now
	} else if el := now.Sub(s.last); el > 0 {
		s.tokens = min(s.tokens+el, capacity)
		s.last = now
	}
	if s.tokens < every {
		s.skipped++
		return false, 0
	}
	s.tokens -= every
	skipped, s.skipped = s.skipped, 0
	return true, skipped
}

// onceSet remembers texts, up to a bound, so that something is said once
// per distinct text. It is safe for concurrent use. The zero onceSet is
// ready.
type onceSet struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// maxOnce is how many distinct texts a onceSet remembers; past it, first
// reports false for every new text (a flood of distinct texts is not a
// persistent failure worth one line each).
const maxOnce = 32

// first reports whether text is seen for the first time.
func (o *onceSet) first(text string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.seen[text]; ok || len(o.seen) >= maxOnce {
		return false
	}
	if o.seen == nil {
		o.seen = make(map[string]struct{})
	}
	o.seen[text] = struct{}{}
	return true
}
