package throttle

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Rate is a limit of Count admissions per Per. For a sliding window, Per is
// the window length; for a token bucket, Count tokens refill every Per.
//
// The zero Rate is invalid: every limiter constructor rejects it with an
// error wrapping [ErrInvalidOption].
type Rate struct {
	Count int           // admissions per Per; must be >= 1
	Per   time.Duration // the window or refill period; must be > 0
}

// PerSecond returns a Rate of n admissions per second.
func PerSecond(n int) Rate { return Rate{Count: n, Per: time.Second} }

// PerMinute returns a Rate of n admissions per minute.
func PerMinute(n int) Rate { return Rate{Count: n, Per: time.Minute} }

// PerHour returns a Rate of n admissions per hour.
func PerHour(n int) Rate { return Rate{Count: n, Per: time.Hour} }

// String formats r as ParseRate reads it, for example "100/1s".
func (r Rate) String() string { return strconv.Itoa(r.Count) + "/" + r.Per.String() }

// Validate reports an error wrapping [ErrInvalidOption] that names the field
// if r.Count < 1 or r.Per <= 0.
func (r Rate) Validate() error {
	if r.Count < 1 {
		return &OptionError{Field: "Rate.Count", Reason: fmt.Sprintf("must be >= 1, got %d", r.Count)}
	}
	if r.Per <= 0 {
		return &OptionError{Field: "Rate.Per", Reason: fmt.Sprintf("must be > 0, got %v", r.Per)}
	}
	return nil
}

// PerMicros returns Per in whole microseconds, rounded up and at least 1:
// the time unit of the limiters in this module.
func (r Rate) PerMicros() int64 {
	us := int64(r.Per / time.Microsecond)
	if r.Per%time.Microsecond != 0 {
		us++
	}
	return max(us, 1)
}

// ParseRate parses "COUNT/PERIOD", where PERIOD is a Go duration ("1m",
// "250ms") or a bare unit meaning one of it ("s", "m", "h"): "100/s",
// "100/1m", "5/250ms". The result is validated; errors wrap
// [ErrInvalidOption].
func ParseRate(s string) (Rate, error) {
	count, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, &OptionError{Field: "Rate", Reason: fmt.Sprintf("%q is not COUNT/PERIOD, e.g. 100/s", s)}
	}
	n, err := strconv.Atoi(strings.TrimSpace(count))
	if err != nil {
		return Rate{}, &OptionError{Field: "Rate.Count", Reason: fmt.Sprintf("%q is not an integer", count)}
	}
	per = strings.TrimSpace(per)
	switch per {
	case "ms", "s", "m", "h":
		per = "1" + per
	}
	d, err := time.ParseDuration(per)
	if err != nil {
		return Rate{}, &OptionError{Field: "Rate.Per", Reason: fmt.Sprintf("%q is not a duration such as 1s, 1m or 250ms", per)}
	}
	r := Rate{Count: n, Per: d}
	return r, r.Validate()
}
