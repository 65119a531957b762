package main

import (
	"context"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// tenantLimiter routes each key (a tenant) to the window for the tenant's
// rate, so one Gate can enforce per-tenant limits. Tenants sharing a rate
// share one limiter (keys are separate inside it). It is safe for
// concurrent use.
type tenantLimiter struct {
	def   throttle.Limiter
	rate  throttle.Rate
	byKey map[string]throttle.Limiter

	// admitted, if set, is called for every admission with the clock read
	// just before and just after the limiter decided: the instant the
	// limiter counted the admission lies between the two.
	admitted func(key string, n int, before, after time.Time)
}

// newTenantLimiter builds one limiter per distinct rate among tenants, with
// newWindow; keys not among tenants use the rate of "".
func newTenantLimiter(tenants []string, rateOf func(string) throttle.Rate, newWindow func(throttle.Rate) (throttle.Limiter, error)) (*tenantLimiter, error) {
	byRate := map[throttle.Rate]throttle.Limiter{}
	get := func(r throttle.Rate) (throttle.Limiter, error) {
		if l, ok := byRate[r]; ok {
			return l, nil
		}
		l, err := newWindow(r)
		if err != nil {
			return nil, err
		}
		byRate[r] = l
		return l, nil
	}
	tl := &tenantLimiter{rate: rateOf(""), byKey: map[string]throttle.Limiter{}}
	var err error
	if tl.def, err = get(tl.rate); err != nil {
		return nil, err
	}
	for _, t := range tenants {
		if tl.byKey[t], err = get(rateOf(t)); err != nil {
			return nil, err
		}
	}
	return tl, nil
}

// AllowN asks the key's limiter.
func (l *tenantLimiter) AllowN(ctx context.Context, key string, n int) (throttle.Decision, error) {
	x, ok := l.byKey[key]
	if !ok {
		x = l.def
	}
	before := time.Now()
	d, err := x.AllowN(ctx, key, n)
	if err == nil && d.Allowed && l.admitted != nil {
		l.admitted(key, n, before, time.Now())
	}
	return d, err
}

// Rate returns the default rate; the Gate uses its Count as the Limit of
// degraded decisions.
func (l *tenantLimiter) Rate() throttle.Rate { return l.rate }

// Algorithm returns the algorithm of the windows.
func (l *tenantLimiter) Algorithm() string {
	if a, ok := l.def.(throttle.Algorithmer); ok {
		return a.Algorithm()
	}
	return "sliding_window_log"
}
