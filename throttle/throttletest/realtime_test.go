package throttletest

import (
	"fmt"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// recorder is a testing.TB that records Fatalf instead of stopping.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	if !r.failed {
		r.failed, r.msg = true, fmt.Sprintf(format, args...)
	}
}

func TestCheckTimedAdmissions(t *testing.T) {
	r := throttle.Rate{Count: 2, Per: time.Second}
	at := func(sent, returned time.Duration) TimedAdmission {
		return TimedAdmission{Sent: T0.Add(sent), Returned: T0.Add(returned)}
	}
	tests := []struct {
		name    string
		adm     []TimedAdmission
		wantErr bool
	}{
		{"within the limit", []TimedAdmission{at(0, 1*ms), at(0, 1*ms), at(time.Second, time.Second+ms)}, false},
		{"three in 500ms", []TimedAdmission{at(0, ms), at(100*ms, 101*ms), at(499*ms, 500*ms)}, true},
		{"unordered", []TimedAdmission{at(499*ms, 500*ms), at(0, ms), at(100*ms, 101*ms)}, true},
		// The third may have been admitted up to 1.2s after the first.
		{"not provable: slow replies", []TimedAdmission{at(0, ms), at(100*ms, 101*ms), at(500*ms, 1200*ms)}, false},
		{"cost counts", []TimedAdmission{{Sent: T0, Returned: T0.Add(ms), N: 2}, at(10*ms, 11*ms)}, true},
		{"within the slack", []TimedAdmission{at(0, 0), at(0, 0), at(0, 999500*time.Microsecond)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			CheckTimedAdmissions(rec, tt.adm, r, time.Millisecond)
			if rec.failed != tt.wantErr {
				t.Fatalf("failed = %v (%s), want %v", rec.failed, rec.msg, tt.wantErr)
			}
		})
	}
}

func TestClockZeroValueAndSetBackwards(t *testing.T) {
	var c Clock
	if !c.Now().Equal(T0) {
		t.Fatalf("zero Clock reads %v, want T0", c.Now())
	}
	c.Advance(time.Second)
	c.Set(c.Now().Add(-2 * time.Second))
	if want := T0.Add(-time.Second); !c.Now().Equal(want) {
		t.Fatalf("Now = %v, want %v", c.Now(), want)
	}
}
