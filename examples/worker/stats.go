package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// handled is one run of the job handler.
type handled struct {
	Tenant string
	JobID  string
	Seq    uint64 // stream sequence of the message
}

// tenantStats are the per-tenant counters of a run.
type tenantStats struct {
	Published  int // jobs the stream stored (PubAck without Duplicate)
	Handled    int // handler runs (a job handled twice counts twice)
	Naks       int // NAKs the throttle sent
	Holds      int // messages the throttle held on their last delivery (sent InProgress)
	Terms      int // messages terminated (never admissible, e.g. a cost above the limit)
	MaxDeliver int // messages the server gave up on (MAX_DELIVERIES advisories)
}

// recorder collects what happens during a run. It is safe for concurrent
// use.
type recorder struct {
	start    time.Time
	total    int           // jobs expected
	complete chan struct{} // closed when every job was handled or lost

	mu      sync.Mutex
	closed  bool // complete is closed
	tenants map[string]*tenantStats
	runs    []handled
	admits  map[string][]event // tenant -> admissions
	byID    map[string]int     // job id -> handler runs
	seqs    map[uint64]string
	held    map[uint64]bool
	naks    int
	pubs    int
	lost    int
}

func newRecorder(start time.Time, total int) *recorder {
	return &recorder{
		start: start, total: total, complete: make(chan struct{}),
		tenants: map[string]*tenantStats{}, byID: map[string]int{}, seqs: map[uint64]string{}, held: map[uint64]bool{},
		admits: map[string][]event{},
	}
}

// check closes complete once every job was handled or lost. r.mu is held.
func (r *recorder) check() {
	if !r.closed && len(r.byID)+r.lost >= r.total {
		r.closed = true
		close(r.complete)
	}
}

func (r *recorder) tenant(name string) *tenantStats {
	ts := r.tenants[name]
	if ts == nil {
		ts = &tenantStats{}
		r.tenants[name] = ts
	}
	return ts
}

func (r *recorder) published(tenant string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(tenant).Published++
	r.seqs[seq] = tenant
	r.pubs++
}

func (r *recorder) handle(h handled) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(h.Tenant).Handled++
	r.runs = append(r.runs, h)
	r.byID[h.JobID]++
	r.check()
}

// admitted records an admission of n units for tenant, made at an instant
// between before and after.
func (r *recorder) admitted(tenant string, n int, before, after time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admits[tenant] = append(r.admits[tenant], event{lo: before.Sub(r.start), hi: after.Sub(r.start), n: n})
}

func (r *recorder) nak(tenant string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(tenant).Naks++
	r.naks++
}

// hold records an InProgress for stream sequence seq; a message counts
// once however many heartbeats it gets.
func (r *recorder) hold(tenant string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held[seq] {
		r.held[seq] = true
		r.tenant(tenant).Holds++
	}
}

// term records a terminated message: it is lost to the consumer.
func (r *recorder) term(tenant string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(tenant).Terms++
	r.lost++
	r.check()
}

// maxDelivered records that the server stopped delivering stream sequence
// seq: the job is lost to this consumer.
func (r *recorder) maxDelivered(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(r.seqs[seq]).MaxDeliver++
	r.lost++
	r.check()
}

// progressLine returns a line such as
// "t=3.5s published 200/368 handled 120/368 naks 40".
func (r *recorder) progressLine() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := fmt.Sprintf("t=%.1fs published %d/%d handled %d/%d naks %d",
		time.Since(r.start).Seconds(), r.pubs, r.total, len(r.byID), r.total, r.naks)
	if r.lost > 0 {
		line += fmt.Sprintf(" lost %d", r.lost)
	}
	return line
}

// event is an admission of n units at an instant known to lie in
// [lo, hi] (the clock read before and after the limiter decided).
type event struct {
	lo, hi time.Duration
	n      int
}

// maxInWindow returns the most units admitted in any window of length per,
// as in the sliding window log: an admission at t counts during
// [t, t+per). It counts only what certainly shares a window, so the
// uncertainty of [lo, hi] never inflates the result: for each event i (by
// lo), the events j with lo_j >= lo_i and hi_j < lo_i + per. With lo == hi
// it is the exact maximum.
func maxInWindow(events []event, per time.Duration) int {
	ev := append([]event(nil), events...)
	sort.SliceStable(ev, func(a, b int) bool { return ev[a].lo < ev[b].lo })
	best := 0
	for i := range ev {
		end, sum := ev[i].lo+per, 0
		for j := i; j < len(ev) && ev[j].lo < end; j++ {
			if ev[j].hi < end {
				sum += ev[j].n
			}
		}
		best = max(best, sum)
	}
	return best
}

// tenantReport is one row of the summary.
type tenantReport struct {
	Tenant string
	Rate   throttle.Rate
	tenantStats
	MaxInWindow int // most units admitted in any window of Rate.Per
}

// Over reports whether the tenant was handled faster than its limit.
func (t tenantReport) Over() bool { return t.MaxInWindow > t.Rate.Count }

// report is the outcome of a run.
type report struct {
	Jobs       int                 // jobs in the file
	Tenants    []tenantReport      // sorted by tenant
	Missing    []string            // job ids never handled
	Duplicates map[string][]uint64 // job id -> stream sequence of each run, for ids run more than once
	Elapsed    time.Duration
}

// ExactlyOnce reports whether every job was handled exactly one time.
func (r report) ExactlyOnce() bool { return len(r.Missing) == 0 && len(r.Duplicates) == 0 }

// WithinLimits reports whether no tenant was handled faster than its limit.
func (r report) WithinLimits() bool {
	for _, t := range r.Tenants {
		if t.Over() {
			return false
		}
	}
	return true
}

// summarize builds the report of a run over jobs, with the limit of each
// tenant from rateOf.
func (r *recorder) summarize(jobs []job, rateOf func(string) throttle.Rate) report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := report{Jobs: len(jobs), Duplicates: map[string][]uint64{}, Elapsed: time.Since(r.start)}
	for _, j := range jobs {
		if r.byID[j.ID] == 0 {
			rep.Missing = append(rep.Missing, j.ID)
		}
		r.tenant(j.Tenant)
	}
	for _, h := range r.runs {
		if r.byID[h.JobID] > 1 {
			rep.Duplicates[h.JobID] = append(rep.Duplicates[h.JobID], h.Seq)
		}
	}
	for name, ts := range r.tenants {
		rate := rateOf(name)
		rep.Tenants = append(rep.Tenants, tenantReport{
			Tenant:      name,
			Rate:        rate,
			tenantStats: *ts,
			MaxInWindow: maxInWindow(r.admits[name], rate.Per),
		})
	}
	sort.Slice(rep.Tenants, func(a, b int) bool { return rep.Tenants[a].Tenant < rep.Tenants[b].Tenant })
	sort.Strings(rep.Missing)
	return rep
}

// print writes the per-tenant summary and, last, the exactly-once verdict.
func (rep report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "tenant\trate\tpublished\thandled\tnaks\tholds\tlost\tmost admitted in any window (cost units)")
	for _, t := range rep.Tenants {
		verdict := ""
		if t.Over() {
			verdict = "  OVER THE LIMIT"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\tmax in any %v: %d (limit %d)%s\n",
			t.Tenant, t.Rate, t.Published, t.Handled, t.Naks, t.Holds, t.Terms+t.MaxDeliver, t.Rate.Per, t.MaxInWindow, t.Rate.Count, verdict)
	}
	tw.Flush()
	if rep.ExactlyOnce() {
		fmt.Fprintf(w, "OK: all %d jobs handled exactly once in %.1fs\n", rep.Jobs, rep.Elapsed.Seconds())
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "FAIL: not every job handled exactly once: %d of %d never handled", len(rep.Missing), rep.Jobs)
	if len(rep.Missing) > 0 {
		b.WriteString(" (" + sample(rep.Missing) + ")")
	}
	fmt.Fprintf(&b, ", %d handled more than once", len(rep.Duplicates))
	if len(rep.Duplicates) > 0 {
		ids := make([]string, 0, len(rep.Duplicates))
		for id, seqs := range rep.Duplicates {
			ids = append(ids, fmt.Sprintf("%s x%d at stream seq %v", id, len(seqs), seqs))
		}
		sort.Strings(ids)
		b.WriteString(" (" + sample(ids) + ")")
	}
	fmt.Fprintln(w, b.String())
}

// sample joins up to 5 items, with "..." when there are more.
func sample(items []string) string {
	if len(items) <= 5 {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:5], ", ") + ", ..."
}
