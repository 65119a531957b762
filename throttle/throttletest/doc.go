// Package throttletest helps test limiters: a settable [Clock] starting at
// the fixed instant [T0], and conformance suites that every limiter of this
// module passes and that users' own limiters can run too.
//
// [RunWindow] checks a sliding window log through the throttle.Limiter
// interface, with the Clock at fixed instants (whole microseconds), each
// subtest on a fresh limiter and keys of its own:
//
//   - it admits up to Count units per Per, then rejects;
//   - the boundary rule: an admission at t counts during [t, t+Per), so at
//     t+Per-1ms it is still counted and at t+Per it is gone;
//   - a rejection's RetryAfter is the time until enough of the oldest
//     admitted units leave the window for n to fit (for a cost n, the k-th
//     oldest unit, k = counted + n - Count), rounded up to the millisecond
//     and never 0; RetryAfter-1ms later is still too early and exactly
//     RetryAfter later is admitted;
//   - rejected attempts never count: a client retrying every millisecond is
//     admitted exactly at the limit's rate;
//   - Remaining is Count minus the units counted after the decision;
//     ResetAfter is the newest counted admission + Per - now (Per for an
//     admission), rounded up to the millisecond;
//   - keys are independent, including odd ones ([OddKeys]: "", braces,
//     colons, keys that differ only in an escaping, binary bytes, 10 KB);
//   - windows below a second (5/250ms) and with a sub-millisecond part;
//   - a cost n < 1 or n > Count is an error wrapping
//     throttle.ErrInvalidCost and admits nothing;
//   - a clock going backwards never moves stored time backwards: an
//     admission made while the clock is behind counts from the newest
//     instant the key has seen.
//
// [RunWindowRealTime] checks the same rules, loosely, against a limiter on
// its own clock (such as the Redis server's TIME), with real sleeps.
//
// Beside them: [RunBucket] and [RunBucketRealTime] for token buckets,
// [RunBucketReservations] for their ids, [RunWindowQuotas] and
// [RunBucketQuotas] for per-key quotas (WithQuotas: each key on its own
// quota, a change applying from the next decision), and [RunPeekReset]
// (Peek says what AllowN would and charges nothing; Reset forgets a key).
//
// [RunRefund] checks throttle.Refunder (an admission or a reservation
// given back by its id, once), and [RunAll] checks throttle.All over two
// limiters of one family against what the parts say alone, and that a
// rejected request charges no part.
//
// [RunPause] checks Pause (throttle.Pauser) on windows and token buckets
// alike: while paused every decision (AllowN, AllowID, Peek) is a
// rejection with Remaining 0 and RetryAfter the time left, charging and
// reserving nothing; a longer pause extends, a shorter one never shortens;
// d <= 0 is refused naming "d"; Reset ends a pause; and a peer limiter on
// the same store sees it.
//
// Usage:
//
//	func TestConformance(t *testing.T) {
//		throttletest.RunWindow(t, func(t *testing.T, r throttle.Rate, c throttle.Clock) throttle.Limiter {
//			l, err := mylimiter.New(r, mylimiter.WithClock(c))
//			if err != nil {
//				t.Fatal(err)
//			}
//			return l
//		})
//	}
package throttletest
