package bucket

import (
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// algorithm is the throttle.algorithm attribute of every bucket.
const algorithm = "token_bucket"

// maxCredit bounds a full bucket's credit: 2^53, the largest range in which
// every integer is exact in a float64, which is what the Redis Lua
// interpreter computes with.
const maxCredit = 1 << 53

// params is the token-bucket arithmetic shared by Local and Redis (and the
// Lua script), in integers so that it is exact: a bucket holds credit, where
// one token is worth perUS units (Rate.Per in whole microseconds) and every
// microsecond adds count units (Rate.Count). Refilling, taking and the
// waits derived from them are then integer operations, with no rounding
// anywhere but the final round-up to a whole millisecond: 5 per 2 s gives
// exactly 400 ms between tokens, never 399 or 401.
type params struct {
	count  int64 // credit added per µs (Rate.Count)
	perUS  int64 // credit per token (Rate.Per in µs, rounded up)
	cap    int64 // credit of a full bucket: burst × perUS
	fullUS int64 // ceil(2^53 / count): an elapsed time beyond this fills any bucket, even one at maxDebt
	burst  int

	// Reservations (AllowID): credit may go down to -maxDebt = -(2^53 -
	// cap), so that cap - credit, and every sum the Lua script makes of
	// credit, stays within 2^53. ids are remembered for memUS = ceil(cap /
	// count), the time from empty to full.
	maxDebt int64
	memUS   int64

	// 1/perUS, 1/count and 1/(count × 1000), so that the divisions of
	// every decision are multiplications (a 64-bit integer division costs
	// tens of cycles).
	invPer, invCount float64
	countMS          int64 // credit added per ms
	invCountMS       float64
}

// newParams validates r and burst. Errors wrap throttle.ErrInvalidOption
// and name the field.
func newParams(r throttle.Rate, burst int) (params, error) {
	if err := r.Validate(); err != nil {
		return params{}, err
	}
	if r.Count > maxCredit/1000 {
		return params{}, &throttle.OptionError{Field: "Rate.Count", Reason: fmt.Sprintf("must be at most 2^53/1000, got %d", r.Count)}
	}
	if burst < 1 {
		return params{}, &throttle.OptionError{Field: "burst", Reason: fmt.Sprintf("must be >= 1, got %d", burst)}
	}
	perUS := r.PerMicros()
	if perUS > maxCredit/int64(burst) {
		return params{}, &throttle.OptionError{Field: "burst", Reason: fmt.Sprintf(
			"burst × Rate.Per must be at most 2^53 µs (about 285 years), got %d × %v", burst, r.Per)}
	}
	p := params{count: int64(r.Count), perUS: perUS, cap: int64(burst) * perUS, burst: burst}
	p.fullUS = (maxCredit + p.count - 1) / p.count
	p.maxDebt = maxCredit - p.cap
	p.memUS = (p.cap + p.count - 1) / p.count
	p.invPer = 1 / float64(p.perUS)
	p.invCount = 1 / float64(p.count)
	p.countMS = p.count * 1000
	p.invCountMS = 1 / float64(p.countMS)
	return p, nil
}

// floorDiv returns floor(a / b) for 0 <= a <= 2^53 and b >= 1, given inv =
// 1/b: the float quotient is off by at most one either way, and is
// corrected, without branches, by the sign of the exact remainder.
func floorDiv(a, b int64, inv float64) int64 {
	q := int64(float64(a) * inv)
	r := a - q*b
	q += r >> 63                    // r < 0: one too many
	q += int64(uint64(b-1-r) >> 63) // r >= b: one too few
	return q
}

// ceilDiv returns ceil(a / b) for 0 <= a <= 2^53 and b >= 1, given inv =
// 1/b.
func ceilDiv(a, b int64, inv float64) int64 {
	q := floorDiv(a, b, inv)
	return q + int64(uint64(q*b-a)>>63) // +1 if a remainder is left
}

// refill returns the credit at now of a bucket that held credit at ts, and
// the time to store with it: max(ts, now), so that stored time never moves
// backwards and elapsed time is clamped at 0. credit may be negative (a
// debt of reservations, at least -maxDebt).
func (p *params) refill(credit, ts, now int64) (int64, int64) {
	if now <= ts {
		return min(credit, p.cap), ts
	}
	if elapsed := now - ts; elapsed > p.fullUS {
		credit = p.cap // elapsed × count > 2^53 >= cap - credit; and no overflow
	} else {
		credit = min(credit+elapsed*p.count, p.cap)
	}
	return credit, now
}

// waitUS returns the µs until the bucket, refilling from credit, holds
// need: ceil((need - credit) / count), or 0.
func (p *params) waitUS(need, credit int64) int64 {
	if credit >= need {
		return 0
	}
	return ceilDiv(need-credit, p.count, p.invCount)
}

// micros converts µs to a Duration rounded up to the millisecond.
func micros(us int64) time.Duration {
	return throttle.CeilMillisecond(time.Duration(us) * time.Microsecond)
}

// decision builds the Decision for a request of cost n that left credit
// in the bucket: admitted (credit is what is left after taking) or
// rejected (credit is what is there now; when negative, the wait includes
// the debt). Waits are ceil(missing credit / credit per ms) whole
// milliseconds, which is the wait in µs rounded up to the millisecond.
func (p *params) decision(allowed bool, n int, credit int64, limit int, src throttle.Source) throttle.Decision {
	d := throttle.Decision{
		Allowed:    allowed,
		Limit:      limit,
		Remaining:  int(floorDiv(max(credit, 0), p.perUS, p.invPer)),
		ResetAfter: time.Duration(ceilDiv(p.cap-credit, p.countMS, p.invCountMS)) * time.Millisecond,
		Source:     src,
	}
	if !allowed {
		// > 0: credit < n × perUS, else the request was admitted.
		d.RetryAfter = time.Duration(max(ceilDiv(int64(n)*p.perUS-credit, p.countMS, p.invCountMS), 1)) * time.Millisecond
	}
	return d
}

// maxHorizonUS bounds a reservation horizon, 2^52 µs (about 142 years), so
// that a slot (now + wait, µs since the Unix epoch) stays exact in a Lua
// number. Longer horizons act as this one.
const maxHorizonUS = 1 << 52

// horizonMicros converts a reservation horizon to µs, rounded down (a slot
// is reserved only if it lies within the horizon) and capped at
// maxHorizonUS. The caller has checked h >= 0.
func horizonMicros(h time.Duration) int64 { return min(int64(h/time.Microsecond), maxHorizonUS) }

// errHorizon is the error of AllowID for a negative horizon.
func errHorizon(h time.Duration) error {
	return &throttle.OptionError{Field: "horizon", Reason: fmt.Sprintf("must be >= 0, got %v", h)}
}

// reservation is the outcome of a fresh request that n tokens now do not
// cover, at credit: if taking them leaves a debt (credit below 0) that the
// refill repays within horizon µs, and within maxDebt, ok and the credit
// after taking; wait is the µs until the request would fit (its slot when
// reserved).
func (p *params) reservation(n int, credit, horizon int64) (wait, after int64, ok bool) {
	debt := int64(n)*p.perUS - credit // > 0
	wait = ceilDiv(debt, p.count, p.invCount)
	return wait, -debt, wait <= horizon && debt <= p.maxDebt
}
