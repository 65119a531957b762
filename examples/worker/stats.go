package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// handled is one run of the job handler.
type handled struct {
	Tenant string `json:"tenant"`
	JobID  string `json:"job"`
	Ref    string `json:"ref"`            // the message: its stream sequence (NATS) or task ID (asynq)
	Proc   int    `json:"proc,omitempty"` // worker process (1..N) with -instances, else 0
	At     int64  `json:"at,omitempty"`   // when the handler started, Unix ns (0: when recorded)
	End    int64  `json:"end,omitempty"`  // when its work ended, before its ack, Unix ns (0: unknown)
	// Delivery is the broker's delivery count of the message that ran:
	// JetStream's NumDelivered, or asynq's retry count plus one (0:
	// unknown).
	Delivery uint64 `json:"delivery,omitempty"`
	// Received is when the delivery reached the worker, Unix ns (0:
	// unknown; asynq); it may have waited in the worker, held or for a
	// reserved slot, before the handler started.
	Received int64 `json:"received,omitempty"`
	// AckAt is when the broker confirmed the ack, Unix ns; 0 while it has
	// not (the ack failed, is still in flight, or its process died), and
	// always for asynq, whose completion the handler does not see.
	AckAt int64 `json:"ack_at,omitempty"`
}

// consumer says which consumer a recorder or report is about; the zero
// value is the JetStream consumer.
type consumer int

const (
	consumerNATS consumer = iota
	consumerAsynq
)

func (c consumer) String() string {
	if c == consumerAsynq {
		return "asynq"
	}
	return "NATS"
}

// published and rejections are the words of the summary for the jobs
// given to the consumer and for the throttle's rejections.
func (c consumer) published() string {
	if c == consumerAsynq {
		return "enqueued"
	}
	return "published"
}

func (c consumer) rejections() string {
	if c == consumerAsynq {
		return "rejections"
	}
	return "naks"
}

// ref is how the summary names the messages of duplicate runs.
func (c consumer) ref() string {
	if c == consumerAsynq {
		return "as tasks"
	}
	return "at stream seq"
}

// tenantStats are the per-tenant counters of a run.
type tenantStats struct {
	Published  int // jobs the stream stored (PubAck without Duplicate), or tasks enqueued
	Handled    int // handler runs (a job handled twice counts twice)
	Naks       int // NAKs the throttle sent, or asynq rejections
	Reserved   int // of those, the ones whose decision reserved the message's own slot
	Holds      int // messages the throttle held on their last delivery (sent InProgress)
	Terms      int // messages terminated (never admissible, e.g. a cost above the limit)
	MaxDeliver int // messages the server gave up on (MAX_DELIVERIES advisories)
	GivenUp    int // -core: messages natsthrottle.Core gave up (and reported)
}

// events is where the consumer of a run reports what happens: a recorder
// in this process, or, in a worker process of -instances, the records it
// sends to the main process.
type events interface {
	// admitted records an admission of n units for tenant, made at an
	// instant between before and after, with identity id ("" for none).
	admitted(tenant, id string, n int, before, after time.Time)
	handle(h handled)
	// acked records that the broker confirmed, at at, the ack of the
	// run of job id by process proc on delivery delivery.
	acked(id string, proc int, delivery uint64, at time.Time)
	// nak records a NAK sent at at; reserved reports that the decision
	// behind it reserved the message's own slot (Decision.Reserved).
	nak(tenant string, at time.Time, reserved bool)
	// hold records an InProgress for stream sequence seq, sent at at.
	hold(tenant string, seq uint64, at time.Time)
	term(tenant string)
	// givenUp records a core NATS message of tenant that the throttle
	// gave up (-core).
	givenUp(tenant string)
}

var _ events = (*recorder)(nil)

// recorder collects what happens during a run. It is safe for concurrent
// use.
type recorder struct {
	start    time.Time
	total    int           // jobs expected
	complete chan struct{} // closed when every job was handled or lost
	consumer consumer

	mu      sync.Mutex
	closed  bool // complete is closed
	tenants map[string]*tenantStats
	runs    []handled
	admits  map[string][]event         // tenant -> admissions
	returns map[string][]returned      // tenant -> NAKs or rejections, in the order recorded
	holdsAt map[string][]time.Duration // tenant -> first InProgress of each held message, from start
	faults  []faultMark
	byID    map[string]int // job id -> handler runs
	seqs    map[uint64]string
	held    map[uint64]bool
	naks    int
	pubs    int
	lost    int
	given   int                  // of lost: given up by natsthrottle.Core (-core), and reported
	procs   map[int]int          // worker process -> handler runs, with -instances
	rejects map[string]int       // job id -> rejections (asynq)
	arrived map[string]time.Time // job id -> when it was published

	// rateOf, if set, gives each tenant's limit for the progress lines;
	// weightOf its weight in the fair shares (nil: 1).
	rateOf   func(string) throttle.Rate
	weightOf func(string) float64
	// horizon is the reservations horizon, which bounds how late a
	// redelivery after a fault may run and still be explained by it.
	horizon time.Duration
}

func newRecorder(start time.Time, total int) *recorder {
	return &recorder{
		start: start, total: total, complete: make(chan struct{}),
		tenants: map[string]*tenantStats{}, byID: map[string]int{}, seqs: map[uint64]string{}, held: map[uint64]bool{},
		admits: map[string][]event{}, returns: map[string][]returned{}, holdsAt: map[string][]time.Duration{}, procs: map[int]int{}, rejects: map[string]int{}, arrived: map[string]time.Time{},
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

// published records that job id of tenant arrived now, as stream sequence
// seq (0 for asynq).
func (r *recorder) published(tenant, id string, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.arrived[id]; !ok {
		r.arrived[id] = time.Now()
	}
	r.tenant(tenant).Published++
	r.seqs[seq] = tenant
	r.pubs++
}

func (r *recorder) handle(h handled) {
	if h.At == 0 {
		h.At = time.Now().UnixNano()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(h.Tenant).Handled++
	r.runs = append(r.runs, h)
	r.byID[h.JobID]++
	if h.Proc > 0 {
		r.procs[h.Proc]++
	}
	r.check()
}

// acked sets the ack time of the last run of job id by process proc on
// delivery delivery.
func (r *recorder) acked(id string, proc int, delivery uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.runs) - 1; i >= 0; i-- {
		if h := &r.runs[i]; h.JobID == id && h.Proc == proc && h.Delivery == delivery && h.AckAt == 0 {
			h.AckAt = at.UnixNano()
			return
		}
	}
}

// runsBy returns the handler runs of worker process proc so far.
func (r *recorder) runsBy(proc int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[proc]
}

// admitted records an admission of n units for tenant, made at an instant
// between before and after, with identity id ("" for none).
func (r *recorder) admitted(tenant, id string, n int, before, after time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admits[tenant] = append(r.admits[tenant], event{lo: before.Sub(r.start), hi: after.Sub(r.start), n: n, id: id})
}

// refunded forgets tenant's last admission of id: the limiter gave it
// back (see recordingLimiter.Refund).
func (r *recorder) refunded(tenant, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.admits[tenant]
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].id == id {
			r.admits[tenant] = slices.Delete(evs, i, i+1)
			return
		}
	}
}

// returned is a NAK or an asynq rejection, at an offset from the start;
// reserved reports that its decision reserved the message's own slot.
type returned struct {
	at       time.Duration
	reserved bool
}

func (r *recorder) nak(tenant string, at time.Time, reserved bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.tenant(tenant)
	ts.Naks++
	if reserved {
		ts.Reserved++
	}
	r.naks++
	r.returns[tenant] = append(r.returns[tenant], returned{at: at.Sub(r.start), reserved: reserved})
}

// rejected records an asynq rejection of job id of tenant, at at.
func (r *recorder) rejected(tenant, id string, at time.Time, reserved bool) {
	r.nak(tenant, at, reserved)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejects[id]++
}

// hold records an InProgress for stream sequence seq; a message counts
// once however many heartbeats it gets, at its first.
func (r *recorder) hold(tenant string, seq uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held[seq] {
		r.held[seq] = true
		r.tenant(tenant).Holds++
		r.holdsAt[tenant] = append(r.holdsAt[tenant], at.Sub(r.start))
	}
}

// fault records a fault of kind injected at at, for the plot.
func (r *recorder) fault(kind string, at time.Time) {
	r.addFault(faultMark{Kind: kind, At: at.Sub(r.start)})
}

// addFault records a fault, with its instants as offsets from the start,
// for the summary, the report and the plot.
func (r *recorder) addFault(m faultMark) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, m)
}

// term records a terminated message: it is lost to the consumer.
func (r *recorder) term(tenant string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(tenant).Terms++
	r.lost++
	r.check()
}

// givenUp records a core NATS message of tenant that the throttle gave up
// (-core): core NATS cannot deliver it again, so it is lost to the
// consumer, and no longer waited for.
func (r *recorder) givenUp(tenant string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenant(tenant).GivenUp++
	r.lost++
	r.given++
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

// event is an admission of n units at an instant known to lie in
// [lo, hi] (the clock read before and after the limiter decided).
type event struct {
	lo, hi time.Duration
	n      int
	id     string // "" for none
}

// charged returns every tenant's admissions that charged the limiter
// (see charged): the admissions on the partner's key, with -partner.
func (r *recorder) charged() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for tenant, evs := range r.admits {
		out = append(out, charged(evs, r.rateOf(tenant).Per)...)
	}
	return out
}

// charged returns the events that charged the limiter: an id admitted
// again while an earlier charged admission of it may still be in the
// window of length per is admitted without a new charge (Gate.AdmitID: a
// redelivery, or a message refused an in-flight slot after its admission,
// perhaps by another worker process), so it is left out.
func charged(events []event, per time.Duration) []event {
	ev := append([]event(nil), events...)
	sort.SliceStable(ev, func(a, b int) bool { return ev[a].lo < ev[b].lo })
	last := map[string]time.Duration{} // id -> hi of its last charged admission
	out := ev[:0]
	for _, e := range ev {
		if e.id != "" {
			if hi, ok := last[e.id]; ok && e.lo < hi+per {
				continue
			}
			last[e.id] = e.hi
		}
		out = append(out, e)
	}
	return out
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
	MaxInWindow int    // most units admitted in any window of Rate.Per
	Bound       int    // the most the limiter may admit in such a window: the limit of a window, burst + refill for a bucket
	BoundText   string // how Bound is made up, e.g. "limit 20" or "bound 40 = burst 20 + refill 20"
	Twice       int    // jobs handled more than once, not all of it explained by the faults (see explainDuplicates)
	Explained   int    // jobs handled more than once, every extra run explained by a fault
	MustWait    int    // jobs that cannot start on arrival (see mustWait): each NAKed or waiting in process
	// WaitP50 and WaitP99 are percentiles of the time from a job's
	// arrival to its handler's (first) start.
	WaitP50, WaitP99 time.Duration
	// MaxInFlight is the most handlers of the tenant running at once,
	// each from its start to the end of its work (before its ack).
	MaxInFlight int
	// Weight is the tenant's weight in the fair shares of the handlers;
	// StartsPerS its handler starts in each whole second from the
	// replay's t=0, ending at its last start.
	Weight     float64
	StartsPerS []int
}

// Over reports whether the tenant was admitted more than its limiter's
// bound in some window.
func (t tenantReport) Over() bool { return t.MaxInWindow > t.Bound }

// report is the outcome of a run on one consumer. Without -redis it is the
// whole outcome; with -redis, the report of the JetStream consumer holds
// the asynq consumer's in Asynq.
type report struct {
	Consumer   consumer
	Jobs       int                 // jobs in the file
	Tenants    []tenantReport      // sorted by tenant
	Missing    []string            // job ids never handled
	Duplicates map[string][]string // job id -> message of each run (see handled.Ref), for ids run more than once not explained by the faults
	Explained  map[string][]string // the same for ids run more than once, every extra run explained by a fault
	Faults     []faultMark         // the faults injected, in order
	Elapsed    time.Duration

	// Span is from the first job's arrival to the last handler start;
	// Deliveries counts every delivery of a job to the throttle (NATS:
	// the consumer's deliveries; asynq: handler runs plus rejections).
	Span       time.Duration
	Deliveries int
	Fairness   fairness // of the handler starts across backlogged tenants

	Hybrid *bucket.HybridStats // decisions by source, with -limiter hybrid
	// Longest is the longest limiter decision and Timeout the Redis
	// limiters' per-call timeout (0 for in-process limiters).
	Longest, Timeout time.Duration
	InFlight         int         // -inflight: handlers of a tenant allowed at once (0: no limit)
	Instances        int         // worker processes, with -instances (else 0)
	Processes        map[int]int // handler runs per worker process, with -instances

	// asynq only.
	Queues         []string // the run's queues (see maxAsynqQueues)
	Archived       int      // archived tasks left in the queues at the end; -1 when unknown
	Failed         int      // tasks asynq counted as failed today in the queues
	MaxRetry       int      // of every task
	MostRejections int      // most rejections of one job

	Core     bool           // -core: the jobs went out on core NATS
	Requests *coreRequests  // -core: how the requests were answered
	Asynq    *report        // the asynq consumer, with -redis
	Partner  *partnerReport // -partner-quota: every consumer and process
	// natsConsumers names the JetStream consumers, for the summary.
	natsConsumers string

	timeline timeline // the run over time, for the sparklines and -plot
}

// ExactlyOnce reports whether every job was handled exactly one time.
func (r report) ExactlyOnce() bool {
	return len(r.Missing) == 0 && len(r.Duplicates) == 0 && len(r.Explained) == 0
}

// NoneLost reports whether every job was handled, and more than once only
// where the faults explain it (see explainDuplicates); with -core, every
// job not handled was given up and reported.
func (r report) NoneLost() bool {
	given := 0
	for _, t := range r.Tenants {
		given += t.GivenUp
	}
	return len(r.Missing) == given && len(r.Duplicates) == 0
}

// OK reports whether the run passes every check: every job handled, and
// more than once only where a fault explains it, no tenant over its
// limiter's bound nor (with -inflight) with more handlers at once than
// the in-flight limit, on each consumer, and no asynq task archived.
func (r report) OK() bool {
	if !r.NoneLost() || !r.WithinLimits() || !r.WithinInFlight() || r.Archived != 0 {
		return false
	}
	return r.Asynq == nil || r.Asynq.OK()
}

// WithinLimits reports whether no tenant was handled faster than its limit.
func (r report) WithinLimits() bool {
	for _, t := range r.Tenants {
		if t.Over() {
			return false
		}
	}
	return true
}

// OverInFlight reports whether the tenant had more handlers running at
// once than the in-flight limit n (0: no limit).
func (t tenantReport) OverInFlight(n int) bool { return n > 0 && t.MaxInFlight > n }

// WithinInFlight reports whether no tenant had more handlers running at
// once than the in-flight limit.
func (r report) WithinInFlight() bool {
	for _, t := range r.Tenants {
		if t.OverInFlight(r.InFlight) {
			return false
		}
	}
	return true
}

// summarize builds the report of a run over jobs, with the limit of each
// tenant from rateOf and the bound from spec.
func (r *recorder) summarize(jobs []job, rateOf func(string) throttle.Rate, spec limiterSpec) report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := report{Consumer: r.consumer, Jobs: len(jobs), Duplicates: map[string][]string{}, Explained: map[string][]string{},
		Faults: append([]faultMark(nil), r.faults...), Elapsed: time.Since(r.start)}
	for _, j := range jobs {
		if r.byID[j.ID] == 0 {
			rep.Missing = append(rep.Missing, j.ID)
		}
		r.tenant(j.Tenant)
	}
	dups := explainDuplicates(r.runs, r.faults, r.start, r.consumer, r.horizon)
	for _, h := range r.runs {
		switch d, ok := dups[h.JobID]; {
		case ok && d.unexplained > 0:
			rep.Duplicates[h.JobID] = append(rep.Duplicates[h.JobID], h.Ref)
		case ok:
			rep.Explained[h.JobID] = append(rep.Explained[h.JobID], h.Ref)
		}
	}
	waits, twice, explained, runs := map[string][]time.Duration{}, map[string]int{}, map[string]int{}, map[string][]handled{}
	first, last := time.Time{}, time.Time{}
	for _, t := range r.arrived {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	started := map[string]bool{}
	var times []jobTimes
	for _, h := range r.runs {
		runs[h.Tenant] = append(runs[h.Tenant], h)
		at := time.Unix(0, h.At)
		last = maxTime(last, at)
		if started[h.JobID] {
			continue
		}
		started[h.JobID] = true
		if arr, ok := r.arrived[h.JobID]; ok {
			waits[h.Tenant] = append(waits[h.Tenant], max(at.Sub(arr), 0))
			times = append(times, jobTimes{tenant: h.Tenant, arrived: arr, start: at})
		}
		switch d, ok := dups[h.JobID]; {
		case ok && d.unexplained > 0:
			twice[h.Tenant]++
		case ok:
			explained[h.Tenant]++
		}
	}
	if !first.IsZero() && last.After(first) {
		rep.Span = last.Sub(first)
	}
	waiting := mustWait(jobs, rateOf, spec)
	weightOf := r.weightOf
	if weightOf == nil {
		weightOf = func(string) float64 { return 1 }
	}
	starts := startsPerSecond(times, r.start)
	rep.Fairness = measureFairness(times, r.start, starts, weightOf, rateOf)
	for name, ts := range r.tenants {
		rate := rateOf(name)
		bound, text := spec.boundFor(name, rate)
		rep.Tenants = append(rep.Tenants, tenantReport{
			Tenant:      name,
			Rate:        rate,
			tenantStats: *ts,
			MaxInWindow: maxInWindow(charged(r.admits[name], rate.Per), rate.Per),
			Bound:       bound,
			BoundText:   text,
			Twice:       twice[name],
			Explained:   explained[name],
			MustWait:    waiting[name],
			WaitP50:     percentile(waits[name], 0.50),
			WaitP99:     percentile(waits[name], 0.99),
			MaxInFlight: maxInFlight(runs[name]),
			Weight:      weightOf(name),
			StartsPerS:  starts[name],
		})
		rep.Deliveries += ts.Handled + ts.Naks
	}
	if len(r.procs) > 0 {
		rep.Processes = map[int]int{}
		for p, n := range r.procs {
			rep.Processes[p] = n
		}
	}
	for _, n := range r.rejects {
		rep.MostRejections = max(rep.MostRejections, n)
	}
	sort.Slice(rep.Tenants, func(a, b int) bool { return rep.Tenants[a].Tenant < rep.Tenants[b].Tenant })
	sort.Strings(rep.Missing)
	rep.timeline = r.timelineLocked(rateOf, spec)
	return rep
}

// print writes the per-tenant summary of each consumer and, last, the
// exactly-once verdict.
func (rep report) print(w io.Writer) {
	if len(rep.Faults) > 0 {
		parts := make([]string, len(rep.Faults))
		for i, f := range rep.Faults {
			parts[i] = fmt.Sprintf("%s at t=%.1fs (recovered t=%.1fs)", f.Kind, f.At.Seconds(), f.Until.Seconds())
		}
		fmt.Fprintln(w, "faults injected: "+strings.Join(parts, ", "))
	}
	if rep.Asynq == nil {
		rep.printTable(w, "")
	} else {
		rep.printTable(w, "NATS JetStream, "+rep.natsConsumers+":")
		rep.Asynq.printTable(w, "asynq, "+queueNames(rep.Asynq.Queues)+":")
	}
	if rep.Partner != nil {
		fmt.Fprintln(w, rep.Partner.line())
	}
	if rep.Core {
		var given []string
		for _, t := range rep.Tenants {
			if t.GivenUp > 0 {
				given = append(given, fmt.Sprintf("%s %d", t.Tenant, t.GivenUp))
			}
		}
		if len(given) > 0 {
			fmt.Fprintln(w, "given up by the throttle, each reported (core NATS cannot deliver them again): "+strings.Join(given, ", "))
		}
		if rep.Requests != nil {
			fmt.Fprintln(w, rep.Requests.line())
		}
	}
	fmt.Fprintln(w, rep.verdict())
}

// printTable writes the per-tenant rows of one consumer, under heading
// unless it is empty, and what the limiter and the processes did.
func (rep report) printTable(w io.Writer, heading string) {
	if heading != "" {
		fmt.Fprintln(w, heading)
	}
	c := rep.Consumer
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	inFlightCol := ""
	if rep.InFlight > 0 {
		inFlightCol = "most in flight\t"
	}
	if c == consumerAsynq {
		fmt.Fprintf(tw, "tenant\trate\t%s\thandled\tmust wait\t%s\treserved\tlost\twait p50/p99\t%smost admitted in any window (cost units)\n", c.published(), c.rejections(), inFlightCol)
	} else {
		fmt.Fprintf(tw, "tenant\trate\t%s\thandled\tmust wait\t%s\treserved\tholds\tlost\twait p50/p99\t%smost admitted in any window (cost units)\n", c.published(), c.rejections(), inFlightCol)
	}
	for _, t := range rep.Tenants {
		verdict := ""
		if t.Over() {
			verdict = "  OVER THE LIMIT"
		}
		holds := fmt.Sprintf("%d\t", t.Holds)
		if c == consumerAsynq {
			holds = ""
		}
		inFlight := ""
		if rep.InFlight > 0 {
			inFlight = fmt.Sprintf("%d (limit %d)\t", t.MaxInFlight, rep.InFlight)
			if t.OverInFlight(rep.InFlight) {
				verdict += "  OVER THE IN-FLIGHT LIMIT"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s%d\t%s/%s\t%smax in any %v: %d (%s)%s\n",
			t.Tenant, t.Rate, t.Published, t.Handled, t.MustWait, t.Naks, t.Reserved, holds, t.Terms+t.MaxDeliver,
			roundWait(t.WaitP50), roundWait(t.WaitP99), inFlight, t.Rate.Per, t.MaxInWindow, t.BoundText, verdict)
	}
	tw.Flush()
	fmt.Fprintln(w, rep.Fairness)
	if lines := rep.timeline.sparklines(); len(lines) > 0 {
		fmt.Fprintln(w, "admissions per second over the run (one character a second; a full block is the limit;")
		fmt.Fprintln(w, "each admission at the middle of its decision's round trip, so a second may show a little over: the max in any window above is the exact count):")
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
	if rep.Timeout > 0 {
		fmt.Fprintf(w, "longest limiter decision: %v (each Redis call: timeout %v, plus one round trip for a reply on its way)\n",
			rep.Longest.Round(time.Millisecond), rep.Timeout)
	}
	if h := rep.Hybrid; h != nil {
		line := fmt.Sprintf("hybrid decisions: %d local, %d Redis, %d degraded", h.Local, h.Redis, h.Degraded)
		if h.Errors > 0 {
			line += fmt.Sprintf(", %d errors", h.Errors)
		}
		if n := h.Local + h.Redis; n > 0 {
			line += fmt.Sprintf(" (%.0f%% without a Redis round trip)", 100*float64(h.Local)/float64(n))
		}
		fmt.Fprintln(w, line)
		fmt.Fprintf(w, "(a hybrid's bound counts the refill over the window plus the %v a leased token may be held)\n", hybridHold)
	}
	if rep.Instances > 0 {
		// #1..#Instances, and the replacements of killed ones after them.
		n := rep.Instances
		for p := range rep.Processes {
			n = max(n, p)
		}
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf("#%d %d", i+1, rep.Processes[i+1])
		}
		fmt.Fprintf(w, "jobs handled per worker process: %s\n", strings.Join(parts, ", "))
	}
	if len(rep.Explained) > 0 {
		fmt.Fprintf(w, "handled again after a fault (explained: the broker delivered again a message whose ack the fault lost; handlers must be idempotent for this): %s\n",
			rep.runsText(rep.Explained))
	}
	if c == consumerAsynq {
		archived := strconv.Itoa(rep.Archived)
		if rep.Archived < 0 {
			archived = "unknown"
		}
		fmt.Fprintf(w, "asynq: %s archived, %d failed; at most %s of one task, with MaxRetry %d\n",
			archived, rep.Failed, plural(rep.MostRejections, "rejection"), rep.MaxRetry)
		if rep.Failed > 0 {
			fmt.Fprintln(w, "(failed: attempts asynq counted as failures: a handler's error, or a lease that expired, as when a Redis fault lost a run's completion and asynq's recoverer ran the task again; rejections are not counted)")
		}
	}
}

// verdict is the last line of the summary: OK, or FAIL and why.
func (rep report) verdict() string {
	v := rep.deliveryVerdict()
	over := rep.overLimits()
	switch {
	case over == "":
		return v
	case strings.HasPrefix(v, "FAIL"):
		return v + "; and over the limit: " + over
	}
	return "FAIL: over the limit: " + over
}

// deliveryVerdict is the verdict on deliveries alone: every job handled
// exactly once (or again, explained by a fault), none lost.
func (rep report) deliveryVerdict() string {
	if rep.Core {
		return rep.coreVerdict()
	}
	if rep.Asynq == nil {
		by := ""
		if rep.Instances > 0 {
			by = fmt.Sprintf(" across %d worker processes", rep.Instances)
		}
		switch {
		case rep.ExactlyOnce():
			return fmt.Sprintf("OK: all %s handled exactly once%s in %.1fs", plural(rep.Jobs, "job"), by, rep.Elapsed.Seconds())
		case rep.NoneLost():
			return fmt.Sprintf("OK: all %s handled%s in %.1fs, none lost; %s handled again after a fault (explained: the broker redelivered them), none otherwise",
				plural(rep.Jobs, "job"), by, rep.Elapsed.Seconds(), plural(len(rep.Explained), "job"))
		}
		return "FAIL: not every job handled exactly once: " + rep.failures()
	}
	a := rep.Asynq
	elapsed := max(rep.Elapsed, a.Elapsed)
	if rep.ExactlyOnce() && a.ExactlyOnce() && a.Archived == 0 {
		return fmt.Sprintf("OK: all %s handled exactly once on NATS and on asynq, 0 archived, in %.1fs", plural(rep.Jobs, "job"), elapsed.Seconds())
	}
	if rep.NoneLost() && a.NoneLost() && a.Archived == 0 {
		return fmt.Sprintf("OK: all %s handled on NATS and on asynq, none lost, 0 archived, in %.1fs; handled again after a fault (explained: the broker redelivered them), none otherwise: %d on NATS, %d on asynq",
			plural(rep.Jobs, "job"), elapsed.Seconds(), len(rep.Explained), len(a.Explained))
	}
	archived := strconv.Itoa(a.Archived)
	if a.Archived < 0 {
		archived = "unknown"
	}
	return fmt.Sprintf("FAIL: not every job handled exactly once: NATS: %s; asynq: %s, %s archived", rep.failures(), a.failures(), archived)
}

// coreVerdict is deliveryVerdict for -core: on core NATS every job
// handled exactly once or given up and reported; with -redis, on asynq
// every job handled exactly once, none archived.
func (rep report) coreVerdict() string {
	given := 0
	for _, t := range rep.Tenants {
		given += t.GivenUp
	}
	a := rep.Asynq
	switch {
	case !rep.NoneLost() || len(rep.Explained) > 0:
		return "FAIL: not every job handled exactly once or given up and reported on core NATS: " + rep.failures()
	case a != nil && (!a.ExactlyOnce() || a.Archived != 0):
		return fmt.Sprintf("FAIL: not every job handled exactly once on asynq: %s, %d archived", a.failures(), a.Archived)
	}
	onAsynq, elapsed := "", rep.Elapsed
	if a != nil {
		onAsynq, elapsed = ", and exactly once on asynq, 0 archived,", max(elapsed, a.Elapsed)
	}
	if given == 0 {
		return fmt.Sprintf("OK: all %s handled exactly once on core NATS%s in %.1fs", plural(rep.Jobs, "job"), onAsynq, elapsed.Seconds())
	}
	return fmt.Sprintf("OK: %d of %s handled exactly once on core NATS, %d given up and reported (core NATS cannot deliver them again)%s in %.1fs",
		rep.Jobs-given, plural(rep.Jobs, "job"), given, onAsynq, elapsed.Seconds())
}

// overLimits names the tenants, per consumer, that went over their
// limiter's bound or (with -inflight) the in-flight limit; "" for none.
func (rep report) overLimits() string {
	var over []string
	for _, r := range []*report{&rep, rep.Asynq} {
		if r == nil {
			continue
		}
		for _, t := range r.Tenants {
			if t.Over() {
				over = append(over, fmt.Sprintf("%s %s %d in one window (%s)", r.Consumer, t.Tenant, t.MaxInWindow, t.BoundText))
			}
			if t.OverInFlight(r.InFlight) {
				over = append(over, fmt.Sprintf("%s %s %d in flight (limit %d)", r.Consumer, t.Tenant, t.MaxInFlight, r.InFlight))
			}
		}
	}
	return strings.Join(over, "; ")
}

// failures says which jobs were not handled exactly once.
func (rep report) failures() string {
	var b strings.Builder
	lost := 0
	for _, t := range rep.Tenants {
		lost += t.Terms + t.MaxDeliver + t.GivenUp
	}
	if lost > 0 {
		// Lost jobs are unhandled too, but the broker gave up on them: the
		// rest were still waiting when the run ended.
		fmt.Fprintf(&b, "%d of %d not handled (%s): %d lost (terminated, or dropped at MaxDeliver), %d never handled",
			len(rep.Missing), rep.Jobs, sample(rep.Missing), lost, max(len(rep.Missing)-lost, 0))
	} else {
		fmt.Fprintf(&b, "%d of %d never handled", len(rep.Missing), rep.Jobs)
		if len(rep.Missing) > 0 {
			b.WriteString(" (" + sample(rep.Missing) + ")")
		}
	}
	fmt.Fprintf(&b, ", %d handled more than once", len(rep.Duplicates))
	if len(rep.Duplicates) > 0 {
		b.WriteString(" (" + rep.runsText(rep.Duplicates) + ")")
	}
	if len(rep.Explained) > 0 {
		fmt.Fprintf(&b, ", %d more handled again after a fault (explained)", len(rep.Explained))
	}
	return b.String()
}

// runsText lists a sample of the jobs of dups with their runs, as
// "acme-012 x2 at stream seq [14 14]".
func (rep report) runsText(dups map[string][]string) string {
	ids := make([]string, 0, len(dups))
	for id, refs := range dups {
		ids = append(ids, fmt.Sprintf("%s x%d %s [%s]", id, len(refs), rep.Consumer.ref(), strings.Join(refs, " ")))
	}
	sort.Strings(ids)
	return sample(ids)
}

// sample joins up to 5 items, with "..." when there are more.
func sample(items []string) string {
	if len(items) <= 5 {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:5], ", ") + ", ..."
}

// percentile returns the p-quantile (0 < p <= 1) of ds, nearest rank, or 0
// for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// roundWait rounds a wait for the summary: to the ms below 10 s, else to
// the tenth of a second.
func roundWait(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
