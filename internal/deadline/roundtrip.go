package deadline

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// RoundTrip bounds the calls of one limiter to its store and learns, from
// their replies, how long a round trip takes and how far the server's
// clock is from this machine's. Each call is bounded by the limiter's
// timeout plus one round trip (its grace): a reply already on its way at
// the timeout is read, not cut off, so go-redis keeps the connection (it
// retires one whose reply was abandoned, and a new one needs more round
// trips than the timeout allows: a reconnect storm in which no call
// succeeds). The script of a call must not apply its decision after the
// call's deadline less the grace, in the server's clock ([RoundTrip.Expiry]),
// so a decision applied is one whose caller reads it.
//
// A RoundTrip is safe for concurrent use; the zero RoundTrip is not
// usable: use NewRoundTrip.
type RoundTrip struct {
	timeout time.Duration
	shared  Shared
	rtt     atomic.Int64 // ns, moving average of round trips; 0 before the first
	off     atomic.Pointer[offset]
}

// offset is an estimate of the server's clock minus the local one, from
// one reply: the server read its clock within the call, so the error is
// at most half the call's round trip.
type offset struct {
	d   time.Duration
	rtt time.Duration
	at  time.Time
}

// OffsetMaxAge is how long an offset estimate is kept against ones with
// longer round trips (so, less exact).
const OffsetMaxAge = time.Minute

// NewRoundTrip returns the RoundTrip of calls with the per-call timeout
// (> 0).
func NewRoundTrip(timeout time.Duration) *RoundTrip {
	r := &RoundTrip{timeout: timeout}
	r.shared = Shared{d: timeout, extra: r.Grace}
	return r
}

// Timeout returns the per-call timeout.
func (r *RoundTrip) Timeout() time.Duration { return r.timeout }

// Estimate returns the moving average of the round trips observed, or 0
// before the first.
func (r *RoundTrip) Estimate() time.Duration { return time.Duration(r.rtt.Load()) }

// Grace returns how long after its timeout a call waits for its reply:
// one round trip, at most MaxGrace timeouts; that most before any round
// trip was observed. The cap is above one timeout so that a connection's
// handshake (go-redis's takes 3 round trips, under the first call's
// deadline) completes when the round trip is near the timeout: the call
// itself then fails (its script refuses to apply late), its connection
// lives on.
func (r *RoundTrip) Grace() time.Duration {
	if rtt := r.Estimate(); rtt > 0 {
		return min(rtt, MaxGrace*r.timeout)
	}
	return MaxGrace * r.timeout
}

// MaxGrace is the most a call's grace can be, in timeouts: a call
// returns within 1 + MaxGrace timeouts whatever the store does.
const MaxGrace = 2

// Bound returns ctx bounded by the timeout plus the grace (a sooner
// deadline of ctx's own is kept), as Bound does.
func (r *RoundTrip) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return Bound(ctx, r.timeout+r.Grace())
}

// Shared is the [Shared] of r's calls: background calls bounded like
// Bound's, sharing contexts.
func (r *RoundTrip) Shared() *Shared { return &r.shared }

// Done records a call sent at start that has just returned err and, when
// it succeeded, a reply carrying the server's instant server (µs since
// the Unix epoch, read while the call ran; < 0 for none), and returns err
// explained (see Explain). A call that met its deadline took at least as
// long as a round trip: that counts only when it is longer than the
// estimate (a caller's own short deadline says nothing).
func (r *RoundTrip) Done(start time.Time, server int64, err error) error {
	switch {
	case err == nil:
		r.observe(start, server)
	case errors.Is(err, context.DeadlineExceeded):
		if took := time.Since(start); took > r.Estimate() {
			r.average(took)
		}
	}
	return r.Explain(err)
}

func (r *RoundTrip) observe(start time.Time, server int64) {
	end := time.Now()
	rtt := end.Sub(start)
	r.average(rtt)
	if server < 0 {
		return
	}
	mid := start.Add(rtt / 2)
	var e *offset // made only when it is kept: most calls keep the one before
	for {
		old := r.off.Load()
		if old != nil && rtt > old.rtt && end.Sub(old.at) < OffsetMaxAge {
			return
		}
		if e == nil {
			e = &offset{d: time.UnixMicro(server).Add(500 * time.Nanosecond).Sub(mid), rtt: rtt, at: end}
		}
		if r.off.CompareAndSwap(old, e) {
			return
		}
	}
}

// average folds rtt into the moving average (weight 1/8).
func (r *RoundTrip) average(rtt time.Duration) {
	rtt = max(rtt, time.Microsecond)
	for {
		old := r.rtt.Load()
		next := int64(rtt)
		if old > 0 {
			next = old + (int64(rtt)-old)/8
		}
		if r.rtt.CompareAndSwap(old, next) {
			return
		}
	}
}

// Expiry returns the instant, µs since the Unix epoch in the server's
// clock, after which a script called with the deadline dl must apply
// nothing: dl less one round trip (the reply then has that long to come
// back). dl may be the caller's own, sooner than Bound's. Before any
// round trip was observed, dl itself: the one before the first reply
// would be MaxGrace timeouts, which would refuse every first call under
// a caller's deadline shorter than that. Until a reply has carried the
// server's instant, the clocks are taken to agree: a script refused
// because the server's clock is ahead replies with its instant, and the
// next call is judged right.
func (r *RoundTrip) Expiry(dl time.Time) int64 {
	back := min(r.Estimate(), MaxGrace*r.timeout)
	return dl.Add(r.Offset() - back).UnixMicro()
}

// Offset returns the estimate of the server's clock minus this machine's
// (0 before a reply carried the server's instant).
func (r *RoundTrip) Offset() time.Duration {
	if o := r.off.Load(); o != nil {
		return o.d
	}
	return 0
}

// Explain returns err, a failed call's, as a *throttle.SlowStoreError when
// it is a timeout and the round trip is longer than the timeout: then no
// call can succeed, and the error says what to change.
func (r *RoundTrip) Explain(err error) error {
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if rtt := r.Estimate(); rtt > r.timeout {
		return &throttle.SlowStoreError{RoundTrip: rtt, Timeout: r.timeout, Err: err}
	}
	return err
}
