package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/quota"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// quotas are the per-tenant limits of a run: -rate (with -burst) for
// every tenant, overridden by the jobs file's rate lines and then by the
// lines of the -rates file, which may set a burst:
//
//	# tenant  quota (throttle.ParseQuota)
//	initech   10/1s
//	globex    50/1s burst 100
//
// The limiters get them through WithQuotas: from this map in process, and
// with -redis from a Redis hash (quota.RedisHash) that the worker fills
// at start, so that `redis-cli HSET <prefix>quotas <tenant> <quota>`
// changes a tenant's limit during the run, in every worker process within
// a second. The report judges each tenant against its quota at the end.
type quotas struct {
	def      throttle.Quota // -rate, and -burst (0: the rate's count)
	byTenant map[string]throttle.Quota
	tenants  []string // of the jobs file, sorted
	hashKey  string   // the Redis hash, with -redis (set by the caller)
	hash     *quota.RedisHash
}

// loadQuotas reads -rate, -burst, the jobs file's rate lines and -rates.
func loadQuotas(cfg config, jf jobsFile) (*quotas, error) {
	defRate, err := throttle.ParseRate(cfg.Rate)
	if err == nil {
		err = checkPeriod(defRate)
	}
	if err != nil {
		return nil, fmt.Errorf("-rate: %w", err)
	}
	q := &quotas{def: throttle.Quota{Rate: defRate, Burst: cfg.Burst}, byTenant: map[string]throttle.Quota{}, tenants: jf.tenants()}
	for t, r := range jf.Rates {
		q.byTenant[t] = throttle.Quota{Rate: r, Burst: cfg.Burst}
	}
	if cfg.RatesPath == "" {
		return q, nil
	}
	f, err := os.Open(cfg.RatesPath)
	if err != nil {
		return nil, fmt.Errorf("-rates: %w", err)
	}
	defer f.Close()
	lines, err := parseRates(f)
	if err != nil {
		return nil, fmt.Errorf("-rates %s: %w", cfg.RatesPath, err)
	}
	for t, tq := range lines {
		if tq.Burst == 0 {
			tq.Burst = cfg.Burst
		}
		q.byTenant[t] = tq
	}
	return q, nil
}

// parseRates reads the lines "TENANT QUOTA" of a -rates file; blank lines
// and those starting with '#' are skipped.
func parseRates(r io.Reader) (map[string]throttle.Quota, error) {
	out := map[string]throttle.Quota{}
	err := eachLine(r, func(text string) error {
		if strings.HasPrefix(text, "#") {
			return nil
		}
		fields := strings.Fields(text)
		tenant := fields[0]
		if err := checkTenant(tenant); err != nil {
			return err
		}
		if _, dup := out[tenant]; dup {
			return fmt.Errorf("tenant %s twice", tenant)
		}
		tq, err := throttle.ParseQuota(strings.Join(fields[1:], " "))
		if err == nil {
			err = checkPeriod(tq.Rate)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tenant, err)
		}
		out[tenant] = tq
		return nil
	})
	return out, err
}

// of returns tenant's quota: with the Redis hash, as it is now; else as
// the run started.
func (q *quotas) of(tenant string) throttle.Quota {
	if q.hash != nil {
		if tq := q.hash.Quota(tenant); !tq.IsZero() {
			return tq
		}
	}
	if tq, ok := q.byTenant[tenant]; ok {
		return tq
	}
	return q.def
}

// rate returns tenant's rate (see of).
func (q *quotas) rate(tenant string) throttle.Rate { return q.of(tenant).Rate }

// bursts returns the bursts that the quotas set (for limiterSpec.Bursts).
func (q *quotas) bursts() map[string]int {
	b := map[string]int{}
	for t, tq := range q.byTenant {
		if tq.Burst > 0 {
			b[t] = tq.Burst
		}
	}
	return b
}

// text describes the limits: "limit 20/1s per tenant (initech 10/1s,
// globex 50/1s burst 100)".
func (q *quotas) text() string {
	var overrides []string
	for _, t := range q.tenants {
		if tq, ok := q.byTenant[t]; ok {
			overrides = append(overrides, t+" "+tq.String())
		}
	}
	limits := fmt.Sprintf("limit %v per tenant", q.def)
	if len(overrides) > 0 {
		limits += " (" + strings.Join(overrides, ", ") + ")"
	}
	if q.hash != nil {
		limits += "; quotas in Redis hash " + q.hashKey
	}
	return limits
}

// source returns the QuotaFunc of the limiters: the quotas map in
// process, or with rc the Redis hash, filled with every tenant's quota
// first (one HSET) and read back every 250 ms; cl closes it.
func (q *quotas) source(ctx context.Context, rc *redis.Client, cl *closers) (throttle.QuotaFunc, error) {
	if rc == nil {
		return func(tenant string) throttle.Quota { return q.byTenant[tenant] }, nil
	}
	if q.hash != nil {
		return q.hash.Func(), nil
	}
	if q.hashKey == "" {
		return nil, errors.New("quotas: no Redis hash key")
	}
	fields := make([]any, 0, 2*len(q.tenants))
	for _, t := range q.tenants {
		fields = append(fields, t, q.of(t).String()) // q.hash is nil yet: the run's start
	}
	if len(fields) > 0 {
		if err := rc.HSet(ctx, q.hashKey, fields...).Err(); err != nil {
			return nil, fmt.Errorf("quotas: HSET %s: %w", q.hashKey, err)
		}
	}
	h, err := quota.NewRedisHash(ctx, rc, q.hashKey, quota.WithErrorHandler(func(err error) {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
	}))
	if err != nil {
		return nil, err
	}
	cl.add(func() { _ = h.Close() })
	q.hash = h
	return h.Func(), nil
}
