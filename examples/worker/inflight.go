package main

import (
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/concurrency"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// inFlightLease is the lease of every in-flight slot (-inflight). The
// consumers renew it every third while a handler runs, so it need not
// cover the job: it bounds how long a worker process that died keeps its
// slots, and how long a job refused a slot stays away (its retry-after is
// the earliest lease end of the tenant, so the refused jobs of a tenant
// come back about once a lease). Short, for throughput, yet with room for
// a renewal that is slow on a busy machine: 2/3 of it, 333 ms.
const inFlightLease = 500 * time.Millisecond

// newInFlight returns the in-flight limit of -inflight n per tenant: in
// Redis with keys under prefix when rc is not nil (shared by every worker
// process, each call bounded by timeout), else in process; nil for n ==
// 0.
func newInFlight(n int, rc *redis.Client, prefix string, timeout time.Duration) (throttle.InFlightLimiter, error) {
	switch {
	case n == 0:
		return nil, nil
	case n < 0:
		return nil, fmt.Errorf("-inflight: must be >= 0, got %d", n)
	case rc == nil:
		return concurrency.NewMemory(n)
	}
	return concurrency.NewRedis(rc, n, concurrency.WithPrefix(prefix), concurrency.WithTimeout(timeout))
}

// describeInFlight says how the handlers are limited, for the header.
func describeInFlight(n int, rc *redis.Client) string {
	if n == 0 {
		return ""
	}
	where := "in process"
	if rc != nil {
		where = "in Redis"
	}
	return fmt.Sprintf("; at most %s of a tenant at once (%s, lease %v)", plural(n, "handler"), where, inFlightLease)
}

// checkWork validates -work: a handler must ack within the consumer's
// AckWait, and does not send InProgress. Before it runs, a message may
// wait about a -work in the client's buffer (16 behind the 16 in flight)
// and about another for a free handler, so -work is kept below a quarter
// of the AckWait: at 2.4 s (below half) a backlog after the faults had 31
// jobs redelivered while they ran.
func checkWork(d time.Duration) error {
	if ackWait := consumerConfig().AckWait; d < 0 || d >= ackWait/4 {
		return fmt.Errorf("-work: must be >= 0 and below a quarter of the consumer's AckWait of %v (a message may wait about two -work before it runs), got %v", ackWait, d)
	}
	return nil
}

// maxInFlight returns the most runs that were running at once, each from
// its start to its end (a run without an end counts at its start only):
// runs are half-open intervals [At, End), so one ending as another starts
// does not overlap it.
func maxInFlight(runs []handled) int {
	type edge struct {
		at    int64
		delta int
	}
	edges := make([]edge, 0, 2*len(runs))
	for _, h := range runs {
		end := max(h.End, h.At)
		if end == h.At {
			end++ // an instant: still counted once
		}
		edges = append(edges, edge{h.At, 1}, edge{end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // ends first
	})
	now, most := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	return most
}

// describeWork says how long a handler takes, for the header.
func describeWork(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("; every handler takes %v", d)
}

// drainNote warns, before the run, when it cannot end before -timeout:
// the last job arrives at the trace's span, and with -work the NATS
// handlers (-handlers in each of instances processes, and -inflight
// n of them for a tenant) need their time. It returns "" when the run can
// end in time (rate limits aside), else a line saying what makes it
// longer.
func drainNote(jf jobsFile, cfg config, instances int) string {
	least := jf.span() + cfg.Work
	why := fmt.Sprintf("the last job arrives at %v", jf.span())
	if cfg.Work > 0 {
		handlers := cfg.Handlers * instances
		if d := time.Duration(len(jf.Jobs)) * cfg.Work / time.Duration(handlers); d > least {
			least, why = d, fmt.Sprintf("%s of %v on %s", plural(len(jf.Jobs), "job"), cfg.Work, plural(handlers, "handler"))
		}
		if cfg.InFlight > 0 {
			perTenant := map[string]int{}
			for _, j := range jf.Jobs {
				perTenant[j.Tenant]++
			}
			for _, t := range jf.tenants() {
				if d := time.Duration(perTenant[t]) * cfg.Work / time.Duration(min(cfg.InFlight, handlers)); d > least {
					least, why = d, fmt.Sprintf("%s's %s of %v, at most %d at once (-inflight)", t, plural(perTenant[t], "job"), cfg.Work, cfg.InFlight)
				}
			}
		}
	}
	if least <= cfg.Timeout {
		return ""
	}
	least = (least + time.Millisecond - 1).Truncate(time.Millisecond) // up: a bound from below
	return fmt.Sprintf("note: %s: the run takes at least %v, longer than -timeout %v; the jobs still waiting then are reported never handled (raise -timeout)\n",
		why, least, cfg.Timeout)
}
