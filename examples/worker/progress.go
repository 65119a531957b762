package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// progressLine returns the progress of the run: a line of totals such as
// "t=3.5s published 200/368 handled 120/368 naks 40" (for asynq,
// "asynq enqueued 200/368 handled 100/368 rejections 50"), then a line of
// each tenant's handler runs per second over the last window of its limit
// against the limit, e.g.
// "  handled/s in the last window, of the limit: acme 20/20  initech 10/10".
// Over a whole window, a tenant at its limit shows the limit exactly:
// shorter spans would show the bursts a window allows as beyond it.
func (r *recorder) progressLine() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	line := fmt.Sprintf("t=%.1fs", now.Sub(r.start).Seconds())
	if r.consumer == consumerAsynq {
		line = "asynq"
	}
	line += fmt.Sprintf(" %s %d/%d handled %d/%d %s %d",
		r.consumer.published(), r.pubs, r.total, len(r.byID), r.total, r.consumer.rejections(), r.naks)
	if r.given > 0 {
		line += fmt.Sprintf(" given up %d", r.given)
	}
	if r.lost > r.given {
		line += fmt.Sprintf(" lost %d", r.lost-r.given)
	}
	if len(r.tenants) == 0 {
		return line
	}
	rateOf := r.rateOf
	if rateOf == nil {
		rateOf = func(string) throttle.Rate { return throttle.PerSecond(1) }
	}
	names := make([]string, 0, len(r.tenants))
	for name := range r.tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	inWindow := map[string]int{}
	for _, h := range r.runs {
		if now.Sub(time.Unix(0, h.At)) < rateOf(h.Tenant).Per {
			inWindow[h.Tenant]++
		}
	}
	parts := make([]string, 0, len(names))
	for _, name := range names {
		rate := rateOf(name)
		part := name + " " + perSecond(float64(inWindow[name])/rate.Per.Seconds())
		if r.rateOf != nil {
			part += "/" + perSecond(float64(rate.Count)/rate.Per.Seconds())
		}
		parts = append(parts, part)
	}
	head := "handled/s in the last window"
	if r.rateOf != nil {
		head += ", of the limit"
	}
	return line + "\n  " + head + ": " + strings.Join(parts, "  ")
}

// perSecond formats a rate: whole numbers without decimals, others with
// one.
func perSecond(v float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0")
}
