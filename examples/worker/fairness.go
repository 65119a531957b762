package main

import (
	"fmt"
	"math"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// fairness is how evenly the handlers went to the tenants that wanted more
// of them than they got: for every whole second of the replay (from its
// t=0, the origin of at_ms) in which two or more tenants were backlogged
// on the handlers (each had a job that arrived before the second began
// and started only after it ended, and started fewer jobs in it than its
// rate allows in a second: waiting for handlers, not for its rate), Jain's
// index of their handler starts in that second, each divided by its
// tenant's weight: 1 when each got its weight's part, 1/n when one of n
// got them all (R. Jain, D. Chiu, W. Hawe, "A quantitative measure of
// fairness and discrimination for resource allocation in shared computer
// systems", DEC-TR-301, 1984).
type fairness struct {
	Seconds int     // seconds with two or more tenants backlogged (and a start)
	Mean    float64 // Jain's index over those seconds
	Min     float64
}

// jain is Jain's index of xs: (sum x)^2 / (n sum x^2).
func jain(xs []float64) float64 {
	sum, sq := 0.0, 0.0
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// jobTimes is one job's arrival and first handler start.
type jobTimes struct {
	tenant         string
	arrived, start time.Time
}

// startsPerSecond counts each tenant's first handler starts in each whole
// second from origin: a list ending at the tenant's last start.
func startsPerSecond(jobs []jobTimes, origin time.Time) map[string][]int {
	out := map[string][]int{}
	for _, j := range jobs {
		s := int(max(j.start.Sub(origin), 0) / time.Second)
		c := out[j.tenant]
		for len(c) <= s {
			c = append(c, 0)
		}
		c[s]++
		out[j.tenant] = c
	}
	return out
}

// measureFairness computes the fairness of a run of jobs, with the
// tenants' weights from weight and their rates from rateOf, from starts
// (startsPerSecond).
func measureFairness(jobs []jobTimes, origin time.Time, starts map[string][]int, weight func(string) float64, rateOf func(string) throttle.Rate) fairness {
	// backlog[t][s] > 0: tenant t was backlogged through second s.
	backlog := map[string][]int{}
	for _, j := range jobs {
		from := int(math.Floor(j.arrived.Sub(origin).Seconds())) + 1 // arrived before s
		to := int(math.Floor(j.start.Sub(origin).Seconds())) - 1     // started after s+1
		if to < from || to < 0 {
			continue
		}
		from = max(from, 0)
		b := backlog[j.tenant]
		for len(b) <= to+1 {
			b = append(b, 0)
		}
		b[from]++ // a difference array, summed below
		b[to+1]--
		backlog[j.tenant] = b
	}
	last := 0
	for t, b := range backlog {
		for s := 1; s < len(b); s++ {
			b[s] += b[s-1]
		}
		last = max(last, len(b))
		backlog[t] = b
	}
	f := fairness{Min: 1}
	sum := 0.0
	for s := range last {
		var xs []float64
		for t, b := range backlog {
			if s >= len(b) || b[s] == 0 {
				continue
			}
			n := 0
			if c := starts[t]; s < len(c) {
				n = c[s]
			}
			if r := rateOf(t); r.Per > 0 && float64(n) >= float64(r.Count)*float64(time.Second)/float64(r.Per) {
				continue // held by its rate, not by the handlers
			}
			xs = append(xs, float64(n)/weight(t))
		}
		if len(xs) < 2 || allZero(xs) {
			continue
		}
		j := jain(xs)
		f.Seconds++
		sum += j
		f.Min = min(f.Min, j)
	}
	if f.Seconds > 0 {
		f.Mean = sum / float64(f.Seconds)
	} else {
		f.Min = 0
	}
	return f
}

func allZero(xs []float64) bool {
	for _, x := range xs {
		if x != 0 {
			return false
		}
	}
	return true
}

// String is the summary's line.
func (f fairness) String() string {
	if f.Seconds == 0 {
		return "fairness: no second had two or more tenants backlogged on the handlers"
	}
	return fmt.Sprintf("fairness: Jain's index of the handler starts per weight, over the %s with two or more tenants backlogged on the handlers: mean %.4f, min %.4f (1 = each its weight's part)",
		plural(f.Seconds, "second"), f.Mean, f.Min)
}
