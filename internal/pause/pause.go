// Package pause holds what every limiter of this module shares to pause a
// key (throttle.Pauser): the check of the pause duration, the in-process
// table of pauses of the in-memory limiters, the Redis script that records
// a pause beside a key's data, and the Decision of a paused key.
package pause

import (
	"fmt"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// Suffix names the pause key beside a key's data in Redis: after its hash
// tag, so in the same cluster slot (a data key always ends with the tag's
// '}', so none ends with it).
const Suffix = ":pause"

// MaxMicros is the longest pause, 2^52 µs (about 142 years): a pause's end
// in µs since the Unix epoch then stays exact in a Lua number.
const MaxMicros = 1 << 52

// Max is MaxMicros as a Duration.
const Max = MaxMicros * time.Microsecond

// Check returns the error of Pause for a pause of d, wrapping
// throttle.ErrInvalidOption and naming the field "d", or nil if 0 < d <= Max.
func Check(d time.Duration) error {
	switch {
	case d <= 0:
		return &throttle.OptionError{Field: "d", Reason: fmt.Sprintf("the pause must be > 0, got %v", d)}
	case d > Max:
		return &throttle.OptionError{Field: "d", Reason: fmt.Sprintf("the pause must be at most 2^52 µs (about 142 years), got %v", d)}
	}
	return nil
}

// Micros returns d in µs, rounded up (a pause never ends early).
func Micros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}

// Decision returns d as the Decision of a key paused for left more: a
// rejection with nothing remaining, a RetryAfter of at least left (d's own
// when longer: the limit may still be full when the pause ends) and a
// ResetAfter of at least left, both rounded up to the millisecond.
// Reserved is false: a paused key reserves nothing.
func Decision(d throttle.Decision, left time.Duration) throttle.Decision {
	left = max(throttle.CeilMillisecond(left), time.Millisecond)
	d.Allowed, d.Reserved, d.Remaining = false, false, 0
	d.RetryAfter = max(d.RetryAfter, left)
	d.ResetAfter = max(d.ResetAfter, left)
	return d
}
