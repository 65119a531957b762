package throttle_test

import (
	"errors"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestParseQuota(t *testing.T) {
	tests := []struct {
		in    string
		want  throttle.Quota
		field string // "" means no error
	}{
		{in: "20/1s", want: throttle.Quota{Rate: throttle.Rate{Count: 20, Per: time.Second}}},
		{in: " 20/1s  burst 40 ", want: throttle.Quota{Rate: throttle.Rate{Count: 20, Per: time.Second}, Burst: 40}},
		{in: "100/m burst=5", want: throttle.Quota{Rate: throttle.Rate{Count: 100, Per: time.Minute}, Burst: 5}},
		{in: "5/250ms BURST 1", want: throttle.Quota{Rate: throttle.Rate{Count: 5, Per: 250 * time.Millisecond}, Burst: 1}},
		{in: "", field: "Quota"},
		{in: "20/1s 40", field: "Quota"},
		{in: "20/1s burst", field: "Quota"},
		{in: "20/1s burst 0", field: "Quota.Burst"},
		{in: "20/1s burst x", field: "Quota.Burst"},
		{in: "0/1s", want: throttle.Blocked(time.Second)},
		{in: "0/1s burst 2", want: throttle.Blocked(time.Second)}, // 0 blocks, whatever the burst
		{in: "0/1s burst x", field: "Quota.Burst"},
		{in: "-1/1s", field: "Rate.Count"},
		{in: "20/1parsec", field: "Rate.Per"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := throttle.ParseQuota(tt.in)
			if tt.field == "" {
				if err != nil || got != tt.want {
					t.Fatalf("throttle.ParseQuota(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
				}
				back, err := throttle.ParseQuota(got.String())
				if err != nil || back != got {
					t.Fatalf("throttle.ParseQuota(%q.String() = %q) = %+v, %v", tt.in, got.String(), back, err)
				}
				return
			}
			var oe *throttle.OptionError
			if !errors.Is(err, throttle.ErrInvalidOption) || !errors.As(err, &oe) || oe.Field != tt.field {
				t.Fatalf("throttle.ParseQuota(%q): error %v, want one naming %s", tt.in, err, tt.field)
			}
		})
	}
	if s := (throttle.Quota{}).String(); s != "" {
		t.Errorf("zero Quota formats as %q", s)
	}
}
