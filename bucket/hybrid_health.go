package bucket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/metric"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// health is the state of one Redis server as the Hybrid sees it.
type health struct {
	node string // the cluster master's address; "" without a cluster
	cb   *gobreaker.CircuitBreaker[grant]
	down atomic.Bool // a Redis call failed and none has succeeded since
}

// callerDone marks an error caused by the caller's context ending (or the
// Hybrid closing), which says nothing about Redis' health.
type callerDone struct{ err error }

func (e *callerDone) Error() string { return e.err.Error() }
func (e *callerDone) Unwrap() error { return e.err }

func isCallerDone(err error) bool {
	var cd *callerDone
	return errors.As(err, &cd)
}

// newHealth returns the health of the Redis server (cluster master) at
// node, with its own circuit breaker.
func (h *Hybrid) newHealth(node string) *health {
	hl := &health{node: node}
	hl.cb = gobreaker.NewCircuitBreaker[grant](gobreaker.Settings{
		Name:        "bucket.hybrid",
		MaxRequests: 1,
		Timeout:     breakerOpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= breakerTrip },
		IsExcluded:  isCallerDone,
		// A reply about one request proves Redis is up.
		IsSuccessful: func(err error) bool { return err == nil || isRequestError(err) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			h.breakerChanged(hl, from, to)
		},
	})
	return hl
}

// healthAt returns the health of the master of slot as last seen, or the
// Hybrid's only one.
func (h *Hybrid) healthAt(slot int) *health {
	if h.slots != nil {
		if hl := h.slots[slot].Load(); hl != nil {
			return hl
		}
	}
	return h.health
}

// resolve returns the health of the Redis server that holds key: with a
// cluster, that of the master go-redis routes key's slot to now (or, if
// the client cannot tell, the one last seen).
func (h *Hybrid) resolve(ctx context.Context, key string) *health {
	if h.cluster == nil {
		return h.health
	}
	rk := rediskey.Key(h.redis.prefix, key)
	slot := rediskey.Slot(rk)
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	m, err := h.cluster.MasterForKey(ctx, rk)
	if err != nil {
		return h.healthAt(slot)
	}
	addr := m.Options().Addr
	v, ok := h.nodes.Load(addr)
	if !ok {
		v, _ = h.nodes.LoadOrStore(addr, h.newHealth(addr))
	}
	hl := v.(*health)
	if h.slots[slot].Load() != hl {
		h.slots[slot].Store(hl)
	}
	return hl
}

// shareRate returns the degraded bucket of WithLocalShare: Count/instances
// × safety tokens per Per, as a Rate and burst. A share below one token
// becomes one token per Per/share.
func shareRate(r throttle.Rate, instances int, safety float64) (throttle.Rate, int) {
	share := float64(r.Count) * safety / float64(instances)
	if share >= 1 {
		n := int(share)
		return throttle.Rate{Count: n, Per: r.Per}, n
	}
	per := math.Ceil(float64(r.Per) / share)
	if per >= math.MaxInt64 {
		return throttle.Rate{Count: 1, Per: math.MaxInt64}, 1
	}
	return throttle.Rate{Count: 1, Per: time.Duration(per)}, 1
}

// shareQuotas returns the quotas of the local share: each key's share of
// its quota f, as shareRate makes the limiter's own share.
func shareQuotas(f throttle.QuotaFunc, instances int, safety float64) throttle.QuotaFunc {
	return func(key string) throttle.Quota {
		q := f(key)
		if q.IsZero() || q.Rate.Validate() != nil {
			return q // the limiter's own share, or the quota's error
		}
		r, b := shareRate(q.Rate, instances, safety)
		return throttle.Quota{Rate: r, Burst: b}
	}
}

// fallback decides when Redis could not: with the local share, or by
// returning the error. An error reply about this request only (WRONGTYPE
// on a key another program wrote) is returned as it is: Redis is up, and
// the local share is for when it is not.
func (h *Hybrid) fallback(ctx context.Context, key string, n int, err error) (throttle.Decision, error) {
	if isRequestError(err) {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: %w", err)
	}
	if h.share == nil {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: redis unavailable: %w", err)
	}
	share, qerr := h.share.lims.of(key)
	if qerr == nil && n > share.p.burst {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: redis unavailable and n=%d exceeds the local share of %d: %w", n, share.p.burst, err)
	}
	d, derr := h.share.AllowN(ctx, key, n)
	if derr != nil {
		h.errorsN.Add(1)
		return throttle.Decision{}, fmt.Errorf("bucket: hybrid: local share: %w (redis unavailable: %w)", derr, err)
	}
	d.Limit = h.rate.Count
	if lim, err := h.redis.lims.of(key); err == nil {
		d.Limit = lim.limit
	}
	d.Source = throttle.SourceDegraded
	h.degradedN.Add(1)
	a := 0
	if d.Allowed {
		a = 1
	}
	h.decisions.Add(ctx, 1, h.decisionOpts[a][throttle.SourceDegraded]...)
	return d, nil
}

// call runs one Redis call through the breaker: it bounds it by the
// timeout, marks errors caused by ctx (not counted against Redis), records
// latency and errors, and keeps the down flag of key's Redis server.
func (h *Hybrid) call(ctx context.Context, op int, key string, f func(context.Context) (grant, error)) (grant, error) {
	hl := h.resolve(ctx, key)
	var start time.Time
	ran := false
	g, err := hl.cb.Execute(func() (grant, error) {
		ran, start = true, time.Now()
		g, err := h.bounded(ctx, op, key, f)
		if err != nil && ctx.Err() != nil {
			err = &callerDone{err}
		}
		return g, err
	})
	if ran {
		h.redisDuration.Record(ctx, time.Since(start).Seconds(), h.durationOpts[op]...)
	}
	if errors.Is(err, gobreaker.ErrTooManyRequests) { // gobreaker's "too many requests" reads like a rejection
		err = fmt.Errorf("circuit breaker half-open, its probe in flight: %w", err)
	}
	switch {
	case err == nil || isRequestError(err):
		if hl.down.Load() {
			hl.down.Store(false)
		}
		if err != nil {
			h.redisErrors.Add(ctx, 1, h.errorOpts[op]...)
		}
	case isCallerDone(err):
	default:
		if ran {
			h.redisErrors.Add(ctx, 1, h.errorOpts[op]...)
		}
		if !hl.down.Load() {
			hl.down.Store(true)
		}
	}
	return g, err
}

// unavailable are the prefixes of Redis error replies that say the server
// cannot serve requests now (or not this client: authentication, ACLs),
// rather than that a request was wrong.
var unavailable = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM", "NOREPLICAS", "MISCONF",
	"ERR max number of clients", "NOAUTH", "NOPERM", "WRONGPASS"}

// isRequestError reports whether err is an error reply from a server that
// is up, about this request only (such as WRONGTYPE on a key that some
// other program wrote): it opens no breaker and puts no other key in the
// degraded mode.
func isRequestError(err error) bool {
	if errors.Is(err, errReply) { // a reply about this request the client cannot use
		return true
	}
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range unavailable {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}

// callResult is the outcome of a Redis call run by bounded.
type callResult struct {
	g   grant
	err error
}

// Outcomes of a bounded call, settled once.
const (
	callPending int32 = iota
	callAbandoned
	callDone
)

// bounded runs f and returns when f does or when the timeout passes,
// whichever is first: the client's own handling of the deadline (go-redis
// adds a millisecond or two, and sometimes far more while it replaces a
// connection) never delays a decision. An abandoned call finishes in the
// background, with one round trip more for its reply (the Redis limiter's
// grace: a reply on its way is read, and the connection kept); tokens it
// leased after all are given back. After Close has begun, f runs inline.
func (h *Hybrid) bounded(ctx context.Context, op int, key string, f func(context.Context) (grant, error)) (grant, error) {
	fctx, fcancel := context.WithTimeout(ctx, h.timeout+h.redis.rt.Grace())
	if !h.track() {
		defer fcancel()
		return f(fctx)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var state atomic.Int32
	ch := make(chan callResult, 1)
	go func() {
		defer h.wg.Done()
		defer fcancel()
		g, err := f(fctx)
		if state.CompareAndSwap(callPending, callDone) {
			ch <- callResult{g, err}
			return
		}
		if op == opLease && err == nil && g.granted > 0 {
			_ = h.redis.giveBack(h.bgCtx, key, g.lim, g.granted)
		}
	}()
	select {
	case r := <-ch:
		return r.g, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(callPending, callAbandoned) {
			return grant{}, fmt.Errorf("bucket: hybrid: redis: %w", ctx.Err())
		}
		r := <-ch
		return r.g, r.err
	}
}

// breakerChanged is the OnStateChange callback of hl's breaker.
func (h *Hybrid) breakerChanged(hl *health, from, to gobreaker.State) {
	if to != gobreaker.StateClosed {
		hl.down.Store(true)
	}
	h.breakerChanges.Add(context.Background(), 1, metric.WithAttributes(
		HybridBreakerFromAttr.String(from.String()), HybridBreakerToAttr.String(to.String())))
	if h.log != nil {
		level := slog.LevelInfo
		if to == gobreaker.StateOpen {
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{slog.String("from", from.String()), slog.String("to", to.String()),
			slog.String("algorithm", hybridAlgorithm), slog.String("rate", h.rate.String())}
		if hl.node != "" {
			attrs = append(attrs, slog.String("node", hl.node))
		}
		h.log.LogAttrs(context.Background(), level, "bucket: hybrid: circuit breaker "+to.String(), attrs...)
	}
}
